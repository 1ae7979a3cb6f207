"""azfs:// end to end against Microsoft's Azurite (``tests/_remote_azure.py``): the real Beam job
reads and writes through Beam's Azure file system, configured only by the connection string a
user sets (``AZURE_STORAGE_CONNECTION_STRING``); the lock uses Blob Storage's conditional
requests; ``readers`` stage the shards through azure-storage-blob. Results are checked against a
local conversion of the same records."""

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
from _pipelines_data import by_shard, make_records, shards_without_run_id, without_run_id, write_dataset
from _remote import stats_by_file_name
from _remote_azure import ACCOUNT_KEY, AzureStack
from _remote_azure import azure_stack  # noqa: F401 - the session fixture
from test_readers_one_dataset import _all_ids, _assert_one_dataset, _datasets, _inputs, _read_across_replacement

from convert.lockfile import LOCK_FILENAME
from convert.spec import METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.transforms import FAILURE_FILENAME, ConversionFailed

pytestmark = pytest.mark.slow

RECORDPREP = Path(sys.executable).with_name("recordprep")


def _opts(inputs: str, config: Path, output: str, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(inputs,), config=str(config), output=output, **kw)


def _files(stack: AzureStack, prefix: str) -> dict[str, bytes]:
    return {name[len(prefix) + 1:]: stack.get(name) for name in stack.names(prefix)}


def _cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RECORDPREP), *args], capture_output=True, text=True, timeout=timeout,
                          env=env or os.environ.copy())


def _upload_inputs(stack: AzureStack, data: Path, glob: str, prefix: str, tmp: Path) -> str:
    upload = tmp / f"upload-{prefix.replace('/', '-')}"
    upload.mkdir()
    for p in sorted(data.glob(glob)):
        (upload / p.name).write_bytes(p.read_bytes())
    return stack.upload_dir(upload, prefix)


@pytest.fixture(scope="module")
def az_dataset(azure_stack, tmp_path_factory):  # noqa: F811
    """AVRO inputs on azfs://, converted by the CLI (azfs:// -> azfs://) and locally with run_convert."""
    root = tmp_path_factory.mktemp("azure")
    paths = write_dataset(root / "data", make_records(400, seed=5))
    az_in = _upload_inputs(azure_stack, root / "data", "*.avro", "e2e/in", root)
    # A temp blob an earlier, killed attempt left behind: the commit must remove it.
    azure_stack.put("e2e/out/.recordprep-tmp/train-00000-deadbeef.tfrecord.gz", b"junk")
    az_out = azure_stack.url("e2e/out") + "/"
    azure_stack.proxy_stats(reset=True)
    started = time.monotonic()
    cli = _cli("convert", "--input", f"{az_in}/*.avro", "--config", str(paths["config"]), "--output", az_out,
               "--num-shards", "3", timeout=300)
    cli_seconds = time.monotonic() - started
    assert cli.returncode == 0, cli.stdout + cli.stderr
    local_out = root / "local-out"
    run_convert(_opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "az_in": az_in, "az_out": az_out.rstrip("/"), "local": local_out, "root": root,
            "cli": cli, "cli_seconds": cli_seconds, "requests": azure_stack.proxy_stats()["counts"]}


def _assert_like_local(files: dict[str, bytes], local: Path) -> None:
    files = {without_run_id(k): v for k, v in files.items()}  # shard names carry their run's id
    expected = {without_run_id(str(p.relative_to(local))): p for p in local.rglob("*") if p.is_file()}
    assert sorted(files) == sorted(expected)  # no temp blob, no lock, nothing else left
    for name, path in expected.items():
        if name == METADATA_FILENAME:
            continue
        if name == STATS_FILENAME:  # names its input files: the same statistics per file name
            assert stats_by_file_name(files[name]) == stats_by_file_name(path.read_bytes())
            continue
        assert files[name] == path.read_bytes(), name


