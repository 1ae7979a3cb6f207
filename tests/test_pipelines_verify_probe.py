"""``verify`` on an output whose listed files were replaced by what no run
writes (issue 44 follow-up): a directory in a vocabulary's or the analysis'
place is a reported problem, not a traceback; a device in their place (a
symlink to ``/dev/zero``, which never ends) is read no further than one byte
past its size, so verify reports it instead of hashing forever. A path whose
URL scheme no file system reads is a usage error before any work."""

from __future__ import annotations

import shutil
import sys
import threading
from pathlib import Path

import pytest
from _pipelines_data import CONFIG, make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify_probe")
    data = write_dataset(root / "d", make_records(60))
    cfg = root / "cfg.yaml"
    cfg.write_text(CONFIG)
    out = root / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(cfg), "-o", str(out), "--num-shards", "1"])
    assert r.exit_code == 0, r.output
    return out


def _copy(made: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(made, out)
    return out


def _verify_within(out: Path, seconds: float = 120):
    """``verify`` in a thread: a run that never ends fails the test instead of hanging the suite."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(runner.invoke(app, ["verify", str(out)])), daemon=True)
    t.start()
    t.join(seconds)
    assert box, "verify did not finish: it reads a file that never ends"
    return box[0]


@pytest.mark.parametrize("name", ["vocab/color.txt", "analysis.json"])
def test_a_directory_in_a_listed_files_place_is_a_reported_problem(made, tmp_path, name):
    out = _copy(made, tmp_path)
    (out / name).unlink()
    (out / name).mkdir()
    r = _verify_within(out)
    assert r.exit_code == 1 and not isinstance(r.exception, IsADirectoryError), r.output
    assert f"{out / name}: unreadable (" in r.output and "re-run the conversion" in r.output


@pytest.mark.skipif(sys.platform != "linux" or not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("name", ["vocab/color.txt", "analysis.json"])
def test_a_listed_file_replaced_by_a_device_that_never_ends_is_reported(made, tmp_path, name):
    out = _copy(made, tmp_path)
    (out / name).unlink()
    (out / name).symlink_to("/dev/zero")
    r = _verify_within(out)
    assert r.exit_code == 1, r.output
    assert str(out / name) in r.output


@pytest.mark.skipif(sys.platform != "linux" or not Path("/dev/zero").exists(), reason="needs /dev/zero")
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_metadata_replaced_by_a_device_that_never_ends_is_refused_not_read_into_memory(made, tmp_path, command):
    """``read_file`` read the whole of it: /dev/zero filled the memory until the kernel killed the process."""
    out = _copy(made, tmp_path)
    (out / "dataset_info.json").unlink()
    (out / "dataset_info.json").symlink_to("/dev/zero")
    box: list = []
    t = threading.Thread(target=lambda: box.append(runner.invoke(app, [command, str(out)])), daemon=True)
    t.start()
    t.join(120)
    assert box, f"{command} did not finish: it reads a file that never ends"
    assert box[0].exit_code != 0 and "dataset_info.json" in box[0].output, box[0].output


@pytest.mark.parametrize(("args", "path"), [
    (["inspect", "http://127.0.0.1:9/out"], "http://127.0.0.1:9/out"),
    (["verify", "s3a://bucket/out"], "s3a://bucket/out"),
    (["convert", "-o", "http://127.0.0.1:9/out", "--dry-run"], "http://127.0.0.1:9/out"),
    (["convert", "--analysis-from", "https://127.0.0.1:9/prev", "--dry-run"], "https://127.0.0.1:9/prev"),
], ids=["inspect-http", "verify-s3a", "dry-run-output-http", "analysis-from-https"])
def test_a_path_no_file_system_reads_is_a_usage_error_before_any_work(made, tmp_path, args, path):
    """Before: the dry run passed (exit 0) and the others failed with Beam's ValueError (exit 1)."""
    if args[0] == "convert":
        info = made.parent
        args = ["convert", "-i", str(info / "d" / "*.avro"), "-c", str(info / "cfg.yaml"),
                *(["-o", str(tmp_path / "o")] if "-o" not in args else []), *args[1:]]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert f"{path}: no file system reads" in r.output and "copy the data" in r.output


def test_a_file_url_is_a_usage_error_naming_the_local_path(tmp_path):
    r = runner.invoke(app, ["inspect", f"file://{tmp_path}"])
    assert r.exit_code == 2 and f"write a local path without file:// ({tmp_path})" in r.output, r.output
