"""Damaged, truncated and missing shards: errors name the file; skip_corrupt skips."""

from __future__ import annotations

import os

import _readers_fixtures as fx
import pytest
import tensorflow as tf

from readers import (
    ReadOptions,
    ShardMismatchError,
    ShardNotFoundError,
    eval_dataset,
    train_dataset,
)


def _train(o, **kw):
    kw.setdefault("num_epochs", 1)
    kw.setdefault("drop_remainder", False)
    return train_dataset(str(o.root / "train-*"), 4, **kw)


def _drain(ds):
    for _ in ds:
        pass


@pytest.mark.parametrize("compression", ["NONE", "GZIP"])
def test_corrupt_shard_raises_naming_the_file(tmp_path, compression):
    o = fx.write_output(tmp_path / "out", compression=compression)
    bad = o.shard_path("train", 2)
    fx.flip_byte(bad, 0.5)
    with pytest.raises(tf.errors.InvalidArgumentError) as err:
        _drain(_train(o, seed=1))
    message = str(err.value)
    assert f"recordprep: shard {bad} is damaged" in message
    assert "11 records dataset_info.json lists" in message
    assert "skip_corrupt=True" in message
    # eval fails the same way
    bad_eval = o.shard_path("eval", 0)
    fx.flip_byte(bad_eval, 0.5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard {bad_eval} is damaged"):
        _drain(eval_dataset(str(o.root / "eval-*"), 4))


@pytest.mark.parametrize("compression", ["NONE", "GZIP"])
def test_skip_corrupt_keeps_the_good_records_and_reports(tmp_path, capfd, compression):
    o = fx.write_output(tmp_path / "out", compression=compression)
    bad = o.shard_path("train", 0)
    fx.flip_byte(bad, 0.6)
    got = fx.ids_of(_train(o, skip_corrupt=True, seed=2))
    assert len(got) == len(set(got))
    good = [i for shard in o.ids["train"][1:] for i in shard]
    assert set(good) <= set(got)
    from_bad = sorted(set(got) - set(good))
    assert from_bad == o.ids["train"][0][: len(from_bad)]  # a prefix of the damaged shard
    assert len(from_bad) < 13
    err = capfd.readouterr().err
    assert (
        f"recordprep: skip_corrupt: skipped the rest of damaged shard {bad}: "
        f"read {len(from_bad)} of the 13 records dataset_info.json lists"
    ) in err


NO_PRECHECK = ReadOptions(verify_files=False)


def test_truncated_shard_is_caught_before_reading_by_its_size(tmp_path):
    o = fx.write_output(tmp_path / "out")
    bad = o.shard_path("train", 1)
    fx.truncate(bad, fx.record_boundary(bad, 4) + 10)
    with pytest.raises(ShardMismatchError) as err:
        _train(o)
    assert f"{bad}: {bad.stat().st_size} bytes on disk, dataset_info.json says" in str(err.value)
    assert "Re-run the conversion" in str(err.value)
    with pytest.raises(ShardMismatchError, match=str(bad)):
        eval_dataset(str(o.root / "train-*"), 4)


def test_truncated_mid_record_raises_naming_the_file_at_read_time(tmp_path):
    o = fx.write_output(tmp_path / "out")
    bad = o.shard_path("train", 1)
    fx.truncate(bad, fx.record_boundary(bad, 4) + 10)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard {bad} is damaged"):
        _drain(_train(o, options=NO_PRECHECK))


def test_truncated_at_record_boundary_is_caught_by_the_record_count(tmp_path):
    # TensorFlow itself reads such a file as a shorter, valid file.
    o = fx.write_output(tmp_path / "out")
    bad = o.shard_path("train", 1)
    fx.truncate(bad, fx.record_boundary(bad, 4))
    assert sum(1 for _ in tf.data.TFRecordDataset(str(bad))) == 4
    with pytest.raises(
        tf.errors.InvalidArgumentError, match=f"shard {bad} is damaged: read 4 of the 9 records"
    ):
        _drain(_train(o, options=NO_PRECHECK))
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard {bad} is damaged"):
        _drain(eval_dataset(str(o.root / "train-*"), 4, options=NO_PRECHECK))


def test_truncated_gzip_shard_raises_naming_the_file(tmp_path):
    o = fx.write_output(tmp_path / "out", compression="GZIP")
    bad = o.shard_path("train", 3)
    fx.truncate(bad, os.path.getsize(bad) // 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard {bad} is damaged"):
        _drain(_train(o, options=NO_PRECHECK))


def test_skip_corrupt_tolerates_a_truncated_shard(tmp_path, caplog):
    o = fx.write_output(tmp_path / "out")
    bad = o.shard_path("train", 1)
    fx.truncate(bad, fx.record_boundary(bad, 4))
    got = fx.ids_of(_train(o, skip_corrupt=True))
    assert sorted(got) == sorted(set(o.all_ids("train")) - set(o.ids["train"][1][4:]))
    assert "differ in size from the metadata" in caplog.text and str(bad) in caplog.text
    assert _train(o, skip_corrupt=True).cardinality() == tf.data.UNKNOWN_CARDINALITY


def test_damage_is_reported_even_if_no_batch_would_contain_it(tmp_path):
    # All records would land in the partial batch drop_remainder drops: the check
    # happens where the shard is read, not where records are parsed.
    o = fx.write_output(tmp_path / "out", {"train": (5,)})
    bad = o.shard_path("train", 0)
    fx.truncate(bad, fx.record_boundary(bad, 3))
    ds = train_dataset(
        str(o.root / "train-*"), 64, num_epochs=1, drop_remainder=True, options=NO_PRECHECK
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard {bad} is damaged: read 3 of"):
        _drain(ds)


def test_missing_shard_is_reported_before_reading(tmp_path):
    o = fx.write_output(tmp_path / "out")
    gone = o.shard_path("train", 2)
    gone.unlink()
    with pytest.raises(ShardNotFoundError) as err:
        _train(o)
    assert str(gone) in str(err.value) and "Re-run the conversion" in str(err.value)
    with pytest.raises(ShardNotFoundError, match=str(gone)):
        eval_dataset(str(o.root / "train-*"), 4)
    # Without the up-front check (or if a shard disappears mid-training) the
    # read-time check still names it, instead of retrying the open forever.
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=f"shard {gone} is damaged: read 0 of the 11 .* does not exist",
    ):
        _drain(_train(o, options=NO_PRECHECK))
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not exist"):
        _drain(eval_dataset(str(o.root / "train-*"), 4, options=NO_PRECHECK))


def test_glob_metacharacters_in_the_directory_name(tmp_path):
    o = fx.write_output(tmp_path / "we[ir]d *out")
    ds = train_dataset(str(o.root / "train-*"), 8, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == o.all_ids("train")
    assert fx.ids_of(eval_dataset(str(o.root), 4, split="eval")) == o.all_ids("eval")
