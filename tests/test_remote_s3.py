"""s3:// end to end against moto's S3 in server mode (``tests/_remote_s3.py``): the real Beam job
reads and writes through Beam's S3 file system (boto3), configured only by the environment a user
sets (``AWS_ENDPOINT_URL`` and keys); the lock uses S3's conditional writes; ``readers`` stage the
shards through boto3. Results are checked against a local conversion of the same records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

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

pytestmark = pytest.mark.slow

RECORDPREP = Path(sys.executable).with_name("recordprep")


def _opts(inputs: str, config: Path, output: str, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(inputs,), config=str(config), output=output, **kw)


def _files(s3_stack, prefix: str) -> dict[str, bytes]:
    return {name[len(prefix) + 1:]: s3_stack.get(name) for name in s3_stack.names(prefix)}


@pytest.fixture(scope="module")
def s3_dataset(s3_stack, tmp_path_factory):
    """AVRO inputs on s3://, converted by the CLI (s3:// -> s3://) and locally with run_convert."""
    root = tmp_path_factory.mktemp("s3")
    paths = write_dataset(root / "data", make_records(400, seed=5))
    upload = root / "upload"
    upload.mkdir()
    for p in sorted((root / "data").glob("*.avro")):
        (upload / p.name).write_bytes(p.read_bytes())
    s3_in = s3_stack.upload_dir(upload, "e2e/in")
    # A temp object an earlier, killed attempt left behind: the commit must remove it.
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key="e2e/out/.recordprep-tmp/train-00000-deadbeef.tfrecord.gz",
                                 Body=b"junk")
    s3_out = f"s3://{s3_stack.bucket}/e2e/out/"
    s3_stack.proxy_stats(reset=True)
    started = time.monotonic()
    cli = subprocess.run(
        [str(RECORDPREP), "convert", "--input", f"{s3_in}/*.avro", "--config", str(paths["config"]),
         "--output", s3_out, "--num-shards", "3"],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )
    cli_seconds = time.monotonic() - started
    assert cli.returncode == 0, cli.stdout + cli.stderr
    local_out = root / "local-out"
    run_convert(_opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "s3_in": s3_in, "s3_out": s3_out.rstrip("/"), "local": local_out,
            "cli": cli, "cli_seconds": cli_seconds, "requests": s3_stack.proxy_stats()["counts"]}


def test_cli_converts_s3_to_s3_like_a_local_run(s3_dataset, s3_stack):
    # shard names carry their run's id: the two runs' files are matched without it
    files = {without_run_id(k): v for k, v in _files(s3_stack, "e2e/out").items()}
    local = {without_run_id(str(p.relative_to(s3_dataset["local"]))): p
             for p in s3_dataset["local"].rglob("*") if p.is_file()}
    expected = sorted(local)
    assert sorted(files) == expected  # the stale temp object and the lock are gone, nothing else is left
    for name in expected:
        if name == METADATA_FILENAME:
            continue
        if name == STATS_FILENAME:  # names its input files: the same statistics per file name
            assert stats_by_file_name(files[name]) == stats_by_file_name(local[name].read_bytes())
            continue
        assert files[name] == local[name].read_bytes(), name
    # Everything went through the endpoint of the environment (the proxy counts it).
    assert s3_dataset["requests"].get("PUT plain", 0) > 0 and s3_dataset["requests"].get("GET plain", 0) > 0
    assert s3_dataset["cli_seconds"] < 120
    assert "recordprep-test-secret" not in s3_dataset["cli"].stdout + s3_dataset["cli"].stderr


def test_rerun_is_a_no_op(s3_dataset):
    opts = _opts(f"{s3_dataset['s3_in']}/*.avro", s3_dataset["paths"]["config"], s3_dataset["s3_out"], num_shards=3)
    assert run_convert(opts).skipped  # same inputs (s3:// sizes and mtimes) and config


