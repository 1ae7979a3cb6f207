"""convert.sources: the Avro fast path (polars) gives exactly the fastavro path's records.

The contract: with ``decoder="auto"`` every batch holds the same records, with
the same Python types (float bits included), offsets, indexes and errors as
with ``decoder="fastavro"``; the fast path is taken only for whitelisted
schemas and codecs, and any block it cannot decode goes to fastavro.
"""

from __future__ import annotations

import copy
import io
import math
import struct
from pathlib import Path

import fastavro
import numpy as np
import pytest
from _record_strategies import avro_bytes, avro_cases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert.column_records import ColumnRecords
from convert.formats import avro_columnar
from convert.formats.avro_columnar import columnar_schema as _columnar_schema
from convert.sources import InputFileError, iter_avro
from convert.splits import _canonical

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def _same(a, b) -> bool:
    """Equal values of the same types (``1 == 1.0 == True`` is not enough), NaN and -0.0 included."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    return a == b


def _read(data: bytes, decoder: str, start: int = 0, end: int | None = None, batch_size: int = 5, jsons=None):
    """(records, offsets, indexes, batch record types, error or None); ``jsons``
    (a list) gets each record's ``record_json`` (None where the batch has none)."""
    recs, offs, idxs, kinds, err = [], [], [], [], None
    try:
        for b in iter_avro(io.BytesIO(data), "mem.avro", start, end, batch_size=batch_size, decoder=decoder,
                           record_json=jsons is not None):
            kinds.append(type(b.records))
            if jsons is not None:
                jsons.extend(getattr(b.records, "record_json", None) or [None] * len(b.records))
            recs.extend(b.records)
            offs.extend(b.offsets)
            idxs.extend(b.indexes)
    except InputFileError as e:
        err = str(e)
    return recs, offs, idxs, kinds, err


def _assert_same_reads(data: bytes, **kw) -> list[type]:
    """Same records either way; the fast path's ``record_json`` is what the
    split would make from the fastavro path's dict (``splits._canonical``)."""
    jsons: list = []
    fast = _read(data, "auto", jsons=jsons, **kw)
    slow = _read(data, "fastavro", **kw)
    assert len(fast[0]) == len(slow[0])
    assert all(map(_same, fast[0], slow[0])), next((a, b) for a, b in zip(fast[0], slow[0], strict=True) if not _same(a, b))
    assert fast[1:3] == slow[1:3]
    assert fast[4] == slow[4]
    assert all(k is list for k in slow[3])
    made = [(j, r) for j, r in zip(jsons, slow[0], strict=True) if j is not None]
    assert [j for j, _ in made] == [_canonical(r) for _, r in made]
    if ColumnRecords in fast[3]:
        assert made  # the fast path gave them (no silent fallback)
    return fast[3]


def _avro(schema: dict, records: list[dict], codec: str = "null", sync_interval: int = 60) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(copy.deepcopy(schema)), records, codec=codec, sync_interval=sync_interval)
    return buf.getvalue()


def _rec(*fields: dict) -> dict:
    return {"type": "record", "name": "R", "namespace": "t", "fields": list(fields)}


# Every whitelisted shape, with the values that tell types apart.
WIDE = _rec(
    {"name": "b", "type": "boolean"},
    {"name": "i", "type": "int"},
    {"name": "l", "type": "long"},
    {"name": "f", "type": "float"},
    {"name": "d", "type": "double"},
    {"name": "s", "type": "string"},
    {"name": "by", "type": "bytes"},
    {"name": "fx", "type": {"type": "fixed", "name": "F3", "size": 3}},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
    {"name": "ni", "type": ["null", "int"]},
    {"name": "ns", "type": ["string", "null"]},
    {"name": "nb", "type": ["null", "bytes"]},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tu", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "dt", "type": {"type": "int", "logicalType": "date"}},
    {"name": "uu", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "al", "type": {"type": "array", "items": "long"}},
    {"name": "an", "type": {"type": "array", "items": ["null", "string"]}},
    {"name": "na", "type": ["null", {"type": "array", "items": "double"}]},
    {"name": "u", "type": ["null", {"type": "record", "name": "U", "fields": [
        {"name": "seg", "type": ["null", "string"]},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "inner", "type": {"type": "record", "name": "V", "fields": [{"name": "x", "type": "float"}]}},
    ]}]},
    {"name": "ar", "type": {"type": "array", "items": {"type": "record", "name": "I", "fields": [
        {"name": "k", "type": "string"}, {"name": "v", "type": ["null", "double"]}]}}},
)


