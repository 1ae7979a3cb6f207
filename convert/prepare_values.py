"""One field's values made into what the vectorizer takes, value by value where
the columns cannot give them: term indexes and token codes, numbers with
their NaN and domain rules, and the Rejection of a record whose value
cannot be used. convert.prepare.Preparer calls these per feature.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from convert.columns import (
    AnalysisPart,
    ListArray,
    NumericArray,
    PresentRows,
    RawValues,
    ScalarArray,
    TermCodes,
    ValidNumbers,
)
from convert.config import FeatureConfig, LabelConfig, one_value_path, parse_path, render_path
from convert.derive import epoch_seconds, timestamp_parts
from convert.records import (
    F32_MAX,
    TOKEN_RE,
    as_list,
    ascii_lower,
    term,
    to_float,
)
from convert.spec import short_repr

try:
    from convert._tokens import TokenTable as _TokenTable
except ImportError:  # no C compiler at install, or a worker of another platform (pipelines/staging.py)
    _TokenTable = None


#: ``TOKEN_RE``'s tokens or a NUL (the row separator of a text column tokenized at once).
_TOKEN_OR_NUL_RE = re.compile(TOKEN_RE.pattern + "|\x00")


#: The delimiters but NUL (the row separator, kept) -> space.
_ASCII_NON_WORD_TO_SPACE = str.maketrans({c: " " for c in range(1, 128) if not (chr(c).isalnum() or chr(c) == "_")})


_BOOL_TERMS = {True: "true", False: "false"}  # term() of booleans; None stays None (missing)


@dataclasses.dataclass
class Rejection:
    """A record the vectorizer could not convert."""

    index: int  # position in the batch
    field: str
    reason: str


NONE_TYPE = type(None)


_NUMBER_TYPES = frozenset({int, float, NONE_TYPE})


def gather(flat: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, n)`` matrix of each row's first ``n`` items of ``flat`` (rows own
    ``counts[i]`` consecutive items), ``-1`` where a row has fewer; and the kept lengths."""
    lens = np.minimum(counts, n)
    if flat.size == 0:
        return np.full((counts.size, n), -1, dtype=flat.dtype), lens
    starts = np.cumsum(counts) - counts
    mask = np.arange(n)[None, :] < lens[:, None]
    src = np.where(mask, starts[:, None] + np.arange(n)[None, :], 0)
    return np.where(mask, flat[src], -1).astype(flat.dtype, copy=False), lens


class TermIndex(dict):
    """Term -> index, a new term getting ``len(index) - 1`` when first looked up
    (``__missing__``), so that known terms cost one C-level lookup and no Python step."""

    __slots__ = ("_tokens",)

    def __missing__(self, term: Any) -> int:
        i = self[term] = len(self) - 1
        return i

    def tokens(self) -> Any:
        """This index's ``convert._tokens.TokenTable`` (made on first use), which
        must only ever be used with this index."""
        try:
            return self._tokens
        except AttributeError:
            self._tokens = _TokenTable()
            return self._tokens


def _index_all(index: TermIndex, items: list[Any]) -> np.ndarray:
    """``index[item]`` for every item (int32), new items getting ``len(index) - 1``
    in order of first occurrence (``index`` starts with a sentinel at -1).

    One ``np.fromiter`` over a C-level ``map`` of ``index.__getitem__``: no
    Python step but for new items, and no list of codes in between.
    """
    return np.fromiter(map(index.__getitem__, items), dtype=np.int32, count=len(items))


def terms_of(values: list[Any]) -> list[str]:
    """``term`` of distinct values that are all strings or all integers."""
    return values if not values or isinstance(values[0], str) else [str(v) for v in values]


def index_codes(index: dict[Any, int], tc: TermCodes) -> np.ndarray:
    """``_index_all`` of the values ``tc`` codes, null (code -1) as ``None``."""
    found = _index_all(index, terms_of(tc.values))
    return np.append(found, np.int32(index.setdefault(None, len(index) - 1)))[tc.codes]