def test_lock_on_s3_lets_exactly_one_of_many_racing_runs_win(s3_stack):
    """S3's conditional create (If-None-Match: *): runs starting at the same instant cannot
    both take the lock (a check-then-write would let several through)."""
    from pipelines.lock import LockHeldError, OutputLock

    out = f"s3://{s3_stack.bucket}/lock-race/out"
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
        assert f"lock-race/out/{LOCK_FILENAME}" not in s3_stack.names("lock-race/out")


def test_lock_on_s3_is_not_taken_when_another_run_writes_it_first(s3_stack, monkeypatch):
    """Another run's lock lands between our check and our write (the race a check-then-write
    loses, deterministic here): the conditional create refuses, and that run keeps its lock."""
    import boto3

    from pipelines.lock import LockHeldError, OutputLock

    out = f"s3://{s3_stack.bucket}/lock-between/out"
    key = f"lock-between/out/{LOCK_FILENAME}"
    carol = json.dumps({"owner": {"host": "elsewhere", "pid": 2, "user": "carol", "token": "c"},
                        "heartbeat_unix": time.time()}).encode()
    written: list[str] = []

    def other_run_first(**_) -> None:
        if not written:
            written.append(key)
            s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=key, Body=carol)

    real_client = boto3.session.Session.client

    def client(self, *args, **kwargs):
        c = real_client(self, *args, **kwargs)
        for op in ("PutObject", "CreateMultipartUpload"):
            c.meta.events.register(f"before-call.s3.{op}", other_run_first)
        return c

    monkeypatch.setattr(boto3.session.Session, "client", client)
    with pytest.raises(LockHeldError, match="carol"):
        OutputLock(out).acquire()
    monkeypatch.undo()
    assert written and s3_stack.get(key) == carol
    s3_stack.client().delete_object(Bucket=s3_stack.bucket, Key=key)


def test_lock_on_s3_heartbeat_take_over_and_release(s3_stack):
    from pipelines.lock import LockHeldError, OutputLock, read_lock

    out = f"s3://{s3_stack.bucket}/lock-test/out"
    key = f"lock-test/out/{LOCK_FILENAME}"
    with OutputLock(out, fingerprint="a", heartbeat_seconds=0.1, stale_after_seconds=30) as lock:
        first = read_lock(out)
        assert first["owner"]["token"] == lock.owner["token"]
        with pytest.raises(LockHeldError, match="being written by another conversion"):
            OutputLock(out).acquire()
        time.sleep(0.5)
        assert read_lock(out)["heartbeat_unix"] > first["heartbeat_unix"]
    assert key not in s3_stack.names("lock-test/out")
    # A dead run's lock (no heartbeat for an hour) is taken over.
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=key, Body=json.dumps(
        {"owner": {"host": "elsewhere", "pid": 1, "user": "bob"}, "heartbeat_unix": time.time() - 3600}).encode())
    with OutputLock(out) as lock:
        assert lock.took_over["owner"]["user"] == "bob"
        assert json.loads(s3_stack.get(key))["owner"]["token"] == lock.owner["token"]
        # A run that took it over meanwhile: release leaves its lock alone (If-Match on the ETag).
        s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=key, Body=json.dumps(
            {"owner": {"host": "elsewhere", "pid": 2, "user": "carol", "token": "x"},
             "heartbeat_unix": time.time()}).encode())
    assert json.loads(s3_stack.get(key))["owner"]["user"] == "carol"
    s3_stack.client().delete_object(Bucket=s3_stack.bucket, Key=key)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(RECORDPREP), *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())


