"""The TensorFlow operations the serving layer (``readers.serving.TransformLayer``)
is built from, each the graph twin of a converter step: tokenizing text
(the converter's delimiters), ISO timestamps and civil dates, scaling,
kind checks on the request's packed values, shared vocabulary tables and
the per-column parameters read from the analysis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from convert.config import FeatureConfig
from convert.derive import DAY_SECONDS
from convert.transforms import transform_of
from readers._serving_kinds import KIND_BOOL, KIND_FLOAT, KIND_INT, KIND_NAMES, KIND_NULL

if TYPE_CHECKING:  # pragma: no cover
    from readers._serving_wire import Wire

# ``is_number`` and ``not_number`` compare kinds as numbers: null, then the three number kinds.
assert (KIND_NULL, KIND_BOOL, KIND_INT, KIND_FLOAT) == (0, 1, 2, 3)


def reason(source: str, why: str) -> str:
    """A rejection reason as the layer reports it: ``source: why``."""
    return f"{source}: {why}"


def slots(ids: tf.Tensor, rows: tf.Tensor, cols: tf.Tensor, n: int, batch: tf.Tensor) -> tf.Tensor:
    """``[batch, n]``: each id at ``(row, col)``, zeros elsewhere; ids past column ``n`` are
    dropped (segment -1, which ``unsorted_segment_sum`` skips). At most one id per slot."""
    slot = tf.where(cols < n, rows * n + cols, tf.constant(-1, tf.int64))
    return tf.reshape(tf.math.unsorted_segment_sum(ids, slot, batch * n), [-1, n])


#: A ``text`` feature's rows are tokenized and looked up in this many row ranges: separate
#: op chains, which the inter-op threads run at once. As one chain, a batch's text is the
#: graph's longest path and runs alone on one thread while the rest of the layer waits.
TEXT_PARTS = 4


#: The delimiters of ``TEXT_DELIMITERS_RE``: every ASCII byte but ``[0-9A-Za-z_]``.
_DELIMITER_BYTES = bytes(c for c in range(128) if not (chr(c).isalnum() or c == ord("_")))


def text_tokens(text: tf.Tensor) -> tf.SparseTensor:
    """Each string's tokens (``convert.records.tokenize`` on the UTF-8), ``[batch, tokens]``:
    split at every byte of ``_DELIMITER_BYTES``, empty tokens dropped. One op, the
    same tokens as ``TEXT_DELIMITERS_RE`` replaced by spaces then split at whitespace,
    without the rewritten copy of the text."""
    return tf.compat.v1.string_split(text, sep=_DELIMITER_BYTES, skip_empty=True)


def fill_value(f: FeatureConfig, stats: Mapping[str, Any]) -> float:
    """What a numeric feature's missing value becomes: the converter's own value
    (``convert.transforms.base.NumericTransform.fill_of``: its ``fill``, or the statistic it names)."""
    return transform_of(f).fill_of(f, stats)  # type: ignore[attr-defined]


def column_params(fs: Sequence[FeatureConfig], stats: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per feature of the grouped numeric op: what every numeric transform shares (the
    NaN checks and the fill); each transform's own step and parameters are its module's."""
    p: dict[str, list[Any]] = {k: [] for k in ("nan_error", "nan_fill", "nan_reason", "fill")}
    for f, st in zip(fs, stats, strict=True):
        p["nan_error"].append(f.on_nan == "error")
        p["nan_fill"].append(f.on_nan == "fill")
        p["nan_reason"].append(reason(f.source, f"value is NaN or infinite (or beyond float32's range, |x| > 3.4e38); "
                                                 f"set on_nan: fill or keep for feature {f.name!r} to accept it"))
        p["fill"].append(fill_value(f, st))
    return p


def f64s(values: Sequence[float]) -> tf.Tensor:
    """A float64 vector constant with exactly the values' bits (-0.0 included)."""
    return tf.constant(np.array(values, dtype=np.float64))


def bools(values: Sequence[bool]) -> tf.Tensor:
    return tf.constant(np.array(values, dtype=bool))


#: The most ids ``shared_table`` holds (terms x features), so its constant stays small.
_SHARED_MAX_IDS = 1 << 20