def token_codes(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
                 index: TermIndex) -> tuple[np.ndarray, np.ndarray]:
    """A text feature's token indexes, flat, and the tokens per row.

    Columns of strings and nulls go to ``convert._tokens`` when it is built; the
    Python paths below define the same output (tests/test_convert_tokens.py)."""
    b = len(values)
    lower = f.lowercase
    if _TokenTable is not None and type(values) is list:
        found = index.tokens().codes(index, values, lower)
        if found is not None:
            return np.frombuffer(found[0], dtype=np.int32), np.frombuffer(found[1], dtype=np.int64)
    joined = " \x00 ".join([v or "" for v in values]) if set(map(type, values)) <= {str, NONE_TYPE} else None
    if joined is not None and joined.count("\x00") == b - 1:
        # The whole column at once (no row holds a NUL): one lowercasing,
        # one tokenizing pass, a NUL token between rows (both delimiters
        # and uncased, so each row's tokens are those of the row alone).
        text = ascii_lower(joined) if lower else joined
        if text.isascii():
            # On ASCII, tokens are runs of [A-Za-z0-9_]: a translate and a
            # split give the regex's tokens, several times faster (docs/benchmarks.md).
            tokens = text.translate(_ASCII_NON_WORD_TO_SPACE).split()
        else:
            tokens = _TOKEN_OR_NUL_RE.findall(text)
        fcodes = _index_all(index, tokens)
        word = fcodes >= 0
        # Tokens per row: the gaps between the NUL tokens' positions.
        counts_a = np.diff(np.flatnonzero(~word), prepend=-1, append=fcodes.size) - 1
        return fcodes[word], counts_a
    findall = TOKEN_RE.findall
    flat: list[str] = []
    counts = [0] * b
    for i, v in enumerate(values):
        if v is None:
            continue
        if not isinstance(v, str):
            bad.setdefault(i, Rejection(i, f.source, f"expected text (a string), found {type(v).__name__} {short_value(v)}"))
            continue
        toks = findall(ascii_lower(v) if lower else v)
        counts[i] = len(toks)
        flat += toks
    return _index_all(index, flat), np.array(counts, dtype=np.int64)


def flat_list_codes(values: list[Any], index: TermIndex) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A list feature's item indexes, flat, and the items per row, when every
    value is a list of strings or null; else ``(None, None)`` (``per_value_list_codes``)."""
    if not set(map(type, values)) <= {list, NONE_TYPE}:
        return None, None
    flat = [x for v in values if v for x in v]
    if not set(map(type, flat)) <= {str}:
        return None, None
    counts_a = np.array([len(v) if v else 0 for v in values], dtype=np.int64)
    return _index_all(index, flat), counts_a


def per_value_list_codes(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
                          index: TermIndex, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A list feature's ``(codes, lens)`` value by value: the vectorizer keeps the
    first max_len non-null items and rejects nested ones among them; the
    analysis counts every item of a value without nested ones."""
    b = len(values)
    codes = np.full((b, n), -1, dtype=np.int32)
    lens = np.zeros(b, dtype=np.int64)
    for i, v in enumerate(values):
        items = leaf_items(f, i, v, n, bad)
        if items is not None:
            lens[i] = len(items)
            codes[i, : len(items)] = [index.setdefault(term(x), len(index) - 1) for x in items]
    return codes, lens


def scalar_codes(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection], index: TermIndex,
                  tc: TermCodes | None) -> np.ndarray:
    """A scalar feature's term index per row (``-1``: null or rejected)."""
    if tc is not None:
        return index_codes(index, tc)
    if (types := set(map(type, values))) <= {str, NONE_TYPE}:
        return _index_all(index, values)
    if types <= {bool, NONE_TYPE}:  # term() of each, by a C-level map
        return _index_all(index, list(map(_BOOL_TERMS.get, values)))
    fcodes = np.full(len(values), -1, dtype=np.int32)
    for i, t in scalar_terms(f, values, bad):
        fcodes[i] = index.setdefault(t, len(index) - 1)
    return fcodes


