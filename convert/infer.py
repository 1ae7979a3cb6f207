"""Drafting a feature config from the data: ``recordprep infer``.

One entry per leaf field, with a transform chosen from what a sample of
records shows (types, nulls, distinct values, token counts, list lengths),
and a comment saying why, so the user edits a reasonable draft instead of
writing a config from nothing. Avro writer schemas tell which dicts are maps
(not records); JSON has no schema, so every object is treated as a record.

Beyond the value types, a draft reads: ISO 8601 strings as ``timestamp``;
identifier-like fields (named ``id``, ``*_id``, ``userId``, ``*uuid``; or card-
number-like: integers of 12+ digits nearly all distinct, digit strings of 9+
digits) as ``hash``, since their numeric value means nothing and new ids keep
coming, unless nearly every record has its own value (an id of the record
itself, noise to a model: left out, saying why); epoch integers of a time-named field (``ts``, ``*_at``, ``*_time``) as
``timestamp`` in the unit their magnitude shows.

Nested records are flattened to dotted paths down to ``MAX_DEPTH`` levels,
which also bounds recursive schemas (``LongList.next.next...``). No label is
chosen without one named: the draft names the candidate instead. The text of
the draft (names, YAML, comments) is ``convert.infer_yaml``'s.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

from convert.config import EACH, KEYS, Step, parse_path, render_path
from convert.config_checks import label_leak
from convert.derive import epoch_seconds
from convert.infer_labels import (
    LABEL_MAX_CLASSES,
    LABEL_NAMES,
    candidate_draft,
    label_draft,
)
from convert.infer_yaml import Draft, Names, render_yaml
from convert.records import tokenize, walk_path
from convert.spec import MAX_FEATURE_SIZE

__all__ = ["LABEL_MAX_CLASSES", "Draft", "infer_config", "render_yaml"]

MAX_DEPTH = 4
_DISTINCT_CAP = 5000
_F32_MAX = 3.4028234663852886e38
#: Avro logical types that are instants, and the unit of their raw integers.
_TIMESTAMP_UNITS = {
    "date": "days",
    "timestamp-millis": "ms", "timestamp-micros": "us", "timestamp-nanos": "ns",
    "local-timestamp-millis": "ms", "local-timestamp-micros": "us", "local-timestamp-nanos": "ns",
}
#: ISO 8601 dates and date-times (the converter's parser takes more; infer wants unmistakable ones).
_ISO_RE = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")
#: Card, account or phone numbers written as text: 9+ digits, maybe grouped by spaces or dashes.
_DIGITS_RE = re.compile(r"\+?\d[\d \-]{7,}\d")
#: Names (last path component) of identifier fields: ``id``, ``user_id``, ``userId``, ``session_uuid``.
_ID_NAMES = (re.compile(r"(?:^|_)(?:id|uuid|guid)$", re.IGNORECASE), re.compile(r"[a-z0-9](?:Id|ID|Uuid|UUID|Guid|GUID)$"))
#: Names of instants: ``ts``, ``event_time``, ``created_at``, ``updatedAt``.
_TIME_NAMES = (re.compile(r"(?:^|_)(?:ts|time|timestamp|datetime|at)$", re.IGNORECASE),
               re.compile(r"[a-z0-9](?:Time|Timestamp|At|Ts)$"))
#: Epoch integers of present-day instants (2000..2100) in each unit; the ranges do not overlap.
_EPOCH_RANGES = {unit: (946_684_800 * k, 4_102_444_800 * k) for unit, k in
                 (("s", 1), ("ms", 10**3), ("us", 10**6), ("ns", 10**9))}
_TIME_TYPES = ("date", "time-millis", "time-micros", "timestamp-millis", "timestamp-micros", "timestamp-nanos",
               "local-timestamp-millis", "local-timestamp-micros", "local-timestamp-nanos")


@dataclasses.dataclass
class _FieldStats:
    count: int = 0  # records seen where the parent existed
    nulls: int = 0
    types: Counter = dataclasses.field(default_factory=Counter)
    distinct: Counter = dataclasses.field(default_factory=Counter)  # value -> records, at most _DISTINCT_CAP values
    tokens: list[int] = dataclasses.field(default_factory=list)
    lengths: list[int] = dataclasses.field(default_factory=list)
    list_tokens: list[int] = dataclasses.field(default_factory=list)  # lists: the tokens of each record's strings
    elem_types: Counter = dataclasses.field(default_factory=Counter)
    nonfinite: int = 0  # NaN, +-inf or beyond float32's range
    iso: int = 0  # strings that are ISO 8601 dates or date-times
    iso_dates: int = 0  # ... of them, dates without a time
    digit_strings: int = 0  # strings of 9+ digits (card, account, phone numbers)
    int_lo: int | None = None
    int_hi: int | None = None

    @property
    def capped(self) -> bool:
        """Whether ``distinct`` stopped at its cap (the sample holds more values)."""
        return len(self.distinct) >= _DISTINCT_CAP

    def add_distinct(self, v: Any) -> None:
        v = v if not isinstance(v, list | dict) else repr(v)
        if v in self.distinct or len(self.distinct) < _DISTINCT_CAP:
            self.distinct[v] += 1


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, bytes | bytearray):
        return "bytes"
    if isinstance(v, list | tuple):
        return "list"
    if isinstance(v, dict):
        return "dict"
    return type(v).__name__


def _schema_paths(schema: Any, prefix: str = "", depth: int = 0, named: dict | None = None,
                  out: dict[str, str] | None = None) -> dict[str, str]:
    """What an Avro schema says about dotted paths: ``"map"`` for maps (not to be
    flattened) or the ``logicalType`` (``timestamp-millis``, ``uuid``, ``decimal``...)
    of a leaf, read raw by the converter (integers, strings, bytes)."""
    named = {} if named is None else named
    out = {} if out is None else out
    if depth > MAX_DEPTH:
        return out
    if isinstance(schema, str):
        schema = named.get(schema, schema)
    prim = schema if isinstance(schema, str) else schema.get("type") if isinstance(schema, dict) else None
    if prefix and isinstance(prim, str) and prim in _FALLBACK:  # "type:PATH": the leaf's type, for always-null fields
        out.setdefault(f"type:{prefix}", prim)
    if isinstance(schema, list):
        for s in schema:
            _schema_paths(s, prefix, depth, named, out)
    elif isinstance(schema, dict):
        t = schema.get("type")
        if "name" in schema and t in ("record", "enum", "fixed"):
            named.setdefault(schema["name"], schema)
            if "namespace" in schema and "." not in schema["name"]:
                named.setdefault(f"{schema['namespace']}.{schema['name']}", schema)
        if t == "map":
            out[prefix] = "map"
        elif t == "array" and prefix:  # the items' paths: items[], items[].price
            _schema_paths(schema.get("items"), f"{prefix}[]", depth + 1, named, out)
        elif t == "record":
            for f in schema.get("fields", []):
                _schema_paths(f["type"], f"{prefix}.{f['name']}" if prefix else f["name"], depth + 1, named, out)
        elif isinstance(t, dict | list):
            _schema_paths(t, prefix, depth, named, out)
        elif isinstance(schema.get("logicalType"), str):
            lt = schema["logicalType"]
            if lt == "decimal":
                lt = f"decimal({schema.get('precision')},{schema.get('scale', 0)})"
            out.setdefault(prefix, lt)
    return out


#: The entry of a field the sample never shows a value of, by its schema type: drafted only when
#: nothing else can be a feature, so the draft of an all-null sample still converts.
_FALLBACK: dict[str, dict[str, Any]] = {
    **{t: {"transform": "identity"} for t in ("int", "long", "float", "double")},
    **{t: {"transform": "hash", "buckets": 1024} for t in ("string", "enum", "boolean")},
}


def _typed_fallback(path: str, kinds: dict[str, str]) -> dict[str, Any] | None:
    """The entry for ``path`` (a field or a list of them) from its schema type alone, if it has one."""
    if (t := kinds.get(f"type:{path}")) is not None:
        return dict(_FALLBACK[t])
    if (t := kinds.get(f"type:{path}[]")) is not None:
        return {**_FALLBACK[t], "max_len": 1}
    return None


#: Items of a list ``infer`` looks into for the paths of lists of records, maps and lists.
_MAX_ITEMS = 100


def _walk(rec: dict, stats: dict[str, _FieldStats], maps: set[str], inner: dict[str, set[tuple[Step, ...]]],
          objects: set[str], prefix: tuple[Step, ...] = (), depth: int = 0) -> None:
    """Observe every leaf field of ``rec`` (``_observe``); ``inner`` gets, per list
    field holding records, lists or maps, the paths through it (``_inner_paths``);
    ``objects`` the paths of nested records."""
    for k, v in rec.items():
        steps = (*prefix, str(k))
        path = render_path(steps)
        if isinstance(v, dict) and path not in maps and depth < MAX_DEPTH:
            objects.add(path)
            _walk(v, stats, maps, inner, objects, steps, depth + 1)
            continue
        st = stats.get(path)
        if st is None:  # (not setdefault: a _FieldStats per value is most of a wide record's cost)
            st = stats[path] = _FieldStats()
        _observe(st, v)
        if isinstance(v, list) and depth < MAX_DEPTH:
            found = inner.setdefault(path, set())
            for x in v[:_MAX_ITEMS]:
                if isinstance(x, dict | list):
                    _inner_paths(x, (*steps, EACH), maps, found, depth + 1)


def _inner_paths(x: Any, steps: tuple[Step, ...], maps: set[str], out: set[tuple[Step, ...]], depth: int) -> None:
    """The paths to the scalars inside ``x``, an item of a list at ``steps``
    (``items[].price``, ``m[][]``, ``orders[].items[].sku``; a map's ``[keys]``)."""
    if depth > 2 * MAX_DEPTH:  # (lists add levels records do not)
        return
    if isinstance(x, dict):
        if render_path(steps) in maps:
            out.add((*steps, KEYS))
            return
        for k, v in x.items():
            _inner_paths(v, (*steps, str(k)), maps, out, depth + 1)
    elif isinstance(x, list):
        nested = [y for y in x[:_MAX_ITEMS] if isinstance(y, dict | list)]
        for y in nested:
            _inner_paths(y, (*steps, EACH), maps, out, depth + 1)
        if any(y is not None and not isinstance(y, dict | list) for y in x[:_MAX_ITEMS]):
            out.add((*steps, EACH))
    else:
        out.add(steps)


#: A JSON object with at least this many distinct keys in the sample, none of them in
#: more than half of the objects, is a map (arbitrary keys), not a record.
_JSON_MAP_KEYS = 20


def _json_maps(sample: list[dict]) -> set[str]:
    """Paths of JSON objects that look like maps: many distinct keys, each in few of them."""
    keys: dict[str, Counter] = {}
    seen: Counter = Counter()
    stack: list[tuple[tuple[Step, ...], Any, int]] = [((), r, 0) for r in sample]
    while stack:
        prefix, obj, depth = stack.pop()
        if prefix:
            p = render_path(prefix)
            seen[p] += 1
            keys.setdefault(p, Counter()).update(map(str, obj))
        if depth < MAX_DEPTH:
            stack.extend(((*prefix, str(k)), v, depth + 1) for k, v in obj.items() if isinstance(v, dict))
    return {p for p, c in keys.items() if len(c) >= _JSON_MAP_KEYS and max(c.values()) <= seen[p] / 2}


def _observe(st: _FieldStats, v: Any) -> None:
    """Add one record's value of a field to its statistics."""
    st.count += 1
    kind = _kind(v)
    st.types[kind] += 1
    if kind == "null":
        st.nulls += 1
    elif kind == "dict":
        st.lengths.append(len(v))
        for x in list(v)[:_MAX_ITEMS]:
            st.add_distinct(x)
    elif kind == "list":
        st.lengths.append(len(v))
        total = 0
        for x in v:
            st.elem_types[_kind(x)] += 1
            if not isinstance(x, list | dict):
                st.add_distinct(x)
            if isinstance(x, int | float) and not isinstance(x, bool) and not _f32_finite(x):
                st.nonfinite += 1
            if isinstance(x, str):
                n = len(tokenize(x, lowercase=False))
                st.tokens.append(n)
                total += n
        st.list_tokens.append(total)
    elif kind == "str":
        st.add_distinct(v)
        if _ISO_RE.fullmatch(v):
            st.iso += 1
            st.iso_dates += len(v) == 10
        elif _DIGITS_RE.fullmatch(v) and sum(c.isdigit() for c in v) >= 9:
            st.digit_strings += 1
        st.tokens.append(len(tokenize(v, lowercase=False)))
    elif kind in ("int", "float", "bool"):
        st.add_distinct(v)
        if kind != "bool" and not _f32_finite(v):
            st.nonfinite += 1
        if kind == "int":
            st.int_lo = v if st.int_lo is None else min(st.int_lo, v)
            st.int_hi = v if st.int_hi is None else max(st.int_hi, v)


def _f32_finite(v: int | float) -> bool:
    try:
        return abs(float(v)) <= _F32_MAX
    except OverflowError:  # an integer beyond the float range
        return False


def _pct(xs: list[int], q: float) -> int:
    if not xs:
        return 1
    s = sorted(xs)
    return s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)]