def test_wait_verify_and_report_on_s3(s3_dataset, tmp_path):
    out = s3_dataset["s3_out"]
    waited = _cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    verified = _cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    reported = _cli("report", out, "--html", str(tmp_path / "r.html"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "train" in (tmp_path / "r.html").read_text()


def test_wait_ends_at_once_on_a_dead_run_on_s3(s3_stack):
    key = f"dead/out/{LOCK_FILENAME}"
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=key, Body=json.dumps(
        {"owner": {"host": "elsewhere", "pid": 1, "user": "bob"}, "heartbeat_unix": time.time() - 3600,
         "heartbeat_seconds": 10, "stale_after_seconds": 60}).encode())
    started = time.monotonic()
    waited = _cli("wait", f"s3://{s3_stack.bucket}/dead/out", "--timeout", "60", "--poll", "0.2")
    assert waited.returncode == 1 and time.monotonic() - started < 30, waited.stdout + waited.stderr
    assert "lock" in waited.stderr.lower()


def test_failed_conversion_on_s3_leaves_its_failure_report(s3_stack, tmp_path):
    paths = write_dataset(tmp_path / "data", make_records(60, seed=9), bad_json_lines=True)
    upload = tmp_path / "upload"
    upload.mkdir()
    for p in sorted((tmp_path / "data").glob("*.jsonl")):
        (upload / p.name).write_bytes(p.read_bytes())
    s3_in = s3_stack.upload_dir(upload, "failing/in")
    out = f"s3://{s3_stack.bucket}/failing/out"
    with pytest.raises(ConversionFailed, match="rejected"):
        run_convert(_opts(f"{s3_in}/*.jsonl", paths["config"], out, num_shards=2))
    names = s3_stack.names("failing/out")
    assert f"failing/out/{FAILURE_FILENAME}" in names
    assert f"failing/out/{METADATA_FILENAME}" not in names and f"failing/out/{LOCK_FILENAME}" not in names
    assert any(n.startswith("failing/out/errors/") for n in names)
    assert not any("/.recordprep-tmp/" in n for n in names)
    waited = _cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 1 and "rejected" in waited.stderr, waited.stdout + waited.stderr


def test_readers_on_s3_stage_the_shards_and_match_local(s3_dataset, s3_stack, tmp_path, monkeypatch):
    """TensorFlow 2.21 has no S3 file system: the readers copy the metadata and the shards they
    read to local disk (boto3, the environment's endpoint and keys) and read them there."""
    import readers

    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(tmp_path / "cache"))
    out, local = s3_dataset["s3_out"], str(s3_dataset["local"])
    info = readers.load_info(out + "/train-*")
    local_info = readers.load_info(local)
    assert shards_without_run_id(info) == shards_without_run_id(local_info) and info.features == local_info.features
    for split in ("train", "eval"):
        remote_batches = list(readers.eval_dataset(f"{out}/{split}-*", 32).as_numpy_iterator())
        local_batches = list(readers.eval_dataset(f"{local}/{split}-*", 32).as_numpy_iterator())
        assert len(remote_batches) == len(local_batches) > 0
        for (rf, rl), (lf, ll) in zip(remote_batches, local_batches, strict=True):
            np.testing.assert_array_equal(rl, ll)
            for k in rf:
                np.testing.assert_array_equal(rf[k], lf[k], err_msg=k)
    staged = tmp_path / "cache" / s3_stack.bucket / "e2e" / "out"
    for shard in info.splits["train"].shards:
        assert (staged / shard.file).read_bytes() == by_shard(s3_dataset["local"], shard.file).read_bytes()

    def ids(pattern: str) -> list[int]:
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, seed=3)
        return sorted(int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0])

    s3_stack.proxy_stats(reset=True)
    assert ids(f"{out}/train-*") == ids(f"{local}/train-*")
    counts = s3_stack.proxy_stats()["counts"]
    # Staged shards unchanged on S3 are not downloaded again: only HEADs and the metadata.
    assert counts.get("HEAD plain", 0) >= len(info.splits["train"].shards)
    assert counts.get("bytes_out", 0) < min(s.num_bytes for s in info.splits["train"].shards) + 64 << 10