def _empty_numbers(b: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(out, present, lens, missing_row)`` for ``b`` rows of ``n`` values: zeros,
    every value present, no row missing."""
    return (np.zeros((b, n), dtype=np.float64), np.ones((b, n), dtype=bool), np.zeros(b, dtype=np.int64),
            np.zeros(b, dtype=bool))


def scalar_numbers(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
                    arr: NumericArray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A scalar numeric feature's ``(out, present, lens, missing_row)`` (as ``Numbers``) and
    its float64 column when a fast path took the values whole (else None)."""
    n = f.max_len or 1
    out, present, lens, missing_row = _empty_numbers(len(values), n)
    fast = False
    # Fast path: numbers and nulls only (None becomes NaN in np.array).
    if isinstance(arr, ScalarArray):
        col, fast = arr.values, True
        if arr.null.any():
            missing_row = arr.null.copy()
        out[:, 0] = col
    elif (types := set(map(type, values))) <= _NUMBER_TYPES:
        try:
            col = np.array(values, dtype=np.float64)
            fast = col.ndim == 1
        except (TypeError, ValueError, OverflowError):
            pass
        if fast:
            if NONE_TYPE in types:
                missing_row = np.array([v is None for v in values], dtype=bool)
            out[:, 0] = col
    if not fast:
        for i, v in enumerate(values):
            if v is None:
                missing_row[i] = True
                out[i, 0] = np.nan
            elif isinstance(v, bool):
                out[i, 0] = float(v)
            elif isinstance(v, int | float):
                out[i, 0] = to_float(v)
            else:
                bad.setdefault(i, Rejection(i, f.source, f"expected a number, found {type(v).__name__} {short_value(v)}; use a categorical transform (vocabulary/hash) for this field or fix the data"))
                out[i, 0] = 0.0
    present[:, 0] = ~missing_row
    lens[:] = 1
    return out, present, lens, missing_row, (col if fast else None)


def list_numbers(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
                  arr: NumericArray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A list numeric feature's ``(out, present, lens, missing_row)`` (as ``Numbers``):
    each row's first ``max_len`` items."""
    n = f.max_len or 1
    out, present, lens, missing_row = _empty_numbers(len(values), n)
    fast = False
    # Fast path: lists of numbers (no null items) and nulls.
    if isinstance(arr, ListArray):
        flat_a, counts, missing_row = arr.items, arr.counts, arr.null.copy()
        fast = True
    elif set(map(type, values)) <= {list, NONE_TYPE}:
        flat = [x for v in values if v for x in v]
        if set(map(type, flat)) <= {int, float}:
            try:
                flat_a = np.array(flat, dtype=np.float64)
                fast = True
            except OverflowError:
                pass
        if fast:
            counts = np.array([len(v) if v else 0 for v in values], dtype=np.int64)
            missing_row = np.array([v is None for v in values], dtype=bool)
    if fast:
        pos, lens = gather(np.arange(flat_a.size), counts, n)
        present = pos >= 0
        if flat_a.size:
            out = np.where(present, flat_a[np.maximum(pos, 0)], 0.0)
    else:
        for i, v in enumerate(values):
            if v is None:
                missing_row[i] = True
                continue
            items = v if isinstance(v, list | tuple) else [v]
            lens[i] = min(len(items), n)
            for j, x in enumerate(items[:n]):
                if x is None:
                    present[i, j] = False
                elif isinstance(x, int | float):
                    out[i, j] = to_float(x)
                else:
                    bad.setdefault(i, Rejection(i, f"{f.source}[{j}]", f"expected a number, found {type(x).__name__} {short_value(x)}"))
        present &= np.arange(n)[None, :] < lens[:, None]
    return out, present, lens, missing_row


def numbers_for_analysis(f: FeatureConfig, values: list[Any], col: np.ndarray | None, present: np.ndarray,
                          missing_row: np.ndarray) -> AnalysisPart:
    """What ``Analyzer.add_prepared`` takes of a numeric feature: its valid numbers
    (from ``col``, a scalar feature's fast column) or its values for statistics,
    else which rows have a value."""
    if f.needs_stats:
        if col is not None:
            with np.errstate(invalid="ignore"):
                ok = np.abs(col) <= F32_MAX  # the Analyzer's rule; NaN (and null) fail it
            return ValidNumbers(col[ok], np.flatnonzero(ok), missing_row)
        return RawValues(values)
    return PresentRows(present.any(axis=1))  # a row with a value (not null, not all null items)


def apply_on_nan(f: FeatureConfig, out: np.ndarray, present: np.ndarray, bad: dict[int, Rejection]) -> None:
    """``on_nan`` on the values not finite as float32: reject their rows
    (``error``) or mark them absent in ``present``, in place (``fill``)."""
    # "Finite" means finite as float32 (the output dtype): NaN, +-inf and
    # |x| > 3.4e38 (which the cast would turn into inf) follow ``on_nan``.
    with np.errstate(invalid="ignore"):
        finite = (np.abs(out) <= F32_MAX) | ~present
    if not finite.all():
        rows = np.nonzero(~finite.all(axis=1))[0]
        if f.on_nan == "error":
            for i in rows.tolist():
                bad.setdefault(i, Rejection(i, f.source, f"value is NaN or infinite (or beyond float32's range, |x| > 3.4e38); set on_nan: fill or keep for feature {f.name!r} to accept it"))
        elif f.on_nan == "fill":
            present &= finite


def reject_log1p_domain(f: FeatureConfig, out: np.ndarray, present: np.ndarray, bad: dict[int, Rejection]) -> None:
    """Reject the rows of a ``log1p`` feature with a present value <= -1."""
    # Only present values (fill comes later and is the user's choice).
    with np.errstate(invalid="ignore"):
        neg = (out <= -1) & present
    for i in np.nonzero(neg.any(axis=1))[0].tolist():
        bad.setdefault(i, Rejection(i, f.source, "log1p needs values > -1; use 'clip' first or another transform"))


def leaf_items(f: FeatureConfig, i: int, v: Any, n: int, bad: dict[int, Rejection]) -> list[Any] | None:
    """The first ``n`` non-null items of row ``i``'s list value ``v`` (a scalar is a
    list of itself); None, and a rejection, when one of them is nested."""
    items = [x for x in as_list(v) if x is not None][:n]
    if any(isinstance(x, dict | list) for x in items):
        _reject_nested_list(f, i, bad)
        return None
    return items


def scalar_terms(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> Iterator[tuple[int, str]]:
    """``(row, term)`` of each non-null value, in order; a nested one is rejected instead."""
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, dict | list):
            _reject_non_scalar(f, i, v, bad)
            continue
        yield i, term(v)


# Categorical features (hash and vocabulary paths) reject non-leaf values alike.
def _reject_nested_list(f: FeatureConfig, i: int, bad: dict[int, Rejection]) -> None:
    bad.setdefault(i, Rejection(i, f.source, "expected a list of scalar values, found nested records/lists; point 'source' at a leaf field"))


def _reject_non_scalar(f: FeatureConfig, i: int, v: Any, bad: dict[int, Rejection]) -> None:
    bad.setdefault(i, Rejection(i, f.source, f"expected a scalar value, found {type(v).__name__}; set max_len for lists or point 'source' at a leaf field"))


def short_value(v: Any) -> str:
    """A record's value for a rejection reason (the record itself is in the error output)."""
    return short_repr(v, 60)


def timestamp_columns(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
    secs, present, rejected = epoch_seconds(values, f.unit or "ms")
    for i, reason in rejected.items():
        bad.setdefault(i, Rejection(i, f.source, reason))
    b = len(values)
    cols: dict[str, tuple[str, Any]] = {f.name: ("int64", secs.reshape(b, 1))}
    for part, col in timestamp_parts(secs, f.parts or ()).items():
        cols[f"{f.name}_{part}"] = ("int64", np.where(present, col, 0).reshape(b, 1))
    if f.missing_indicator:
        cols[f"{f.name}_missing"] = ("int64", (~present).astype(np.int64).reshape(b, 1))
    return cols


def bytes_columns(f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
    out = []
    for i, v in enumerate(values):
        if v is None:
            out.append(b"")
        elif isinstance(v, bytes | bytearray):
            out.append(bytes(v))
        elif isinstance(v, str):
            out.append(v.encode("utf-8", "surrogatepass"))
        else:
            bad.setdefault(i, Rejection(i, f.source, f"expected bytes or a string, found {type(v).__name__}"))
            out.append(b"")
    return {f.name: ("string", out)}


def label_rejection(lab: LabelConfig, i: int, v: Any, must: str, fix: str = "") -> Rejection:
    """Why row ``i``'s label value ``v`` is refused: it ``must`` be something else (``fix``: what to
    do about it). A list or a record is several values where the label takes one: the reason
    names the label and says what to write instead (``one_value_path``, or one of the record's fields)."""
    if isinstance(v, list | tuple):
        return Rejection(i, lab.source, f"the label {lab.name!r} takes one value per record, found list "
                                         f"{short_value(v)}; read one item, e.g. source: {one_value_path(lab.source)!r}")
    if isinstance(v, dict):
        key = next(iter(v), None)
        field = render_path((*parse_path(lab.source), key if isinstance(key, str) and 0 < len(key) <= 40 else "field"))
        return Rejection(i, lab.source, f"the label {lab.name!r} takes one value per record, found a record "
                                         f"{short_value(v)}; read one of its fields, e.g. source: {field!r}")
    what = "missing (null)" if v is None else f"{type(v).__name__} {short_value(v)}"
    return Rejection(i, lab.source, f"label must be {must}, found {what}{fix}")


def label_terms(lab: LabelConfig, values: list[Any], bad: dict[int, Rejection]) -> list[str | None]:
    """Each row's class name (``term``: strings, integers, booleans; integral
    floats as integers); None, and a rejection, for anything else."""
    if set(map(type, values)) <= {str}:
        return values
    out: list[str | None] = []
    for i, v in enumerate(values):
        if isinstance(v, str | bytes | bytearray | int) or (isinstance(v, float) and v.is_integer()):
            out.append(term(v))
        else:
            bad.setdefault(i, label_rejection(lab, i, v, "a class name (a string, integer or boolean)", "; fix the record"))
            out.append(None)
    return out


def label_columns(lab: LabelConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
    b = len(values)
    types = set(map(type, values))
    if lab.dtype == "int64":
        if types <= {int}:  # fast path: ints (not bools) within int64
            try:
                return {lab.name: ("int64", np.array(values, dtype=np.int64).reshape(b, 1))}
            except OverflowError:
                pass
        out = np.zeros((b, 1), dtype=np.int64)
        for i, v in enumerate(values):
            if isinstance(v, bool):
                out[i, 0] = int(v)
            elif isinstance(v, int) and -(2**63) <= v < 2**63:
                out[i, 0] = v
            elif isinstance(v, float) and v.is_integer() and -(2.0**63) <= v < 2.0**63:
                out[i, 0] = int(v)
            else:
                bad.setdefault(i, label_rejection(lab, i, v, "an integer", "; fix the record or set label dtype: float32"))
    else:
        if types <= {int, float}:  # fast path: every value a number finite as float32
            try:
                col = np.array(values, dtype=np.float64)
                with np.errstate(invalid="ignore"):
                    if (np.abs(col) <= F32_MAX).all():
                        return {lab.name: ("float32", col.astype(np.float32).reshape(b, 1))}
            except OverflowError:
                pass
        out = np.zeros((b, 1), dtype=np.float32)
        for i, v in enumerate(values):
            if isinstance(v, int | float) and not isinstance(v, bool) and abs(to_float(v)) <= F32_MAX:
                out[i, 0] = to_float(v)  # finite, and stays finite as float32
            else:
                bad.setdefault(i, label_rejection(lab, i, v, "a finite number"))
    return {lab.name: (lab.dtype, out)}
