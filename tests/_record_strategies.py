"""Hypothesis strategies shared by the property tests and the fuzz driver (tests/fuzz_records.py).

``avro_cases()`` draws a random Avro schema within the supported types
(primitives, nullable unions, nested records, arrays, maps, enums, logical
types), records for it, and a feature config with one feature per leaf and a
transform that fits its type. ``json_documents()`` draws arbitrary JSON values
(the converter must never crash on them).

"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
from typing import Any

import fastavro
from hypothesis import strategies as st

F32_SAFE = 1e30  # doubles drawn within float32's range (beyond it: tests/test_property_edges.py)

_ENUM_SYMBOLS = ["RED", "GREEN", "BLUE", "_x9"]
_MAP_KEYS = ["a", "b", "c"]


@dataclasses.dataclass
class Leaf:
    kind: str
    schema: Any
    values: st.SearchStrategy
    transforms: list[dict]


def _numeric(kind, schema, values):
    return Leaf(kind, schema, values, [
        {"transform": "identity"}, {"transform": "zscore"}, {"transform": "minmax"},
        {"transform": "clip", "clip_min": -100.0, "clip_max": 1000.0}, {"transform": "identity", "fill": 3.5},
    ])


def _categorical(kind, schema, values, text=False):
    ts = [{"transform": "vocabulary"}, {"transform": "hash", "buckets": 7}, {"transform": "vocabulary", "top_k": 2},
          {"transform": "vocabulary", "min_frequency": 2}]
    if text:
        ts.append({"transform": "text", "max_len": 3})
        ts.append({"transform": "text", "max_len": 2, "lowercase": False})
    return Leaf(kind, schema, values, ts)


def _leaves(n: int) -> list[Leaf]:
    """Leaf types; ``n`` makes named types unique within one schema."""
    words = st.sampled_from(["alpha", "Beta", "gamma", "", "x y", "Ünï cødé", "7", "true", "a_b-c"])
    text = st.one_of(words, st.text(max_size=10))
    return [
        _numeric("int", "int", st.integers(-(2**31), 2**31 - 1)),
        _numeric("long", "long", st.integers(-(2**63), 2**63 - 1)),
        _numeric("float", "float", st.floats(width=32, allow_nan=False, allow_infinity=False)),
        _numeric("double", "double", st.floats(-F32_SAFE, F32_SAFE, allow_nan=False)),
        _numeric("timestamp-millis", {"type": "long", "logicalType": "timestamp-millis"}, st.integers(-(2**62), 2**62)),
        _numeric("date", {"type": "int", "logicalType": "date"}, st.integers(-(2**31), 2**31 - 1)),
        _numeric("time-micros", {"type": "long", "logicalType": "time-micros"}, st.integers(0, 86_400_000_000)),
        _categorical("boolean", "boolean", st.booleans()),
        _categorical("string", "string", text, text=True),
        _categorical("enum", {"type": "enum", "name": f"E{n}", "symbols": _ENUM_SYMBOLS}, st.sampled_from(_ENUM_SYMBOLS)),
        _categorical("uuid", {"type": "string", "logicalType": "uuid"}, st.uuids().map(str)),
        Leaf("bytes", "bytes", st.binary(max_size=12), [{"transform": "bytes"}, {"transform": "hash", "buckets": 5}]),
        Leaf("decimal", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
             st.decimals(min_value=-(10**9), max_value=10**9, places=2, allow_nan=False), [{"transform": "bytes"}]),
        Leaf("fixed", {"type": "fixed", "name": f"F{n}", "size": 4}, st.binary(min_size=4, max_size=4), [{"transform": "bytes"}]),
    ]


@dataclasses.dataclass
class AvroCase:
    schema: dict
    records: list[dict]
    config: dict  # the YAML mapping
    codec: str


@st.composite
def _field(draw, i: int, depth: int):
    """(avro field, value strategy, [(source suffix, feature options)])."""
    leaves = _leaves(i)
    shape = draw(st.sampled_from(["leaf", "leaf", "nullable", "array", "map", "record"] if depth < 2 else ["leaf", "nullable"]))
    name = f"f{i}"
    if shape in ("leaf", "nullable"):
        leaf = draw(st.sampled_from(leaves))
        opts = dict(draw(st.sampled_from(leaf.transforms)))
        values = leaf.values
        schema = leaf.schema
        if shape == "nullable":
            schema = ["null", schema]
            values = st.one_of(st.none(), values)
            if opts["transform"] in ("identity", "zscore", "minmax", "clip") and draw(st.booleans()):
                opts["missing_indicator"] = True
        return {"name": name, "type": schema}, values, [("", opts)]
    if shape == "array":
        kind = draw(st.sampled_from(["long", "double", "string", "enum"]))
        leaf = next(x for x in leaves if x.kind == kind)
        max_len = draw(st.integers(1, 4))
        opts = {"transform": "identity" if kind in ("long", "double") else "vocabulary", "max_len": max_len}
        if kind in ("long", "double") and draw(st.booleans()):
            opts["transform"] = "clip"
            opts["clip_min"] = 0.0
        return ({"name": name, "type": {"type": "array", "items": leaf.schema}},
                st.lists(leaf.values, max_size=6), [("", opts)])
    if shape == "map":
        key = draw(st.sampled_from(_MAP_KEYS))
        return ({"name": name, "type": {"type": "map", "values": ["null", "long"]}},
                st.dictionaries(st.sampled_from(_MAP_KEYS), st.one_of(st.none(), st.integers(-(2**40), 2**40)), max_size=3),
                [(f".{key}", {"transform": "identity", "missing_indicator": True})])
    # nested record (nullable or not), 1-3 fields
    subs = [draw(_field(i * 10 + k, depth + 1)) for k in range(draw(st.integers(1, 3)))]
    rec_schema = {"type": "record", "name": f"R{i}_{depth}", "fields": [s[0] for s in subs]}
    values = st.fixed_dictionaries({s[0]["name"]: s[1] for s in subs})
    nullable = draw(st.booleans())
    feats = [(f".{s[0]['name']}{suffix}", opts) for s in subs for suffix, opts in s[2]]
    if nullable:
        return {"name": name, "type": ["null", rec_schema]}, st.one_of(st.none(), values), feats
    return {"name": name, "type": rec_schema}, values, feats


@st.composite
def avro_cases(draw, max_records: int = 20) -> AvroCase:
    fields = [draw(_field(i + 1, 0)) for i in range(draw(st.integers(1, 5)))]
    schema = {"type": "record", "name": "Row", "namespace": "prop", "fields": [f[0] for f in fields]}
    records = draw(st.lists(st.fixed_dictionaries({f[0]["name"]: f[1] for f in fields}), min_size=1, max_size=max_records))
    features = []
    for f in fields:
        for suffix, opts in f[2]:
            source = f[0]["name"] + suffix
            features.append({"name": f"x_{source.replace('.', '_')}", "source": source, **opts})
    codec = draw(st.sampled_from(["null", "deflate", "snappy", "zstandard", "bzip2", "xz"]))
    return AvroCase(schema, records, {"features": features}, codec)


def _variant(n: int) -> tuple[dict, st.SearchStrategy]:
    """A variant-like struct (Spark's VARIANT as Parquet stores it: metadata and value bytes), nullable."""
    schema = {"type": "record", "name": f"V{n}", "fields": [{"name": "metadata", "type": "bytes"},
                                                            {"name": "value", "type": "bytes"}]}
    values = st.fixed_dictionaries({"metadata": st.binary(max_size=4), "value": st.binary(max_size=6)})
    return {"name": f"v{n}", "type": ["null", schema]}, st.one_of(st.none(), values)


@st.composite
def _records_field(draw, n: int):
    """(avro field, value strategy): a (nullable) list of records, each holding a field of any
    shape, a nullable nested record (a record of records) and a variant-like struct."""
    inner, inner_values, _ = draw(_field(n * 10 + 1, 1))
    leaf, leaf_values, _ = draw(_field(n * 10 + 2, 2))
    nested = {"type": "record", "name": f"E{n}", "fields": [leaf]}
    variant, variant_values = _variant(n * 10 + 3)
    item = {"type": "record", "name": f"I{n}", "fields": [inner, {"name": "info", "type": ["null", nested]}, variant]}
    item_values = st.fixed_dictionaries({inner["name"]: inner_values, variant["name"]: variant_values,
                                         "info": st.one_of(st.none(), st.fixed_dictionaries({leaf["name"]: leaf_values}))})
    values = st.lists(item_values, max_size=4)
    if draw(st.booleans()):
        return {"name": f"hits{n}", "type": ["null", {"type": "array", "items": item}]}, st.one_of(st.none(), values)
    return {"name": f"hits{n}", "type": {"type": "array", "items": item}}, values


@st.composite
def wide_nested_cases(draw, max_records: int = 20) -> AvroCase:
    """``avro_cases`` plus lists of records of records and variant-like structs, which
    the case's config does not read (for ``infer``, which drafts its own)."""
    case = draw(avro_cases(max_records))
    extra = [draw(_records_field(1000 + k)) for k in range(draw(st.integers(1, 3)))]
    extra.append(_variant(2000))
    fields = case.schema["fields"] + [f for f, _ in extra]
    more = draw(st.lists(st.fixed_dictionaries({f["name"]: v for f, v in extra}),
                         min_size=len(case.records), max_size=len(case.records)))
    records = [{**r, **m} for r, m in zip(case.records, more, strict=True)]
    return AvroCase({**case.schema, "fields": fields}, records, case.config, case.codec)


def avro_bytes(case: AvroCase, sync_interval: int = 200) -> bytes:
    """The case as an Avro container file (small blocks, so files have several)."""
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(copy.deepcopy(case.schema)), case.records,
                    codec=case.codec, sync_interval=sync_interval)
    return buf.getvalue()


