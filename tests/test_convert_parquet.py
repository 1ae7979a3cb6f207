"""Parquet input (convert/formats/parquet*.py): the record model shared with Avro,
row groups as byte-range units, partitions, the schema ``infer`` and the
check read, and errors naming file, row group and field."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convert.check import InputCheck, check_inputs
from convert.config import parse_config
from convert.formats.parquet_reader import iter_parquet, row_group_offsets
from convert.formats.parquet_types import partition_fields
from convert.infer import infer_config
from convert.source_types import InputFileError
from convert.sources import (
    detect_format,
    is_splittable,
    iter_avro,
    iter_records,
    read_record_schema,
)

UTC = dt.UTC

#: One Avro schema with every logical type both formats hold, and its Parquet (Arrow) twin.
AVRO_SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts_ms", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    {"name": "ts_us", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
    {"name": "t_ms", "type": ["null", {"type": "int", "logicalType": "time-millis"}]},
    {"name": "t_us", "type": ["null", {"type": "long", "logicalType": "time-micros"}]},
    {"name": "price", "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}]},
    {"name": "user", "type": ["null", {"type": "record", "name": "U", "fields": [
        {"name": "name", "type": ["null", "string"]},
        {"name": "scores", "type": ["null", {"type": "array", "items": ["null", "double"]}]}]}]},
    {"name": "tags", "type": ["null", {"type": "array", "items": ["null", "string"]}]},
]}
ARROW_SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False), ("ts_ms", pa.timestamp("ms", tz="UTC")),
    ("ts_us", pa.timestamp("us", tz="America/New_York")), ("day", pa.date32()), ("t_ms", pa.time32("ms")),
    ("t_us", pa.time64("us")), ("price", pa.decimal128(12, 3)),
    ("user", pa.struct([("name", pa.string()), ("scores", pa.list_(pa.float64()))])), ("tags", pa.list_(pa.string())),
])


def _records(n: int = 40) -> list[dict]:
    out = []
    for i in range(n):
        null = i % 7 == 3
        out.append({
            "id": i,
            "ts_ms": None if null else dt.datetime(2020, 1, 1, tzinfo=UTC) + dt.timedelta(milliseconds=1234567 * i),
            "ts_us": None if null else dt.datetime(1969, 12, 31, tzinfo=UTC) + dt.timedelta(microseconds=987654321 * i),
            "day": None if null else dt.date(1970, 1, 1) + dt.timedelta(days=37 * i - 500),
            "t_ms": None if null else dt.time(i % 24, i % 60, 1, 1000 * i),
            "t_us": None if null else dt.time(23, 59, 59, 999999 - i),
            "price": None if null else decimal.Decimal(f"{(-1) ** i * 1000 * i + i}.{i:03d}"),
            "user": None if i % 5 == 4 else {"name": None if i % 3 else f"u{i}", "scores": [i / 3, None][: i % 3]},
            "tags": None if null else ["a", "b", None][: i % 4],
        })
    return out


def _parquet(records: list[dict], **kw) -> io.BytesIO:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(records, schema=ARROW_SCHEMA), buf, **kw)
    buf.seek(0)
    return buf


def _read_parquet(buf, path="f.parquet", **kw) -> list[dict]:
    return [r for b in iter_parquet(buf, path, **kw) for r in b.records]


def test_a_record_reads_the_same_from_avro_and_from_parquet():
    records = _records()
    avro = io.BytesIO()
    fastavro.writer(avro, AVRO_SCHEMA, records)
    avro.seek(0)
    from_avro = [r for b in iter_avro(avro, "f.avro", decoder="fastavro") for r in b.records]
    assert from_avro[1]["ts_ms"] == 1577836800000 + 1234567  # raw integers, as documented
    for decoder in ("auto", "fastavro"):
        assert _read_parquet(_parquet(records, row_group_size=7), decoder=decoder) == from_avro


def test_the_fast_path_gives_columns_and_record_json():
    buf = _parquet(_records(10))
    batch = next(iter_parquet(buf, "f.parquet", record_json=True))
    assert type(batch.records).__name__ == "ColumnRecords" and "id" in batch.records.arrays
    assert batch.records.record_json[0].startswith(b'{"day":')


@pytest.mark.parametrize("unit", ["s", "ms", "us", "ns"])
@pytest.mark.parametrize("tz", [None, "UTC", "Asia/Kolkata"])
def test_timestamps_are_their_raw_integers_in_every_unit_and_zone(unit, tz):
    raw = [0, -1, 253402300800, None]  # (year 10000 in seconds: no datetime holds it)
    buf = io.BytesIO()
    pq.write_table(pa.table({"t": pa.array(raw, pa.timestamp(unit, tz=tz))}), buf)
    # Parquet has no seconds: pyarrow stores them as milliseconds, the unit the file then declares
    want = [None if v is None else v * 1000 for v in raw] if unit == "s" else raw
    for decoder in ("auto", "fastavro"):
        assert [r["t"] for r in _read_parquet(buf, decoder=decoder)] == want
    logical = read_record_schema(buf, "f.parquet")["fields"][0]["type"][1]["logicalType"]
    assert logical == ("timestamp-" if tz else "local-timestamp-") + {"s": "millis", "ms": "millis", "us": "micros",
                                                                      "ns": "nanos"}[unit]


def test_dictionary_columns_decode_and_maps_become_dicts():
    t = pa.table({
        "cat": pa.array(["x", "y", None, "x"]).dictionary_encode(),
        "attrs": pa.array([[("k", 1)], [], None, [("a", 2), ("b", None)]], pa.map_(pa.string(), pa.int64())),
        "ids": pa.array([[(1, "one")], None, [], []], pa.map_(pa.int32(), pa.string())),
    })
    buf = io.BytesIO()
    pq.write_table(t, buf, use_dictionary=True)
    got = _read_parquet(buf)
    assert [r["cat"] for r in got] == ["x", "y", None, "x"]
    assert [r["attrs"] for r in got] == [{"k": 1}, {}, None, {"a": 2, "b": None}]
    assert got[0]["ids"] == {"1": "one"}  # map keys as their str(), as Avro maps hold
    assert read_record_schema(buf, "f.parquet")["fields"][1]["type"][1]["type"] == "map"


@pytest.mark.parametrize("codec", ["none", "snappy", "gzip", "brotli", "zstd", "lz4"])
def test_every_codec_pyarrow_writes(codec):
    records = _records(30)
    got = _read_parquet(_parquet(records, compression=codec, row_group_size=8))
    assert [r["id"] for r in got] == list(range(30))


def test_row_groups_split_across_byte_ranges_read_each_record_once():
    buf = _parquet(_records(100), row_group_size=9)
    size = len(buf.getvalue())
    offsets = row_group_offsets(pq.ParquetFile(buf))
    assert len(offsets) == 12 and offsets == sorted(offsets)
    cuts = [0, offsets[3], offsets[3] + 1, size // 2, size]
    ids = []
    for lo, hi in zip(cuts, [*cuts[1:], None], strict=True):
        buf.seek(0)
        for b in iter_records(buf, "f.parquet", lo, hi, batch_size=4):
            assert set(b.offsets) <= set(offsets)
            ids.extend(r["id"] for r in b.records)
    assert sorted(ids) == list(range(100))
    batch = next(iter_records(buf, "f.parquet", offsets[5], None, batch_size=4))
    assert batch.offsets == [offsets[5]] * 4 and batch.indexes == [0, 1, 2, 3]


def test_format_detection_and_splittability():
    head = _parquet(_records(2)).getvalue()[:8]
    assert detect_format("data.bin", head) == "parquet"
    assert is_splittable("data.bin", head)
    assert detect_format("x.parquet", b"") == "parquet"  # named so: its reader reports what is wrong


def test_partition_directories_become_string_fields():
    assert partition_fields("/data/run=3/tbl/dt=2024-01-01/country=a%2Fb/part-0.parquet") == {
        "dt": "2024-01-01", "country": "a/b"}
    assert partition_fields("gs://b/t/k=__HIVE_DEFAULT_PARTITION__/p.parquet") == {"k": None}
    buf = _parquet(_records(3))
    got = _read_parquet(buf, "/d/dt=2024-01-01/part.parquet")
    assert [r["dt"] for r in got] == ["2024-01-01"] * 3
    assert read_record_schema(buf, "/d/dt=x/p.parquet")["fields"][-1] == {"name": "dt", "type": ["null", "string"]}
    with pytest.raises(InputFileError, match=r"partition directory id=\.\.\. names a field"):
        _read_parquet(buf, "/d/id=4/part.parquet")


def test_not_parquet_and_cut_short_files_name_the_file():
    with pytest.raises(InputFileError, match=r"x\.parquet at byte 0: not a Parquet file"):
        list(iter_records(io.BytesIO(b'{"a": 1}\n'), "x.parquet"))
    cut = io.BytesIO(_parquet(_records(5)).getvalue()[:-30])
    with pytest.raises(InputFileError, match=r"cut\.parquet at byte 0: not a readable Parquet file"):
        list(iter_records(cut, "cut.parquet"))


def test_a_corrupt_row_group_names_it_and_its_field_after_the_intact_ones():
    buf = _parquet(_records(40), row_group_size=10, compression="snappy", use_dictionary=False)
    pf = pq.ParquetFile(buf)
    col = pf.metadata.row_group(2).column(1)  # ts_ms of the third row group
    raw = bytearray(buf.getvalue())
    start = col.data_page_offset
    raw[start + 20:start + col.total_compressed_size] = b"\xff" * (col.total_compressed_size - 20)
    seen = []
    with pytest.raises(InputFileError, match=r"row group 2 .*field 'ts_ms'") as e:
        for b in iter_parquet(io.BytesIO(bytes(raw)), "bad.parquet", batch_size=10):
            seen.extend(r["id"] for r in b.records)
    assert seen == list(range(20))
    assert e.value.offset == row_group_offsets(pf)[2]


def test_a_column_chunk_over_the_block_cap_is_refused_naming_it():
    buf = _parquet(_records(200))
    with pytest.raises(InputFileError, match=r"row group 0, column 'user.name' .*--max-block-mb|row group 0, column"):
        _read_parquet(buf, max_block_bytes=64)


def test_duplicate_column_names_are_refused():
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]), buf)
    with pytest.raises(InputFileError, match="declares the field 'a' twice in the columns"):
        _read_parquet(buf)


def test_infer_and_the_check_read_the_parquet_schema(tmp_path):
    records = _records(30)
    path = tmp_path / "part.parquet"
    path.write_bytes(_parquet(records).getvalue())
    with open(path, "rb") as f:
        schema = read_record_schema(f, str(path))
        sample = _read_parquet(f, str(path))
    cfg, _ = infer_config(sample, schema)
    names = {f["name"]: f for f in cfg["features"]}
    assert names["ts_ms"]["transform"] == "timestamp" and names["ts_ms"].get("unit", "ms") == "ms"
    good = parse_config({"features": [{"name": "n", "source": "user.name", "transform": "hash", "buckets": 8}]})
    assert isinstance(check_inputs(good, [str(path)], lambda p: open(p, "rb")), InputCheck)
    bad = parse_config({"features": [{"name": "n", "source": "user.nmae", "transform": "hash", "buckets": 8}]})
    with pytest.raises(ValueError, match="user.nmae"):
        check_inputs(bad, [str(path)], lambda p: open(p, "rb"))


def test_raw_arrays_of_sliced_nested_columns_equal_the_reference_values():
    """Arrow slices share buffers at an offset: the fast path's casts must honour it at every depth."""
    from convert.formats.parquet_records import record_value
    from convert.formats.parquet_types import raw_array

    t = pa.struct([("x", pa.int64()), ("l", pa.list_(pa.timestamp("ms"))), ("d", pa.decimal128(5, 1))])
    a = pa.array([{"x": 1, "l": [1, 2], "d": decimal.Decimal("1.5")}, None, {"x": 3, "l": None, "d": None},
                  {"x": 4, "l": [5], "d": decimal.Decimal("-2.5")}], t)
    for s in (a.slice(1), a.slice(2, 2), a.slice(0, 2), a.slice(3)):
        assert raw_array(s).to_pylist() == [record_value(v) for v in s]
    assert raw_array(a.slice(3)).to_pylist() == [{"x": 4, "l": [5], "d": b"\xe7"}]


def test_polars_without_pyarrow_is_said_once_and_reads_the_same_records(tmp_path):
    """A process that imported polars while pyarrow was marked absent (a local worker's mark, before
    the Parquet reader lifts it) cannot take the fast path: it says so once, as a warning, and the
    per-record path gives the same records."""
    import subprocess
    import sys

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3], "s": ["x", None, "z"]}), path)
    code = f"""
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
sys.modules["pyarrow"] = None
import polars
from convert.sources import iter_records
out = []
for _ in range(2):
    with open({str(path)!r}, "rb") as f:
        for b in iter_records(f, {str(path)!r}, 0, None, 2):
            out += [dict(r) for r in b.records]
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("polars cannot read Arrow data") == 1, r.stderr
    assert json.loads(r.stdout) == [{"a": 1, "s": "x"}, {"a": 2, "s": None}, {"a": 3, "s": "z"}] * 2
