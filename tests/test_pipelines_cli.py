"""The CLI through typer's CliRunner: messages, exit codes, no tracebacks."""

from __future__ import annotations

import json

import pytest
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(80))


@pytest.mark.slow
def test_convert_then_inspect(data, tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2"])
    assert r.exit_code == 0, r.output
    assert "records read: 80" in r.output
    r = runner.invoke(app, ["inspect", str(out), "-n", "2"])
    assert r.exit_code == 0, r.output
    assert "split train:" in r.output and "example 1" in r.output
    assert "tags_len" in r.output
    r = runner.invoke(app, ["wait", str(out), "--timeout", "1"])
    assert r.exit_code == 0 and "complete" in r.output


def test_dry_run_prints_the_plan(data, tmp_path):
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(tmp_path / "o"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "inputs: 2 files" in r.output and "shards per split: 1" in r.output
    assert "user_name" in r.output and "user.name" in r.output
    assert not (tmp_path / "o").exists()


def test_bad_config_is_a_usage_error_without_traceback(data, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("features:\n  - {name: x, transform: zscroe}\n")
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(cfg), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "feature 'x'" in r.output and "zscroe" in r.output and "zscore" in r.output
    assert "Traceback" not in r.output


def test_no_matching_input(data, tmp_path):
    r = runner.invoke(app, ["convert", "-i", str(tmp_path / "nope*.avro"), "-c", str(data["config"]), "-o", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert "matched no files" in r.output


@pytest.mark.slow
def test_unreadable_input_names_the_file(data, tmp_path):
    bad = tmp_path / "bad.avro"
    bad.write_bytes(b"Obj\n")
    r = runner.invoke(app, ["convert", "-i", str(bad), "-c", str(data["config"]), "-o", str(tmp_path / "o")])
    assert r.exit_code == 1
    assert str(bad) in r.output and "Traceback" not in r.output


def test_wait_times_out_on_incomplete_output(tmp_path):
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "0.2", "--poll", "0.05"])
    assert r.exit_code == 1
    assert "still incomplete" in r.output


def test_wait_reports_a_failed_conversion(tmp_path):
    (tmp_path / "_FAILURE.json").write_text(json.dumps({"reason": "3 of 10 records were rejected"}))
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "5"])
    assert r.exit_code == 1 and "3 of 10 records were rejected" in r.output


@pytest.mark.slow
def test_verify_finds_damage(data, tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out),
                            "--num-shards", "2", "--compression", "none"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0 and "OK (4 shards, 80 records" in r.output
    shard = sorted(out.glob("train-00000-*"))[0]
    data_ = bytearray(shard.read_bytes())
    data_[len(data_) // 2] ^= 0xFF
    shard.write_bytes(bytes(data_))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1
    assert shard.name in r.output and "CRC mismatch" in r.output
    gone = sorted(out.glob("eval-00001-of-00002-*.tfrecord"))[0]
    gone.unlink()
    r = runner.invoke(app, ["verify", str(out)])
    assert f"{gone.name}: listed in the metadata but missing" in r.output
    # The analysis and vocabularies are the committed run's (their digests in the metadata).
    vocab = sorted((out / "vocab").glob("*.txt"))[0]
    vocab.write_text("another\nrun\n")
    (out / "analysis.json").write_text((out / "analysis.json").read_text().replace("[", "[ ", 1))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 1
    for name in (vocab.name, "analysis.json"):
        assert f"{name}: not the file the metadata was committed with" in r.output.replace("\n", ""), r.output


def test_unknown_layout_is_a_one_line_error(tmp_path, data):
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(tmp_path / "o"),
                            "--layout", "columnar"])
    assert r.exit_code == 2 and "--layout must be one of" in r.output and "Traceback" not in r.output


def test_inspect_aligns_its_feature_columns_however_long_the_names(data, tmp_path):
    long_name = "a_feature_name_much_longer_than_twenty_four_characters"
    cfg = tmp_path / "long.yaml"
    cfg.write_text(f"features:\n  - {{name: {long_name}, source: user.name, transform: vocabulary}}\n"
                   "  - {name: a, source: user.name, transform: hash, buckets: 8}\n"
                   "  - {name: x_z, source: x, transform: zscore}\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(cfg), "-o", str(out), "--num-shards", "1"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["inspect", str(out), "-n", "0"])
    assert r.exit_code == 0, r.output
    rows = r.output.split("features (3):\n")[1].splitlines()[:3]
    assert [row.split()[0] for row in rows] == [long_name, "a", "x_z"], rows
    for col in ("shape=", "<-"):  # every column starts at one place in every row
        assert len({row.index(col) for row in rows}) == 1, (col, rows)