def _wide_records(n: int) -> list[dict]:
    out = []
    for k in range(n):
        odd = k % 2 == 1
        out.append({
            "b": odd, "i": [-(2**31), 0, 2**31 - 1][k % 3], "l": [-(2**63), 0, 2**63 - 1, 2**53 + 1][k % 4],
            "f": [0.0, -0.0, float("nan"), 1.1, float("inf"), 3.4e38][k % 6], "d": [-0.0, 1e-310, float("-inf"), 0.1][k % 4],
            "s": ["", "é\u0000😀", "x" * 50][k % 3], "by": [b"", b"\x00\xff", b"abc"][k % 3], "fx": b"\x00\x01\x02",
            "e": "ABC"[k % 3], "ni": None if odd else k, "ns": None if k % 3 == 0 else "" if k % 3 == 1 else "v",
            "nb": None if odd else b"", "ts": [-62_135_596_800_000 * 10, 0, 253_402_300_799_999 * 5][k % 3],
            "tu": None if k % 3 == 0 else 2**62, "dt": [-1_000_000, 0, 3_000_000][k % 3],
            "uu": "a5e4f2a0-0000-4000-8000-000000000000",
            "al": list(range(k % 4)), "an": [None, "a", ""][: k % 4], "na": None if odd else [0.5] * (k % 3),
            "u": None if k % 4 == 3 else {"seg": None if odd else "s", "t": k, "inner": {"x": 0.25}},
            "ar": [{"k": "a", "v": None}, {"k": "", "v": -1.5}][: k % 3],
        })
    return out


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy"])
def test_every_whitelisted_type_decodes_to_fastavros_values(codec):
    data = _avro(WIDE, _wide_records(37), codec)
    kinds = _assert_same_reads(data, batch_size=8)
    assert kinds and all(k is ColumnRecords for k in kinds)  # the fast path was taken


