"""The checks every remote store passes the same way (``tests/test_remote_s3.py``, ``tests/test_remote_azure.py``):
the lock's race, heartbeat and take-over, ``wait``/``verify``/``report``, failure reports, the staged
readers matching a local run, ``--analysis-from`` and hostile metadata.

Each takes a store's stack (``S3Stack``, ``AzureStack``: a ``ServerStack`` with ``ProxyControl``) with ``url(prefix)``, ``put``/``get``/``delete`` of a
key and ``names(prefix)``, whose environment is applied to this process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _pipelines_data import (
    by_shard,
    make_records,
    shards_without_run_id,
    without_run_id,
    write_dataset,
)
from _remote import stats_by_file_name

from convert.lockfile import LOCK_FILENAME
from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.run_files import ConversionFailed

RECORDPREP = Path(sys.executable).with_name("recordprep")


def opts(inputs: str, config: Path, output: str, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(inputs,), config=str(config), output=output, **kw)


def cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RECORDPREP), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or os.environ.copy())


def files(stack: Any, prefix: str) -> dict[str, bytes]:
    """The objects under ``prefix``, by name relative to it."""
    return {name[len(prefix) + 1:]: stack.get(name) for name in stack.names(prefix)}


def upload_inputs(stack: Any, data: Path, glob: str, prefix: str) -> str:
    """The files of ``data`` matching ``glob``, uploaded under ``prefix``; returns its URL."""
    for p in sorted(data.glob(glob)):
        stack.put(f"{prefix.strip('/')}/{p.name}", p.read_bytes())
    return stack.url(prefix)


def assert_like_local(remote: dict[str, bytes], local: Path) -> None:
    """The output's objects are a local run's files, byte for byte (less run ids and input names)."""
    remote = {without_run_id(k): v for k, v in remote.items()}  # shard names carry their run's id
    expected = {without_run_id(str(p.relative_to(local))): p for p in local.rglob("*") if p.is_file()}
    assert sorted(remote) == sorted(expected)  # no temp object, no lock, nothing else left
    for name, path in expected.items():
        if name == METADATA_FILENAME:
            continue
        if name == STATS_FILENAME:  # names its input files: the same statistics per file name
            assert stats_by_file_name(remote[name]) == stats_by_file_name(path.read_bytes())
            continue
        assert remote[name] == path.read_bytes(), name


def lock_race_has_one_winner(stack: Any, prefix: str) -> None:
    """Runs starting at the same instant cannot both take the lock (a check-then-write would let several through)."""
    from pipelines.lock import LockHeldError, OutputLock

    out = stack.url(prefix)
    for attempt in range(3):
        barrier = threading.Barrier(8)
        won: list[OutputLock] = []
        refused: list[LockHeldError] = []

        def start(barrier=barrier, won=won, refused=refused) -> None:
            lock = OutputLock(out)
            barrier.wait()
            try:
                won.append(lock.acquire())
            except LockHeldError as e:
                refused.append(e)

        threads = [threading.Thread(target=start) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(won) == 1 and len(refused) == 7, (attempt, len(won))
        won[0].release()
        assert f"{prefix}/{LOCK_FILENAME}" not in stack.names(prefix)


def lock_heartbeat_take_over_and_release(stack: Any, prefix: str) -> None:
    from pipelines.lock import LockHeldError, OutputLock, read_lock

    out, key = stack.url(prefix), f"{prefix}/{LOCK_FILENAME}"
    with OutputLock(out, fingerprint="a", heartbeat_seconds=0.1, stale_after_seconds=30) as lock:
        first = read_lock(out)
        assert first["owner"]["token"] == lock.owner["token"]
        with pytest.raises(LockHeldError, match="being written by another conversion"):
            OutputLock(out).acquire()
        time.sleep(0.5)
        assert read_lock(out)["heartbeat_unix"] > first["heartbeat_unix"]
    assert key not in stack.names(prefix)
    # A dead run's lock (no heartbeat for an hour) is taken over.
    stack.put(key, json.dumps({"owner": {"host": "elsewhere", "pid": 1, "user": "bob"},
                               "heartbeat_unix": time.time() - 3600}).encode())
    with OutputLock(out) as lock:
        assert lock.took_over["owner"]["user"] == "bob"
        assert json.loads(stack.get(key))["owner"]["token"] == lock.owner["token"]
        # A run that took it over meanwhile: release leaves its lock alone (If-Match on the ETag).
        stack.put(key, json.dumps({"owner": {"host": "elsewhere", "pid": 2, "user": "carol", "token": "x"},
                                   "heartbeat_unix": time.time()}).encode())
    assert json.loads(stack.get(key))["owner"]["user"] == "carol"
    stack.delete(key)


def wait_verify_and_report(out: str, tmp_path: Path) -> None:
    waited = cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    verified = cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    reported = cli("report", out, "--html", str(tmp_path / "r.html"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "train" in (tmp_path / "r.html").read_text()


def wait_ends_at_once_on_a_dead_run(stack: Any, prefix: str) -> None:
    stack.put(f"{prefix}/{LOCK_FILENAME}", json.dumps(
        {"owner": {"host": "elsewhere", "pid": 1, "user": "bob"}, "heartbeat_unix": time.time() - 3600,
         "heartbeat_seconds": 10, "stale_after_seconds": 60}).encode())
    waited = cli("wait", stack.url(prefix), "--timeout", "60", "--poll", "0.2")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "lock" in waited.stderr.lower() and "still incomplete" not in waited.stderr  # the dead run, not the timeout


def failed_conversion_leaves_its_failure_report(stack: Any, tmp_path: Path, prefix: str) -> None:
    paths = write_dataset(tmp_path / "data", make_records(60, seed=9), bad_json_lines=True)
    remote_in = upload_inputs(stack, tmp_path / "data", "*.jsonl", f"{prefix}/in")
    out = stack.url(f"{prefix}/out")
    with pytest.raises(ConversionFailed, match="rejected"):
        run_convert(opts(f"{remote_in}/*.jsonl", paths["config"], out, num_shards=2))
    names = stack.names(f"{prefix}/out")
    assert f"{prefix}/out/{FAILURE_FILENAME}" in names
    assert f"{prefix}/out/{METADATA_FILENAME}" not in names and f"{prefix}/out/{LOCK_FILENAME}" not in names
    assert any(n.startswith(f"{prefix}/out/errors/") for n in names)
    assert not any("/.recordprep-tmp/" in n for n in names)
    waited = cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 1 and "rejected" in waited.stderr, waited.stdout + waited.stderr


def staged_readers_match_local(stack: Any, out: str, local: Path, staged: Path) -> None:
    """The readers copy the metadata and the shards they read into ``staged`` (the store's staging
    directory of ``out``) and read the same values as from ``local``; a second read downloads nothing."""
    import readers

    info = readers.load_info(out + "/train-*")
    local_info = readers.load_info(str(local))
    assert shards_without_run_id(info) == shards_without_run_id(local_info) and info.features == local_info.features
    for split in ("train", "eval"):
        remote_batches = list(readers.eval_dataset(f"{out}/{split}-*", 32).as_numpy_iterator())
        local_batches = list(readers.eval_dataset(f"{local}/{split}-*", 32).as_numpy_iterator())
        assert len(remote_batches) == len(local_batches) > 0
        for (rf, rl), (lf, ll) in zip(remote_batches, local_batches, strict=True):
            np.testing.assert_array_equal(rl, ll)
            for k in rf:
                np.testing.assert_array_equal(rf[k], lf[k], err_msg=k)
    for shard in info.splits["train"].shards:
        assert (staged / shard.file).read_bytes() == by_shard(local, shard.file).read_bytes()

    def ids(pattern: str) -> list[int]:
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, seed=3)
        return sorted(int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0])

    stack.proxy_stats(reset=True)
    assert ids(f"{out}/train-*") == ids(f"{local}/train-*")
    counts = stack.proxy_stats()["counts"]
    # Staged shards unchanged on the store are not downloaded again: only HEADs and the metadata.
    assert counts.get("HEAD plain", 0) >= len(info.splits["train"].shards)
    assert counts.get("bytes_out", 0) < min(s.num_bytes for s in info.splits["train"].shards) + 64 << 10


def analysis_from_reuses_the_vocabularies(stack: Any, inputs: str, config: Path, earlier: str, prefix: str) -> None:
    """``--analysis-from`` the output under ``earlier``: its vocabularies and scalings, reused as they are."""
    run = cli("convert", "--input", inputs, "--config", str(config), "--output", stack.url(prefix),
              "--num-shards", "2", "--analysis-from", stack.url(earlier), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    reused, first = files(stack, prefix), files(stack, earlier)
    vocab = [n for n in first if n.startswith("vocab/")]
    assert vocab and all(reused[n] == first[n] for n in vocab)


def hostile_metadata_stages_nothing(stack: Any, local: Path, prefix: str, tmp_path: Path) -> None:
    """A dataset_info.json naming a shard outside its directory is refused before anything is copied
    (the store's staging directory must be under ``tmp_path``)."""
    import readers
    from convert.spec import SpecError

    doc = json.loads((local / METADATA_FILENAME).read_text())
    doc["splits"]["train"]["shards"][0]["file"] = "../../x.sh"
    stack.put("x.sh", b"#!/bin/sh\necho owned\n")
    for p in local.glob("train-*"):
        stack.put(f"{prefix}/{p.name}", p.read_bytes())
    stack.put(f"{prefix}/{METADATA_FILENAME}", json.dumps(doc).encode())
    with pytest.raises(SpecError, match="must be a plain file name inside the output"):
        readers.train_dataset(stack.url(prefix) + "/train-*", 4, num_epochs=1)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def worker_processes_convert_like_local(stack: Any, inputs: str, config: Path, local: Path, prefix: str) -> None:
    """Multi-process workers (``pipelines.local.worker``: the store's Beam file system loaded because a path uses it)."""
    result = run_convert(opts(inputs, config, stack.url(prefix), num_shards=3, workers=2))
    assert "2 worker processes" in result.info["runner"]
    written = {without_run_id(k): v for k, v in files(stack, prefix).items()}
    for p in local.rglob("*.tfrecord.gz"):
        name = without_run_id(str(p.relative_to(local)))
        assert written[name] == p.read_bytes(), name
