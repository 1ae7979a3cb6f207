"""The lock's split brain with real processes on every object store (issue 44, item 1): a run
paused while holding the lock of a ``gs://`` (emulator), ``s3://`` (moto) or ``azfs://``
(Azurite) output, whose lock another run took over and committed, stops without deleting or
committing anything (``tests/_lock_fencing.py``); and a run whose store dies fails in bounded
time naming it (item 14)."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from _lock_fencing import convert_cmd, env, split_brain_is_refused, wait_paused
from _pipelines_data import make_records, write_dataset

from pipelines.lock import PAUSE_ENV

pytestmark = pytest.mark.slow


def _files(stack, prefix: str, get) -> dict[str, bytes]:
    return {name[len(prefix) + 1:]: get(name) for name in stack(prefix)}


def test_split_brain_on_gcs(remote_stack, tmp_path):
    data = write_dataset(tmp_path / "d", make_records(600))
    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    prefix = "fencing/out"
    err = split_brain_is_refused(
        data, f"gs://{remote_stack.bucket}/{prefix}",
        lambda: _files(remote_stack.gcs_names, prefix, lambda n: bucket.blob(n).download_as_bytes()),
        "commit-shards", preconditions=False)
    assert "the lock of gs://" in err


def test_split_brain_on_s3(s3_stack, tmp_path):
    data = write_dataset(tmp_path / "d", make_records(600))
    prefix = "fencing/out"
    split_brain_is_refused(data, s3_stack.url(prefix), lambda: _files(s3_stack.names, prefix, s3_stack.get),
                           "commit-shards")


def test_split_brain_on_azure(azure_stack, tmp_path):
    data = write_dataset(tmp_path / "d", make_records(600))
    prefix = "fencing/out"
    split_brain_is_refused(data, azure_stack.url(prefix), lambda: _files(azure_stack.names, prefix, azure_stack.get),
                           "commit-metadata")


# ------------------------------------------------------------------ a store that dies (item 14)


@pytest.mark.parametrize("sigterm", [False, True], ids=["alone", "sigterm"])
def test_a_run_whose_store_dies_stops_naming_it(tmp_path, sigterm):
    """A private moto (the shared one lives on) is stopped while the run is paused before its
    commit; resumed, the run cannot prove it holds its lock: exit 1 naming the lock's store,
    or, told to stop with SIGTERM, 143 (the lock's calls fail in bounded time: no minutes of retries)."""
    from _remote_process import ServerMissing
    from _remote_s3 import S3Stack

    data = write_dataset(tmp_path / "d", make_records(300))
    try:
        stack = S3Stack(workdir=tmp_path / "s3")
    except ServerMissing as e:
        pytest.skip(f"local S3 server unavailable: {e}")
    with stack:
        out = stack.url("dies/out")
        a = subprocess.Popen(convert_cmd(data, out, 2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env(stack.env(), **{PAUSE_ENV: "commit-shards"}))
        try:
            wait_paused(a)
            stack.stop()
            if sigterm:  # pending while the run is stopped: the first thing it meets when resumed
                os.kill(a.pid, signal.SIGTERM)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        _, err = a.communicate(timeout=300)  # before the fix: still retrying after 480 s
    if sigterm:
        assert a.returncode == 143 and "SIGTERM" in err, err
    else:
        assert a.returncode == 1, err
        assert f"the lock of {out} could not be refreshed for" in err and f"{out}/_LOCK.json" in err, err
    assert "Traceback" not in err, err