def test_byte_ranges_partition_the_records_as_on_the_fastavro_path():
    data = _avro(WIDE, _wide_records(60), "deflate", sync_interval=200)
    whole = _read(data, "auto")[0]
    for cuts in ([0, len(data) // 3, 2 * len(data) // 3, len(data)], [0, 1, 5000, len(data)]):
        got = []
        for a, b in zip(cuts, cuts[1:], strict=False):
            _assert_same_reads(data, start=a, end=b, batch_size=7)
            got += _read(data, "auto", a, b, 7)[0]
        assert all(map(_same, got, whole)) and len(got) == len(whole) == 60


_ENUM = {"type": "enum", "name": "NE", "symbols": ["A", "B"]}


@pytest.mark.parametrize(("field_type", "values"), [
    ({"type": "map", "values": "int"}, [{"k": 1}, {}]),
    (["null", "int", "string"], ["s", 3]),
    (["null", _ENUM], ["A", None]),
    ({"type": "array", "items": _ENUM}, [["A", "B"], []]),
    ({"type": "record", "name": "S", "fields": [{"name": "e", "type": _ENUM}]}, [{"e": "B"}, {"e": "A"}]),
    ("null", [None, None]),
    ({"type": "int", "logicalType": "time-millis"}, [86_400_000, 0]),  # 24:00, which polars turns into null
    ({"type": "bytes", "logicalType": "decimal", "precision": 5, "scale": 2}, [b"\x01", b""]),
    ({"type": "long", "logicalType": "timestamp-nanos"}, [2**62, -1]),
    ({"type": "long", "logicalType": "local-timestamp-millis"}, [2**50, 0]),
    (["null", "t.R"], [{"a": 2, "x": None}, None]),  # a named-type reference (here: recursion)
])
def test_schemas_off_the_whitelist_take_the_fastavro_path(field_type, values):
    schema = _rec({"name": "a", "type": "int"}, {"name": "x", "type": field_type})
    assert not _columnar_schema(schema)
    kinds = _assert_same_reads(_avro(schema, [{"a": i, "x": v} for i, v in enumerate(values)]))
    assert kinds and all(k is list for k in kinds)


def test_a_record_with_no_fields_is_off_the_whitelist():
    assert not _columnar_schema(_rec())  # polars decodes it as zero rows


@pytest.mark.parametrize("codec", ["zstandard", "bzip2", "xz"])
def test_codecs_off_the_whitelist_take_the_fastavro_path(codec):
    kinds = _assert_same_reads(_avro(WIDE, _wide_records(9), codec))
    assert all(k is list for k in kinds)


def test_a_corrupt_block_gives_the_fastavro_paths_records_then_error():
    data = bytearray(_avro(WIDE, _wide_records(40), "deflate", sync_interval=100))
    offsets = sorted(set(_read(bytes(data), "fastavro")[1]))
    assert len(offsets) >= 4
    data[offsets[2] + 8: offsets[2] + 20] = b"\xff" * 12  # inside the third block's compressed data
    _assert_same_reads(bytes(data), batch_size=4)
    data2 = bytes(data[: offsets[3] + 5])  # and a file that ends inside a block
    _assert_same_reads(data2, batch_size=4)
    assert _read(data2, "auto")[4] is not None


def test_deflate_blocks_reach_polars_inflated_behind_the_files_metadata(monkeypatch):
    """The fast path inflates deflate blocks itself (zlib-ng) and hands polars a
    null-codec file with the original metadata and sync marker: same records."""
    import polars as pl

    from convert.formats.avro_framing import null_codec_header as _null_codec_header

    real, seen = pl.read_avro, []
    monkeypatch.setattr(pl, "read_avro", lambda src, *a, **kw: (seen.append(src.getvalue()), real(src, *a, **kw))[1])
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(copy.deepcopy(WIDE)), _wide_records(40), codec="deflate",
                    sync_interval=100, metadata={"app.note": "kept"})
    data = buf.getvalue()
    kinds = _assert_same_reads(data, batch_size=7)
    assert kinds and all(k is ColumnRecords for k in kinds) and seen
    header = fastavro.reader(io.BytesIO(data))._header
    for sent in seen:
        got = fastavro.reader(io.BytesIO(sent))
        assert got.codec == "null" and got.metadata["app.note"] == "kept"
        assert got._header["sync"] == header["sync"]
    end = data.index(header["sync"]) + 16
    assert _null_codec_header(data[:end - 1]) is None and _null_codec_header(b"Obj\x02" + data[4:end]) is None


def test_when_polars_fails_on_a_batch_fastavro_reads_from_that_block_on(monkeypatch):
    import polars as pl

    real = pl.read_avro
    calls = {"n": 0}

    class FakePanic(BaseException):  # what pyo3 raises for a Rust panic (not an Exception)
        pass

    def flaky(src, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise FakePanic("internal error: entered unreachable code")
        return real(src, *a, **kw)

    monkeypatch.setattr(pl, "read_avro", flaky)
    data = _avro(WIDE, _wide_records(50), "deflate", sync_interval=100)
    kinds = _assert_same_reads(data, batch_size=6)
    assert kinds[0] is ColumnRecords and list in kinds  # fast, then fastavro from the failing batch on
    monkeypatch.setattr(pl, "read_avro", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):  # never swallowed
        _read(data, "auto")


def test_column_records_behave_as_the_list_of_records():
    cr = ColumnRecords({"a": [1, 2, 3], "b": ["x", None, "z"]}, 3)
    assert len(cr) == 3 and cr[1] == {"a": 2, "b": None} and cr[-1] == {"a": 3, "b": "z"}
    assert cr == [{"a": 1, "b": "x"}, {"a": 2, "b": None}, {"a": 3, "b": "z"}] and cr[1:] == list(cr)[1:]
    with pytest.raises(IndexError):
        cr[3]
    with pytest.raises(ValueError, match="one value per record"):
        ColumnRecords({"a": [1]}, 2)


def test_deferred_columns_are_made_on_first_use_in_field_order():
    made = []

    def make(values):
        return lambda: made.append(values) or list(values)

    cr = ColumnRecords({"a": None, "b": ["x", "y"], "c": None}, 2, deferred={"a": make([1, 2]), "c": make([0.5, None])})
    assert cr.fields == ["a", "b", "c"] and cr.deferred_fields == ["a", "c"] and made == []
    assert repr(cr) == "ColumnRecords(2 records, fields ['a', 'b', 'c'])" and made == []
    assert cr.column("c") == [0.5, None] and cr.deferred_fields == ["a"]
    assert cr.column("nope", "dflt") == "dflt"
    assert list(cr) == [{"a": 1, "b": "x", "c": 0.5}, {"a": 2, "b": "y", "c": None}]  # keys in field order
    assert cr.deferred_fields == [] and len(made) == 2
    bad = ColumnRecords({"a": None}, 3, deferred={"a": lambda: [1]})
    with pytest.raises(ValueError, match="1 values for 3 records"):
        bad.column("a")


def test_unknown_decoder_is_refused():
    with pytest.raises(ValueError, match="auto, fastavro"):
        list(iter_avro(io.BytesIO(_avro(WIDE, _wide_records(1))), "x.avro", decoder="polars"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(avro_cases())
def test_random_schemas_and_records_decode_alike(case):
    _assert_same_reads(avro_bytes(case, sync_interval=50), batch_size=3)


def _realdata_avro() -> list[Path]:
    return sorted(REALDATA.rglob("*.avro*")) if REALDATA.is_dir() else []


@pytest.mark.skipif(not _realdata_avro(), reason="../shared/realdata is not beside the project")
def test_real_files_from_other_writers_decode_alike():
    fast_files = 0
    for path in _realdata_avro():
        data = path.read_bytes()
        kinds = _assert_same_reads(data, batch_size=100)
        fast_files += ColumnRecords in kinds
    assert fast_files >= 5  # the fast path did run on real files (Java, Go, JS, Spark writers)


def test_the_whitelist_is_what_the_decoder_sees():
    assert _columnar_schema(WIDE)
    assert avro_columnar.COLUMNAR_CODECS == {"null", "deflate", "snappy"}


NUMERIC = _rec(
    {"name": "i", "type": "int"},
    {"name": "l", "type": ["null", "long"]},
    {"name": "f", "type": "float"},
    {"name": "d", "type": ["null", "double"]},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "dt", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "fl", "type": {"type": "array", "items": "float"}},
    {"name": "nl", "type": ["null", {"type": "array", "items": "long"}]},
    {"name": "hole", "type": {"type": "array", "items": ["null", "double"]}},  # null items: the per-value path
    {"name": "b", "type": "boolean"},
    {"name": "s", "type": ["null", "string"]},
)


def _numeric_records(n: int) -> list[dict]:
    big = [2**53 + 1, -(2**63), 2**63 - 1, 0, 7]
    return [{
        "i": k - 3, "l": None if k % 5 == 0 else big[k % 5], "f": [0.5, float("nan"), float("inf"), -0.0, 3.4e38][k % 5],
        "d": None if k % 4 == 1 else [1e300, -1e-300, float("-inf"), 2.5][k % 4], "ts": [253_402_300_799_999 * 3, -1, 0][k % 3],
        "dt": None if k % 3 == 0 else k * 1000, "fl": [float(j) / 3 for j in range(k % 7)],
        "nl": None if k % 2 else [2**60 + j for j in range(k % 4)], "hole": [None, 1.5][: k % 3],
        "b": k % 2 == 0, "s": None if k % 3 else f"s{k % 4}",
    } for k in range(n)]


def _vectorize(config, batches):
    """(analysis JSON, vectorized batches, the fields whose lists each batch made)
    of a unit's batches, the whole training split analyzed."""
    from convert.analysis import Analyzer
    from convert.prepare import Preparer
    from convert.vectorize import Vectorizer

    prep, acc = Preparer(config, unit_terms=True), Analyzer(config)
    prepared, made = [], []
    for b in batches:
        pb = prep.prepare(b.records, analyze=True)
        made.append(set(b.records.fields) - set(b.records.deferred_fields) if type(b.records) is ColumnRecords else None)
        acc.add_prepared(pb, np.ones(len(b), dtype=bool))
        pb.analysis = None
        prepared.append(pb)
    acc.flush()
    analysis = acc.result()
    vec = Vectorizer(config, analysis)
    return analysis.to_json(), [vec.finish(pb) for pb in prepared], made


def _assert_same_vectors(a_vbs, f_vbs) -> None:
    for va, vf in zip(a_vbs, f_vbs, strict=True):
        assert [(r.index, r.field, r.reason) for r in va.rejections] == [(r.index, r.field, r.reason) for r in vf.rejections]
        np.testing.assert_array_equal(va.keep, vf.keep)
        assert va.columns.keys() == vf.columns.keys()
        for k in va.columns:
            assert va.columns[k][0] == vf.columns[k][0]
            np.testing.assert_array_equal(va.columns[k][1], vf.columns[k][1], err_msg=k)


def test_the_vectorizer_gives_the_same_columns_from_column_batches():
    """The numeric fast paths read ``ColumnRecords.arrays`` (numpy from polars) instead
    of the Python values: columns, rejections and analysis equal the dict path's."""
    from convert.config import parse_config

    config = parse_config({"features": [
        {"name": "i", "transform": "zscore"}, {"name": "l", "transform": "identity", "missing_indicator": True},
        {"name": "f", "transform": "minmax", "on_nan": "fill"}, {"name": "d", "transform": "log1p", "missing_indicator": True},
        {"name": "ts", "transform": "identity"}, {"name": "dt", "transform": "zscore", "fill": "mean"},
        {"name": "fl", "transform": "identity", "max_len": 4}, {"name": "nl", "transform": "clip", "clip_min": 0.0, "max_len": 3},
        {"name": "hole", "transform": "identity", "max_len": 2}, {"name": "b", "transform": "identity"},
        {"name": "s", "transform": "vocabulary"},
    ]})
    data = _avro(NUMERIC, _numeric_records(97), "deflate", sync_interval=300)
    results = {}
    for decoder in ("auto", "fastavro"):
        batches = list(iter_avro(io.BytesIO(data), "n.avro", batch_size=40, decoder=decoder))
        assert (type(batches[0].records) is ColumnRecords) == (decoder == "auto")
        if decoder == "auto":
            assert {"i", "l", "f", "d", "ts", "dt", "fl", "nl"} <= set(batches[0].records.arrays)
            assert "hole" not in batches[0].records.arrays and "b" not in batches[0].records.arrays
        a_json, vbs, made = _vectorize(config, batches)
        if decoder == "auto":  # the numeric features read arrays: their lists are never made
            assert all(not {"i", "l", "f", "d", "ts", "dt", "fl", "nl"} & fields for fields in made)
        results[decoder] = (a_json, vbs)
    (a_json, a_vbs), (f_json, f_vbs) = results["auto"], results["fastavro"]
    assert a_json == f_json
    _assert_same_vectors(a_vbs, f_vbs)
    assert any(vb.rejections for vb in f_vbs)  # the data does reach the rejection paths


TERMS = _rec(
    {"name": "s", "type": ["null", "string"]},
    {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B", "C"]}},
    {"name": "tags", "type": ["null", {"type": "array", "items": "string"}]},
    {"name": "holes", "type": {"type": "array", "items": ["null", "string"]}},  # null items: the per-value path
    {"name": "n", "type": ["null", "long"]},
    {"name": "k", "type": "int"},
    {"name": "x", "type": "string"},
    {"name": "u", "type": ["null", {"type": "record", "name": "U", "fields": [
        {"name": "s", "type": ["null", "string"]}, {"name": "i", "type": "int"},
        {"name": "v", "type": {"type": "record", "name": "V", "fields": [{"name": "d", "type": ["null", "double"]}]}},
        {"name": "l", "type": {"type": "array", "items": "string"}}]}]},
)


def _terms_config():
    from convert.config import parse_config

    return parse_config({"features": [
        {"name": "s", "transform": "vocabulary", "num_oov_buckets": 2},
        {"name": "s_hash", "source": "s", "transform": "hash", "buckets": 7},
        {"name": "e", "transform": "vocabulary"},
        {"name": "tags", "transform": "vocabulary", "max_len": 3, "top_k": 4},
        {"name": "holes", "transform": "vocabulary", "max_len": 2},
        {"name": "n", "transform": "hash", "buckets": 5},
        {"name": "k", "transform": "vocabulary", "min_frequency": 2},
        {"name": "x", "transform": "vocabulary"},
        {"name": "x_text", "source": "x", "transform": "text", "max_len": 2},  # x is read as values too
        {"name": "us", "source": "u.s", "transform": "vocabulary"},  # fields of a nullable record
        {"name": "ui", "source": "u.i", "transform": "zscore", "missing_indicator": True},
        {"name": "ui_hash", "source": "u.i", "transform": "hash", "buckets": 3},
        {"name": "uvd", "source": "u.v.d", "transform": "identity", "missing_indicator": True},
    ]})


def _terms_outputs(data: bytes, decoder: str, batch_size: int):
    """(analysis JSON, vectorized batches, lists made per batch) of the TERMS config."""
    batches = list(iter_avro(io.BytesIO(data), "t.avro", batch_size=batch_size, decoder=decoder))
    assert (type(batches[0].records) is ColumnRecords) == (decoder == "auto")
    return _vectorize(_terms_config(), batches)


_WORDS = st.sampled_from(["", "a", "b", "A", "é", "x y", "\x00", "日本", "a" * 30])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.none() | _WORDS, st.sampled_from("ABC"), st.none() | st.lists(_WORDS, max_size=4),
                          st.lists(st.none() | _WORDS, max_size=3), st.none() | st.integers(-(2**63), 2**63 - 1),
                          st.integers(-3, 3), _WORDS), min_size=1, max_size=60),
       st.integers(1, 25))
def test_string_columns_as_codes_give_the_dict_paths_ids(rows, batch_size):
    """Vocabulary and hash features read string, enum and integer columns as
    distinct values plus codes (``TermCodes``, made by polars), not as Python
    values, and features of a record's fields read them as codes or arrays:
    ids, rejections and the analysis equal the fastavro path's, and a column
    only those features read never becomes a Python list."""
    records = [{"s": r[0], "e": r[1], "tags": r[2], "holes": r[3], "n": r[4], "k": r[5], "x": r[6],
                "u": None if r[5] == 0 else {"s": r[0], "i": r[5], "v": {"d": None if r[4] is None else r[4] / 3}, "l": r[2] or []}}
               for r in rows]
    data = _avro(TERMS, records, "deflate", sync_interval=200)
    a_json, a_vbs, made = _terms_outputs(data, "auto", batch_size)
    f_json, f_vbs, _ = _terms_outputs(data, "fastavro", batch_size)
    assert a_json == f_json
    _assert_same_vectors(a_vbs, f_vbs)
    for fields in made:  # s, e, n, k, the fields of u and (without null items) tags came as codes or arrays
        assert fields <= {"x", "holes", "tags"}, fields


def test_term_codes_keep_first_occurrence_order_and_nulls():
    import polars as pl

    from convert.column_records import term_coders as _term_coders
    from convert.formats.avro_columnar import _leaves

    df = pl.DataFrame({"s": ["b", None, "a", "b", ""], "l": [["x", "y"], None, [], ["y"], ["z", "x"]],
                       "holes": [["x", None], [], [], [], []], "i": [7, None, -2, 7, 2**40], "f": [1.0, 2.0, 3.0, 4.0, 5.0]},
                      schema={"s": pl.String, "l": pl.List(pl.String), "holes": pl.List(pl.String), "i": pl.Int64, "f": pl.Float64})
    coders = _term_coders(_leaves(df))
    assert set(coders) == {"s", "l", "holes", "i"}
    s = coders["s"]()
    assert (s.kind, s.values, s.codes.tolist()) == ("scalar", ["b", "a", ""], [0, -1, 1, 0, 2])
    lst = coders["l"]()
    assert (lst.kind, lst.values, lst.codes.tolist(), lst.counts.tolist()) == ("list", ["x", "y", "z"], [0, 1, 1, 2, 0], [2, 0, 0, 1, 2])
    assert coders["holes"]() is None  # a null item: the vectorizer decides per value
    i = coders["i"]()
    assert (i.values, i.codes.tolist()) == ([7, -2, 2**40], [0, -1, 1, 0, 2])


def test_term_codes_made_together_equal_those_made_one_by_one():
    """``ColumnRecords.make_term_codes`` makes the scalar string columns' codes in
    two polars queries for all of them: the same values, codes and dtype as each
    column's own ``term_codes`` (nulls, an all-null column, "", an enum, a record's field)."""
    schema = _rec({"name": "a", "type": ["null", "string"]}, {"name": "b", "type": "string"},
                  {"name": "none", "type": ["null", "string"]},
                  {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["X", "Y"]}},
                  {"name": "i", "type": "long"}, {"name": "l", "type": {"type": "array", "items": "string"}},
                  {"name": "u", "type": ["null", {"type": "record", "name": "U", "fields": [{"name": "s", "type": "string"}]}]})
    rows = [{"a": [None, "x", "", "日本"][k % 4], "b": str(k % 3), "none": None, "e": "XY"[k % 2], "i": k % 5,
             "l": ["p", "q"][: k % 3], "u": None if k % 4 == 0 else {"s": "s" + str(k % 2)}} for k in range(30)]
    data = _avro(schema, rows, "deflate", sync_interval=200)
    names = ["a", "b", "none", "e", "i", "l", "u.s", "missing"]
    one, together = (next(iter_avro(io.BytesIO(data), "t.avro", batch_size=100)).records for _ in range(2))
    together.make_term_codes(names)
    assert set(together._codes) == {"a", "b", "none", "e", "u.s"}  # made now: the scalar string columns
    for name in names:
        x, y = one.term_codes(name), together.term_codes(name)
        assert (x is None) == (y is None) and (x is None or (
            (x.kind, x.values, x.codes.tolist(), x.codes.dtype) == (y.kind, y.values, y.codes.tolist(), y.codes.dtype))), name


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(), st.floats(width=32), st.text(), st.binary(max_size=6), st.integers(-(2**63), 2**63 - 1),
                          st.lists(st.floats(width=32, allow_nan=False), max_size=3)), min_size=1, max_size=40))