def test_cli_converts_azure_to_azure_like_a_local_run(az_dataset, azure_stack):  # noqa: F811
    _assert_like_local(_files(azure_stack, "e2e/out"), az_dataset["local"])
    # Everything went through the connection string's endpoint (the proxy counts it).
    assert az_dataset["requests"].get("PUT plain", 0) > 0 and az_dataset["requests"].get("GET plain", 0) > 0
    assert az_dataset["cli_seconds"] < 120


def test_credentials_are_never_printed(az_dataset, azure_stack, tmp_path):  # noqa: F811
    """Neither a successful run nor one refused for a wrong key shows the key or the connection string."""
    assert ACCOUNT_KEY not in az_dataset["cli"].stdout + az_dataset["cli"].stderr
    wrong_key = "d3Jvbmcta2V5LW5ldmVyLXRvLWJlLXByaW50ZWQ="
    env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING":
           os.environ["AZURE_STORAGE_CONNECTION_STRING"].replace(ACCOUNT_KEY, wrong_key)}
    refused = _cli("wait", az_dataset["az_out"], "--timeout", "20", "--poll", "0.2", env=env)
    assert refused.returncode != 0
    assert "AuthenticationFailed" in refused.stderr or "authorization" in refused.stderr.lower(), refused.stderr
    for secret in (wrong_key, ACCOUNT_KEY, "AccountKey="):
        assert secret not in refused.stdout + refused.stderr


def test_local_to_azure_then_overwrite_replaces_it(az_dataset, azure_stack, tmp_path):  # noqa: F811
    out = azure_stack.url("local-in/out")
    local_in = str(az_dataset["root"] / "data" / "*.avro")
    run_convert(_opts(local_in, az_dataset["paths"]["config"], out, num_shards=3))
    _assert_like_local(_files(azure_stack, "local-in/out"), az_dataset["local"])
    # Other records into the same output: refused without --overwrite, replaced with it.
    other = write_dataset(tmp_path / "other", make_records(120, seed=11))
    with pytest.raises(Exception, match="overwrite"):
        run_convert(_opts(str(tmp_path / "other" / "*.avro"), other["config"], out, num_shards=2))
    run_convert(_opts(str(tmp_path / "other" / "*.avro"), other["config"], out, num_shards=2, overwrite=True))
    names = azure_stack.names("local-in/out")
    info = json.loads(azure_stack.get(f"local-in/out/{METADATA_FILENAME}"))
    listed = {s["file"] for sp in info["splits"].values() for s in sp["shards"]}
    assert listed and {n.rsplit("/", 1)[-1] for n in names if ".tfrecord" in n} == listed  # the old shards are gone


def test_rerun_is_a_no_op(az_dataset):
    opts = _opts(f"{az_dataset['az_in']}/*.avro", az_dataset["paths"]["config"], az_dataset["az_out"], num_shards=3)
    assert run_convert(opts).skipped  # same inputs (azfs:// sizes and mtimes) and config


def test_lock_on_azure_lets_exactly_one_of_many_racing_runs_win(azure_stack):  # noqa: F811
    """Put Blob with If-None-Match: *: runs starting at the same instant cannot both take the lock."""
    from pipelines.lock import LockHeldError, OutputLock

    out = azure_stack.url("lock-race/out")
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
        assert f"lock-race/out/{LOCK_FILENAME}" not in azure_stack.names("lock-race/out")


def test_lock_on_azure_is_not_taken_when_another_run_writes_it_first(azure_stack, monkeypatch):  # noqa: F811
    """Another run's lock lands between our check and our write (deterministic here): the
    conditional create refuses, and that run keeps its lock."""
    from azure.storage.blob import BlobClient

    from pipelines.lock import LockHeldError, OutputLock

    out = azure_stack.url("lock-between/out")
    key = f"lock-between/out/{LOCK_FILENAME}"
    carol = json.dumps({"owner": {"host": "elsewhere", "pid": 2, "user": "carol", "token": "c"},
                        "heartbeat_unix": time.time()}).encode()
    real_upload = BlobClient.upload_blob

    def upload_blob(self, data, *args, **kwargs):
        if self.blob_name == key and not kwargs.get("overwrite", False):
            azure_stack.put(key, carol)
        return real_upload(self, data, *args, **kwargs)

    monkeypatch.setattr(BlobClient, "upload_blob", upload_blob)
    with pytest.raises(LockHeldError, match="carol"):
        OutputLock(out).acquire()
    monkeypatch.undo()
    assert azure_stack.get(key) == carol
    azure_stack.delete(key)


