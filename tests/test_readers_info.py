"""load_info / select_shards / keras_inputs / wait_for_dataset / ReadOptions / import hygiene."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import _readers_fixtures as fx
import pytest

import readers
from convert.spec import METADATA_FILENAME, SpecError
from readers import (
    DatasetIncompleteError,
    ReadOptions,
    ShardSelectionError,
    keras_inputs,
    load_info,
    wait_for_dataset,
)
from readers.info import locate, select_shards

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def out(tmp_path):
    return fx.write_output(tmp_path / "out")


# ---------------------------------------------------------------- load_info


@pytest.mark.parametrize(
    "suffix",
    [
        "",
        "/",
        "/dataset_info.json",
        "/train-*",
        "/eval-*.tfrecord",
        "/train-00001-of-00004.tfrecord",
    ],
)
def test_load_info_from_directory_metadata_or_pattern(out, suffix):
    info = load_info(str(out.root) + suffix)
    assert info == out.info
    assert info.label_key == "label" and info.splits["train"].num_records == 40


def test_load_info_gzip_pattern(tmp_path):
    o = fx.write_output(tmp_path / "gz", compression="GZIP")
    assert load_info(str(o.root / "train-*.tfrecord.gz")).compression == "GZIP"


def test_missing_metadata_means_incomplete_output(tmp_path):
    o = fx.write_output(tmp_path / "out", write_metadata=False)
    with pytest.raises(DatasetIncompleteError) as err:
        load_info(str(o.root / "train-*"))
    message = str(err.value)
    assert "has not finished" in message and "failed" in message
    assert "wait_for_dataset" in message and "recordprep wait" in message
    assert str(o.root / METADATA_FILENAME) in message
    assert isinstance(err.value, FileNotFoundError)
    with pytest.raises(DatasetIncompleteError, match="does not exist"):
        load_info(str(tmp_path / "never-written"))
    # the dataset builders refuse it the same way, before touching any shard
    with pytest.raises(DatasetIncompleteError, match="has not finished"):
        readers.train_dataset(str(o.root / "train-*"), 4)
    with pytest.raises(DatasetIncompleteError, match="has not finished"):
        readers.eval_dataset(str(o.root / "eval-*"), 4)


def test_failed_conversion_is_reported_with_its_reason(tmp_path):
    o = fx.write_output(tmp_path / "out", write_metadata=False)
    reason = "12 of 40 records were rejected (first reasons in errors/)"
    (o.root / "_FAILURE.json").write_text(json.dumps({"reason": reason, "counts": {}}))
    with pytest.raises(readers.DatasetFailedError) as err:
        load_info(str(o.root / "train-*"))
    assert err.value.reason == reason
    assert reason in str(err.value) and "failed" in str(err.value)
    assert isinstance(err.value, DatasetIncompleteError)
    with pytest.raises(readers.DatasetFailedError, match="were rejected"):
        wait_for_dataset(str(o.root), timeout=30, poll=0.05)  # the failure, not the timeout (a TimeoutError)
    with pytest.raises(readers.DatasetFailedError):
        readers.train_dataset(str(o.root / "train-*"), 4)


def test_newer_format_version_is_refused(tmp_path):
    o = fx.write_output(tmp_path / "out", format_version=99)
    with pytest.raises(SpecError, match="format_version 99 is newer.*upgrade recordprep"):
        load_info(str(o.root))
    with pytest.raises(SpecError, match=str(o.root / METADATA_FILENAME)):
        readers.train_dataset(str(o.root / "train-*"), 4)


def test_damaged_metadata(tmp_path):
    o = fx.write_output(tmp_path / "out")
    (o.root / METADATA_FILENAME).write_text('{"format_version": 1, "features": [')
    with pytest.raises(SpecError, match="not valid JSON"):
        load_info(str(o.root))


# ---------------------------------------------------------------- shard selection


def test_select_shards_by_pattern_directory_and_split(out):
    sel = select_shards(str(out.root / "train-*"))
    assert sel.split == "train" and len(sel.shards) == 4 and sel.num_records == 40
    assert sel.paths[0] == str(out.shard_path("train", 0))
    assert [s.file for s in select_shards(str(out.root / "train-0000[13]-*")).shards] == [
        out.info.splits["train"].shards[1].file,
        out.info.splits["train"].shards[3].file,
    ]
    assert select_shards(str(out.root), "eval").num_records == 10
    assert select_shards(str(out.root / "*"), "eval").split == "eval"


def test_select_shards_errors_say_what_to_do(out):
    with pytest.raises(ShardSelectionError, match=r"split='...'.*train-\*"):
        select_shards(str(out.root))
    with pytest.raises(ShardSelectionError, match="several splits"):
        select_shards(str(out.root / "*.tfrecord"))
    with pytest.raises(ShardSelectionError, match=r"matches none.*train-00000-of-00004.tfrecord"):
        select_shards(str(out.root / "train-*.tfrecord.gz"))
    with pytest.raises(ShardSelectionError, match="no split 'test'.*train, eval"):
        select_shards(str(out.root), "test")
    with pytest.raises(ShardSelectionError, match="file-name part"):
        locate("gs://bucket/out-*/train-*")


def test_empty_shards_are_skipped_and_all_empty_is_an_error(tmp_path):
    o = fx.write_output(tmp_path / "out", {"train": (3, 0, 2), "empty": (0, 0)})
    assert [s.num_records for s in select_shards(str(o.root / "train-*")).shards] == [3, 2]
    with pytest.raises(ShardSelectionError, match="no records"):
        select_shards(str(o.root / "empty-*"))


def test_locate_urls():
    assert locate("gs://b/out/train-*") == readers.info.Location("gs://b/out", "train-*")
    assert locate("gs://b/out/") == readers.info.Location("gs://b/out", None)
    assert locate("hdfs://nn:8020/x/out/dataset_info.json").root == "hdfs://nn:8020/x/out"


# ---------------------------------------------------------------- keras_inputs


def test_keras_inputs_match_the_features(out):
    inputs = keras_inputs(out.info)
    assert list(inputs) == ["num", "vec", "count", "ids", "raw"]  # metadata order, no label
    assert tuple(inputs["vec"].shape) == (None, 4)
    assert tuple(inputs["num"].shape) == (None, 1)
    assert inputs["ids"].dtype == "int64" and inputs["raw"].dtype == "string"
    assert inputs["num"].dtype == "float32"
    subset = keras_inputs(out.info, ["ids", "num"])
    assert list(subset) == ["ids", "num"]
    with pytest.raises(KeyError, match="nope"):
        keras_inputs(out.info, ["nope"])


# ---------------------------------------------------------------- wait_for_dataset


def test_wait_for_dataset_returns_when_metadata_appears(tmp_path):
    final = fx.write_output(tmp_path / "out", write_metadata=False)
    text = final.info.dumps()

    def finish():
        time.sleep(0.3)
        tmp = final.root / f".{METADATA_FILENAME}.tmp"
        tmp.write_text(text)
        os.replace(tmp, final.root / METADATA_FILENAME)  # what the converter does

    writer = threading.Thread(target=finish)
    assert not (final.root / METADATA_FILENAME).exists()  # so the info below is what the wait waited for
    writer.start()
    try:
        info = wait_for_dataset(str(final.root / "train-*"), timeout=30, poll=0.05)
    finally:
        writer.join()
    assert info == final.info


def test_wait_for_dataset_times_out_with_a_clear_message(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    with pytest.raises(TimeoutError) as err:
        wait_for_dataset(str(root), timeout=0.2, poll=0.05)
    message = str(err.value)
    assert str(root / METADATA_FILENAME) in message and "0.2 s" in message
    assert "still running, or it failed" in message


def test_wait_for_dataset_keeps_polling_past_unparsable_json(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    (root / METADATA_FILENAME).write_text("{")
    with pytest.raises(TimeoutError, match="not valid JSON yet"):
        wait_for_dataset(str(root), timeout=0.15, poll=0.05)


def test_wait_for_dataset_does_not_wait_for_a_newer_format(tmp_path):
    o = fx.write_output(tmp_path / "out", format_version=7)
    with pytest.raises(SpecError, match="newer"):  # at once: the timeout is a TimeoutError
        wait_for_dataset(str(o.root), timeout=30, poll=0.05)


def test_wait_for_dataset_argument_checks(tmp_path):
    with pytest.raises(ValueError, match="poll"):
        wait_for_dataset(str(tmp_path), timeout=1, poll=0)
    with pytest.raises(ValueError, match="timeout"):
        wait_for_dataset(str(tmp_path), timeout=-1)


# ---------------------------------------------------------------- ReadOptions


def test_read_options_defaults_local_vs_remote():
    local = ReadOptions.for_path("/data/out/train-*")
    remote = ReadOptions.for_path("gs://bucket/out/train-*")
    assert local.remote is False and remote.remote is True
    assert ReadOptions.for_path("hdfs://nn:8020/out").remote is True
    assert ReadOptions.for_path("file:///data/out").remote is False
    assert local.resolved_cycle_length(100, remote=False) == 8
    assert local.resolved_cycle_length(3, remote=False) == 3  # never more than the files
    assert remote.resolved_cycle_length(100, remote=True) == 16
    assert remote.resolved_num_parallel_calls(16, remote=True) == 16
    assert 1 <= local.resolved_num_parallel_calls(8, remote=False) <= 8
    assert local.resolved_read_buffer_bytes(remote=False) == 1 << 20
    assert remote.resolved_read_buffer_bytes(remote=True) == 8 << 20
    tuned = ReadOptions.for_path("gs://b/o", cycle_length=32, read_buffer_bytes=16 << 20)
    assert tuned.resolved_cycle_length(100, remote=True) == 32
    assert tuned.resolved_read_buffer_bytes(remote=True) == 16 << 20
    assert ReadOptions().shuffle_buffer == 10_000 and ReadOptions().deterministic is False
    # Epochs started ahead: none locally; on remote storage two for a split of at most 256 MiB.
    small, big = 256 << 20, (256 << 20) + 1
    assert local.resolved_epoch_lookahead(remote=False, read_bytes=small) == 0
    assert remote.resolved_epoch_lookahead(remote=True, read_bytes=small) == 2
    assert remote.resolved_epoch_lookahead(remote=True, read_bytes=big) == 1
    for given, ahead in ((False, 0), (True, 1), (3, 3)):
        assert ReadOptions(epoch_lookahead=given).resolved_epoch_lookahead(remote=True, read_bytes=small) == ahead


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, (64 << 20) + 1),  # TensorFlow's default block, 64 MiB
        ({"GCS_READ_CACHE_BLOCK_SIZE_MB": "128"}, (128 << 20) + 1),
        ({"GCS_READAHEAD_BUFFER_SIZE_BYTES": str(32 << 20)}, (32 << 20) + 1),
        ({"GCS_READAHEAD_BUFFER_SIZE_BYTES": "1", "GCS_READ_CACHE_BLOCK_SIZE_MB": "16"}, (16 << 20) + 1),
        ({"GCS_READ_CACHE_BLOCK_SIZE_MB": "4"}, 8 << 20),  # 8 MiB reads already skip a 4 MB block
        ({"GCS_READ_CACHE_BLOCK_SIZE_MB": "0"}, 8 << 20),  # no block at all
        ({"GCS_READ_CACHE_MAX_SIZE_MB": "512"}, 8 << 20),  # shared block cache instead
    ],
)
def test_gcs_read_buffer_is_one_byte_over_tensorflows_block(monkeypatch, env, expected):
    """On gs:// reads larger than TensorFlow's per-file GCS block skip that block
    (which TensorFlow zero-fills before every fill); other schemes keep 8 MiB."""
    for name in ("GCS_READ_CACHE_BLOCK_SIZE_MB", "GCS_READAHEAD_BUFFER_SIZE_BYTES", "GCS_READ_CACHE_MAX_SIZE_MB"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    opts = ReadOptions()
    assert opts.resolved_read_buffer_bytes(remote=True, scheme="gs") == expected
    assert opts.resolved_read_buffer_bytes(remote=True, scheme="s3") == 8 << 20
    assert opts.resolved_read_buffer_bytes(remote=False, scheme="gs") == 1 << 20
    assert ReadOptions(read_buffer_bytes=4096).resolved_read_buffer_bytes(remote=True, scheme="gs") == 4096


def test_read_options_validation():
    with pytest.raises(ValueError, match="explicit number of shards"):
        ReadOptions(cycle_length=-1)  # tf.data.AUTOTUNE
    with pytest.raises(ValueError, match="cycle_length must be >= 1"):
        ReadOptions(cycle_length=0)
    with pytest.raises(TypeError, match="must be an int"):
        ReadOptions(read_buffer_bytes=1.5)
    with pytest.raises(ValueError, match="shuffle_buffer"):
        ReadOptions(shuffle_buffer=-3)
    with pytest.raises(ValueError, match="prefetch"):
        ReadOptions(prefetch=-5)
    with pytest.raises(TypeError, match="deterministic"):
        ReadOptions(deterministic="yes")
    with pytest.raises(TypeError, match="epoch_lookahead must be None, a bool or a number of epochs"):
        ReadOptions(epoch_lookahead=1.0)
    with pytest.raises(ValueError, match="epoch_lookahead must be 0 to 4 epochs, found -1"):
        ReadOptions(epoch_lookahead=-1)
    with pytest.raises(TypeError, match="remote must be a bool or None"):
        ReadOptions(remote="gs")
    assert ReadOptions(num_parallel_calls=-1).num_parallel_calls == -1  # AUTOTUNE is fine there
    with pytest.raises(dataclasses.FrozenInstanceError):
        ReadOptions().cycle_length = 3
    with pytest.raises(ValueError):
        ReadOptions().replace(block_length=0)


# ---------------------------------------------------------------- import hygiene


def test_import_readers_does_not_import_beam():
    code = (
        "import sys, readers\n"
        "assert 'tensorflow' not in sys.modules, 'import readers should not load TensorFlow'\n"
        "readers.train_dataset, readers.eval_dataset, readers.keras_inputs\n"
        "import readers.dataset, stores.staging\n"
        "assert 'tensorflow' in sys.modules\n"
        "bad = sorted(m for m in sys.modules if m == 'apache_beam' or m.startswith('apache_beam.'))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")


def test_metadata_helpers_work_without_tensorflow(tmp_path):
    o = fx.write_output(tmp_path / "out")
    code = (
        "import sys\n"
        "sys.modules['tensorflow'] = None  # make any TensorFlow import fail\n"
        "import readers\n"
        f"info = readers.load_info({str(o.root / 'train-*')!r})\n"
        f"info2 = readers.wait_for_dataset({str(o.root)!r}, timeout=5)\n"
        "assert info == info2 and info.splits['train'].num_records == 40\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "ok"
