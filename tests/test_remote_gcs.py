"""gs:// end to end against local servers: the real Beam job writes through a GCS emulator,
``readers`` read through TensorFlow's own GCS file system (via the TLS proxy of
``tests/_remote.py``), and the results are checked against a local conversion of
the same records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _pipelines_data import make_records, shards_without_run_id, without_run_id, write_dataset
from _remote import stats_by_file_name

from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.run_files import ConversionFailed

pytestmark = pytest.mark.slow

RECORDPREP = Path(sys.executable).with_name("recordprep")


def _opts(inputs: str, config: Path, output: str, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(inputs,), config=str(config), output=output, **kw)


def _local_files(remote_stack, prefix: str) -> dict[str, bytes]:
    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    return {
        without_run_id(name[len(prefix) + 1 :]): bucket.blob(name).download_as_bytes()
        for name in remote_stack.gcs_names(prefix)
    }


@pytest.fixture(scope="module")
def gcs_dataset(remote_stack, tmp_path_factory):
    """AVRO inputs on gs://, converted by the CLI (gs:// -> gs://) and locally with run_convert."""
    root = tmp_path_factory.mktemp("gcs")
    paths = write_dataset(root / "data", make_records(400, seed=5))
    upload = root / "upload"
    upload.mkdir()
    for p in sorted((root / "data").glob("*.avro")):
        (upload / p.name).write_bytes(p.read_bytes())
    gs_in = remote_stack.upload_dir(upload, "e2e/in")
    # A temp object an earlier, killed attempt left behind: the commit must remove it.
    remote_stack.storage_client().bucket(remote_stack.bucket).blob(
        "e2e/out/.recordprep-tmp/train-00000-deadbeef.tfrecord.gz"
    ).upload_from_string(b"junk")
    gs_out = f"gs://{remote_stack.bucket}/e2e/out/"
    cli = subprocess.run(
        [str(RECORDPREP), "convert", "--input", f"{gs_in}/*.avro", "--config", str(paths["config"]),
         "--output", gs_out, "--num-shards", "3"],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    local_out = root / "local-out"
    run_convert(_opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "gs_in": gs_in, "gs_out": gs_out.rstrip("/"), "local": local_out,
            "cli": cli}


def test_cli_converts_gs_to_gs_like_a_local_run(gcs_dataset, remote_stack):
    files = _local_files(remote_stack, "e2e/out")
    local = {without_run_id(str(p.relative_to(gcs_dataset["local"]))): p.read_bytes()
             for p in gcs_dataset["local"].rglob("*") if p.is_file()}
    expected = sorted(local)
    assert sorted(files) == expected  # the stale temp object is gone, nothing else is left
    assert not any(name.startswith(".recordprep-tmp") for name in files)
    for name in expected:
        if name == METADATA_FILENAME:
            continue
        if name == STATS_FILENAME:  # names its input files: the same statistics per file name
            assert stats_by_file_name(files[name]) == stats_by_file_name(local[name])
            continue
        # same records, same units, same analysis: byte-identical shards and vocabularies
        assert files[name] == local[name], name
    # No ~20 s hunt for credentials (the fixture's credential file is found at once).
    assert "Unable to find default credentials" not in gcs_dataset["cli"].stderr
    assert "train" in gcs_dataset["cli"].stdout


def test_worker_processes_convert_gs_to_gs_like_a_local_run(gcs_dataset, remote_stack):
    """Multi-process workers (``pipelines.local.worker``, unused Beam connectors not loaded) read and write gs://."""
    out = f"gs://{remote_stack.bucket}/workers/out"
    result = run_convert(_opts(f"{gcs_dataset['gs_in']}/*.avro", gcs_dataset["paths"]["config"], out,
                               num_shards=3, workers=2))
    assert "2 worker processes" in result.info["runner"]
    files = _local_files(remote_stack, "workers/out")
    for p in gcs_dataset["local"].rglob("*.tfrecord.gz"):
        name = without_run_id(str(p.relative_to(gcs_dataset["local"])))
        assert files[name] == p.read_bytes(), name


def test_metadata_is_written_last(gcs_dataset, remote_stack):
    blobs = list(remote_stack.storage_client().list_blobs(remote_stack.bucket, prefix="e2e/out/"))
    meta = next(b for b in blobs if b.name.endswith("/" + METADATA_FILENAME))
    others = [b for b in blobs if b is not meta]
    assert others and all(b.time_created <= meta.time_created for b in others)


def test_load_info_and_datasets_on_gcs_match_local(gcs_dataset, remote_stack):
    import readers

    gs_out, local = gcs_dataset["gs_out"], str(gcs_dataset["local"])
    before = remote_stack.proxy_stats()["counts"]
    info = readers.load_info(gs_out + "/train-*")
    local_info = readers.load_info(local)
    assert shards_without_run_id(info) == shards_without_run_id(local_info) and info.features == local_info.features
    assert readers.load_info(gs_out) == info  # directory and pattern alike

    for split in ("train", "eval"):
        remote_batches = list(readers.eval_dataset(f"{gs_out}/{split}-*", 32).as_numpy_iterator())
        local_batches = list(readers.eval_dataset(f"{local}/{split}-*", 32).as_numpy_iterator())
        assert len(remote_batches) == len(local_batches) > 0
        for (rf, rl), (lf, ll) in zip(remote_batches, local_batches, strict=True):
            np.testing.assert_array_equal(rl, ll)
            assert rf.keys() == lf.keys()
            for k in rf:
                np.testing.assert_array_equal(rf[k], lf[k], err_msg=k)

    def ids(pattern):
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, seed=3)
        return sorted(int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0])

    assert ids(f"{gs_out}/train-*") == ids(f"{local}/train-*")
    after = remote_stack.proxy_stats()["counts"]
    # TensorFlow really went through its GCS file system (TLS via CONNECT, ranged reads).
    assert after.get("connect", 0) > before.get("connect", 0)
    assert after.get("GET range", 0) > before.get("GET range", 0)


