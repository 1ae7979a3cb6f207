"""A conversion killed with SIGKILL at any point leaves no metadata, readers
refuse the directory, and a re-run finishes cleanly (issue: reliability)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from _pipelines_data import make_records, write_dataset

from convert.spec import METADATA_FILENAME

pytestmark = pytest.mark.slow


def _cmd(data, out):
    return [sys.executable, "-m", "pipelines.cli", "convert", "-i", str(data["json"]), "-c", str(data["config"]),
            "-o", str(out), "--num-shards", "4", "--batch-size", "200"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(6000))


def test_kill_at_several_points_then_rerun(data, tmp_path):
    # how long a full run takes here, to spread the kill points over it
    t0 = time.perf_counter()
    ref = tmp_path / "ref"
    subprocess.run(_cmd(data, ref), check=True, capture_output=True, timeout=300)
    full = time.perf_counter() - t0
    assert (ref / METADATA_FILENAME).exists()

    for frac in (0.15, 0.4, 0.7, 0.9):
        out = tmp_path / f"out{frac}"
        p = subprocess.Popen(_cmd(data, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(full * frac)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        if (out / METADATA_FILENAME).exists():
            continue  # it finished before the kill: nothing to check for this point
        import readers

        with pytest.raises(Exception, match="(?i)incomplete|not finished|dataset_info"):
            readers.load_info(str(out))
        r = subprocess.run(_cmd(data, out), capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert (out / METADATA_FILENAME).exists()
        assert not (out / ".recordprep-tmp").exists()
        shards = sorted(f.name for f in out.glob("*.tfrecord.gz"))
        assert shards == sorted(f.name for f in ref.glob("*.tfrecord.gz"))
        v = subprocess.run([sys.executable, "-m", "pipelines.cli", "verify", str(out)], capture_output=True, text=True, timeout=300)
        assert v.returncode == 0, v.stdout + v.stderr
        # the same records as the uninterrupted run, shard by shard
        for name in shards:
            assert (out / name).read_bytes() == (ref / name).read_bytes(), name
