"""A conversion killed with SIGKILL at any point leaves no metadata, readers
refuse the directory, and a re-run finishes cleanly (issue: reliability).

Each kill lands in a chosen phase, found by watching the run's own progress
(its progress files, its temp shards) or, for the commit's rename loop, which
is too short to hit from outside, by holding the run after its first shard
rename until the kill."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pipelines_data import by_shard, make_records, without_run_id, write_dataset

from convert.spec import METADATA_FILENAME
from pipelines.run_files import TMP_DIR

pytestmark = pytest.mark.slow

#: The launcher, with each shard rename into the output's top level followed by
#: a marker file and a wait for the kill when argv[1] is set.
_LAUNCHER = r"""
import os, sys, time
out, marker = os.path.abspath(sys.argv[1]), sys.argv[2]
if marker:
    real = os.rename

    def rename(src, dst, *a, **kw):
        real(src, dst, *a, **kw)
        if os.path.dirname(os.path.abspath(dst)) == out and ".tfrecord" in os.path.basename(dst):
            open(marker, "w").close()
            time.sleep(3600)  # the test kills the run here: one shard renamed, the others not

    os.rename = rename
from pipelines.cli import main
sys.argv = ["recordprep", *sys.argv[3:]]
main()
"""


def _args(data, out):
    return ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out),
            "--num-shards", "4", "--batch-size", "200"]


def _final_shards(out: Path) -> list[str]:
    return sorted(f.name for f in out.glob("*.tfrecord*"))


def _temp_shards(out: Path) -> list[Path]:
    return [p for p in (out / TMP_DIR).rglob("*.tfrecord*") if p.is_file()]


def _progress_files(out: Path) -> list[Path]:
    return list((out / TMP_DIR / "progress").glob("*.json"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(6000))


@pytest.fixture(scope="module")
def ref(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "out"
    subprocess.run([sys.executable, "-m", "pipelines.cli", *_args(data, out)], check=True, capture_output=True, timeout=300)
    assert (out / METADATA_FILENAME).exists()
    return out


def _kill_when(data, out: Path, reached, marker: str = "") -> None:
    """Start the run, SIGKILL it (and any worker) as soon as ``reached()``; fail if it ends first."""
    p = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(out), marker, *_args(data, out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not reached():
            assert p.poll() is None, f"the run ended (exit {p.returncode}) before the phase the kill waits for"
            assert time.monotonic() < deadline, "the run never reached the phase the kill waits for"
            time.sleep(0.005)
        os.killpg(p.pid, signal.SIGKILL)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL


@pytest.mark.parametrize("phase", ["reading", "shards in the temp dir", "renaming shards"])
def test_kill_at_a_phase_then_rerun(data, ref, tmp_path, phase):
    out = tmp_path / "out"
    marker = tmp_path / "renamed-one"
    if phase == "reading":
        _kill_when(data, out, lambda: bool(_progress_files(out)))
        assert not _final_shards(out)
    elif phase == "shards in the temp dir":
        _kill_when(data, out, lambda: bool(_temp_shards(out)))
        assert not _final_shards(out) and _temp_shards(out)  # killed before the commit
    else:
        _kill_when(data, out, marker.exists, marker=str(marker))
        assert len(_final_shards(out)) == 1 and _temp_shards(out)  # in the middle of the renames
    assert not (out / METADATA_FILENAME).exists()
    import readers

    with pytest.raises(Exception, match="(?i)incomplete|not finished|dataset_info"):
        readers.load_info(str(out))
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", *_args(data, out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (out / METADATA_FILENAME).exists()
    assert not (out / TMP_DIR).exists()
    shards = _final_shards(out)  # the dead run's shard is gone: only the re-run's, one per name
    assert [without_run_id(n) for n in shards] == [without_run_id(n) for n in _final_shards(ref)]
    v = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", str(out)], capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout + v.stderr
    # the same records as the uninterrupted run, shard by shard
    for name in shards:
        assert (out / name).read_bytes() == by_shard(ref, name).read_bytes(), name
