"""azfs:// end to end against Microsoft's Azurite (``tests/_remote_azure.py``): the real Beam job
reads and writes through Beam's Azure file system, configured only by the connection string a
user sets (``AZURE_STORAGE_CONNECTION_STRING``); the lock uses Blob Storage's conditional
requests; ``readers`` stage the shards through azure-storage-blob. Results are checked against a
local conversion of the same records."""

from __future__ import annotations

import json
import os
import time

import pytest
from _pipelines_data import make_records, write_dataset
from _remote_azure import (
    ACCOUNT_KEY,
    AzureStack,
)
from _remote_contract import (
    analysis_from_reuses_the_vocabularies,
    assert_like_local,
    cli,
    failed_conversion_leaves_its_failure_report,
    files,
    hostile_metadata_stages_nothing,
    lock_heartbeat_take_over_and_release,
    lock_race_has_one_winner,
    opts,
    staged_readers_match_local,
    upload_inputs,
    wait_ends_at_once_on_a_dead_run,
    wait_verify_and_report,
    worker_processes_convert_like_local,
)
from test_readers_one_dataset import (
    _all_ids,
    _assert_one_dataset,
    _datasets,
    _inputs,
    _read_across_replacement,
)

from convert.lockfile import LOCK_FILENAME
from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from pipelines.job import run_convert

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _beam_patch_undone_after_the_module():
    """The conversions here apply ``pipelines.local.patches.AzureExists`` for the process; later test modules find Beam as it was."""
    yield
    from pipelines import remote

    remote._AZURE_PATCH.close()


@pytest.fixture(scope="module")
def az_dataset(azure_stack, tmp_path_factory):
    """AVRO inputs on azfs://, converted by the CLI (azfs:// -> azfs://) and locally with run_convert."""
    root = tmp_path_factory.mktemp("azure")
    paths = write_dataset(root / "data", make_records(400, seed=5))
    az_in = upload_inputs(azure_stack, root / "data", "*.avro", "e2e/in")
    # A temp blob an earlier, killed attempt left behind: the commit must remove it.
    azure_stack.put("e2e/out/.recordprep-tmp/train-00000-deadbeef.tfrecord.gz", b"junk")
    az_out = azure_stack.url("e2e/out") + "/"
    azure_stack.proxy_stats(reset=True)
    run = cli("convert", "--input", f"{az_in}/*.avro", "--config", str(paths["config"]), "--output", az_out,
              "--num-shards", "3", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    local_out = root / "local-out"
    run_convert(opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "az_in": az_in, "az_out": az_out.rstrip("/"), "local": local_out, "root": root,
            "cli": run, "requests": azure_stack.proxy_stats()["counts"]}


def test_cli_converts_azure_to_azure_like_a_local_run(az_dataset, azure_stack):
    assert_like_local(files(azure_stack, "e2e/out"), az_dataset["local"])
    # Everything went through the connection string's endpoint (the proxy counts it).
    assert az_dataset["requests"].get("PUT plain", 0) > 0 and az_dataset["requests"].get("GET plain", 0) > 0


def test_credentials_are_never_printed(az_dataset, azure_stack, tmp_path):
    """Neither a successful run nor one refused for a wrong key shows the key or the connection string."""
    assert ACCOUNT_KEY not in az_dataset["cli"].stdout + az_dataset["cli"].stderr
    wrong_key = "d3Jvbmcta2V5LW5ldmVyLXRvLWJlLXByaW50ZWQ="
    env = {**os.environ, "AZURE_STORAGE_CONNECTION_STRING":
           os.environ["AZURE_STORAGE_CONNECTION_STRING"].replace(ACCOUNT_KEY, wrong_key)}
    refused = cli("wait", az_dataset["az_out"], "--timeout", "20", "--poll", "0.2", env=env)
    assert refused.returncode != 0
    assert "AuthenticationFailed" in refused.stderr or "authorization" in refused.stderr.lower(), refused.stderr
    for secret in (wrong_key, ACCOUNT_KEY, "AccountKey="):
        assert secret not in refused.stdout + refused.stderr


def test_local_to_azure_then_overwrite_replaces_it(az_dataset, azure_stack, tmp_path):
    out = azure_stack.url("local-in/out")
    local_in = str(az_dataset["root"] / "data" / "*.avro")
    run_convert(opts(local_in, az_dataset["paths"]["config"], out, num_shards=3))
    assert_like_local(files(azure_stack, "local-in/out"), az_dataset["local"])
    # Other records into the same output: refused without --overwrite, replaced with it.
    other = write_dataset(tmp_path / "other", make_records(120, seed=11))
    with pytest.raises(Exception, match="overwrite"):
        run_convert(opts(str(tmp_path / "other" / "*.avro"), other["config"], out, num_shards=2))
    run_convert(opts(str(tmp_path / "other" / "*.avro"), other["config"], out, num_shards=2, overwrite=True))
    names = azure_stack.names("local-in/out")
    info = json.loads(azure_stack.get(f"local-in/out/{METADATA_FILENAME}"))
    listed = {s["file"] for sp in info["splits"].values() for s in sp["shards"]}
    assert listed and {n.rsplit("/", 1)[-1] for n in names if ".tfrecord" in n} == listed  # the old shards are gone


def test_rerun_is_a_no_op(az_dataset):
    again = opts(f"{az_dataset['az_in']}/*.avro", az_dataset["paths"]["config"], az_dataset["az_out"], num_shards=3)
    assert run_convert(again).skipped  # same inputs (azfs:// sizes and mtimes) and config


def test_lock_on_azure_lets_exactly_one_of_many_racing_runs_win(azure_stack):
    """Put Blob with If-None-Match: *: runs starting at the same instant cannot both take the lock."""
    lock_race_has_one_winner(azure_stack, "lock-race/out")


def test_lock_on_azure_is_not_taken_when_another_run_writes_it_first(azure_stack, monkeypatch):
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


def test_lock_on_azure_heartbeat_take_over_and_release(azure_stack):
    lock_heartbeat_take_over_and_release(azure_stack, "lock-test/out")


def test_a_second_conversion_into_a_locked_output_is_refused(az_dataset, azure_stack):
    from pipelines.lock import OutputLock

    out = azure_stack.url("locked/out")
    with OutputLock(out):
        second = cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config",
                     str(az_dataset["paths"]["config"]), "--output", out, timeout=300)
    assert second.returncode != 0 and "being written by another conversion" in second.stderr, second.stderr
    assert not [n for n in azure_stack.names("locked/out") if not n.endswith(LOCK_FILENAME)]


