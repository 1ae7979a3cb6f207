"""Parquet written by several writers (pyarrow, polars, DuckDB; real files of
apache/parquet-testing when present) reads to the same records on both paths,
with the record model of ``convert.formats.parquet_types``."""

from __future__ import annotations

import datetime as dt
import decimal
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convert.formats.parquet_reader import iter_parquet
from convert.source_types import InputFileError

#: What every writer writes (as its own types): ids, a nullable float, a
#: string, a list of strings, a struct, a UTC timestamp in microseconds, a date, a decimal.
ROWS = [
    {"id": i, "x": None if i % 4 == 0 else i / 4, "s": f"s{i % 3}", "tags": ["a", "b"][: i % 3],
     "u": {"name": f"n{i}", "n": i * 10}, "ts": dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
     "day": dt.date(2024, 1, 1) + dt.timedelta(days=i), "price": decimal.Decimal(f"{i}.25")}
    for i in range(50)
]
#: The records every writer's file must read to.
EXPECTED = [
    {"id": r["id"], "x": r["x"], "s": r["s"], "tags": r["tags"], "u": r["u"],
     "ts": 1704067200_000000 + r["id"] * 1_000_000, "day": 19723 + r["id"],
     "price": (r["id"] * 100 + 25).to_bytes(((r["id"] * 100 + 25).bit_length() + 8) // 8, "big", signed=True)}
    for r in ROWS
]
REAL = Path(__file__).resolve().parents[2] / "shared" / "parquet-testing" / "data"


def _both(data: bytes) -> list[dict]:
    out = {}
    for decoder in ("auto", "fastavro"):
        out[decoder] = [r for b in iter_parquet(io.BytesIO(data), "w.parquet", batch_size=16, decoder=decoder)
                        for r in b.records]
    assert repr(out["auto"]) == repr(out["fastavro"])
    return out["auto"]


def _pyarrow(path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("x", pa.float64()), ("s", pa.string()), ("tags", pa.list_(pa.string())),
                        ("u", pa.struct([("name", pa.string()), ("n", pa.int64())])), ("ts", pa.timestamp("us", tz="UTC")),
                        ("day", pa.date32()), ("price", pa.decimal128(10, 2))])
    pq.write_table(pa.Table.from_pylist(ROWS, schema=schema), path, row_group_size=16, compression="zstd")


def _polars(path: Path) -> None:
    import polars as pl

    df = pl.DataFrame(ROWS, schema={"id": pl.Int64, "x": pl.Float64, "s": pl.String, "tags": pl.List(pl.String),
                                    "u": pl.Struct({"name": pl.String, "n": pl.Int64}),
                                    "ts": pl.Datetime("us", "UTC"), "day": pl.Date, "price": pl.Decimal(10, 2)})
    df.write_parquet(path, row_group_size=16, compression="snappy")


def _duckdb(path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="DuckDB is in the dev extras (pip install -e '.[dev]')")
    con = duckdb.connect()
    con.execute("CREATE TABLE t (id BIGINT, x DOUBLE, s VARCHAR, tags VARCHAR[], u STRUCT(name VARCHAR, n BIGINT), "
                "ts TIMESTAMPTZ, day DATE, price DECIMAL(10, 2))")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [[r["id"], r["x"], r["s"], r["tags"], r["u"], r["ts"], r["day"], r["price"]] for r in ROWS])
    con.execute(f"COPY (SELECT * FROM t ORDER BY id) TO '{path}' (FORMAT parquet, ROW_GROUP_SIZE 16, COMPRESSION gzip)")


@pytest.mark.parametrize("writer", [_pyarrow, _polars, _duckdb], ids=["pyarrow", "polars", "duckdb"])
def test_every_writers_file_reads_to_the_same_records(writer, tmp_path):
    path = tmp_path / "w.parquet"
    writer(path)
    got = _both(path.read_bytes())
    assert got == EXPECTED


def _real_files() -> list[Path]:
    return sorted(REAL.glob("*.parquet")) if REAL.is_dir() else []


@pytest.mark.skipif(not _real_files(), reason=f"apache/parquet-testing is not copied to {REAL} (optional: "
                                              "docs/development.md)")
@pytest.mark.parametrize("path", _real_files(), ids=lambda p: p.name)
def test_real_files_read_the_same_on_both_paths_or_name_what_is_wrong(path):
    """Every file either reads to the same records on both paths, or fails with
    an ``InputFileError`` naming the file (the suite's files include corrupt ones,
    and codecs or encodings pyarrow does not read)."""
    data = path.read_bytes()
    try:
        records = _both(data)
    except InputFileError as e:
        assert "w.parquet" in str(e)
        return
    md = pq.ParquetFile(io.BytesIO(data)).metadata  # every row of every row group, none dropped
    assert len(records) == sum(md.row_group(i).num_rows for i in range(md.num_row_groups))  # (parquet-rs 0.3 wrote a file total of 0)