def _named(path: str, patterns: tuple[re.Pattern, ...]) -> bool:
    last = path.rsplit(".", 1)[-1]
    return any(p.search(last) for p in patterns)


def _epoch_unit(st: _FieldStats) -> str | None:
    """The unit in which every integer of ``st`` is a present-day instant, if one is."""
    if st.int_lo is None:
        return None
    return next((u for u, (lo, hi) in _EPOCH_RANGES.items() if lo <= st.int_lo and st.int_hi <= hi), None)


def _epoch_unit_fits(st: _FieldStats, unit: str) -> bool | None:
    """Whether every integer of ``st`` is an instant of years 2000-2100 in ``unit`` (None: no integers)."""
    if st.int_lo is None:
        return None
    lo, hi = _EPOCH_RANGES[unit]
    return lo <= st.int_lo and st.int_hi <= hi


def _few(distinct: int, non_null: int) -> bool:
    """Few enough values for a vocabulary (codes like ``country_id``), not an open-ended set of ids."""
    return distinct <= 50 and distinct <= 0.5 * non_null


def _identifier(path: str, st: _FieldStats, types: set[str], non_null: int, null_note: str) -> Draft | None:
    """A draft for a field whose values identify things or instants rather than measure them, else None."""
    distinct = len(st.distinct)
    more = "+" if distinct >= _DISTINCT_CAP else ""
    missing = bool(null_note)  # null or absent in some records
    if types == {"str"} and st.iso == non_null:
        _, _, bad = epoch_seconds(list(st.distinct), "s")
        if not bad:
            parts = ["day_of_week", "month"] if st.iso_dates == non_null else ["hour", "day_of_week"]
            e: dict[str, Any] = {"transform": "timestamp", "parts": parts}
            if missing:
                e["missing_indicator"] = True
            return Draft(e, f"{path}: ISO 8601 {'dates' if st.iso_dates == non_null else 'date-times'} -> epoch seconds + "
                            f"{', '.join(parts)} (UTC; times without an offset read as UTC){null_note}", path)
    if types == {"int"} and _named(path, _TIME_NAMES) and (unit := _epoch_unit(st)):
        e = {"transform": "timestamp", "unit": unit, "parts": ["hour", "day_of_week"]}
        if missing:
            e["missing_indicator"] = True
        return Draft(e, f"{path}: integers that are epoch {unit} of years 2000-2100 -> epoch seconds + hour, day_of_week "
                        f"(UTC){null_note}", path)
    hashed = {"transform": "hash", "buckets": _hash_buckets(distinct)}
    what = None
    if _named(path, _ID_NAMES):
        if _few(distinct, non_null):
            return Draft({"transform": "vocabulary"}, f"{path}: an id with {distinct} values in the sample: categorical{null_note}", path)
        what = "identifier"
        why = "its numeric value means nothing and new ids keep coming" if types == {"int"} else "new ids keep coming"
    elif types == {"int"} and st.int_lo is not None and not st.nonfinite:
        big = max(abs(st.int_lo), abs(st.int_hi))
        if big > 2**53 or (min(abs(st.int_lo), abs(st.int_hi)) >= 10**11 and st.int_lo > 0 and distinct >= 0.9 * non_null
                           and _epoch_unit(st) is None):
            what, why = "identifier-like integers (12+ digits: card or account numbers?)", "their numeric value means nothing"
    elif types == {"str"} and st.digit_strings == non_null and not _few(distinct, non_null):
        what, why = "digit strings of 9+ digits (card, account or phone numbers?)", "new numbers keep coming"
    if what is None:
        return None
    if _one_per_record(distinct, non_null):
        return _left_out(path, what, distinct, non_null, null_note)
    return Draft(hashed, f"{path}: {what} ({distinct}{more} distinct in {non_null}), hashed: {why}{null_note}", path)


