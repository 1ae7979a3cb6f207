"""s3:// end to end against moto's S3 in server mode (``tests/_remote_s3.py``): the real Beam job
reads and writes through Beam's S3 file system (boto3), configured only by the environment a user
sets (``AWS_ENDPOINT_URL`` and keys); the lock uses S3's conditional writes; ``readers`` stage the
shards through boto3. Results are checked against a local conversion of the same records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pipelines_data import (
    make_records,
    write_dataset,
)
from _remote_contract import (
    analysis_from_reuses_the_vocabularies,
    assert_like_local,
    failed_conversion_leaves_its_failure_report,
    files,
    hostile_metadata_stages_nothing,
    lock_heartbeat_take_over_and_release,
    lock_race_has_one_winner,
    opts,
    staged_readers_match_local,
    wait_ends_at_once_on_a_dead_run,
    wait_verify_and_report,
    worker_processes_convert_like_local,
)

from convert.lockfile import LOCK_FILENAME
from convert.spec import FAILURE_FILENAME
from pipelines.job import run_convert

pytestmark = pytest.mark.slow

RECORDPREP = Path(sys.executable).with_name("recordprep")


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
    cli = subprocess.run(
        [str(RECORDPREP), "convert", "--input", f"{s3_in}/*.avro", "--config", str(paths["config"]),
         "--output", s3_out, "--num-shards", "3"],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    local_out = root / "local-out"
    run_convert(opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "s3_in": s3_in, "s3_out": s3_out.rstrip("/"), "local": local_out,
            "cli": cli, "requests": s3_stack.proxy_stats()["counts"]}


def test_cli_converts_s3_to_s3_like_a_local_run(s3_dataset, s3_stack):
    # the stale temp object and the lock are gone, nothing else is left
    assert_like_local(files(s3_stack, "e2e/out"), s3_dataset["local"])
    # Everything went through the endpoint of the environment (the proxy counts it).
    assert s3_dataset["requests"].get("PUT plain", 0) > 0 and s3_dataset["requests"].get("GET plain", 0) > 0
    assert "recordprep-test-secret" not in s3_dataset["cli"].stdout + s3_dataset["cli"].stderr


def test_rerun_is_a_no_op(s3_dataset):
    again = opts(f"{s3_dataset['s3_in']}/*.avro", s3_dataset["paths"]["config"], s3_dataset["s3_out"], num_shards=3)
    assert run_convert(again).skipped  # same inputs (s3:// sizes and mtimes) and config


def test_lock_on_s3_lets_exactly_one_of_many_racing_runs_win(s3_stack):
    """S3's conditional create (If-None-Match: *): runs starting at the same instant cannot
    both take the lock (a check-then-write would let several through)."""
    lock_race_has_one_winner(s3_stack, "lock-race/out")


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
    lock_heartbeat_take_over_and_release(s3_stack, "lock-test/out")


def test_wait_verify_and_report_on_s3(s3_dataset, tmp_path):
    wait_verify_and_report(s3_dataset["s3_out"], tmp_path)


def test_wait_ends_at_once_on_a_dead_run_on_s3(s3_stack):
    wait_ends_at_once_on_a_dead_run(s3_stack, "dead/out")


def test_failed_conversion_on_s3_leaves_its_failure_report(s3_stack, tmp_path):
    failed_conversion_leaves_its_failure_report(s3_stack, tmp_path, "failing")


def test_readers_on_s3_stage_the_shards_and_match_local(s3_dataset, s3_stack, tmp_path, monkeypatch):
    """TensorFlow 2.21 has no S3 file system: the readers copy the metadata and the shards they
    read to local disk (boto3, the environment's endpoint and keys) and read them there."""
    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(tmp_path / "cache"))
    staged = tmp_path / "cache" / s3_stack.bucket / "e2e" / "out"
    staged_readers_match_local(s3_stack, s3_dataset["s3_out"], s3_dataset["local"], staged)


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
    worker_processes_convert_like_local(s3_stack, f"{s3_dataset['s3_in']}/*.avro", s3_dataset["paths"]["config"],
                                        s3_dataset["local"], "workers/out")


def test_analysis_from_an_s3_output(s3_dataset, s3_stack):
    """``--analysis-from s3://``: the vocabularies and scalings of the earlier output, reused as they are."""
    analysis_from_reuses_the_vocabularies(s3_stack, f"{s3_dataset['s3_in']}/*.avro", s3_dataset["paths"]["config"],
                                          "e2e/out", "reuse/out")


def test_hostile_metadata_on_s3_stages_nothing_outside_its_cache(s3_dataset, s3_stack, tmp_path, monkeypatch):
    """A dataset_info.json naming a shard outside its directory is refused before anything is copied."""
    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(tmp_path / "cache"))
    hostile_metadata_stages_nothing(s3_stack, s3_dataset["local"], "hostile/out", tmp_path)


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
