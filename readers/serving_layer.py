"""``TransformLayer``: the converter's transforms as a TensorFlow module, raw
record fields in (the request format of ``readers._serving_wire``), the
model's inputs out, bit for bit what the converter writes; records it cannot
transform are named with their reason. ``readers.serving`` exports it with a
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from convert import spec as _spec
from convert.apply import OutputAnalysis, read_output_analysis
from convert.config import FeatureConfig, count_path
from convert.derive import CROSS_SEPARATOR, DAY_SECONDS, UNITS
from convert.prepare import transform_constants
from readers import _io
from readers._serving_limits import checked_inputs
from readers._serving_wire import (
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NAMES,
    KIND_NESTED,
    KIND_NULL,
    KIND_STRING,
    LENS,
    PACKED,
    Source,
    Wire,
    WireError,
    instances,
)
from readers.errors import SpecError
from readers.info import locate
from readers.serving_ops import (
    CUT_LIST,
    TEXT_PARTS,
    PackedColumns,
    Reasons,
    any_bad,
    bools,
    civil_month,
    column_params,
    f64,
    f64s,
    is_number,
    isin,
    iso_seconds,
    not_number,
    np_max,
    np_min,
    numeric_group,
    oov_default,
    pad_to,
    reason,
    scalar_ids,
    scalar_numeric,
    scale,
    scaled_base,
    shared_table,
    shared_vocabularies,
    slots,
    take_columns,
    text_tokens,
    unknown_kind,
    wrong_kind_reason,
)

_F32_MAX = float(np.finfo(np.float32).max)
_TF_FORM = {"number": tf.float64, "term": tf.string, "raw": tf.string, "int": tf.int64}


_TF_PACKED = {PACKED[form]: dtype for form, dtype in _TF_FORM.items()} | {PACKED["kind"]: tf.int32, LENS: tf.int32}


#: Transforms whose ids come from a hash the converter computes; the layer
#: computes them only for outputs whose format defines that hash in-graph.
_HASHED = ("hash", "cross", "text")


SERVING_MIN_FORMAT_VERSION: int | None = getattr(_spec, "SERVING_MIN_FORMAT_VERSION", None)


def unsupported_reason(info_version: int, f: FeatureConfig) -> str | None:
    """Why feature ``f`` of an output of ``info_version`` cannot be served exactly, or None."""
    oov_hash = f.transform == "vocabulary" and f.num_oov_buckets > 1
    if f.transform in _HASHED or oov_hash:
        if SERVING_MIN_FORMAT_VERSION is None or info_version < SERVING_MIN_FORMAT_VERSION:
            what = "out-of-vocabulary buckets" if oov_hash else f"transform {f.transform!r}"
            return (f"feature {f.name!r}: {what} uses a hash or tokenizer TensorFlow cannot reproduce in "
                    f"this output's format (version {info_version}); re-convert with this recordprep to "
                    f"export a serving model")
    return None


class TransformLayer(tf.Module):
    """The converter's mapping of one output, raw fields -> feature tensors.

    Build it with :func:`transform_layer`. ``layer.input_signature`` is the
    inputs it takes (``{name: tf.TensorSpec}``); ``layer.encode(records)``
    makes them from raw records.
    """

    def __init__(self, applied: OutputAnalysis, name: str = "recordprep_transform"):
        super().__init__(name=name)
        info, config = applied.info, applied.config
        if SERVING_MIN_FORMAT_VERSION is not None and info.format_version < SERVING_MIN_FORMAT_VERSION:
            raise SpecError(
                f"this output has format_version {info.format_version}: its hash and text ids were computed "
                f"in ways TensorFlow cannot reproduce (serving needs {SERVING_MIN_FORMAT_VERSION}); "
                f"re-convert with this recordprep to export a serving model")
        problems = [r for f in config.features if (r := unsupported_reason(info.format_version, f))]
        if problems:
            raise SpecError("; ".join(problems))
        self._applied = applied
        self.config = config
        self.wire = Wire(config)
        self.features = tuple(f for f in info.features if f.role != "label")
        self._stats = {k: transform_constants(v) for k, v in applied.analysis.stats.items()}  # as finish_numbers reads them
        self._tables: dict[str, tf.lookup.StaticHashTable] = {}
        shared = shared_vocabularies(config.features, applied.analysis.vocabularies)
        for f in config.features:
            if f.needs_vocabulary and f.name not in shared:
                terms = applied.analysis.vocabularies[f.name]
                base = 1 + f.num_oov_buckets
                keys = tf.constant([t.encode("utf-8", "surrogatepass") for t in terms] or [b""], tf.string)
                ids = tf.constant(list(range(base, base + len(terms))) or [oov_default(f)], tf.int64)
                self._tables[f.name] = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=oov_default(f),
                    name=f"vocab_{len(self._tables)}")
        self._shared = shared
        self._shared_table = None
        if shared:
            keys, ids = shared_table(config.features, shared, applied.analysis.vocabularies)
            self._shared_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.range(len(keys), dtype=tf.int64)),
                default_value=len(keys), name="vocab_shared")
            self._shared_ids = tf.constant(ids.reshape(-1))
        # Tracked so a SavedModel keeps the tables.
        self._table_list = [*self._tables.values(), *([self._shared_table] if shared else [])]
        self._compiled: Any = None

    # -- the interface
    @property
    def input_signature(self) -> dict[str, tf.TensorSpec]:
        sig = {name: tf.TensorSpec([None, len(cols)], _TF_PACKED[name], name=name)
               for name, cols in self.wire.columns.items()}
        for s in self.wire.sources:
            if s.is_list:
                for form in s.forms:
                    sig[s.input_name(form)] = tf.TensorSpec([None, None], _TF_FORM[form], name=s.input_name(form))
                sig[s.kind_name] = tf.TensorSpec([None, None], tf.int32, name=s.kind_name)
        return sig

    def encode(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        """The layer's inputs for ``records`` (dicts as JSON/Avro decode them), as numpy arrays.

        Raises ValueError naming the record for the few values the wire format
        cannot carry (see ``readers._serving_wire.Wire.encode``).
        """
        inputs, rejected = self.wire.encode(records)
        if rejected:
            i, why = min(rejected.items())
            raise ValueError(f"record {i}: {why}")
        return inputs

    def instances(self, records: Sequence[Any]) -> list[dict[str, Any]]:
        """``records`` as TF Serving REST ``instances`` (JSON-ready) for an exported model."""
        return instances(self.encode(records))

    def transform(self, inputs: Mapping[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """``(features, errors)``: the feature tensors, and per row ``""`` or why
        the converter would reject the record (its features are then unspecified).

        Raises ``InvalidArgumentError`` naming the input for a request of the wrong
        shape (``readers._serving_limits.checked_inputs``): no record of it is read."""
        features, any_bad, reasons = self._features(inputs)
        # The reasons (string work) are built only for a batch with a rejected row.
        return features, tf.cond(any_bad, reasons, lambda: tf.fill(reasons.batch, ""))

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        """The feature tensors; raises ``InvalidArgumentError`` if any record would be rejected."""
        features, any_bad, reasons = self._features(inputs)

        def fail() -> tf.Tensor:
            errors = reasons()
            first = tf.boolean_mask(errors, tf.not_equal(errors, ""))[:1]
            with tf.control_dependencies([tf.debugging.Assert(False, [
                    "the converter would reject a record: ", first,
                    " (use TransformLayer.transform for per-row errors)"])]):
                return tf.constant(False)

        ok = tf.cond(any_bad, fail, lambda: tf.constant(True))
        if tf.executing_eagerly() or tf.inside_function():
            return features  # the Assert is stateful: a function call runs it before it returns
        with tf.control_dependencies([ok]):
            return {k: tf.identity(v) for k, v in features.items()}

    def _features(self, inputs: Mapping[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor, Reasons]:
        """The features, whether any row is rejected (one reduction over every
        check), and the per-row reasons to build when one is."""
        packed = {k: tf.convert_to_tensor(inputs[k], dtype=spec.dtype) for k, spec in self.input_signature.items()}
        packed = checked_inputs(self.wire, packed)  # a malformed request fails here, naming the input
        batch = tf.shape(next(iter(packed.values())), out_type=tf.int64)[:1]
        inputs = PackedColumns(self.wire, packed)
        out: dict[str, tf.Tensor] = {}
        tagged = self._invalid_kinds(packed, inputs)
        together = [(i, f) for i, f in enumerate(self.config.features) if scalar_numeric(f)]
        if together:
            out.update(self._scalar_numerics(together, packed, tagged))
        together = [(i, f) for i, f in enumerate(self.config.features) if scalar_ids(f)]
        if together:
            out.update(self._scalar_ids(together, packed, inputs, tagged))
        for i, f in enumerate(self.config.features):
            bad: list[tuple[tf.Tensor, Any]] = []
            self._feature(f, inputs, out, bad)
            tagged += [(i, m, why) for m, why in bad]
        features = {f.name: out[f.name] for f in self.features}
        return features, any_bad(tagged), Reasons(batch, tagged)

    def _invalid_kinds(self, packed: Mapping[str, tf.Tensor], inputs: Mapping[str, tf.Tensor]) -> list:
        """Rows whose kind codes are none of ``KIND_NAMES`` (a request not written by
        ``encode``): rejected first (order -1), naming the source and the code."""
        tagged: list[tuple[Any, tf.Tensor, Any]] = []
        if PACKED["kind"] in packed:
            kinds, sources = packed[PACKED["kind"]], self.wire.columns[PACKED["kind"]]
            tagged.append(([-1] * len(sources), unknown_kind(kinds),
                           [wrong_kind_reason(s.path, kinds, "found ", column=j) for j, s in enumerate(sources)]))
        for s in self.wire.sources:
            if s.is_list:
                kinds = inputs[s.kind_name]
                sent = tf.range(tf.shape(kinds)[1])[None, :] < inputs[s.len_name][:, None]
                tagged.append((-1, tf.reduce_any(sent & unknown_kind(kinds), axis=1), reason(
                    s.path, f"a list item has an invalid kind code on the wire (expected 0..{len(KIND_NAMES) - 1}: "
                            f"{', '.join(KIND_NAMES)}); send it as encode writes it")))
        return tagged

    def _feature(self, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], out: dict[str, tf.Tensor], bad: list) -> None:
        """Feature ``f``'s columns into ``out`` (single-valued numerics, vocabularies and hashes
        are computed together, elsewhere)."""
        if scalar_numeric(f) or scalar_ids(f):
            return
        if f.transform == "cross":
            out.update(self._cross(f, inputs, bad))
            return
        if f.transform == "count":  # the list's length; null or absent: 0
            lens = tf.cast(inputs[self.wire.by_path(count_path(f.source)).len_name], tf.int64)
            out[f.name] = scaled_base(f.transform, lens, None, self._stats.get(f.name) or {})[:, None]
            return
        s = self.wire.by_path(f.source)
        if f.is_numeric:
            out.update(self._numeric(f, s, inputs, bad))
        elif f.transform == "bytes":
            out.update(self._bytes(f, s, inputs, bad))
        elif f.transform == "timestamp":
            out.update(self._timestamp(f, s, inputs, bad))
        elif f.transform == "text":
            out.update(self._text(f, s, inputs, bad))
        else:
            out.update(self._vocabulary(f, s, inputs, bad))

    def transform_records(self, records: Sequence[Any]) -> tuple[dict[str, np.ndarray], list[str]]:
        """Features (numpy) and per-record errors (``""`` = converted) for raw records:
        batch scoring without building inputs by hand. Records the wire format
        cannot carry are reported like rejected ones."""
        inputs, rejected = self.wire.encode(records)
        if self._compiled is None:
            self._compiled = tf.function(self.transform, input_signature=[self.input_signature])
        features, errors = self._compiled(inputs)
        errs = [e.decode("utf-8", "replace") for e in errors.numpy().tolist()]
        for i, why in rejected.items():
            errs[i] = why
        return {k: v.numpy() for k, v in features.items()}, errs

    # -- pieces
    def _kind(self, s: Source, inputs: Mapping[str, tf.Tensor]) -> tf.Tensor:
        return inputs[s.kind_name]

    def _numeric(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor],
                 bad: list) -> dict[str, tf.Tensor]:
        kind = self._kind(s, inputs)
        x = inputs[s.input_name("number")]
        n = f.max_len or 1
        if f.multi_valued:
            lens_in = tf.cast(inputs[s.len_name], tf.int64)
            missing_row = lens_in < 0
            x, kind = pad_to(x, n), pad_to(kind, n)  # kind padded with nulls
            lens = tf.clip_by_value(lens_in, 0, n)
            in_list = tf.range(n, dtype=tf.int64)[None, :] < lens[:, None]
            width_ok = tf.minimum(lens, tf.cast(tf.shape(inputs[s.kind_name])[1], tf.int64)) >= lens
            bad.append((~width_ok, reason(s.path, CUT_LIST)))
            bad.append((tf.reduce_any(in_list & not_number(kind), axis=1), reason(s.path, "a list item is not a number")))
            present = in_list & is_number(kind)
        else:
            missing_row = tf.equal(kind, KIND_NULL)
            bad.append((not_number(kind), wrong_kind_reason(s.path, kind, "expected a number, found ")))
            present = is_number(kind)
            x, present = x[:, None], present[:, None]
            lens = None
        if f.on_nan in ("error", "fill"):
            finite = (tf.abs(x) <= _F32_MAX) | ~present
        if f.on_nan == "error":
            bad.append((~tf.reduce_all(finite, axis=1), reason(
                s.path, f"value is NaN or infinite (or beyond float32's range, |x| > 3.4e38); set on_nan: fill "
                        f"or keep for feature {f.name!r} to accept it")))
        elif f.on_nan == "fill":
            present = present & finite
        if f.transform == "log1p":
            neg = (x <= -1.0) & present
            bad.append((tf.reduce_any(neg, axis=1), reason(s.path, "log1p needs values > -1; use 'clip' first or another transform")))
        stats = self._stats.get(f.name) or {}
        cols: dict[str, tf.Tensor] = {}
        if f.transform == "bucketize":
            bounds = [float(b) for b in stats.get("boundaries") or []]
            if bounds:
                pos = tf.searchsorted(tf.constant(bounds, tf.float64), tf.reshape(x, [-1]), side="right", out_type=tf.int64)
                ids = tf.reshape(pos, [-1, 1]) + 1
            else:
                ids = tf.ones_like(x, dtype=tf.int64)
            cols[f.name] = tf.where(present, ids, tf.zeros_like(ids))
        else:
            fill = stats.get("mean") if f.fill == "mean" else f.fill
            fill = 0.0 if fill is None else float(fill)
            if f.multi_valued:  # a null item in the list takes the fill, a slot past it 0.0
                # Operands of x's shape: a select that broadcasts scalars costs several times more.
                pad = tf.zeros_like(x)
                if fill != 0.0 or np.signbit(fill):
                    pad = tf.where(in_list, tf.broadcast_to(f64(fill), tf.shape(x)), pad)
                out = tf.where(present, x, pad)
            else:
                out = tf.where(present, x, tf.broadcast_to(f64(fill), tf.shape(x)))
            y = scale(f, out, present, stats)
            if f.multi_valued and f.transform != "identity":  # identity: out is 0.0 past the list already
                y = tf.where(in_list, y, tf.zeros_like(y))
            cols[f.name] = tf.cast(y, tf.float32)
        if f.multi_valued:
            cols[f"{f.name}_len"] = lens[:, None]
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = tf.cast(missing_row, tf.int64)[:, None]
        return cols

    def _scalar_numerics(self, together: list[tuple[int, FeatureConfig]], packed: Mapping[str, tf.Tensor],
                         tagged: list) -> dict[str, tf.Tensor]:
        """The single-valued numeric features but ``bucketize``, as ``[batch, k]`` ops over
        the packed columns (one op per step, not per feature: a call's cost grows with
        its graph's nodes). Per element the same float64 operations as ``_numeric``
        and ``scale`` (the selected branch's), so the same bits."""
        orders = [i for i, _ in together]
        fs = [f for _, f in together]
        cols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["number"]])}
        kcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["kind"]])}
        x = take_columns(packed[PACKED["number"]], [cols[f.source] for f in fs])
        kind = take_columns(packed[PACKED["kind"]], [kcols[f.source] for f in fs])

        # Per column: flags, constants and reasons, as plain Python lists.
        p = column_params(fs, [self._stats.get(f.name) or {} for f in fs])
        missing_row = tf.equal(kind, KIND_NULL)
        tagged.append((orders, not_number(kind),
                       [wrong_kind_reason(f.source, kind, "expected a number, found ", column=j) for j, f in enumerate(fs)]))
        present = is_number(kind)
        if any(p["nan_error"]) or any(p["nan_fill"]):
            finite = (tf.abs(x) <= _F32_MAX) | ~present
        if any(p["nan_error"]):
            tagged.append((orders, ~finite & bools(p["nan_error"]), p["nan_reason"]))
        if any(p["nan_fill"]):
            present = present & (finite | ~bools(p["nan_fill"]))
        out = tf.where(present, x, f64s(p["fill"]))
        result: dict[str, tf.Tensor] = {}

        def emit(js: list[int], y: tf.Tensor, dtype: tf.DType = tf.float32, suffix: str = "") -> None:
            for j, col in zip(js, tf.split(tf.cast(y, dtype), len(js), axis=1), strict=True):
                result[fs[j].name + suffix] = col

        def pick(key: str) -> list[Any]:
            return [v for v, g in zip(p[key], groups, strict=True) if g == group]

        # Each transform on its own columns: zscore and minmax (x - a) / b; a degenerate minmax
        # zeros; log1p; clip; identity x.
        groups = [numeric_group(p, j) for j in range(len(fs))]
        for group in dict.fromkeys(groups):
            js = [j for j, g in enumerate(groups) if g == group]
            o = take_columns(out, js)
            if group == "linear":
                emit(js, (o - f64s(pick("a"))) / f64s(pick("b")))
            elif group == "zero":
                emit(js, tf.zeros_like(o))
            elif group == "log1p":
                neg = (o <= -1.0) & take_columns(present, js)  # where present, out is x
                tagged.append(([orders[j] for j in js], neg, pick("log1p_reason")))
                emit(js, tf.math.log1p(tf.where(neg, tf.zeros_like(o), o)))
            elif group == "clip":
                emit(js, np_min(np_max(o, f64s(pick("clip_min"))), f64s(pick("clip_max"))))
            else:
                emit(js, o)
        indicated = [j for j, f in enumerate(fs) if f.missing_indicator]
        if indicated:
            emit(indicated, take_columns(missing_row, indicated), tf.int64, "_missing")
        return result

    def _scalar_ids(self, together: list[tuple[int, FeatureConfig]], packed: Mapping[str, tf.Tensor],
                    inputs: Mapping[str, tf.Tensor], tagged: list) -> dict[str, tf.Tensor]:
        """The single-valued ``vocabulary`` and ``hash`` features: an id per feature, then the
        null and nested checks as ``[batch, k]`` ops (``_vocabulary``'s, once for all).
        The vocabularies of ``self._shared`` are looked up together, by one op."""
        together = ([(i, f) for i, f in together if f.name in self._shared]
                    + [(i, f) for i, f in together if f.name not in self._shared])
        orders = [i for i, _ in together]
        fs = [f for _, f in together]
        kcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["kind"]])}
        kind = take_columns(packed[PACKED["kind"]], [kcols[f.source] for f in fs])
        parts = []
        k = len(self._shared)
        if k:
            tcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["term"]])}
            # The whole packed input is looked up (the other columns' rows unused): slicing
            # the strings out first would copy them.
            rows = take_columns(self._shared_table.lookup(packed[PACKED["term"]]), [tcols[f.source] for f in fs[:k]])
            parts.append(tf.gather(self._shared_ids, rows * k + tf.range(k, dtype=tf.int64)))
        if fs[k:]:
            parts.append(tf.stack([self._ids(f, inputs[self.wire.by_path(f.source).input_name("term")])
                                   for f in fs[k:]], axis=1))
        ids = parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)
        nested = tf.equal(kind, KIND_NESTED)
        tagged.append((orders, nested, [reason(f.source, "expected a scalar value, found a record or list; set max_len "
                                                          "for lists or point 'source' at a leaf field") for f in fs]))
        ids = tf.where(tf.equal(kind, KIND_NULL) | nested, tf.zeros_like(ids), ids)
        return {f.name: col for f, col in zip(fs, tf.split(ids, len(fs), axis=1), strict=True)}

    def _bytes(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: list) -> dict[str, tf.Tensor]:
        kind = self._kind(s, inputs)
        ok = isin(kind, (KIND_STRING, KIND_BYTES))
        bad.append((~ok & tf.not_equal(kind, KIND_NULL), wrong_kind_reason(s.path, kind, "expected bytes or a string, found ")))
        v = tf.where(ok, inputs[s.input_name("raw")], "")
        return {f.name: v[:, None]}

    def _timestamp(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: list) -> dict[str, tf.Tensor]:
        kind = self._kind(s, inputs)
        unit = f.unit or "ms"
        why = f"; give an epoch count in {unit!r} or an ISO 8601 string"
        is_int, is_float, is_str = tf.equal(kind, KIND_INT), tf.equal(kind, KIND_FLOAT), tf.equal(kind, KIND_STRING)
        wrong = ~(is_int | is_float | is_str) & tf.not_equal(kind, KIND_NULL)
        bad.append((wrong, wrong_kind_reason(s.path, kind, "not a timestamp (expected an epoch number or an ISO 8601 string, found ", ")" + why)))
        v = inputs[s.input_name("int")]
        if unit == "days":
            lo, hi = -((2**63) // DAY_SECONDS), (2**63 - 1) // DAY_SECONDS
            int_ok = (v >= lo) & (v <= hi)
            secs_i = tf.where(int_ok, v, 0) * DAY_SECONDS
        else:
            int_ok = tf.ones_like(is_int)
            secs_i = tf.math.floordiv(v, UNITS[unit])
        bad.append((is_int & ~int_ok, reason(s.path, f"not a timestamp (beyond int64 seconds){why}")))
        x = inputs[s.input_name("number")]
        finite = tf.math.is_finite(x)
        y = tf.floor(x * DAY_SECONDS) if unit == "days" else tf.floor(x / UNITS[unit])
        float_ok = finite & (y >= -(2.0**63)) & (y < 2.0**63)
        bad.append((is_float & ~float_ok, reason(s.path, f"not a timestamp (NaN, infinite or beyond int64 seconds){why}")))
        secs_f = tf.cast(tf.where(float_ok, y, tf.zeros_like(y)), tf.int64)
        # ISO strings are parsed only when the batch holds one (regex work per row).
        text = inputs[s.input_name("term")]
        iso_secs, iso_ok, iso_known = tf.cond(
            tf.reduce_any(is_str), lambda: iso_seconds(text, is_str),
            lambda: (tf.zeros_like(v), tf.zeros_like(is_str), tf.zeros_like(is_str)))
        bad.append((is_str & ~iso_known, reason(
            s.path, "this ISO 8601 form is not supported by the serving layer (it takes YYYY-MM-DD, optionally "
                    "followed by T or a space, hh[:mm[:ss[.f]]] and Z or +-hh[:mm]); send epoch numbers")))
        bad.append((is_str & iso_known & ~iso_ok, reason(s.path, f"not a timestamp (an invalid date or time){why}")))
        present = (is_int & int_ok) | (is_float & float_ok) | (is_str & iso_ok)
        secs = tf.where(is_int & int_ok, secs_i, tf.where(is_float & float_ok, secs_f, tf.zeros_like(secs_i)))
        secs = tf.where(is_str & iso_ok, iso_secs, secs)
        cols: dict[str, tf.Tensor] = {f.name: scaled_base(f.transform, secs, present, self._stats.get(f.name) or {})[:, None]}
        days = tf.math.floordiv(secs, DAY_SECONDS)
        for part in f.parts or ():
            if part == "hour":
                col = tf.math.floordiv(tf.math.floormod(secs, DAY_SECONDS), 3600)
            elif part == "day_of_week":
                col = tf.math.floormod(days + 3, 7)
            else:
                col = civil_month(days)
            cols[f"{f.name}_{part}"] = tf.where(present, col, tf.zeros_like(col))[:, None]
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = tf.cast(~present, tf.int64)[:, None]
        return cols

    def _ids(self, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        """Ids of terms (UTF-8 bytes): ``hash`` buckets, or vocabulary ids with OOV buckets."""
        if f.transform == "hash":
            return tf.strings.to_hash_bucket_fast(terms, f.buckets) + 1
        ids = self._tables[f.name].lookup(terms)
        if f.num_oov_buckets <= 1:
            return ids  # the table's default is the OOV id, 1
        oov = tf.strings.to_hash_bucket_fast(terms, f.num_oov_buckets) + 1
        return tf.where(tf.equal(ids, 0), oov, ids)

    def _cross(self, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: list) -> dict[str, tf.Tensor]:
        missing = None
        terms = []
        for path in f.sources or ():
            s = self.wire.by_path(path)
            kind = self._kind(s, inputs)
            nested = tf.equal(kind, KIND_NESTED)
            bad.append((nested, reason(path, "cross needs single values, found a record or list; cross scalar fields only")))
            m = tf.equal(kind, KIND_NULL) | nested
            missing = m if missing is None else missing | m
            terms.append(inputs[s.input_name("term")])
        ids = tf.strings.to_hash_bucket_fast(tf.strings.join(terms, separator=CROSS_SEPARATOR), f.buckets) + 1
        return {f.name: tf.where(missing, tf.zeros_like(ids), ids)[:, None]}

    def _text(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: list) -> dict[str, tf.Tensor]:
        kind = self._kind(s, inputs)
        is_str = tf.equal(kind, KIND_STRING)
        bad.append((~is_str & tf.not_equal(kind, KIND_NULL), wrong_kind_reason(s.path, kind, "expected text (a string), found ")))
        # Other kinds' rows are zeroed at the end (int ops), not emptied first (a string copy).
        name = s.input_name("term")
        batch = tf.shape(kind, out_type=tf.int64)[0]
        cuts = [batch * i // TEXT_PARTS for i in range(TEXT_PARTS + 1)]
        dense = tf.concat([self._text_ids(f, inputs.rows(name, cuts[i], cuts[i + 1])) for i in range(TEXT_PARTS)], axis=0)
        lens = tf.math.count_nonzero(dense, axis=1)  # a token's id is never 0 (padding)
        return {f.name: tf.where(is_str[:, None], dense, tf.zeros_like(dense)),
                f"{f.name}_len": tf.where(is_str, lens, tf.zeros_like(lens))[:, None]}

    def _text_ids(self, f: FeatureConfig, text: tf.Tensor) -> tf.Tensor:
        """``[len(text), max_len]``: each string's token ids, zero-padded."""
        if f.lowercase:
            text = tf.strings.lower(text)  # ASCII only, like convert.records.ascii_lower
        tokens = text_tokens(text)
        # Every token is looked up, then summed into its row's slot (its position; past the
        # first n, segment -1, which the sum drops): cheaper than a ragged tensor's row
        # splits and to_tensor.
        rows, cols = tf.unstack(tokens.indices, num=2, axis=1)
        return slots(self._ids(f, tokens.values), rows, cols, f.max_len, tokens.dense_shape[0])

    def _vocabulary(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: list) -> dict[str, tf.Tensor]:
        kind = self._kind(s, inputs)
        terms = inputs[s.input_name("term")]
        if not f.multi_valued:
            ids = self._ids(f, terms)
            nested = tf.equal(kind, KIND_NESTED)
            bad.append((nested, reason(s.path, "expected a scalar value, found a record or list; set max_len for "
                                                "lists or point 'source' at a leaf field")))
            ids = tf.where(tf.equal(kind, KIND_NULL) | nested, tf.zeros_like(ids), ids)
            return {f.name: ids[:, None]}
        n = f.max_len
        lens_in = tf.cast(inputs[s.len_name], tf.int64)
        width = tf.shape(kind, out_type=tf.int64)[1]
        batch = tf.shape(kind, out_type=tf.int64)[0]
        sent = tf.range(width)[None, :] < lens_in[:, None]
        non_null = sent & tf.not_equal(kind, KIND_NULL)
        # The non-null items in row-major order and each one's rank in its row: its place in
        # that order less its row's start (a scan over the rows' counts, cheaper than one
        # along every list).
        at = tf.where(non_null)
        rows = at[:, 0]
        starts = tf.cumsum(tf.reduce_sum(tf.cast(non_null, tf.int64), axis=1), exclusive=True)
        rank = tf.range(tf.shape(at, out_type=tf.int64)[0]) - tf.gather(starts, rows)
        # A list sent cut short (``encode`` stops at its n-th non-null item) lacks items the
        # feature keeps when fewer than n non-null ones arrived: reported, as for numeric lists.
        cut = (lens_in > width) & (tf.reduce_sum(tf.cast(non_null, tf.int64), axis=1) < n)
        bad.append((cut, reason(s.path, CUT_LIST)))
        nested = tf.equal(tf.gather_nd(kind, at), KIND_NESTED) & (rank < n)
        bad.append((tf.math.unsorted_segment_max(tf.cast(nested, tf.int32), rows, batch) > 0, reason(
            s.path, "expected a list of scalar values, found nested records/lists; point 'source' at a leaf field")))
        # Looked up and summed into their row's slot, as _text does: no ragged tensor to build and pad.
        dense = slots(self._ids(f, tf.gather_nd(terms, at)), rows, rank, n, batch)
        # An item's id is never 0 (num_oov_buckets >= 1), so the non-zero slots are the kept items.
        return {f.name: dense, f"{f.name}_len": tf.math.count_nonzero(dense, axis=1)[:, None]}


def transform_layer(output: str) -> TransformLayer:
    """The serving transform of a finished output (local, ``gs://``, ``hdfs://`` path).

    Reads ``dataset_info.json`` and the analysis once; the layer holds
    everything it needs. Raises SpecError for an output it cannot serve
    exactly (the message says which feature and what to do).
    """
    location = locate(output)
    applied = read_output_analysis(_io.read_bytes, location.root, location.metadata_path, _io.join)
    try:
        return TransformLayer(applied)
    except (WireError, SpecError) as e:
        raise SpecError(f"{location.root}: {e}") from None