def test_record_json_from_polars_is_what_the_split_makes_from_dicts(rows):
    """Every double (NaN, infinities, subnormals, -0.0), float32, string (controls,
    astral characters), bytes and int64, alone and in lists and a nullable struct:
    polars writes the bytes orjson writes for the record's dict."""
    import polars as pl

    from convert.formats.avro_columnar import _records_json

    df = pl.DataFrame(
        {"d": [r[0] for r in rows], "f": [r[1] for r in rows], "s": [r[2] for r in rows], "b": [r[3] for r in rows],
         "i": [r[4] for r in rows], "fl": [r[5] for r in rows],
         "st": [None if k % 3 == 0 else {"z": r[2], "a": r[1]} for k, r in enumerate(rows)]},
        schema={"d": pl.Float64, "f": pl.Float32, "s": pl.String, "b": pl.Binary, "i": pl.Int64,
                "fl": pl.List(pl.Float32), "st": pl.Struct({"z": pl.String, "a": pl.Float32})},
    )
    assert _records_json(df) == [_canonical(r) for r in df.to_dicts()]


# Lists of records (issue 19): paths through lists read with column operations.
ORDERS = _rec(
    {"name": "orders", "type": ["null", {"type": "array", "items": ["null", {"type": "record", "name": "O", "fields": [
        {"name": "id", "type": "string"},
        {"name": "total", "type": ["null", "double"]},
        {"name": "items", "type": ["null", {"type": "array", "items": {"type": "record", "name": "It", "fields": [
            {"name": "sku", "type": ["null", "string"]}, {"name": "qty", "type": "long"}]}}]}]}]}]},
    {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": "double"}}},
    {"name": "user", "type": ["null", {"type": "record", "name": "Us", "fields": [
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}]},
)


def _orders_config():
    from convert.config import parse_config

    return parse_config({"features": [
        {"name": "order_id", "source": "orders[].id", "transform": "vocabulary", "max_len": 3},
        {"name": "order_id_h", "source": "orders[].id", "transform": "hash", "buckets": 9, "max_len": 3},
        {"name": "total", "source": "orders[].total", "transform": "identity", "max_len": 3, "missing_indicator": True},
        {"name": "total_mean", "source": "orders[].total", "transform": "log1p", "fill": "mean", "max_len": 2},
        {"name": "sku", "source": "orders[].items[].sku", "transform": "vocabulary", "max_len": 4},
        {"name": "sku_text", "source": "orders[].items[].sku", "transform": "text", "max_len": 4},
        {"name": "qty", "source": "orders[].items[].qty", "transform": "clip", "clip_max": 5.0, "max_len": 4},
        {"name": "n_orders", "source": "orders", "transform": "count"},
        {"name": "n_items", "source": "orders[].items[]", "transform": "count"},
        {"name": "grid", "source": "grid[][]", "transform": "identity", "max_len": 5},
        {"name": "grid0", "source": "grid[0]", "transform": "identity", "max_len": 2},
        {"name": "utags", "source": "user.tags[]", "transform": "vocabulary", "max_len": 2},
    ]})


_ITEM = st.fixed_dictionaries({"sku": st.none() | _WORDS, "qty": st.integers(-(2**40), 2**40)})
_ORDER = st.none() | st.fixed_dictionaries({
    "id": _WORDS, "total": st.none() | st.floats(-1e6, 1e6) | st.just(float("nan")),
    "items": st.none() | st.lists(_ITEM, max_size=3)})
_ORDERS_ROW = st.fixed_dictionaries({
    "orders": st.none() | st.lists(_ORDER, max_size=3),
    "grid": st.lists(st.lists(st.floats(-10, 10), max_size=3), max_size=3),
    "user": st.none() | st.fixed_dictionaries({"tags": st.lists(_WORDS, max_size=3)})})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_ORDERS_ROW, min_size=1, max_size=40), st.integers(1, 25))