#: Sampled values below which every value being distinct proves nothing (a small sample of a few categories).
_MIN_ID_SAMPLE = 20


def _one_per_record(distinct: int, non_null: int) -> bool:
    """Nearly one distinct value per record: an identifier of the record itself (a request or event id)."""
    return non_null >= _MIN_ID_SAMPLE and distinct >= 0.95 * non_null


def _left_out(path: str, what: str, distinct: int, non_null: int, null_note: str) -> Draft:
    """No entry for an identifier of the record itself, saying why."""
    more = "+" if distinct >= _DISTINCT_CAP else ""
    return Draft(None, f"{path}: {what} with {distinct}{more} distinct values in {non_null} records, nearly one per "
                       f"record: left out, since an id seen once in training carries no signal (a hashed one is "
                       f"noise); add it with transform: hash if its values recur{null_note}", path,
                 fallback={"transform": "hash", "buckets": _hash_buckets(distinct)})


def _round_up(n: int) -> int:
    """``n`` rounded up to two significant digits (2,984 -> 3,000; 137 -> 140)."""
    step = 10 ** max(0, len(str(n)) - 2)
    return -(-n // step) * step


def _vocabulary(path: str, st: _FieldStats, entry: dict[str, Any]) -> tuple[str, list[str]]:
    """Set ``top_k`` on a vocabulary ``entry`` from the sample's distinct count;
    returns the comment's note (the estimated coverage) and a warning when many
    new values are likely out of vocabulary.

    The coverage is Good-Turing's estimate: the share of new values never seen
    in the sample is about the share of sampled values seen exactly once.
    """
    distinct = len(st.distinct)
    n = sum(st.distinct.values())
    once = sum(1 for c in st.distinct.values() if c == 1)
    if n < _MIN_ID_SAMPLE or distinct <= 100 and not once:
        return "", []  # (too few values to estimate from)
    coverage = 1 - once / n
    note = f"; estimated coverage {coverage:.0%} of new values ({once} of {n} sampled values occur once)"
    if distinct > 100:
        entry["top_k"] = _round_up(distinct)
        note = f"; top_k {entry['top_k']}: the sample's {distinct}{'+' if distinct >= _DISTINCT_CAP else ''} distinct values" + note
    warnings = []
    if coverage < 0.9:
        warnings.append(f"{path}: an estimated {1 - coverage:.0%} of new values will be out of vocabulary "
                        f"({once} of {n} sampled values occur once); consider transform: hash, or --sample more records")
    return note, warnings


def _max_len(counts: list[int]) -> tuple[int, int, str]:
    """A drafted ``max_len``: the 95th percentile of ``counts`` capped at
    ``MAX_FEATURE_SIZE`` (what the config accepts), the percentile, and a note
    for the comment when capped."""
    p95 = max(1, _pct(counts, 0.95))
    if p95 <= MAX_FEATURE_SIZE:
        return p95, p95, ""
    return MAX_FEATURE_SIZE, p95, f", max_len capped at the limit {MAX_FEATURE_SIZE} (longer values are truncated)"


def _hash_buckets(distinct: int) -> int:
    return 1 << max(10, min(20, math.ceil(math.log2(max(2, distinct * 4)))))


def _decide(path: str, st: _FieldStats, total: int, logical: str | None = None, maps: set[str] = frozenset()) -> Draft:
    """The drafted entry for one field, by the kind of values the sample holds:
    a map, an Avro logical type, an identifier, numbers, booleans, bytes,
    strings or lists; otherwise no entry and a note saying why."""
    non_null = st.count - st.nulls
    types = {t for t in st.types if t != "null"}
    distinct = len(st.distinct)
    null_note = f", {st.nulls}/{total} null" if st.nulls else ""
    missing_in = total - st.count
    if missing_in > 0:
        null_note += f", absent in {missing_in}/{total}"
    if not types:
        return Draft(None, f"{path}: always null in the sample; nothing to learn", path)
    if types == {"dict"}:
        return _decide_map(path, st, null_note)
    # Avro logical types: the converter reads them raw (integers, strings, bytes).
    if logical and (draft := _decide_logical(path, st, types, logical, distinct, null_note, missing_in)):
        return draft
    if types in ({"int"}, {"str"}) and (ident := _identifier(path, st, types, non_null, null_note)):
        return ident
    if types <= {"int", "float"}:
        return _decide_numeric(path, st, types, distinct, non_null, null_note, missing_in)
    if types == {"bool"}:
        return Draft({"transform": "vocabulary"}, f"{path}: boolean{null_note}", path)
    if types == {"bytes"}:
        return Draft({"transform": "bytes"}, f"{path}: bytes, passed through unvectorized{null_note}", path)
    if types == {"str"}:
        return _decide_string(path, st, distinct, non_null, null_note)
    if types == {"list"}:
        return _decide_list(path, st, maps, null_note)
    if types - {"dict"} == types and "list" in types and not st.elem_types.keys() & {"dict", "list"}:
        return _decide_scalar_or_list(path, st, types, null_note)
    scalar = types - {"list", "dict"}
    if types == scalar:
        return Draft({"transform": "hash", "buckets": 1024},
                     f"{path}: mixed types ({', '.join(sorted(types))}) across records; hashed as strings, check this", path)
    return Draft(None, f"{path}: mixed scalar/list/record values ({', '.join(sorted(types))}); not vectorized", path)


def _decide_map(path: str, st: _FieldStats, null_note: str) -> Draft:
    """A map with arbitrary keys: its keys as categories (a key's value is drafted by path)."""
    if not st.distinct:
        return Draft(None, f"{path}: a map that is always empty in the sample; nothing to learn", path)
    max_len, p95, capped = _max_len(st.lengths)
    e = {"transform": "vocabulary", "max_len": max_len}
    note, warnings = _vocabulary(path, st, e)
    return Draft(e, f"{path}: a map (arbitrary keys): its keys as categories, {len(st.distinct)} distinct, "
                    f"count p95 {p95}{capped}{note}; a key's value: source: {path}[\"KEY\"]{null_note}",
                 render_path((*parse_path(path), KEYS)), warnings=warnings)


def _decide_logical(path: str, st: _FieldStats, types: set[str], logical: str, distinct: int, null_note: str,
                    missing_in: int) -> Draft | None:
    """The entry for an Avro logical type read raw, or ``None`` when the values do not fit it."""
    if logical in _TIMESTAMP_UNITS and types == {"int"}:
        # Instants: exact epoch seconds plus the calendar parts models usually want.
        unit = _TIMESTAMP_UNITS[logical]
        seen = _epoch_unit(st)
        if seen is not None and unit != "days" and seen != unit and _epoch_unit_fits(st, unit) is False:
            logical, unit = f"{logical} declared, but the values are epoch {seen} of years 2000-2100", seen
        e = {"transform": "timestamp", "unit": unit,
             "parts": ["day_of_week", "month"] if unit == "days" else ["hour", "day_of_week"]}
        if st.nulls or missing_in:
            e["missing_indicator"] = True
        return Draft(e, f"{path}: {logical} -> epoch seconds + {', '.join(e['parts'])} (UTC){null_note}", path)
    if logical in _TIME_TYPES and types == {"int"}:
        e = {"transform": "zscore"}
        if st.nulls or missing_in:
            e["missing_indicator"] = True
        unit = "days since 1970-01-01" if logical == "date" else "raw integer " + logical.rsplit("-", 1)[-1]
        return Draft(e, f"{path}: {logical} ({unit}), numeric{null_note}", path)
    if logical == "uuid" and types == {"str"}:
        if _one_per_record(distinct, st.count - st.nulls):
            return _left_out(path, "uuid (an identifier)", distinct, st.count - st.nulls, null_note)
        return Draft({"transform": "hash", "buckets": _hash_buckets(distinct)}, f"{path}: uuid (an identifier), hashed{null_note}", path)
    if logical.startswith("decimal") and types == {"bytes"}:
        return Draft({"transform": "bytes"}, f"{path}: {logical}: read as its unscaled two's-complement bytes "
                     f"(decimals are not converted to numbers); passed through unvectorized{null_note}", path)
    if logical == "duration" and types == {"bytes"}:
        return Draft({"transform": "bytes"}, f"{path}: duration (fixed 12 bytes: months, days, millis), "
                     f"passed through unvectorized{null_note}", path)
    return None


def _decide_numeric(path: str, st: _FieldStats, types: set[str], distinct: int, non_null: int, null_note: str,
                    missing_in: int) -> Draft:
    """Numbers: standardized (NaN and infinities filled like nulls), or categories when
    integers take at most two values."""
    if types == {"int"} and distinct <= 2 and non_null > 0 and not st.nonfinite:
        return Draft({"transform": "vocabulary"}, f"{path}: integer with {distinct} values{null_note}", path)
    e: dict[str, Any] = {"transform": "zscore"}
    if st.nulls or missing_in:
        e["missing_indicator"] = True
    nonfinite_note = ""
    if st.nonfinite:
        e["on_nan"] = "fill"
        nonfinite_note = f", {st.nonfinite} NaN/inf/beyond-float32 value(s) filled like nulls (on_nan: fill)"
    return Draft(e, f"{path}: numeric, {distinct}{'+' if distinct >= _DISTINCT_CAP else ''} distinct{null_note}{nonfinite_note}", path)


def _decide_string(path: str, st: _FieldStats, distinct: int, non_null: int, null_note: str) -> Draft:
    """Strings: free text (several tokens, mostly distinct), categories (few distinct) or hashed."""
    avg_tokens = sum(st.tokens) / max(1, len(st.tokens))
    ratio = distinct / max(1, non_null)
    if avg_tokens > 2.5 and ratio > 0.3:
        max_len, p95, capped = _max_len(st.tokens)
        return Draft({"transform": "text", "max_len": max_len},
                     f"{path}: free text, {avg_tokens:.1f} tokens on average (max_len = 95th percentile, {p95}){capped}{null_note}", path)
    if distinct <= 1000 and (ratio < 0.5 or distinct <= 50):
        e: dict[str, Any] = {"transform": "vocabulary"}
        note, warnings = _vocabulary(path, st, e)
        return Draft(e, f"{path}: categorical, {distinct} distinct in the sample{note}{null_note}", path, warnings=warnings)
    if avg_tokens <= 2.5 and _one_per_record(distinct, non_null):
        return _left_out(path, "identifier-like strings", distinct, non_null, null_note)
    return Draft({"transform": "hash", "buckets": _hash_buckets(distinct)},
                 f"{path}: high-cardinality string ({distinct}{'+' if distinct >= _DISTINCT_CAP else ''} distinct in {non_null}){null_note}", path)


def _items(path: str) -> str:
    """The path to the items of the list at ``path``; a path through a list already yields its items."""
    steps = parse_path(path)
    return path if EACH in steps else render_path((*steps, EACH))


def _decide_scalar_or_list(path: str, st: _FieldStats, types: set[str], null_note: str) -> Draft:
    """A value that is a scalar in some records and a list of scalars in others:
    free text read item by item (a lone string is one item), else a list of
    categories (vocabulary and hash take a scalar as a one-item list)."""
    kinds = ", ".join(sorted(types - {"list"}))
    lengths = st.lengths + [1] * (st.count - st.nulls - len(st.lengths))
    max_len, p95, capped = _max_len(lengths)
    avg_tokens = sum(st.tokens) / max(1, len(st.tokens))
    elems = {t for t in st.elem_types if t != "null"} | (types - {"list"})
    if elems == {"str"} and avg_tokens > 2.5 and len(st.distinct) > 0.3 * max(1, len(st.tokens)):
        t_len, t_p95, t_capped = _max_len(st.list_tokens + st.tokens)
        return Draft({"transform": "text", "max_len": t_len},
                     f"{path}: free text, a string in some records and a list of strings in others; text reads "
                     f"the items ({_items(path)}), max_len = 95th percentile of tokens {t_p95}{t_capped}{null_note}",
                     _items(path), path_name=path)
    distinct = len(st.distinct)
    e: dict[str, Any] = ({"transform": "hash", "buckets": _hash_buckets(distinct)} if distinct > 1000
                         else {"transform": "vocabulary"})
    note, warnings = _vocabulary(path, st, e) if e["transform"] == "vocabulary" else ("", [])
    e["max_len"] = max_len
    return Draft(e, f"{path}: {kinds} in some records, a list in others: drafted as a list of categories (a "
                    f"scalar is a one-item list), length p95 {p95}{capped}{note}{null_note}", path, warnings=warnings)


def _decide_list(path: str, st: _FieldStats, maps: set[str], null_note: str) -> Draft:
    """Lists, by their items: records, maps or lists (counted; the items are drafted by
    path), free text, numbers or categories; mixed kinds get no entry."""
    elems = {t for t in st.elem_types if t != "null"}
    max_len, p95, capped = _max_len(st.lengths)
    if not elems:
        return Draft(None, f"{path}: always an empty list in the sample", path, fallback={"transform": "count"})
    steps = parse_path(path)
    if "dict" in elems and EACH in steps and isinstance(steps[-1], str) and path not in maps:
        return Draft(None, f"{path}: a record inside each item of a list, not a list: nothing to count; its fields "
                           f"are drafted as {path}.FIELD", path)
    if elems <= {"dict", "list"}:
        record = "maps" if f"{path}[]" in maps else "records"
        what = " and ".join({"dict": record, "list": "lists"}[k] for k in sorted(elems))
        return Draft({"transform": "count"}, f"{path}: a list of {what}: its length (p95 {p95}) as a count; what "
                                             f"is inside is drafted as {path}[]...{null_note}", path)
    avg_tokens = sum(st.tokens) / max(1, len(st.tokens))
    if elems == {"str"} and avg_tokens > 2.5 and len(st.distinct) > 0.3 * max(1, len(st.tokens)):
        max_len, p95, capped = _max_len(st.list_tokens)
        return Draft({"transform": "text", "max_len": max_len},
                     f"{path}: lists of free text, {avg_tokens:.1f} tokens per string on average (max_len = 95th "
                     f"percentile of a record's tokens, {p95}){capped}; text reads the items ({_items(path)}){null_note}",
                     _items(path), path_name=path)
    if elems <= {"int", "float"}:
        e = {"transform": "identity", "max_len": max_len}
        nonfinite_note = ""
        if st.nonfinite:
            e["on_nan"] = "fill"
            nonfinite_note = f", {st.nonfinite} NaN/inf/beyond-float32 item(s) filled (on_nan: fill)"
        return Draft(e, f"{path}: numeric list, length p95 {p95}{capped}{null_note}{nonfinite_note}", path)
    if elems <= {"str", "int", "bool"}:
        e = {"transform": "vocabulary", "max_len": max_len}
        note, warnings = _vocabulary(path, st, e)
        return Draft(e, f"{path}: list of categories, length p95 {p95}{capped}{note}{null_note}", path, warnings=warnings)
    return Draft(None, f"{path}: list of {'/'.join(sorted(elems))} mixed: one feature takes lists of one kind; "
                       f"point 'source' at the items of one kind", path)


def _allow_missing(d: Draft, st: _FieldStats, total: int) -> Draft:
    """Mark ``allow_all_missing`` on a feature whose field is absent, null or empty
    in part of the sample, or reached through a list: convert's training split
    may then lack it entirely (convert stops on such a feature unless marked)."""
    sparse = st.nulls or total - st.count or "[]" in d.path or any(n == 0 for n in st.lengths)
    if d.entry is not None and sparse:
        d.entry["allow_all_missing"] = True
        d.comment += "; allow_all_missing: absent, null or empty in part of the sample, so possibly in all of a split"
    return d


def _observed(stats: dict[str, _FieldStats], inner: dict[str, set[tuple[Step, ...]]], sample: list[dict],
              kinds: dict[str, str], maps: set[str]) -> tuple[list[Draft], list[tuple[Draft, list[Draft]]]]:
    """A draft per observed path, each list's paths through it (``items[].price``)
    right after the list's own; and each counted list with the drafts through it,
    for ``_one_length`` once the drafts are final."""
    total = len(sample)
    drafts = []
    lists = []
    for p, st in list(stats.items()):
        d = _decide(p, st, total, kinds.get(p), maps)
        subs = []
        for steps in sorted(inner.get(p, ()), key=render_path):  # paths through the list: items[].price
            path = render_path(steps)
            sub = _FieldStats()
            for r in sample:
                _observe(sub, walk_path(r, steps))
            stats[path] = sub
            subs.append(_allow_missing(_decide(path, sub, total, kinds.get(path), maps), sub, total))
        if d.entry is not None and d.entry.get("transform") == "count":
            d.path_name = f"{p}_count"
            lists.append((d, subs))
        drafts.append(_allow_missing(d, st, total))
        drafts += subs
    return drafts, lists


def _one_length(count: Draft, subs: list[Draft], stats: dict[str, _FieldStats]) -> None:
    """One length feature for a list of records: the ``<name>_len`` of its first numeric item
    field (a numeric list counts every item, null ones too), else of its first item field
    of ids that is never null, else its ``count``. The other numeric item fields share that
    ``_len`` (``length_of``), the item fields of ids leave theirs out (``length: false``: the
    count of their non-zero ids is their length)."""
    lst = count.path
    items = [x for x in subs if x.entry is not None and "max_len" in x.entry and _item_field(x.path, lst)]
    numeric = [x for x in items if x.entry["transform"] in ("identity", "log1p", "clip")]
    ids = [x for x in items if x not in numeric]
    carrier = numeric[0] if numeric else next(
        (x for x in ids if x.entry["transform"] != "text" and not stats[x.path].elem_types["null"]), None)
    for x in numeric[1:]:
        x.entry["max_len"] = carrier.entry["max_len"]
        x.entry["length_of"] = carrier  # the carrier's feature name, once names are claimed
        x.comment += f"; its length is {carrier.path}'s <name>_len (length_of: one length per list)"
    for x in ids:
        if x is not carrier:
            x.entry["length"] = False
            x.comment += "; length: false (its length is the count of its non-zero ids; one length per list)"
    if carrier is not None:
        count.entry = None
        count.comment = (f"{lst}: a list of records: its length is the <name>_len of {carrier.path}'s feature "
                         f"(one length feature per list, not a count beside it)")


def _item_field(path: str, lst: str) -> bool:
    """Whether ``path`` reads one value per item of the list ``lst``: a field of its records
    (``items[].price``), not a list inside them."""
    below = parse_path(path)[len(parse_path(lst)):]  # (EACH, "price") for items[].price
    return len(below) >= 2 and below[0] is EACH and all(isinstance(x, str) for x in below[1:])


def _fall_back(drafts: list[Draft], stats: dict[str, _FieldStats], kinds: dict[str, str], total: int) -> None:
    """Nothing but identifiers or null fields: each drafted after all (hashed, or the schema's
    type), so the draft still converts."""
    for d in drafts:
        if d.entry is None and d.fallback is None and not stats[d.path].distinct:
            d.fallback = _typed_fallback(d.path, kinds)
            if d.fallback is not None:
                d.comment += (f" (the schema's type: {d.fallback['transform']} drafted all the same, as no "
                              f"other field can be a feature)")
        if d.fallback is not None:
            d.entry = _allow_missing(Draft(dict(d.fallback), "", d.path), stats[d.path], total).entry
            d.comment = (d.comment.replace("left out, since", "hashed all the same (no other field can be a "
                                           "feature), though").replace("; add it with transform: hash if its values recur", ""))


def infer_config(records: Iterable[dict], avro_schema: Any = None, label: str | None = None) -> tuple[dict[str, Any], list[Draft]]:
    """Draft a config from sample records; returns (config mapping, drafts incl. skipped fields).

    ``label`` is the label's source path, in the config's grammar: a field, or
    a value one path gives per record as convert reads it (``y[0]``, ``n.a``,
    ``m["k"]``; ``convert.infer_labels.label_path_problem`` says whether convert
    takes it). Features that would hold its value (``y`` for ``y[0]``) are left
    out. Without it the draft has no label: a numeric field with a label's name
    (``label``, ``clicked``...) is named as the candidate in the label's comment
    and a warning, and left out of the features (where it would leak the label
    once the user names it).

    Raises:
      PathError: ``label`` is not a path of the grammar.
    """
    label_steps = parse_path(label) if label is not None else ()
    label = render_path(label_steps) if label is not None else None  # as drafts write paths
    kinds = _schema_paths(avro_schema) if avro_schema is not None else {}
    maps = {p for p, k in kinds.items() if k == "map"}
    stats: dict[str, _FieldStats] = {}
    inner: dict[str, set[tuple[Step, ...]]] = {}
    objects: set[str] = set()
    sample = [r for r in records if isinstance(r, dict)]
    if avro_schema is None:
        maps = _json_maps(sample)
    for r in sample:
        _walk(r, stats, maps, inner, objects)
    total = len(sample)
    drafts, lists = _observed(stats, inner, sample, kinds, maps)
    for d in drafts:
        if d.path in objects:  # a value in some records, a nested record in others: convert rejects either way
            d.entry, d.fallback, d.warnings, d.path_name = None, None, [], None  # in place: lists hold these drafts
            d.comment = (f"{d.path}: a value in some records, a nested record in others; not vectorized "
                         f"(its fields are drafted as {d.path}.FIELD)")
    for count, subs in lists:
        _one_length(count, subs, stats)
    if not any(d.entry is not None and d.path not in (label, None) for d in drafts):
        _fall_back(drafts, stats, kinds, total)
    if label is not None and label not in stats:  # a path no field is (y[0], m["k"]): read as convert reads it
        stats[label] = _FieldStats()
        for r in sample:
            _observe(stats[label], walk_path(r, label_steps))
        drafts.append(Draft(None, "", label))  # the label's draft, made below
    candidate = None
    if label is None:  # a numeric field with a label's name: named, never chosen
        candidate = next((p for p, st in stats.items() if p.lower() in LABEL_NAMES
                          and set(st.types) - {"null"} and set(st.types) - {"null"} <= {"int", "float", "bool"}), None)
    names = Names()
    features = []
    label_entry = None
    for i, d in enumerate(drafts):
        if d.path == label:
            drafts[i] = label_draft(d.path, stats[d.path], total, names)
            label_entry = drafts[i].entry
            continue
        if d.path == candidate:
            drafts[i] = candidate_draft(d.path, stats[d.path], total)
            continue
        if d.entry is None:
            continue
        if label is not None and label_leak(parse_path(d.path), label_steps, d.entry.get("transform") == "count"):
            d.entry = None
            d.comment = f"{d.path}: holds the label {label!r}; left out so the label cannot leak into the inputs"
            continue
        name = names.claim(d.path_name or d.path, tuple(d.entry.get("parts", ())))
        e = {"name": name}
        if name != d.path:
            e["source"] = d.path
        e.update(d.entry)
        d.entry = e
        features.append(e)
    for e in features:
        if isinstance(e.get("length_of"), Draft):
            carrier = e.pop("length_of").entry  # None: left out as the label's holder; its own length then
            if carrier is not None:
                e["length_of"] = carrier["name"]
    return {"label": label_entry, "features": features}, drafts