# ------------------------------------------------------------------- JSON

_KEYS = st.sampled_from(["x", "n", "s", "tags", "user", "id", "b", "y", "", "é", "a.b"])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
    st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, 1e308, -0.0, 0, "", "NaN"]),
)
json_values = st.recursive(_SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(_KEYS, kids, max_size=4)),
                           max_leaves=20)
json_documents = st.one_of(st.dictionaries(_KEYS, json_values, max_size=6), json_values)

#: A config touching every transform over the keys json_documents uses.
JSON_CONFIG = {
    "label": {"source": "y", "dtype": "int64"},
    "features": [
        {"name": "x", "transform": "zscore", "missing_indicator": True},
        {"name": "xl", "source": "x", "transform": "log1p", "on_nan": "fill"},
        {"name": "xk", "source": "n", "transform": "minmax", "on_nan": "keep"},
        {"name": "s", "transform": "vocabulary"},
        {"name": "st", "source": "s", "transform": "text", "max_len": 3},
        {"name": "tags", "transform": "vocabulary", "max_len": 2},
        {"name": "nums", "source": "tags", "transform": "identity", "max_len": 2, "on_nan": "fill"},
        {"name": "uid", "source": "user.id", "transform": "hash", "buckets": 16},
        {"name": "b", "transform": "bytes"},
        {"name": "idc", "source": "id", "transform": "clip", "clip_min": -1, "clip_max": 1},
    ],
}


def json_line(v: Any) -> bytes:
    """Python's encoder: writes NaN/Infinity and big ints the way real producers do."""
    return json.dumps(v, allow_nan=True).encode()