def shared_vocabularies(fs: Sequence[FeatureConfig], vocabularies: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Of the features ``fs`` that can share a table (single-valued vocabularies without OOV
    buckets), those whose ids one lookup gives (``shared_table``); none when fewer than
    two, or too many ids."""
    union = {t for f in fs for t in vocabularies[f.name]}
    if len(fs) < 2 or (len(union) + 1) * len(fs) > _SHARED_MAX_IDS:
        return ()
    return tuple(f.name for f in fs)


def shared_table(features: Sequence[FeatureConfig], shared: Sequence[str],
                  vocabularies: Mapping[str, Sequence[str]]) -> tuple[list[bytes], np.ndarray]:
    """``(keys, ids)``: every term of the ``shared`` features' vocabularies (UTF-8), and
    ``ids[r, j]`` the id of term ``r`` in the ``j``-th one (its OOV id where it lacks
    the term; row ``len(keys)``: a term none has)."""
    by_name = {f.name: f for f in features}
    rows: dict[str, int] = {}
    for name in shared:
        for t in vocabularies[name]:
            rows.setdefault(t, len(rows))
    ids = np.empty((len(rows) + 1, len(shared)), dtype=np.int64)
    for j, name in enumerate(shared):
        f = by_name[name]
        ids[:, j] = oov_default(f)
        base = 1 + f.num_oov_buckets
        for i, t in enumerate(vocabularies[name]):
            ids[rows[t], j] = base + i
    return [t.encode("utf-8", "surrogatepass") for t in rows], ids


def oov_default(f: FeatureConfig) -> int:
    """The vocabulary table's value for a term it lacks: the OOV id 1, or 0 where
    ``num_oov_buckets`` > 1 picks one of the OOV ids by hash (``_ids``)."""
    return 0 if f.num_oov_buckets > 1 else 1


def f64(v: float) -> tf.Tensor:
    """A float64 scalar constant with exactly ``v``'s bits. ``tf.constant(-0.0)``
    may return a cached ``0.0`` in eager mode (the scalar cache compares by value)."""
    return tf.bitcast(tf.constant(np.array(v, np.float64).view(np.int64)), tf.float64)


def is_number(kind: tf.Tensor) -> tf.Tensor:
    """Kinds bool, int and float (consecutive: one unsigned compare)."""
    return tf.cast(kind - KIND_BOOL, tf.uint32) <= KIND_FLOAT - KIND_BOOL


def not_number(kind: tf.Tensor) -> tf.Tensor:
    """Neither a number nor null: any kind past float (as unsigned, negative ones are too)."""
    return tf.cast(kind, tf.uint32) > KIND_FLOAT


def unknown_kind(kind: tf.Tensor) -> tf.Tensor:
    """None of ``KIND_NAMES`` (as unsigned, negative codes are past the last too)."""
    return tf.cast(kind, tf.uint32) >= len(KIND_NAMES)


def isin(kind: tf.Tensor, kinds: Sequence[int]) -> tf.Tensor:
    out = tf.equal(kind, kinds[0])
    for k in kinds[1:]:
        out = out | tf.equal(kind, k)
    return out


def pad_to(t: tf.Tensor, n: int) -> tf.Tensor:
    """``t[:, :n]``, padded with zeros/False to n columns."""
    width = tf.shape(t)[1]
    pad = tf.maximum(n - width, 0)
    return tf.pad(t, [[0, 0], [0, pad]])[:, :n]


def wrong_kind_reason(source: str, kind: tf.Tensor, prefix: str, suffix: str = "", column: int | None = None) -> Any:
    """The reason naming what the record held (``kind``, or its ``column``), built only when some row is rejected."""
    def build() -> tf.Tensor:
        names = tf.constant([reason(source, f"{prefix}{k}{suffix}") for k in KIND_NAMES])
        held = kind if column is None else kind[:, column]
        known = (held >= 0) & (held < len(KIND_NAMES))
        invalid = tf.strings.join([
            reason(source, "invalid kind code "), tf.strings.as_string(held),
            f" on the wire (expected 0..{len(KIND_NAMES) - 1}: {', '.join(KIND_NAMES)}); send it as encode writes it"])
        return tf.where(known, tf.gather(names, tf.clip_by_value(held, 0, len(KIND_NAMES) - 1)), invalid)
    return build


def np_max(a: tf.Tensor, b: float | tf.Tensor) -> tf.Tensor:
    """numpy's ``maximum`` inside ``np.clip``: NaN propagates, ``a >= b`` keeps ``a`` (so -0.0 stays)."""
    c = b if isinstance(b, tf.Tensor) else f64(b)
    return tf.where(tf.math.is_nan(a) | (a >= c), a, tf.broadcast_to(c, tf.shape(a)))


def np_min(a: tf.Tensor, b: float | tf.Tensor) -> tf.Tensor:
    c = b if isinstance(b, tf.Tensor) else f64(b)
    return tf.where(tf.math.is_nan(a) | (a <= c), a, tf.broadcast_to(c, tf.shape(a)))


#: Characters ``str.strip()`` removes (``str.isspace``), as an RE2 class.
_PY_SPACE = ("[\\t\\n\\x0b\\x0c\\r\\x1c-\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}"
             "\\x{202f}\\x{205f}\\x{3000}]")


#: The ISO 8601 forms the layer parses (after the converter's ``strip()`` and
#: ``"Z"`` -> ``"+00:00"``); groups: year, month, day, hour, minute, second,
#: offset sign, hours, minutes. Python's ``fromisoformat`` accepts more (week
#: dates, basic formats, any separator, offsets with seconds); those are reported.
_ISO_RE = ("([0-9]{4})-([0-9]{2})-([0-9]{2})(?:[T ]([0-9]{2})(?::([0-9]{2})(?::([0-9]{2})(?:[.,][0-9]+)?)?)?"
           "(?:([+-])([0-9]{2})(?::?([0-9]{2}))?)?)?")


def iso_seconds(text: tf.Tensor, is_str: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(seconds, valid, parsed)`` of ISO 8601 strings in the forms of ``_ISO_RE``,
    as ``convert.derive`` computes them with ``datetime.fromisoformat``: ``parsed``
    rows match a supported form, ``valid`` ones also name a real date and time."""
    text = tf.where(is_str, text, "")
    text = tf.strings.regex_replace(text, f"^{_PY_SPACE}+|{_PY_SPACE}+$", "")
    text = tf.strings.regex_replace(text, "Z", "+00:00")
    parsed = tf.strings.regex_full_match(text, _ISO_RE) & is_str

    def group(i: int) -> tf.Tensor:
        g = tf.strings.regex_replace(tf.where(parsed, text, ""), f"^{_ISO_RE}$", f"\\{i}")
        return g

    def number(i: int) -> tf.Tensor:
        g = group(i)
        return tf.strings.to_number(tf.where(tf.equal(g, ""), "0", g), tf.int64)

    y, m, d, hh, mi, ss, th, tm = (number(i) for i in (1, 2, 3, 4, 5, 6, 8, 9))
    sign = tf.where(tf.equal(group(7), "-"), tf.constant(-1, tf.int64), tf.constant(1, tf.int64))
    leap = tf.equal(tf.math.floormod(y, 4), 0) & (tf.not_equal(tf.math.floormod(y, 100), 0) | tf.equal(tf.math.floormod(y, 400), 0))
    month_days = tf.gather(tf.constant([31, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], tf.int64), tf.clip_by_value(m, 0, 12))
    month_days = month_days + tf.cast(leap & tf.equal(m, 2), tf.int64)
    offset = th * 3600 + tm * 60
    valid = (parsed & (y >= 1) & (m >= 1) & (m <= 12) & (d >= 1) & (d <= month_days) & (hh <= 23) & (mi <= 59)
             & (ss <= 59) & (offset < DAY_SECONDS))
    # Days since the epoch of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    yy = y - tf.cast(m <= 2, tf.int64)
    era = tf.math.floordiv(yy, 400)
    yoe = yy - era * 400
    doy = tf.math.floordiv(153 * (m + tf.where(m > 2, tf.constant(-3, tf.int64), tf.constant(9, tf.int64))) + 2, 5) + d - 1
    doe = yoe * 365 + tf.math.floordiv(yoe, 4) - tf.math.floordiv(yoe, 100) + doy
    days = era * 146_097 + doe - 719_468
    secs = days * DAY_SECONDS + hh * 3600 + mi * 60 + ss - sign * offset
    return tf.where(valid, secs, tf.zeros_like(secs)), valid, parsed


def civil_month(days: tf.Tensor) -> tf.Tensor:
    """``convert.derive._civil_month`` in int64 ops."""
    z = days + 719_468
    era = tf.math.floordiv(z, 146_097)
    doe = z - era * 146_097
    yoe = tf.math.floordiv(doe - tf.math.floordiv(doe, 1460) + tf.math.floordiv(doe, 36_524)
                           - tf.math.floordiv(doe, 146_096), 365)
    doy = doe - (365 * yoe + tf.math.floordiv(yoe, 4) - tf.math.floordiv(yoe, 100))
    mp = tf.math.floordiv(5 * doy + 2, 153)
    return tf.where(mp < 10, mp + 3, mp - 9)


#: A list whose ``lens`` column counts items the feature keeps that its inputs do not carry.
CUT_LIST = "the list has more items than were sent (__len > width)"


class Reasons:
    """Per row ``""`` or the first (in config order) reason its record is rejected.

    ``bad`` holds ``(order, mask, why)``: a ``[batch]`` mask and its reason (a
    string, or a callable building per-row strings), or for checks of several
    features at once a ``[batch, k]`` mask with a list of ``k`` orders and reasons.
    """

    def __init__(self, batch: tf.Tensor, bad: list[tuple[Any, tf.Tensor, Any]]):
        self.batch, self._bad = batch, bad

    def __call__(self) -> tf.Tensor:
        checks = []
        for order, mask, why in self._bad:
            if isinstance(why, list):
                for j, (o, w) in enumerate(zip(order, why, strict=True)):
                    checks.append((o, len(checks), mask[:, j], w))
            else:
                checks.append((order, len(checks), mask, why))
        errors = tf.fill(self.batch, "")
        for _, _, mask, why in sorted(checks, key=lambda c: c[:2], reverse=True):
            errors = tf.where(mask, why() if callable(why) else why, errors)
        return errors


class PackedColumns(Mapping):
    """The per-source view of the wire inputs: a list source's own inputs, and each
    packed column sliced out when a feature reads it (unstacking every column
    would copy all of them, strings included, for the few read one by one)."""

    def __init__(self, wire: Wire, packed: Mapping[str, tf.Tensor]):
        self._packed = packed
        self._own = {n: packed[n] for s in wire.sources for n in s.input_names()}
        self._at = wire.positions()
        self._cut: dict[str, tf.Tensor] = {}
        self._graph = tf.compat.v1.get_default_graph()

    def __getitem__(self, name: str) -> tf.Tensor:
        if name in self._own:
            return self._own[name]
        packed, j = self._at[name]
        if tf.compat.v1.get_default_graph() is not self._graph:  # e.g. in a cond branch: not kept for outside
            return self._packed[packed][:, j]
        if name not in self._cut:
            self._cut[name] = self._packed[packed][:, j]
        return self._cut[name]

    def rows(self, name: str, lo: tf.Tensor, hi: tf.Tensor) -> tf.Tensor:
        """Rows ``lo:hi`` of input ``name``, cut from the packed input (one copy, not two)."""
        if name in self._own or name in self._cut:
            return self[name][lo:hi]
        packed, j = self._at[name]
        return self._packed[packed][lo:hi, j]

    def __iter__(self) -> Any:
        return iter([*self._own, *self._at])

    def __len__(self) -> int:
        return len(self._own) + len(self._at)


def take_columns(t: tf.Tensor, columns: Sequence[int]) -> tf.Tensor:
    """``t``'s ``columns`` (``[batch, len(columns)]``): ``t`` itself or a slice where they
    are all or a run of its columns in order (a gather along axis 1 copies element by element)."""
    first = columns[0]
    if list(columns) != list(range(first, first + len(columns))):
        return tf.gather(t, list(columns), axis=1)
    if first == 0 and t.shape[1] == len(columns):
        return t
    return t[:, first:first + len(columns)]


def any_bad(bad: list[tuple[Any, tf.Tensor, Any]]) -> tf.Tensor:
    """Whether any mask of ``bad`` holds a True: one reduction."""
    rows = [m for _, m, _ in bad if m.shape.rank == 1]
    cols = ([tf.stack(rows, axis=1)] if rows else []) + [m for _, m, _ in bad if m.shape.rank == 2]
    return tf.reduce_any(tf.concat(cols, axis=1)) if cols else tf.constant(False)


def scaled_base(base: tf.Tensor, present: tf.Tensor | None, stats: Mapping[str, Any]) -> tf.Tensor:
    """``convert.derive.scaled_column`` in a graph: float32 ``(base - mean) / std`` in float64
    (``base``: the float64 value its transform counts, e.g. epoch seconds), 0.0 where
    ``present`` is False (``None``: every row counts, as a null list counts 0 items)."""
    x = (base - f64(stats.get("mean") or 0.0)) / f64(stats.get("std") or 1.0)
    if present is not None:
        x = tf.where(present, x, tf.zeros_like(x))
    return tf.cast(x, tf.float32)
