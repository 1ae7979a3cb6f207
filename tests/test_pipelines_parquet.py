"""Parquet input through the whole job: the same records as Avro and as
Parquet give byte-identical shards and the same counts; row groups spread a
file over work units; rejected records land in the error output naming file,
row group and row; hive partition directories; ``infer`` and ``check`` on
Parquet through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _e2e import check_accounting, cli, error_rows
from _pipelines_data import make_records, without_run_id, write_dataset

from convert.splits import Splits
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.plan import discover

pytestmark = pytest.mark.slow

#: tests/_pipelines_data.SCHEMA as Arrow types.
ARROW = pa.schema([
    pa.field("id", pa.int64(), nullable=False), ("x", pa.float64()), ("color", pa.string()),
    ("tags", pa.list_(pa.string())), ("text", pa.string()), ("user", pa.struct([("name", pa.string())])),
    ("y", pa.int32()),
])


def write_parquet_twin(root: Path, records: list[dict], **kw) -> Path:
    """``write_dataset``'s two parts as Parquet files (row groups of 17 rows), beside the Avro ones."""
    half = len(records) // 2
    for k, part in enumerate((records[:half], records[half:])):
        table = pa.Table.from_pylist(part, schema=ARROW)
        pq.write_table(table, root / f"part-{k}.parquet", row_group_size=17, **kw)
    return root / "*.parquet"


def _convert(inputs, config, out, **kw):
    opts = ConvertOptions(inputs=(str(inputs),), config=str(config), output=str(out), max_error_fraction=1.0, **kw)
    return run_convert(opts)


def _shards(out: Path) -> dict[str, bytes]:
    return {without_run_id(p.relative_to(out).as_posix()): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and ".tfrecord" in p.name}


@pytest.mark.parametrize("split_key", [None, "user.name"])
def test_the_same_records_as_avro_and_parquet_give_identical_shards(tmp_path, split_key):
    records = make_records(400)
    paths = write_dataset(tmp_path / "d", records)
    parquet = write_parquet_twin(tmp_path / "d", records, compression="zstd")
    config = tmp_path / "features.yaml"  # log1p rejects x <= -1: some records go to the error output
    config.write_text(paths["config"].read_text().replace("transform: zscore, missing_indicator: true", "transform: log1p"))
    splits = Splits.parse("train=0.8,eval=0.2", split_key)
    results = {}
    for name, inputs in (("avro", paths["avro"]), ("parquet", parquet)):
        res = _convert(inputs, config, tmp_path / name, num_shards=1, splits=splits)
        counts = {k: v for k, v in res.info["counts"].items() if k != "per_file"}
        results[name] = (_shards(tmp_path / name), counts)
    (avro_shards, avro_counts), (pq_shards, pq_counts) = results["avro"], results["parquet"]
    assert avro_counts == pq_counts and 0 < pq_counts["errors"] < 400
    assert avro_shards.keys() == pq_shards.keys() and avro_shards
    for k in avro_shards:
        assert avro_shards[k] == pq_shards[k], k
    check_accounting(tmp_path / "parquet")
    rows = error_rows(tmp_path / "parquet")
    assert len(rows) == pq_counts["errors"]
    for row in rows:
        path = row["file"]
        pf = pq.ParquetFile(path)
        from convert.formats.parquet_reader import row_group_offsets

        group = row_group_offsets(pf).index(row["byte_offset"])
        original = pf.read_row_group(group).slice(row["row_in_row_group"], 1).to_pylist()[0]
        assert original["id"] == row["record"]["id"] and row["field"] == "x"


def test_row_groups_of_one_file_spread_over_work_units(tmp_path):
    records = make_records(600)
    root = tmp_path / "d"
    paths = write_dataset(root, records)
    pq.write_table(pa.Table.from_pylist(records, schema=ARROW), root / "one.parquet", row_group_size=25)
    res = _convert(root / "one.parquet", paths["config"], tmp_path / "out", num_shards=4)
    counts = check_accounting(tmp_path / "out")
    assert counts["read"] == 600 and counts["errors"] == 0
    sizes = [s["num_records"] for sp in res.info["splits"].values() for s in sp["shards"]]
    per_unit = {}
    for sp in res.info["splits"].values():
        for i, s in enumerate(sp["shards"]):
            per_unit[i] = per_unit.get(i, 0) + s["num_records"]
    assert sum(sizes) == 600 and len([n for n in per_unit.values() if n]) >= 3, per_unit