def test_lock_on_azure_heartbeat_take_over_and_release(azure_stack):  # noqa: F811
    from pipelines.lock import LockHeldError, OutputLock, read_lock

    out = azure_stack.url("lock-test/out")
    key = f"lock-test/out/{LOCK_FILENAME}"
    with OutputLock(out, fingerprint="a", heartbeat_seconds=0.1, stale_after_seconds=30) as lock:
        first = read_lock(out)
        assert first["owner"]["token"] == lock.owner["token"]
        with pytest.raises(LockHeldError, match="being written by another conversion"):
            OutputLock(out).acquire()
        time.sleep(0.5)
        assert read_lock(out)["heartbeat_unix"] > first["heartbeat_unix"]
    assert key not in azure_stack.names("lock-test/out")
    # A dead run's lock (no heartbeat for an hour) is taken over.
    azure_stack.put(key, json.dumps({"owner": {"host": "elsewhere", "pid": 1, "user": "bob"},
                                     "heartbeat_unix": time.time() - 3600}).encode())
    with OutputLock(out) as lock:
        assert lock.took_over["owner"]["user"] == "bob"
        assert json.loads(azure_stack.get(key))["owner"]["token"] == lock.owner["token"]
        # A run that took it over meanwhile: release leaves its lock alone (If-Match on the ETag).
        azure_stack.put(key, json.dumps({"owner": {"host": "elsewhere", "pid": 2, "user": "carol", "token": "x"},
                                         "heartbeat_unix": time.time()}).encode())
    assert json.loads(azure_stack.get(key))["owner"]["user"] == "carol"
    azure_stack.delete(key)


def test_a_second_conversion_into_a_locked_output_is_refused(az_dataset, azure_stack):  # noqa: F811
    from pipelines.lock import OutputLock

    out = azure_stack.url("locked/out")
    with OutputLock(out):
        cli = _cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config",
                   str(az_dataset["paths"]["config"]), "--output", out, timeout=300)
    assert cli.returncode != 0 and "being written by another conversion" in cli.stderr, cli.stdout + cli.stderr
    assert not [n for n in azure_stack.names("locked/out") if not n.endswith(LOCK_FILENAME)]


def test_wait_verify_and_report_on_azure(az_dataset, tmp_path):
    out = az_dataset["az_out"]
    waited = _cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    verified = _cli("verify", out)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    reported = _cli("report", out, "--html", str(tmp_path / "r.html"))
    assert reported.returncode == 0, reported.stdout + reported.stderr
    assert "train" in (tmp_path / "r.html").read_text()


def test_wait_ends_at_once_on_a_dead_run_on_azure(azure_stack):  # noqa: F811
    azure_stack.put(f"dead/out/{LOCK_FILENAME}", json.dumps(
        {"owner": {"host": "elsewhere", "pid": 1, "user": "bob"}, "heartbeat_unix": time.time() - 3600,
         "heartbeat_seconds": 10, "stale_after_seconds": 60}).encode())
    started = time.monotonic()
    waited = _cli("wait", azure_stack.url("dead/out"), "--timeout", "60", "--poll", "0.2")
    assert waited.returncode == 1 and time.monotonic() - started < 30, waited.stdout + waited.stderr
    assert "lock" in waited.stderr.lower()


