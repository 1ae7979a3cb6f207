"""A label's ``source`` is a path in the grammar of ``convert/paths.py``, read exactly
as a feature with the same ``source`` reads it: an index (``y[0]``), a nested
record's field (``n.a``), both (``n.c[1]``), a map's value (``m["k"]``). A path
or a value giving several values per record is an error naming the label and
saying what to write. Through the CLI, on JSON Lines, Avro (fast and fastavro
decoders) and Parquet (fast and reference paths)."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _e2e import check_accounting, cli, error_rows
from _expected_values import read_split

pytestmark = pytest.mark.slow

SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "id", "type": "long"},
    {"name": "x", "type": "double"},
    {"name": "y", "type": {"type": "array", "items": "long"}},
    {"name": "n", "type": {"type": "record", "name": "N", "fields": [
        {"name": "a", "type": "long"}, {"name": "c", "type": {"type": "array", "items": "long"}}]}},
    {"name": "m", "type": {"type": "map", "values": "long"}},
]}
EMPTY_Y = {5, 17}  # records whose list y is empty: y[0] is missing there


def _records(n: int = 80) -> list[dict]:
    return [{"id": i, "x": float(i % 11), "y": [] if i in EMPTY_Y else [i % 2, i % 3, i % 5],
             "n": {"a": i % 4, "c": [i % 7, i % 6]}, "m": {"k": i % 3}} for i in range(n)]


def _write(root: Path, kind: str, records: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "json":
        path = root / "events.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif kind == "avro":
        path = root / "events.avro"
        with open(path, "wb") as f:
            fastavro.writer(f, SCHEMA, records, sync_interval=500)
    else:
        path = root / "events.parquet"
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=30)
    return path


def _config(tmp_path: Path, label: str, feature_source: str | None = None) -> Path:
    cfg = tmp_path / "features.yaml"
    lines = [f"label: {{name: lab, source: {json.dumps(label)}, dtype: int64}}", "features:",
             "  - {name: id, transform: identity}", "  - {name: x, transform: zscore}"]
    if feature_source is not None:
        lines.append(f"  - {{name: twin, source: {json.dumps(feature_source)}, transform: identity, "
                     f"allow_label_source: true}}")
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


#: (label source, each record's value at it; None: missing)
PATHS = [
    ("y[0]", lambda r: r["y"][0] if r["y"] else None),
    ("y[-1]", lambda r: r["y"][-1] if r["y"] else None),
    ("n.a", lambda r: r["n"]["a"]),
    ("n.c[1]", lambda r: r["n"]["c"][1]),
    ('m["k"]', lambda r: r["m"]["k"]),
]
INPUTS = [("json", "auto"), ("avro", "auto"), ("avro", "fastavro"), ("parquet", "auto"), ("parquet", "fastavro")]


@pytest.mark.parametrize("kind,decoder", INPUTS, ids=[f"{k}-{d}" for k, d in INPUTS])
@pytest.mark.parametrize("source,value", PATHS, ids=[p for p, _ in PATHS])
def test_a_label_reads_its_path_as_a_feature_with_the_same_source(tmp_path, kind, decoder, source, value):
    records = _records()
    path = _write(tmp_path / "d", kind, records)
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", _config(tmp_path, source, source), "-o", out, "--num-shards", "1",
            "--splits", "train=0.6,eval=0.4", "--avro-decoder", decoder, "--max-errors", "5")
    assert r.exit_code == 0, r.output
    want = {rec["id"]: value(rec) for rec in records}
    missing = {i for i, v in want.items() if v is None}
    counts = check_accounting(out)
    assert counts["errors"] == len(missing), r.output
    rejected = {row["record"]["id"]: row["reason"] for row in error_rows(out)}
    assert rejected.keys() == missing
    assert all("label must be an integer, found missing (null)" in why for why in rejected.values()), rejected
    seen = 0
    for split in ("train", "eval"):
        got = read_split(out, split)
        ids = got["id"].ravel().astype(np.int64).tolist()
        assert got["lab"].dtype == np.int64
        assert got["lab"].ravel().tolist() == [want[i] for i in ids], (split, source)
        assert got["twin"].ravel().tolist() == got["lab"].ravel().astype(np.float32).tolist(), (split, source)
        seen += len(ids)
    assert seen == len(records) - len(missing)


def test_a_vocabulary_label_reads_an_index_path(tmp_path):
    records = [{**r, "cls": ["abc"[r["id"] % 3], "z"]} for r in _records(60)]
    path = _write(tmp_path / "d", "json", records)
    cfg = tmp_path / "features.yaml"
    cfg.write_text('label: {name: lab, source: "cls[0]", transform: vocabulary}\n'
                   "features:\n  - {name: id, transform: identity}\n")
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", cfg, "-o", out, "--num-shards", "1", "--splits", "train=1")
    assert r.exit_code == 0, r.output
    assert check_accounting(out, ("train",))["errors"] == 0
    info = json.loads((out / "dataset_info.json").read_text())
    classes = next(f for f in info["features"] if f["role"] == "label")["params"]["classes"]
    assert sorted(classes) == ["a", "b", "c"]
    got = read_split(out, "train")
    byid = {r["id"]: r["cls"][0] for r in records}
    assert [classes[c] for c in got["lab"].ravel()] == [byid[int(i)] for i in got["id"].ravel()]


@pytest.mark.parametrize("source,fix", [("y[]", "'y[0]'"), ("n.c[]", "'n.c[0]'"), ("m[keys]", "'m.key'")])
def test_a_label_path_through_a_list_is_a_config_error_saying_what_to_write(tmp_path, source, fix):
    path = _write(tmp_path / "d", "json", _records(20))
    r = cli("convert", "-i", path, "-c", _config(tmp_path, source), "-o", tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert "the label 'lab' takes one value per record" in r.output and f"e.g. {fix}" in r.output, r.output
    assert not (tmp_path / "out" / "dataset_info.json").exists()


@pytest.mark.parametrize("kind", ["json", "avro", "parquet"])
@pytest.mark.parametrize("source,fix", [("y", "'y[0]'"), ("n", "'n.a'")])
def test_a_label_whose_value_is_a_list_or_record_is_refused_saying_what_to_write(tmp_path, kind, source, fix):
    """JSON: every record is rejected with the reason; Avro and Parquet: the schema check refuses it
    before the run; either way the message names the label and the path to write."""
    path = _write(tmp_path / "d", kind, _records(20))
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", _config(tmp_path, source), "-o", out)
    assert r.exit_code != 0, r.output
    assert not (out / "dataset_info.json").exists()
    if kind == "json":
        reasons = [row["reason"] for row in error_rows(out)]
        assert len(reasons) == 20 and all("the label 'lab' takes one value per record" in why
                                          and f"e.g. source: {fix}" in why for why in reasons), reasons
    assert "the label" in r.output and fix.strip("'") in r.output, r.output
