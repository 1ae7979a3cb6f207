"""Serving parity for Parquet-sourced records: records read from Parquet
(timestamps as ``timestamp[ms, UTC]``, days as ``date32``, bytes as binary,
nested structs, dictionary-encoded strings) map through the serving layer to exactly the
converter's features, and the same records converted from Parquet and from
JSON give the same dataset."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_readers_serving import _train_record, check_parity, cli, layer, output  # noqa: F401 - fixtures

from convert.formats.parquet_reader import iter_parquet

#: The serving test's training records as Parquet types: logical types where the field holds one.
ARROW = pa.schema([
    ("y", pa.float64()), ("num", pa.float64()), ("num2", pa.float64()), ("num3", pa.int64()),
    ("nums", pa.list_(pa.float64())), ("cat", pa.dictionary(pa.int32(), pa.string())), ("tags", pa.list_(pa.string())),
    ("tags2", pa.list_(pa.string())), ("user", pa.struct([("id", pa.string()), ("segment", pa.string())])),
    ("flag", pa.bool_()), ("ts", pa.timestamp("ms", tz="UTC")), ("day", pa.date32()), ("secs", pa.int64()),
    ("blob", pa.binary()), ("deep", pa.struct([("a", pa.struct([("b", pa.string()), ("n", pa.int64())]))])),
    ("query", pa.string()),
])


def _parquet_records(tmp_path, n: int = 240) -> list[Any]:
    rows = []
    for i in range(n):
        r = _train_record(i)
        r["cat"] = str(r["cat"])  # (one Parquet column holds one type)
        r["blob"] = r["blob"].encode()
        rows.append(r)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=ARROW), path, row_group_size=50)
    with open(path, "rb") as f:
        return [r for b in iter_parquet(f, str(path)) for r in b.records]


def test_parquet_records_hold_raw_logical_values(tmp_path):
    recs = _parquet_records(tmp_path, 3)
    assert recs[1]["ts"] == _train_record(1)["ts"] and recs[1]["day"] == _train_record(1)["day"]


def test_serving_parity_on_parquet_sourced_records(output, layer, tmp_path):  # noqa: F811 - fixtures
    check_parity(output, layer, _parquet_records(tmp_path))


@pytest.mark.slow
def test_parquet_and_json_inputs_convert_to_the_same_features(output, tmp_path):  # noqa: F811 - fixtures
    import readers

    _parquet_records(tmp_path)  # writes train.parquet
    config = output.parent / "features.yaml"
    out = tmp_path / "out"
    r = cli("convert", "-i", tmp_path / "train.parquet", "-c", config, "-o", out, "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    a = next(iter(readers.eval_dataset(f"{output}/train-*", batch_size=240)))
    b = next(iter(readers.eval_dataset(f"{out}/train-*", batch_size=240)))
    for name in a[0]:
        np.testing.assert_array_equal(np.sort(a[0][name].numpy(), axis=0), np.sort(b[0][name].numpy(), axis=0), err_msg=name)