def test_reading_under_latency_and_bandwidth_cap(gcs_dataset, remote_stack, tmp_path):
    import readers

    gs_out = gcs_dataset["gs_out"]
    n_train = readers.load_info(gs_out).splits["train"].num_records
    remote_stack.set_latency(ttfb_ms=100, mbps=10)
    try:
        remote_stack.proxy_stats(reset=True)
        ds = readers.train_dataset(f"{gs_out}/train-*", 16, num_epochs=2, drop_remainder=False,
                                   cache=str(tmp_path / "cache"))
        first_epoch_bytes = None
        seen = 0
        for features, _ in ds.as_numpy_iterator():
            seen += len(features["id"])
            if first_epoch_bytes is None and seen >= n_train:
                first_epoch_bytes = remote_stack.proxy_stats()["counts"].get("bytes_out", 0)
        assert seen == 2 * n_train
        # The second epoch came from the local cache: no more shard bytes over the "network".
        assert remote_stack.proxy_stats()["counts"].get("bytes_out", 0) == first_epoch_bytes
        assert list(tmp_path.joinpath("cache").iterdir())
    finally:
        remote_stack.set_latency(ttfb_ms=0, mbps=0)


def test_shards_are_opened_without_listing_them_first(gcs_dataset, remote_stack, monkeypatch):
    """On gs:// a shard is opened straight away: no listing request per shard (each
    waits a time to first byte before the shard's own requests could start)."""
    import readers
    from readers import shards as rd

    pattern = gcs_dataset["gs_out"] + "/train-*"
    shards = len(readers.load_info(pattern).splits["train"].shards)
    opts = readers.ReadOptions(verify_files=False)

    def plain_gets_for_one_epoch() -> int:
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, options=opts)
        before = remote_stack.proxy_stats()["counts"].get("GET plain", 0)
        assert sum(len(f["id"]) for f, _ in ds.as_numpy_iterator()) > 0
        return remote_stack.proxy_stats()["counts"].get("GET plain", 0) - before

    direct = plain_gets_for_one_epoch()
    monkeypatch.setattr(rd, "_OPENS_MISSING_FILES", ())  # as for local files: glob, then open
    globbed = plain_gets_for_one_epoch()
    assert globbed - direct >= shards, (direct, globbed)