def test_wait_verify_and_report_on_azure(az_dataset, tmp_path):
    wait_verify_and_report(az_dataset["az_out"], tmp_path)


def test_wait_ends_at_once_on_a_dead_run_on_azure(azure_stack):
    wait_ends_at_once_on_a_dead_run(azure_stack, "dead/out")


def test_failed_conversion_on_azure_leaves_its_failure_report(azure_stack, tmp_path):
    failed_conversion_leaves_its_failure_report(azure_stack, tmp_path, "failing")


def test_readers_on_azure_stage_the_shards_and_match_local(az_dataset, azure_stack, tmp_path, monkeypatch):
    """TensorFlow 2.21 has no Azure file system: the readers copy the metadata and the shards they
    read to local disk (azure-storage-blob, the environment's connection string) and read them there."""
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    staged = tmp_path / "cache" / azure_stack.account / azure_stack.container / "e2e" / "out"
    staged_readers_match_local(azure_stack, az_dataset["az_out"], az_dataset["local"], staged)


def test_readers_on_azure_never_mix_two_runs_across_an_overwrite(azure_stack, tmp_path, monkeypatch):
    """The one-dataset guarantee with staging: a dataset built before ``--overwrite`` reads the old
    run whole (its shards were staged), a new one reads only the new run."""
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    old, new = _inputs(tmp_path / "old", new=False), _inputs(tmp_path / "new", new=True)
    urls = {name: upload_inputs(azure_stack, tmp_path / name, "*.jsonl", f"onedataset/{name}")
            for name in ("old", "new")}
    out = azure_stack.url("onedataset/out")
    convert = ["convert", "--num-shards", "8", "--output", out]
    first = cli(*convert, "-i", f"{urls['old']}/*.jsonl", "-c", str(old["config"]), timeout=300)
    assert first.returncode == 0, first.stderr
    old_ids = set(_all_ids(out + "/train-*"))

    def replace() -> None:
        again = cli(*convert, "-i", f"{urls['new']}/*.jsonl", "-c", str(new["config"]), "--overwrite", timeout=300)
        assert again.returncode == 0, again.stderr

    ids, error = _read_across_replacement(_datasets(out + "/train-*")["eval"], replace)
    _assert_one_dataset(ids, error, old_ids)
    assert min(_all_ids(out + "/train-*")) >= 100_000  # the new run's ids