def test_readers_on_s3_name_a_failed_or_missing_output(s3_stack, tmp_path, monkeypatch):
    import readers

    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(tmp_path / "cache"))
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=f"rfail/out/{FAILURE_FILENAME}",
                                 Body=json.dumps({"reason": "3 records rejected"}).encode())
    with pytest.raises(readers.DatasetFailedError, match="rejected"):
        readers.load_info(f"s3://{s3_stack.bucket}/rfail/out")
    with pytest.raises((readers.DatasetIncompleteError, TimeoutError)):
        readers.wait_for_dataset(f"s3://{s3_stack.bucket}/nothing/out", timeout=0.5, poll=0.2)


def test_worker_processes_convert_s3_to_s3_like_a_local_run(s3_dataset, s3_stack):
    """Multi-process workers (``pipelines.local.worker``: Beam's S3 file system loaded because a path uses it)."""
    out = f"s3://{s3_stack.bucket}/workers/out"
    result = run_convert(_opts(f"{s3_dataset['s3_in']}/*.avro", s3_dataset["paths"]["config"], out,
                               num_shards=3, workers=2))
    assert "2 worker processes" in result.info["runner"]
    files = _files(s3_stack, "workers/out")
    files = {without_run_id(k): v for k, v in files.items()}
    for p in s3_dataset["local"].rglob("*.tfrecord.gz"):
        name = without_run_id(str(p.relative_to(s3_dataset["local"])))
        assert files[name] == p.read_bytes(), name


def test_analysis_from_an_s3_output(s3_dataset, s3_stack):
    """``--analysis-from s3://``: the vocabularies and scalings of the earlier output, reused as they are."""
    out = f"s3://{s3_stack.bucket}/reuse/out"
    cli = _cli("convert", "--input", f"{s3_dataset['s3_in']}/*.avro", "--config", str(s3_dataset["paths"]["config"]),
               "--output", out, "--num-shards", "2", "--analysis-from", s3_dataset["s3_out"], timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    reused = _files(s3_stack, "reuse/out")
    first = _files(s3_stack, "e2e/out")
    vocab = [n for n in first if n.startswith("vocab/")]
    assert vocab and all(reused[n] == first[n] for n in vocab)


def test_hostile_metadata_on_s3_stages_nothing_outside_its_cache(s3_dataset, s3_stack, tmp_path, monkeypatch):
    """A dataset_info.json naming a shard outside its directory is refused before anything is copied."""
    import readers
    from convert.spec import SpecError

    local = s3_dataset["local"]
    doc = json.loads((local / METADATA_FILENAME).read_text())
    doc["splits"]["train"]["shards"][0]["file"] = "../../x.sh"
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key="x.sh", Body=b"#!/bin/sh\necho owned\n")
    for p in local.glob("train-*"):
        s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=f"hostile/out/{p.name}", Body=p.read_bytes())
    s3_stack.client().put_object(Bucket=s3_stack.bucket, Key=f"hostile/out/{METADATA_FILENAME}",
                                 Body=json.dumps(doc).encode())
    cache = tmp_path / "cache"
    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(cache))
    with pytest.raises(SpecError, match="must be a plain file name inside the output"):
        readers.train_dataset(f"s3://{s3_stack.bucket}/hostile/out/train-*", 4, num_epochs=1)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_lock_on_a_store_without_conditional_deletes_checks_the_etag_first(s3_stack, monkeypatch):
    """Where DeleteObject refuses If-Match, release still never removes another run's lock."""
    from botocore.exceptions import ClientError

    from pipelines.lock import OutputLock

    out = f"s3://{s3_stack.bucket}/lock-nodelete/out"
    key = f"lock-nodelete/out/{LOCK_FILENAME}"
    lock = OutputLock(out).acquire()
    real_delete = lock._store.client.delete_object

    def delete_object(**kw):
        if "IfMatch" in kw:
            raise ClientError({"Error": {"Code": "NotImplemented", "Message": "no conditional deletes"}}, "DeleteObject")
        return real_delete(**kw)

    monkeypatch.setattr(lock._store.client, "delete_object", delete_object)
    assert lock._store.remove_if('"not-its-etag"') is False and key in s3_stack.names("lock-nodelete/out")
    lock.release()
    assert key not in s3_stack.names("lock-nodelete/out")