def test_shard_reads_bypass_the_gcs_per_file_block(gcs_dataset, remote_stack):
    """On gs:// every shard read asks for more than TensorFlow's GCS block, so its
    file system sends it straight into the reader's buffer instead of zero-filling
    a 64 MB block per opened shard first (same number of requests either way)."""
    import readers
    from readers.options import gcs_block_bytes

    block = gcs_block_bytes()
    assert block, "this test expects TensorFlow's default per-file GCS block"
    pattern = gcs_dataset["gs_out"] + "/train-*"
    shards = len(readers.load_info(pattern).splits["train"].shards)
    opts = readers.ReadOptions(verify_files=False)

    def gets_by_length(options) -> dict[int, int]:
        before = remote_stack.proxy_stats()["counts"]
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, options=options)
        assert sum(len(f["id"]) for f, _ in ds.as_numpy_iterator()) > 0
        after = remote_stack.proxy_stats()["counts"]
        return {n: after.get(f"GET range of {n} bytes", 0) - before.get(f"GET range of {n} bytes", 0)
                for n in (block, block + 1)}

    # (load_info's own read of the metadata goes through the block: one GET of `block`.)
    assert gets_by_length(opts)[block + 1] == shards
    # The reader's old 8 MiB default: each shard read goes through the GCS block.
    old = gets_by_length(opts.replace(read_buffer_bytes=8 << 20))
    assert old[block + 1] == 0 and old[block] >= shards


def test_next_epochs_open_their_shards_before_the_current_one_ends(gcs_dataset, remote_stack):
    """On gs:// (epoch_lookahead, the remote default: two epochs ahead for a split this
    small) the next epochs' shard reads are in flight while the current epoch's are,
    so an epoch start does not wait a time to first byte per shard, and a slow shard
    is read while two epochs go by; epochs still never mix."""
    import readers

    pattern = gcs_dataset["gs_out"] + "/train-*"
    info = readers.load_info(pattern)
    shards, n = len(info.splits["train"].shards), info.splits["train"].num_records
    opts = readers.ReadOptions(verify_files=False)

    def most_reads_at_once(options) -> tuple[int, list[int]]:
        ds = readers.train_dataset(pattern, 8, num_epochs=3, seed=5, drop_remainder=False, options=options)
        remote_stack.proxy_stats(reset=True)
        ids = [int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0]]
        return remote_stack.proxy_stats()["counts"].get("GET range max in flight", 0), ids

    remote_stack.set_latency(ttfb_ms=200, mbps=0)  # each shard read waits, so reads overlap in time
    try:
        two_ahead, ids = most_reads_at_once(opts)
        one_ahead, _ = most_reads_at_once(opts.replace(epoch_lookahead=1))
        one_epoch_at_a_time, _ = most_reads_at_once(opts.replace(epoch_lookahead=False))
    finally:
        remote_stack.set_latency(ttfb_ms=0, mbps=0)
    assert two_ahead > 2 * shards >= one_ahead > shards >= one_epoch_at_a_time, (two_ahead, one_ahead, one_epoch_at_a_time)
    for e in range(3):  # each epoch: every record once
        assert len(set(ids[e * n:(e + 1) * n])) == n and set(ids[e * n:(e + 1) * n]) == set(ids[:n])
    assert len(ids) == 3 * n


def test_shard_deleted_from_gcs_is_named_not_retried(gcs_dataset, remote_stack, tmp_path):
    """Without the listing, a missing object fails at its first read; the read-time
    check names it as missing (instead of TFRecordDataset retrying an open forever)."""
    import tensorflow as tf

    import readers

    for p in gcs_dataset["local"].iterdir():
        if p.is_file():
            (tmp_path / p.name).write_bytes(p.read_bytes())
    url = remote_stack.upload_dir(tmp_path, "deleted/out")
    gone = readers.load_info(url).splits["train"].shards[1].file
    remote_stack.storage_client().bucket(remote_stack.bucket).blob(f"deleted/out/{gone}").delete()
    opts = readers.ReadOptions(verify_files=False)
    for ds in (readers.train_dataset(url + "/train-*", 16, num_epochs=1, options=opts),
               readers.eval_dataset(url + "/train-*", 16, options=opts)):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=f"shard {url}/{gone} is damaged: read 0 of .* does not exist"):
            for _ in ds:
                pass