def test_readers_on_azure_name_a_failed_or_missing_output(azure_stack, tmp_path, monkeypatch):
    import readers

    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    azure_stack.put(f"rfail/out/{FAILURE_FILENAME}", json.dumps({"reason": "3 records rejected"}).encode())
    with pytest.raises(readers.DatasetFailedError, match="rejected"):
        readers.load_info(azure_stack.url("rfail/out"))
    with pytest.raises((readers.DatasetIncompleteError, TimeoutError)):
        readers.wait_for_dataset(azure_stack.url("nothing/out"), timeout=0.5, poll=0.2)


def test_worker_processes_convert_azure_to_azure_like_a_local_run(az_dataset, azure_stack):
    """Multi-process workers (``pipelines.local.worker``: Beam's Azure file system loaded because a path uses it)."""
    worker_processes_convert_like_local(azure_stack, f"{az_dataset['az_in']}/*.avro", az_dataset["paths"]["config"],
                                        az_dataset["local"], "workers/out")


def test_analysis_from_an_azure_output(az_dataset, azure_stack):
    """``--analysis-from azfs://``: the vocabularies and scalings of the earlier output, reused as they are."""
    analysis_from_reuses_the_vocabularies(azure_stack, f"{az_dataset['az_in']}/*.avro", az_dataset["paths"]["config"],
                                          "e2e/out", "reuse/out")


def test_hostile_metadata_on_azure_stages_nothing_outside_its_cache(az_dataset, azure_stack, tmp_path, monkeypatch):
    """A dataset_info.json naming a shard outside its directory is refused before anything is copied."""
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", str(tmp_path / "cache"))
    hostile_metadata_stages_nothing(azure_stack, az_dataset["local"], "hostile/out", tmp_path)


def test_paths_of_another_account_or_scheme_are_refused_before_anything_runs(az_dataset, azure_stack):
    """Beam's Azure client serves the connection string's account only: a path naming another
    account would silently land there, so it is refused; az:// names the azfs:// form."""
    config = str(az_dataset["paths"]["config"])
    other = cli("convert", "--input", str(az_dataset["root"] / "data" / "*.avro"), "--config", config,
                 "--output", "azfs://otheraccount/recordprep/out")
    assert other.returncode != 0 and "is for the account 'devstoreaccount1'" in other.stderr, other.stderr
    mixed = cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config", config,
                 "--output", "azfs://otheraccount/recordprep/out")
    assert mixed.returncode != 0 and "one account per job" in mixed.stderr, mixed.stderr
    az = cli("convert", "--input", f"{az_dataset['az_in']}/*.avro", "--config", config,
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
    with pytest.raises(StagingError, match=r"azfs://devstoreaccount1/recordprep/out/.*AZURE_STORAGE_CONNECTION_STRING"):
        readers.load_info("azfs://devstoreaccount1/recordprep/out/train-*")


def test_beam_azure_exists_answers_false_for_a_missing_blob(azure_stack):
    """Beam 2.77's BlobStorageIO.exists raises for a missing blob; with recordprep's patch
    (applied once a path is on azfs://) it answers False, and True for one that exists."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines import remote
    from pipelines.local import patches as _patches

    azure_stack.put("exists/here.txt", b"x")
    remote.use_paths(azure_stack.url("exists"))
    assert _patches.AZURE_EXISTS.active
    assert FileSystems.exists(azure_stack.url("exists/here.txt"))
    assert not FileSystems.exists(azure_stack.url("exists/missing.txt"))