def test_failed_conversion_on_azure_leaves_its_failure_report(azure_stack, tmp_path):  # noqa: F811
    paths = write_dataset(tmp_path / "data", make_records(60, seed=9), bad_json_lines=True)
    az_in = _upload_inputs(azure_stack, tmp_path / "data", "*.jsonl", "failing/in", tmp_path)
    out = azure_stack.url("failing/out")
    with pytest.raises(ConversionFailed, match="rejected"):
        run_convert(_opts(f"{az_in}/*.jsonl", paths["config"], out, num_shards=2))
    names = azure_stack.names("failing/out")
    assert f"failing/out/{FAILURE_FILENAME}" in names
    assert f"failing/out/{METADATA_FILENAME}" not in names and f"failing/out/{LOCK_FILENAME}" not in names
    assert any(n.startswith("failing/out/errors/") for n in names)
    assert not any("/.recordprep-tmp/" in n for n in names)
    waited = _cli("wait", out, "--timeout", "30", "--poll", "0.2")
    assert waited.returncode == 1 and "rejected" in waited.stderr, waited.stdout + waited.stderr


def test_readers_on_azure_stage_the_shards_and_match_local(az_dataset, azure_stack, tmp_path, monkeypatch):  # noqa: F811
    """TensorFlow 2.21 has no Azure file system: the readers copy the metadata and the shards they
    read to local disk (azure-storage-blob, the environment's connection string) and read them there."""
    import readers

    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    out, local = az_dataset["az_out"], str(az_dataset["local"])
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
    staged = tmp_path / "cache" / azure_stack.account / azure_stack.container / "e2e" / "out"
    for shard in info.splits["train"].shards:
        assert (staged / shard.file).read_bytes() == by_shard(az_dataset["local"], shard.file).read_bytes()

    def ids(pattern: str) -> list[int]:
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, seed=3)
        return sorted(int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0])

    azure_stack.proxy_stats(reset=True)
    assert ids(f"{out}/train-*") == ids(f"{local}/train-*")
    counts = azure_stack.proxy_stats()["counts"]
    # Staged shards unchanged on Azure are not downloaded again: only HEADs and the metadata.
    assert counts.get("HEAD plain", 0) >= len(info.splits["train"].shards)
    assert counts.get("bytes_out", 0) < min(s.num_bytes for s in info.splits["train"].shards) + 64 << 10


def test_readers_on_azure_never_mix_two_runs_across_an_overwrite(azure_stack, tmp_path, monkeypatch):  # noqa: F811
    """The one-dataset guarantee with staging: a dataset built before ``--overwrite`` reads the old
    run whole (its shards were staged), a new one reads only the new run."""
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    old, new = _inputs(tmp_path / "old", new=False), _inputs(tmp_path / "new", new=True)
    urls = {name: _upload_inputs(azure_stack, tmp_path / name, "*.jsonl", f"onedataset/{name}", tmp_path)
            for name in ("old", "new")}
    out = azure_stack.url("onedataset/out")
    convert = ["convert", "--num-shards", "8", "--output", out]
    first = _cli(*convert, "-i", f"{urls['old']}/*.jsonl", "-c", str(old["config"]), timeout=300)
    assert first.returncode == 0, first.stderr
    old_ids = set(_all_ids(out + "/train-*"))

    def replace() -> None:
        again = _cli(*convert, "-i", f"{urls['new']}/*.jsonl", "-c", str(new["config"]), "--overwrite", timeout=300)
        assert again.returncode == 0, again.stderr

    ids, error = _read_across_replacement(_datasets(out + "/train-*")["eval"], replace)
    _assert_one_dataset(ids, error, old_ids)
    assert min(_all_ids(out + "/train-*")) >= 100_000  # the new run's ids


def test_readers_on_azure_name_a_failed_or_missing_output(azure_stack, tmp_path, monkeypatch):  # noqa: F811
    import readers

    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    azure_stack.put(f"rfail/out/{FAILURE_FILENAME}", json.dumps({"reason": "3 records rejected"}).encode())
    with pytest.raises(readers.DatasetFailedError, match="rejected"):
        readers.load_info(azure_stack.url("rfail/out"))
    with pytest.raises((readers.DatasetIncompleteError, TimeoutError)):
        readers.wait_for_dataset(azure_stack.url("nothing/out"), timeout=0.5, poll=0.2)