def test_incomplete_output_is_refused(gcs_dataset, remote_stack, tmp_path):
    import readers

    partial = tmp_path / "partial"
    partial.mkdir()
    for p in gcs_dataset["local"].glob("train-*"):
        (partial / p.name).write_bytes(p.read_bytes())
    url = remote_stack.upload_dir(partial, "partial/out")
    with pytest.raises(readers.DatasetIncompleteError, match="has not finished"):
        readers.load_info(url + "/train-*")
    with pytest.raises(readers.DatasetIncompleteError):
        readers.train_dataset(url + "/train-*", 8)
    with pytest.raises((readers.DatasetIncompleteError, TimeoutError)):
        readers.wait_for_dataset(url, timeout=0.5, poll=0.2)


def test_failed_conversion_on_gcs_is_reported_to_readers(remote_stack, tmp_path):
    import readers

    paths = write_dataset(tmp_path / "data", make_records(60, seed=9), bad_json_lines=True)
    upload = tmp_path / "upload"
    upload.mkdir()
    for p in sorted((tmp_path / "data").glob("*.jsonl")):
        (upload / p.name).write_bytes(p.read_bytes())
    gs_in = remote_stack.upload_dir(upload, "failing/in")
    out = f"gs://{remote_stack.bucket}/failing/out"
    with pytest.raises(ConversionFailed, match="rejected"):
        run_convert(_opts(f"{gs_in}/*.jsonl", paths["config"], out, num_shards=2))
    names = remote_stack.gcs_names("failing/out")
    assert f"failing/out/{FAILURE_FILENAME}" in names
    assert f"failing/out/{METADATA_FILENAME}" not in names
    assert any(n.startswith("failing/out/errors/") for n in names)
    assert not any("/.recordprep-tmp/" in n or ("-of-" in n.rsplit("/", 1)[-1] and n.endswith(".gz"))
                   for n in names)
    with pytest.raises(readers.DatasetFailedError, match="rejected"):
        readers.load_info(out)


def test_rerun_is_a_no_op_and_overwrite_replaces(gcs_dataset, remote_stack):
    paths = gcs_dataset["paths"]
    opts = _opts(f"{gcs_dataset['gs_in']}/*.avro", paths["config"], gcs_dataset["gs_out"] + "/",
                 num_shards=3)
    assert run_convert(opts).skipped  # same inputs (gs:// sizes and mtimes) and config
    out = f"gs://{remote_stack.bucket}/rerun/out"
    run_convert(_opts(f"{gcs_dataset['gs_in']}/*.avro", paths["config"], out, num_shards=3))
    from apache_beam.io.filesystems import FileSystems

    for stale in ("vocab/gone_feature.txt", "errors/errors-00000.jsonl"):  # from an older dataset
        with FileSystems.create(f"{out}/{stale}") as f:
            f.write(b"old\n")
    result = run_convert(_opts(f"{gcs_dataset['gs_in']}/*.avro", paths["config"], out, num_shards=2,
                               overwrite=True))
    assert not result.skipped
    shards = [n for n in remote_stack.gcs_names("rerun/out") if ".tfrecord" in n]
    assert shards and all("-of-00002" in n for n in shards)
    names = remote_stack.gcs_names("rerun/out")
    assert not [n for n in names if "gone_feature" in n or "errors/" in n], names  # --overwrite leaves nothing old


_STALE_STAT_SCRIPT = r"""
import sys
from google.cloud import storage
from readers import _io

bucket, name = sys.argv[1], sys.argv[2]
url = f"gs://{bucket}/{name}"
blob = storage.Client().bucket(bucket).blob(name)
blob.upload_from_string(b'{"v": 1}')
assert _io.read_bytes(url) == b'{"v": 1}'  # TensorFlow now holds the object's size in its stat cache
blob.upload_from_string(b'{"v": 2, "longer": "' + b"x" * 5000 + b'"}')
sys.stdout.buffer.write(_io.read_bytes(url))
"""


def test_a_replaced_object_is_read_whole_despite_tensorflows_stat_cache(remote_stack, tmp_path):
    # TensorFlow's GCS file system caches an object's size (5 s by default) and GFile.read()
    # reads that many bytes: metadata replaced by another run came back cut at the old size.
    env = {**os.environ, **remote_stack.env(), "GCS_STAT_CACHE_MAX_AGE": "300"}
    r = subprocess.run([sys.executable, "-c", _STALE_STAT_SCRIPT, remote_stack.bucket, "stale/info.json"],
                       capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr.decode()[-3000:]
    assert r.stdout == b'{"v": 2, "longer": "' + b"x" * 5000 + b'"}'
