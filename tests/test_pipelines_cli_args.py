"""The command line's own arguments: several paths per ``--input``, nothing typed
dropped or handed to Beam unless after ``--``, ``--force``, the summary of error
files, and ``--help`` readable at 80 columns."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from _pipelines_data import CONFIG, make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()
RECORDPREP = Path(sys.executable).with_name("recordprep")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """``part-0.avro`` and ``part-1.avro`` (40 + 40 records) and their config."""
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(80))


def _files(data) -> list[str]:
    return [str(data["config"].parent / f"part-{k}.avro") for k in (0, 1)]


def _info(out: Path) -> dict:
    return json.loads((out / "dataset_info.json").read_text())


def _convert(*args: str) -> object:
    return runner.invoke(app, ["convert", *map(str, args)])


def test_several_paths_after_one_input_are_all_converted(data, tmp_path):
    out = tmp_path / "out"
    r = _convert("-i", *_files(data), "-c", data["config"], "-o", out, "--num-shards", "1")
    assert r.exit_code == 0, r.output
    info = _info(out)
    assert info["counts"]["read"] == 80
    assert sorted(f["path"] for f in info["inputs"]) == _files(data)


def test_paths_after_repeated_and_glued_inputs_add_up(data, tmp_path):
    a, b = _files(data)
    json_part = str(data["config"].parent / "part-0.jsonl")
    out = tmp_path / "out"
    r = _convert(f"--input={a}", json_part, "-c", data["config"], "-i", b, "-o", out, "--num-shards", "1")
    assert r.exit_code == 0, r.output
    assert sorted(f["path"] for f in _info(out)["inputs"]) == sorted([a, b, json_part])
    assert _info(out)["counts"]["read"] == 120


@pytest.mark.slow
def test_an_unquoted_glob_the_shell_expands_converts_every_file(data, tmp_path):
    out = tmp_path / "out"
    d = data["config"].parent
    cmd = f"{RECORDPREP} convert -i {d}/*.avro -c {data['config']} -o {out} --num-shards 1"
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _info(out)["counts"]["read"] == 80
    assert len(_info(out)["inputs"]) == 2


def test_beam_flags_after_the_double_dash_still_reach_beam(data, tmp_path):
    out = tmp_path / "out"
    r = _convert("-i", *_files(data), "-c", data["config"], "-o", out, "--num-shards", "1",
                 "--", "--runner", "BundleBasedDirectRunner")
    assert r.exit_code == 0, r.output
    assert _info(out)["runner"] == "BundleBasedDirectRunner"
    assert _info(out)["counts"]["read"] == 80
    # The same statistics as the default runner's (its side inputs and combine are its own).
    ref = tmp_path / "ref"
    assert _convert("-i", *_files(data), "-c", data["config"], "-o", ref, "--num-shards", "1").exit_code == 0
    assert json.loads((out / "stats.json").read_text()) == json.loads((ref / "stats.json").read_text())


def test_a_stray_argument_before_the_double_dash_is_refused(data, tmp_path):
    a, b = _files(data)
    out = tmp_path / "out"
    r = _convert("-i", a, "-c", data["config"], b, "-o", out)
    assert r.exit_code == 2
    assert b in r.output and "--input" in r.output and "`--`" in r.output
    assert not out.exists()
    r = _convert("-i", a, "-c", data["config"], "-o", out, "--dry-run", "oops")
    assert r.exit_code == 2 and "oops" in r.output


@pytest.mark.parametrize("beam", [["stray.avro"], ["--runner", "BundleBasedDirectRunner", "x/y.avro"],
                                  ["--save_main_session", "part-9.avro"], ["-x", "1"]])
def test_an_argument_beam_would_drop_after_the_double_dash_is_refused(data, tmp_path, beam):
    out = tmp_path / "out"
    r = _convert("-i", _files(data)[0], "-c", data["config"], "-o", out, "--", *beam)
    assert r.exit_code == 2, r.output
    assert "Beam would ignore" in r.output and beam[-1 if beam[0] != "-x" else 0] in r.output
    assert not out.exists()


def test_a_beam_flag_without_its_value_is_a_usage_error(data, tmp_path):
    r = _convert("-i", _files(data)[0], "-c", data["config"], "-o", tmp_path / "o", "--", "--runner")
    assert r.exit_code == 2 and "--runner" in r.output and "expected one argument" in r.output


def test_infer_takes_several_paths_after_one_input(data):
    r = runner.invoke(app, ["infer", "-i", *_files(data)])
    assert r.exit_code == 0, r.output
    assert "of 2 file(s)" in r.output
    r = runner.invoke(app, ["infer", "-i", _files(data)[0], "--sample", "5", "stray"])
    assert r.exit_code == 2 and "stray" in r.output


def test_force_reruns_a_complete_output_and_overwrite_does_not(data, tmp_path):
    out = tmp_path / "out"
    args = ["-i", *_files(data), "-c", data["config"], "-o", out, "--num-shards", "1"]
    assert _convert(*args).exit_code == 0
    shard = next(out.glob("train-*.tfrecord.gz"))
    shard.write_bytes(b"")  # a rerun rewrites it; a skipped run leaves it empty
    r = _convert(*args, "--overwrite")
    assert r.exit_code == 0 and "nothing to do" in r.output and "--force" in r.output
    assert shard.read_bytes() == b""
    r = _convert(*args, "--force")
    assert r.exit_code == 0, r.output
    assert "nothing to do" not in r.output
    assert not shard.exists()  # the rerun's shards carry its own run id
    assert next(out.glob("train-*.tfrecord.gz")).stat().st_size > 0


def test_force_never_deletes_files_no_run_wrote(data, tmp_path):
    out = tmp_path / "out"
    args = ["-i", *_files(data), "-c", data["config"], "-o", out, "--num-shards", "1"]
    assert _convert(*args).exit_code == 0
    (out / "notes.txt").write_text("mine")
    r = _convert(*args, "--force")
    assert r.exit_code == 1 and "notes.txt" in r.output and "nothing was deleted" in r.output
    assert (out / "notes.txt").read_text() == "mine"


def test_the_summary_gives_error_files_one_line(tmp_path):
    records = make_records(60)
    d = tmp_path / "d"
    d.mkdir()
    for k in range(6):  # one malformed line per file and work unit
        lines = [json.dumps(r) for r in records[k * 10:(k + 1) * 10]]
        (d / f"p{k}.jsonl").write_text("\n".join([*lines, '{"id": ']) + "\n")
    cfg = tmp_path / "features.yaml"
    cfg.write_text(CONFIG)
    out = tmp_path / "out"
    r = _convert("-i", d, "-c", cfg, "-o", out, "--num-shards", "6", "--max-errors", "10")
    assert r.exit_code == 0, r.output
    files = sorted(p.name for p in (out / "errors").glob("*.jsonl"))
    assert len(files) > 3  # work units with rejected records
    lines = [line for line in r.output.splitlines() if line.strip().startswith("errors")]
    assert len(lines) == 1, r.output
    shown = ", ".join(files[:3])
    assert re.search(rf"errors\s+6 records in .*/errors/ \({len(files)} files: {re.escape(shown)} and {len(files) - 3} more\)$",
                     lines[0]), lines[0]


def _commands() -> list[str]:
    return sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("command", [None, *_commands()])
def test_help_is_readable_at_80_columns(command):
    group = typer.main.get_command(app)
    argv = [command, "--help"] if command else ["--help"]
    r = CliRunner(env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}).invoke(app, argv)
    assert r.exit_code == 0, r.output
    assert "…" not in r.output
    cut = [line for line in r.output.splitlines() if line.rstrip().endswith("...") and not line.startswith("Usage:")]
    assert not cut, cut
    wide = [line for line in r.output.splitlines() if len(line) > 80]
    assert not wide, wide
    cmd = group.commands[command] if command else group
    names = [o for p in cmd.params for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ()))
             if o.startswith("-")] + ["--help"]
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", r.output), (command, name)
