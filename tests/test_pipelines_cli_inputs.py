"""``--input`` through the CLI: directories without a slash, literal names with glob characters,
FIFOs (no hang), unreadable and vanished files (one-line errors)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _pipelines_data import CONFIG, make_records
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()
RECORDPREP = Path(sys.executable).with_name("recordprep")
TIMEOUT_S = 120  # a FIFO regression must fail, not hang the suite


def _jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture
def data(tmp_path):
    """``d/`` holds two JSON Lines files (40 records); the config sits outside it."""
    records = make_records(40)
    d = tmp_path / "d"
    d.mkdir()
    _jsonl(d / "part-0.jsonl", records[:25])
    _jsonl(d / "part-1.jsonl", records[25:])
    cfg = tmp_path / "features.yaml"
    cfg.write_text(CONFIG)
    return {"dir": d, "config": cfg, "records": records, "root": tmp_path}


def _run(*args: str, cwd: Path | None = None, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, str(RECORDPREP), *args], capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd)


@pytest.mark.slow
def test_convert_reads_a_directory_given_without_slash(data):
    out = data["root"] / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["dir"]), "-c", str(data["config"]), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "records read: 40" in r.output
    info = json.loads((out / "dataset_info.json").read_text())
    assert sorted(f["path"] for f in info["inputs"]) == [str(data["dir"] / "part-0.jsonl"), str(data["dir"] / "part-1.jsonl")]


def test_infer_reads_a_directory_given_without_slash(data):
    r = runner.invoke(app, ["infer", "-i", str(data["dir"])])
    assert r.exit_code == 0, r.output
    assert "inferred from 40 records of 2 file(s)" in r.output


@pytest.mark.slow
def test_a_literal_name_with_glob_characters_converts_that_file(data):
    d = data["dir"]
    for p in d.iterdir():
        p.unlink()
    _jsonl(d / "br[1].jsonl", data["records"][:20])
    _jsonl(d / "br1.jsonl", data["records"][20:])  # what the glob br[1].jsonl would match
    out = data["root"] / "out"
    r = runner.invoke(app, ["convert", "-i", str(d / "br[1].jsonl"), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2"])
    assert r.exit_code == 0, r.output
    assert "records read: 20" in r.output
    info = json.loads((out / "dataset_info.json").read_text())
    assert [f["path"] for f in info["inputs"]] == [str(d / "br[1].jsonl")]
    r = runner.invoke(app, ["infer", "-i", str(d / "br[1].jsonl")])
    assert r.exit_code == 0 and "inferred from 20 records of 1 file(s)" in r.output, r.output


@pytest.mark.parametrize("where", ["direct", "directory"])
@pytest.mark.parametrize("command", ["convert", "infer"])
def test_a_fifo_input_is_refused_not_waited_on(data, where, command):
    fifo = data["dir"] / "stream.jsonl"
    os.mkfifo(fifo)
    given = str(fifo if where == "direct" else data["dir"])
    args = ["-i", given] + (["-c", str(data["config"]), "-o", str(data["root"] / "out")] if command == "convert" else [])
    r = _run(command, *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (data["root"] / "out").exists()


def test_a_symlink_to_a_regular_file_is_an_input(data):
    link = data["root"] / "link.jsonl"
    link.symlink_to(data["dir"] / "part-0.jsonl")
    r = runner.invoke(app, ["convert", "-i", str(link), "-c", str(data["config"]), "-o", str(data["root"] / "o"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "inputs: 1 files" in r.output and str(link) in r.output


@pytest.mark.parametrize("form", ["glob", "directory", "path", "glob_here", "recursive_glob"])
@pytest.mark.parametrize("command", ["convert", "infer"])
def test_a_dangling_symlink_is_refused_naming_it_however_it_is_given(data, command, form, monkeypatch):
    link = data["dir"] / "part-2.jsonl"
    link.symlink_to(data["root"] / "gone.jsonl")
    monkeypatch.chdir(data["dir"])
    given = {"glob": str(data["dir"] / "*.jsonl"), "directory": str(data["dir"]), "path": str(link),
             "glob_here": "*.jsonl", "recursive_glob": str(data["root"] / "**.jsonl")}[form]
    out = data["root"] / "o"
    args = ["-i", given, "-c", str(data["config"]), "-o", str(out)] if command == "convert" else ["-i", given]
    r = runner.invoke(app, [command, *args])
    assert r.exit_code == 2, r.output
    assert "part-2.jsonl" in r.output and "broken symlink" in r.output, r.output
    assert not out.exists()


def test_a_glob_skips_hidden_names_and_matches_within_a_segment(data):
    (data["dir"] / ".part-9.jsonl").symlink_to(data["root"] / "gone.jsonl")
    sub = data["dir"] / "sub"
    sub.mkdir()
    _jsonl(sub / "part-3.jsonl", data["records"][:1])
    r = runner.invoke(app, ["convert", "-i", str(data["dir"] / "*.jsonl"), "-c", str(data["config"]),
                            "-o", str(data["root"] / "o"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "inputs: 2 files" in r.output and "part-3" not in r.output, r.output


def _without_read_permission() -> tuple[str, ...]:
    """A command prefix under which a mode-000 file cannot be read (root drops its DAC capabilities)."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search")


@pytest.mark.parametrize("command", ["convert", "infer"])
def test_an_unreadable_input_is_named(data, command):
    bad = data["dir"] / "part-1.jsonl"
    bad.chmod(0)
    prefix = _without_read_permission()
    probe = subprocess.run([*prefix, "cat", str(bad)], capture_output=True, timeout=TIMEOUT_S)
    if probe.returncode == 0:
        pytest.skip("this environment can still read a mode-000 file")
    args = ["-i", str(data["dir"])] + (["-c", str(data["config"]), "-o", str(data["root"] / "out")] if command == "convert" else [])
    r = _run(command, *args, prefix=prefix)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{bad} is not readable (permission denied)" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("num_shards", ["1", "2"])
def test_an_input_removed_after_listing_is_a_one_line_error(data, monkeypatch, num_shards):
    """Removed between discovery and reading: in planning (2 shards cut the file) or in the job (1 shard)."""
    import pipelines.plan

    gone = data["dir"] / "part-1.jsonl"
    real = pipelines.plan.discover

    def discover_then_remove(patterns):
        files = real(patterns)
        gone.unlink()
        return files

    monkeypatch.setattr(pipelines.plan, "discover", discover_then_remove)
    r = runner.invoke(app, ["convert", "-i", str(gone), "-c", str(data["config"]), "-o", str(data["root"] / "out"), "--num-shards", num_shards])
    assert r.exit_code in (1, 2), r.output
    assert str(gone) in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) <= 2, r.output  # "converting ..." and the error