def test_worker_processes_convert_azure_to_azure_like_a_local_run(az_dataset, azure_stack):  # noqa: F811
    """Multi-process workers (``pipelines._worker``: Beam's Azure file system loaded because a path uses it)."""
    out = azure_stack.url("workers/out")
    result = run_convert(_opts(f"{az_dataset['az_in']}/*.avro", az_dataset["paths"]["config"], out,
                               num_shards=3, workers=2))
    assert "2 worker processes" in result.info["runner"]
    files = {without_run_id(k): v for k, v in _files(azure_stack, "workers/out").items()}
    for p in az_dataset["local"].rglob("*.tfrecord.gz"):
        name = without_run_id(str(p.relative_to(az_dataset["local"])))
        assert files[name] == p.read_bytes(), name


def test_analysis_from_an_azure_output(az_dataset, azure_stack):  # noqa: F811
    """``--analysis-from azfs://``: the vocabularies and scalings of the earlier output, reused as they are."""
    out = azure_stack.url("reuse/out")
    cli = _cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config", str(az_dataset["paths"]["config"]),
               "--output", out, "--num-shards", "2", "--analysis-from", az_dataset["az_out"], timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    reused, first = _files(azure_stack, "reuse/out"), _files(azure_stack, "e2e/out")
    vocab = [n for n in first if n.startswith("vocab/")]
    assert vocab and all(reused[n] == first[n] for n in vocab)


def test_hostile_metadata_on_azure_stages_nothing_outside_its_cache(az_dataset, azure_stack, tmp_path, monkeypatch):  # noqa: F811
    """A dataset_info.json naming a shard outside its directory is refused before anything is copied."""
    import readers
    from convert.spec import SpecError

    local = az_dataset["local"]
    doc = json.loads((local / METADATA_FILENAME).read_text())
    doc["splits"]["train"]["shards"][0]["file"] = "../../x.sh"
    azure_stack.put("x.sh", b"#!/bin/sh\necho owned\n")
    for p in local.glob("train-*"):
        azure_stack.put(f"hostile/out/{p.name}", p.read_bytes())
    azure_stack.put(f"hostile/out/{METADATA_FILENAME}", json.dumps(doc).encode())
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SpecError, match="must be a plain file name inside the output"):
        readers.train_dataset(azure_stack.url("hostile/out/train-*"), 4, num_epochs=1)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_paths_of_another_account_or_scheme_are_refused_before_anything_runs(az_dataset, azure_stack):  # noqa: F811
    """Beam's Azure client serves the connection string's account only: a path naming another
    account would silently land there, so it is refused; az:// names the azfs:// form."""
    config = str(az_dataset["paths"]["config"])
    other = _cli("convert", "--input", str(az_dataset["root"] / "data" / "*.avro"), "--config", config,
                 "--output", "azfs://otheraccount/recordprep/out")
    assert other.returncode != 0 and "is for the account 'devstoreaccount1'" in other.stderr, other.stderr
    mixed = _cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config", config,
                 "--output", "azfs://otheraccount/recordprep/out")
    assert mixed.returncode != 0 and "one account per job" in mixed.stderr, mixed.stderr
    az = _cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config", config,
              "--output", "az://devstoreaccount1/recordprep/out")
    assert az.returncode != 0 and "azfs://<account>/<container>/<path>" in az.stderr, az.stderr
    assert not azure_stack.names("out")


def test_unreachable_azure_says_what_to_check(monkeypatch, tmp_path):
    """The readers' client gives up on a store that does not answer within seconds, naming what to check."""
    from _ports import free_port

    import readers
    from readers.errors import StagingError

    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING",
                       AzureStack.connection_string(f"http://127.0.0.1:{free_port()}"))  # nothing listens there
    started = time.monotonic()
    with pytest.raises(StagingError, match=r"azfs://devstoreaccount1/recordprep/out/.*AZURE_STORAGE_CONNECTION_STRING"):
        readers.load_info("azfs://devstoreaccount1/recordprep/out/train-*")
    assert time.monotonic() - started < 60