@pytest.mark.parametrize("warm", ["1", "0"])  # workers forked from the launcher, or new interpreters
def test_worker_processes_and_the_cli_launcher_read_parquet(tmp_path, warm):
    """A local run's launcher and worker processes mark pyarrow absent for Beam
    (pipelines/local/worker.py); a Parquet input lifts it: `recordprep convert --workers 2`
    writes the bytes of an in-process run."""
    records = make_records(600)
    root = tmp_path / "d"
    paths = write_dataset(root, records)
    pq.write_table(pa.Table.from_pylist(records, schema=ARROW), root / "one.parquet", row_group_size=40)
    _convert(root / "one.parquet", paths["config"], tmp_path / "inproc", num_shards=3, workers=1)
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", "-i", str(root / "one.parquet"), "-c",
                        str(paths["config"]), "-o", str(tmp_path / "workers"), "--num-shards", "3", "--workers", "2"],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "RECORDPREP_WARM_WORKERS": warm})
    assert r.returncode == 0, r.stdout + r.stderr
    assert _shards(tmp_path / "workers") == _shards(tmp_path / "inproc")


def test_hive_partition_directories_are_fields(tmp_path):
    records = make_records(120)
    root = tmp_path / "table"
    for dt in ("2024-01-01", "2024-01-02"):
        part = root / f"dt={dt}"
        part.mkdir(parents=True)
        chunk = records[:60] if dt.endswith("1") else records[60:]
        pq.write_table(pa.Table.from_pylist(chunk, schema=ARROW), part / "part-0.parquet")
    config = tmp_path / "features.yaml"
    config.write_text("label: {source: y, dtype: int64}\nfeatures:\n  - {name: id, transform: identity}\n"
                      "  - {name: dt, transform: vocabulary}\n")
    _convert(root, config, tmp_path / "out", num_shards=1)
    counts = check_accounting(tmp_path / "out")
    assert counts["read"] == 120 and len(counts["per_file"]) == 2
    vocab = json.loads((tmp_path / "out" / "analysis.json").read_text())["vocabularies"]["dt"]
    assert set(vocab) == {"2024-01-01", "2024-01-02"}


def test_infer_and_check_on_parquet_through_the_cli(tmp_path):
    records = make_records(80)
    root = tmp_path / "d"
    root.mkdir()
    write_parquet_twin(root, records)
    r = cli("infer", "-i", root / "*.parquet", "--label", "y")
    assert r.exit_code == 0, r.output
    assert "source: user.name" in r.output and "name: tags" in r.output
    drafted = tmp_path / "drafted.yaml"
    drafted.write_text(r.stdout)
    r = cli("convert", "-i", root / "*.parquet", "-c", drafted, "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("label: {source: y, dtype: int64}\nfeatures:\n  - {name: n, source: user.nmae, transform: hash, buckets: 8}\n")
    r = cli("convert", "-i", root / "*.parquet", "-c", bad, "-o", tmp_path / "out2", "--dry-run")
    assert r.exit_code != 0 and "user.nmae" in r.output


def test_parquet_fast_and_reference_paths_write_the_same_bytes(tmp_path):
    """The fast path (default) and the per-record reference path (``--avro-decoder fastavro``) give
    byte-identical shards, error output and counts on Parquet input, over several work units."""
    records = make_records(400)
    paths = write_dataset(tmp_path / "d", records)
    parquet = write_parquet_twin(tmp_path / "d", records, compression="snappy")
    config = tmp_path / "features.yaml"
    config.write_text(paths["config"].read_text().replace("transform: zscore, missing_indicator: true", "transform: log1p"))
    outs = {}
    for decoder in ("auto", "fastavro"):
        out = tmp_path / decoder
        res = _convert(parquet, config, out, num_shards=3, avro_decoder=decoder)
        files = {without_run_id(p.relative_to(out).as_posix()): p.read_bytes() for p in sorted(out.rglob("*"))
                 if p.is_file() and (p.suffix in (".gz", ".jsonl") or ".tfrecord" in p.name)}
        outs[decoder] = (files, res.info["counts"])
    (fast, fast_counts), (ref, ref_counts) = outs["auto"], outs["fastavro"]
    assert fast_counts == ref_counts and 0 < fast_counts["errors"] < 400
    assert fast.keys() == ref.keys() and any(k.startswith("errors/") for k in fast)
    for k in fast:
        assert fast[k] == ref[k], k


def _partitioned_tree(root: Path, records: list[dict]) -> None:
    """Part files under ``dt=`` partitions, plus files a partition walk must skip."""
    for k, dt in enumerate(("2024-01-01", "2024-01-02")):
        (root / f"dt={dt}").mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(records[k::2], schema=ARROW), root / f"dt={dt}" / "part-0.parquet")
    for skipped in ("notes/x.parquet", "_tmp=1/y.parquet", "dt=2024-01-01/_SUCCESS"):
        (root / skipped).parent.mkdir(parents=True, exist_ok=True)
        (root / skipped).write_bytes(b"PAR1")