def test_lists_of_records_read_by_column_operations_give_the_dict_paths_columns(rows, batch_size):
    """Paths through lists of records (``orders[].items[].sku``, counts, lists of
    lists) give the same ids, floats, lengths, rejections and analysis on the
    fast path as from fastavro's dicts, and the lists of records never become
    Python dicts on the fast path."""
    data = _avro(ORDERS, rows, "deflate", sync_interval=200)
    out = {}
    for decoder in ("auto", "fastavro"):
        batches = list(iter_avro(io.BytesIO(data), "o.avro", batch_size=batch_size, decoder=decoder))
        assert (type(batches[0].records) is ColumnRecords) == (decoder == "auto")
        out[decoder] = _vectorize(_orders_config(), batches)
    (a_json, a_vbs, made), (f_json, f_vbs, _) = out["auto"], out["fastavro"]
    assert a_json == f_json
    _assert_same_vectors(a_vbs, f_vbs)
    for fields in made:
        assert not fields, fields  # no column became Python values (grid[0] included)


_LEAF_VALUES = {"long": st.integers(-(2**40), 2**40), "double": st.floats(), "string": _WORDS}


@st.composite
def _shape(draw, depth: int, names: list[int]):
    """``(schema, values, paths)`` of a random field type: leaves, nullable unions,
    records and arrays (of records, of arrays) nested up to 3 deep; ``paths`` are
    the steps below it to each leaf (``EACH`` for an array's items) with the
    leaf's type, and to each array with ``"array"``."""
    from convert.config import EACH

    shape = draw(st.sampled_from(["leaf", "record", "array", "array"] if depth < 3 else ["leaf"]))
    if shape == "leaf":
        t = draw(st.sampled_from(sorted(_LEAF_VALUES)))
        schema, values, paths = t, _LEAF_VALUES[t], [((), t)]
    elif shape == "record":
        names[0] += 1
        name = f"N{names[0]}"
        subs = [draw(_shape(depth + 1, names)) for _ in range(draw(st.integers(1, 3)))]
        schema = {"type": "record", "name": name, "fields": [{"name": f"k{j}", "type": s[0]} for j, s in enumerate(subs)]}
        values = st.fixed_dictionaries({f"k{j}": s[1] for j, s in enumerate(subs)})
        paths = [((f"k{j}", *p), t) for j, s in enumerate(subs) for p, t in s[2]]
    else:
        sub = draw(_shape(depth + 1, names))
        schema, values = {"type": "array", "items": sub[0]}, st.lists(sub[1], max_size=3)
        paths = [((), "array"), *(((EACH, *p), t) for p, t in sub[2])]
    if draw(st.booleans()):
        schema, values = ["null", schema], st.none() | values
    return schema, values, paths