def test_a_directory_input_finds_partition_files_locally_and_on_gcs(tmp_path, remote_stack):
    from apache_beam.io.filesystems import FileSystems

    from convert.sources import iter_records

    records = make_records(40)
    local = tmp_path / "table"
    _partitioned_tree(local, records)
    want = ["dt=2024-01-01/part-0.parquet", "dt=2024-01-02/part-0.parquet"]
    assert [f.path[len(str(local)) + 1:] for f in discover([str(local)])] == want
    remote = remote_stack.upload_dir(local, "parquet-partitions")
    found = [f.path for f in discover([remote])]
    assert [p[len(remote) + 1:] for p in found] == want
    read = []
    for path in found:  # pyarrow reads through Beam's gs:// file objects
        with FileSystems.open(path, compression_type="uncompressed") as f:
            read.extend((r["id"], r["dt"]) for b in iter_records(f, path) for r in b.records)
    assert sorted(read) == sorted((r["id"], "2024-01-0" + str(1 + r["id"] % 2)) for r in records)


def test_a_run_decodes_only_the_columns_its_config_and_split_key_read(tmp_path):
    """A column no feature reads is never decoded when the split has a key: a large
    one passes ``--max-block-mb``; a whole-record split hashes it, so it is read and refused."""
    records = make_records(40)
    root = tmp_path / "d"
    paths = write_dataset(root, records)
    table = pa.Table.from_pylist(records, schema=ARROW).append_column("blob", pa.array([b"z" * 200_000] * 40))
    pq.write_table(table, root / "wide.parquet", use_dictionary=False, compression="zstd")
    keyed = Splits.parse("train=0.8,eval=0.2", "id")
    _convert(root / "wide.parquet", paths["config"], tmp_path / "keyed", num_shards=1, splits=keyed, max_block_mb=1)
    counts = check_accounting(tmp_path / "keyed")
    assert counts["read"] == 40
    _convert(root / "part-*.avro", paths["config"], tmp_path / "avro", num_shards=1, splits=keyed)
    assert _shards(tmp_path / "keyed") == _shards(tmp_path / "avro")
    with pytest.raises(Exception, match=r"wide\.parquet.*column 'blob'.*--max-block-mb"):
        _convert(root / "wide.parquet", paths["config"], tmp_path / "whole", num_shards=1, max_block_mb=1)


def test_infer_drafts_uuid_and_json_columns_and_convert_reads_them(tmp_path):
    """pyarrow reads them as extension types (``arrow.uuid``, ``arrow.json``): their storage types count."""
    n = 40
    table = pa.table({"id": list(range(n)), "y": [i % 2 for i in range(n)],
                      "u": pa.array([bytes([i]) * 16 for i in range(n)], pa.uuid()),
                      "j": pa.array([f'{{"k": {i % 3}}}' for i in range(n)], pa.json_())})
    path = tmp_path / "ext.parquet"
    pq.write_table(table, path)
    r = cli("infer", "-i", path, "--label", "y")
    assert r.exit_code == 0, r.output
    assert "{name: u, transform: bytes}" in r.stdout and "{name: j, transform: vocabulary}" in r.stdout
    drafted = tmp_path / "drafted.yaml"
    drafted.write_text(r.stdout)
    r = cli("convert", "-i", path, "-c", drafted, "-o", tmp_path / "out", "--num-shards", "1")
    assert r.exit_code == 0, r.output
    assert check_accounting(tmp_path / "out")["read"] == n
    vocab = json.loads((tmp_path / "out" / "analysis.json").read_text())["vocabularies"]["j"]
    assert set(vocab) <= {'{"k": 0}', '{"k": 1}', '{"k": 2}'} and vocab


def test_a_list_only_file_whose_footer_understates_its_rows_fails_the_run_naming_it(tmp_path):
    """Its column chunks count list items, not rows: the run converts every row or fails naming the
    file and row group, never writes fewer records than the file holds."""
    from test_convert_parquet_guards import _patch_footer

    table = pa.table({"tags": [[f"t{i % 4}", "x"] for i in range(60)], "y": [[i % 2] for i in range(60)]})
    honest, lying = tmp_path / "honest" / "lists.parquet", tmp_path / "lying" / "lists.parquet"
    for p in (honest, lying):
        p.parent.mkdir()
        pq.write_table(table, p, row_group_size=30)
    lying.write_bytes(_patch_footer(lying.read_bytes(), {(3,): 40, (4, 1, 3): 10}))  # row group 1: 10 rows of 30
    config = tmp_path / "features.yaml"
    config.write_text('features:\n  - {name: tags, transform: vocabulary, max_len: 2}\n'
                      '  - {name: y, source: "y[0]", transform: identity}\n')
    r = cli("convert", "-i", honest, "-c", config, "-o", tmp_path / "out", "--num-shards", "1")
    assert r.exit_code == 0, r.output
    assert check_accounting(tmp_path / "out")["read"] == 60
    r = cli("convert", "-i", lying, "-c", config, "-o", tmp_path / "out2", "--num-shards", "1")
    assert r.exit_code != 0, r.output
    assert "lists.parquet" in r.output and "row group 1" in r.output and "understates the rows" in r.output
    assert not (tmp_path / "out2" / "dataset_info.json").exists()