@st.composite
def _list_path_cases(draw):
    """A schema of 1-3 random fields, records for it, and a config reading every
    path through its arrays: vocabulary and hash of strings, identity of numbers
    (max_len 3), count of every array."""
    from convert.config import EACH, render_path

    names = [0]
    tops = [draw(_shape(0, names)) for _ in range(draw(st.integers(1, 3)))]
    schema = _rec(*({"name": f"t{j}", "type": s[0]} for j, s in enumerate(tops)))
    records = draw(st.lists(st.fixed_dictionaries({f"t{j}": s[1] for j, s in enumerate(tops)}), min_size=1, max_size=30))
    features = []
    for j, (_, _, paths) in enumerate(tops):
        for p, t in paths:
            source = render_path((f"t{j}", *p))
            if t == "array":
                features.append({"source": source, "transform": "count"})
            elif EACH not in p:
                continue
            elif t == "string":
                features += [{"source": source, "transform": "vocabulary", "max_len": 3},
                             {"source": source, "transform": "hash", "buckets": 11, "max_len": 3}]
            else:
                features.append({"source": source, "transform": "identity", "max_len": 3, "on_nan": "keep"})
    if not features:
        features.append({"source": "t0", "transform": "hash", "buckets": 5})
    return schema, records, {"features": [{"name": f"f{i}", **f} for i, f in enumerate(features)]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(_list_path_cases(), st.integers(1, 12))
def test_random_paths_through_arrays_give_the_same_columns_on_both_decoders(case, batch_size):
    """Random nestings of arrays, records and nullable unions, every path through
    their arrays as a feature: the fast path's columns, rejections and analysis
    equal the fastavro path's."""
    from convert.config import parse_config

    schema, records, raw = case
    config = parse_config(raw)
    data = _avro(schema, records, "deflate", sync_interval=100)
    out = {}
    for decoder in ("auto", "fastavro"):
        batches = list(iter_avro(io.BytesIO(data), "r.avro", batch_size=batch_size, decoder=decoder))
        if decoder == "auto":
            assert (type(batches[0].records) is ColumnRecords) == _columnar_schema(schema)
        out[decoder] = _vectorize(config, batches)
    assert out["auto"][0] == out["fastavro"][0]
    _assert_same_vectors(out["auto"][1], out["fastavro"][1])
