"""train_dataset / eval_dataset: values, coverage, order, sharding, cache, checkpoints."""

from __future__ import annotations

import logging
import math
from collections import Counter

import _readers_fixtures as fx
import numpy as np
import pytest
import tensorflow as tf

import readers
from readers import ReadOptions, ShardSelectionError, eval_dataset, train_dataset


@pytest.fixture(params=["NONE", "GZIP"])
def out(request, tmp_path):
    return fx.write_output(tmp_path / "out", compression=request.param)


@pytest.fixture
def plain(tmp_path):
    return fx.write_output(tmp_path / "out")


@pytest.fixture(params=["window", "buffer", "window-ahead1", "window-ahead2"])
def mode(request):
    """Both shuffle modes (ReadOptions.shuffle_mode), with and without the next
    one or two epochs started early (ReadOptions.epoch_lookahead, the remote
    default), must keep every guarantee."""
    shuffle_mode, _, ahead = request.param.partition("-ahead")
    return ReadOptions(shuffle_mode=shuffle_mode, epoch_lookahead=int(ahead or 0))


def _pattern(o, split="train"):
    return str(o.root / f"{split}-*")


# ---------------------------------------------------------------- values and shapes


def test_train_values_shapes_and_dtypes(out):
    ds = train_dataset(_pattern(out), 5, num_epochs=1, seed=1)
    features_spec, label_spec = ds.element_spec
    assert set(features_spec) == {"num", "vec", "count", "ids", "raw"}
    assert features_spec["vec"].shape.as_list() == [5, 4]  # drop_remainder: static batch
    assert features_spec["raw"].dtype == tf.string
    assert label_spec.shape.as_list() == [5, 1] and label_spec.dtype == tf.int64
    seen = 0
    for features, label in ds:
        for row in range(5):
            i = int(features["count"][row, 0])
            want = fx.expected_values(i)
            np.testing.assert_array_equal(features["num"][row].numpy(), want["num"])
            np.testing.assert_array_equal(features["vec"][row].numpy(), want["vec"])
            np.testing.assert_array_equal(features["ids"][row].numpy(), want["ids"])
            assert features["raw"][row].numpy().tolist() == want["raw"].tolist()
            np.testing.assert_array_equal(label[row].numpy(), want["label"])
            assert features["num"].dtype == tf.float32 and features["ids"].dtype == tf.int64
            seen += 1
    assert seen == 40


def test_every_record_exactly_once_per_epoch(out, mode):
    ds = train_dataset(_pattern(out), 7, num_epochs=1, drop_remainder=False, options=mode)
    assert sorted(fx.ids_of(ds)) == out.all_ids("train")
    assert int(ds.cardinality()) == math.ceil(40 / 7)

    three = train_dataset(_pattern(out), 8, num_epochs=3, drop_remainder=False, seed=3,
                          shuffle_buffer=16, options=mode)
    ids = fx.ids_of(three)
    # shuffle before repeat: each epoch is one whole pass, never mixed with the next
    assert sorted(ids[:40]) == sorted(ids[40:80]) == sorted(ids[80:]) == out.all_ids("train")
    # which the order above only shows when the timing goes wrong: a reordered
    # batch (non-deterministic parse) could carry epoch 2 ahead of epoch 1's end.
    # Only the shard interleave may overtake; every later stage keeps order.
    assert three.options().deterministic is True
    assert int(three.cardinality()) == 15


def test_window_shuffle_permutes_each_window_of_the_stream(plain):
    # One shard at a time, no file shuffle: the stream is the metadata order, so
    # each window of 16 output records is a permutation of 16 consecutive ids.
    opts = ReadOptions(cycle_length=1, shuffle_files=False, shuffle_buffer=16)
    ids = fx.ids_of(train_dataset(_pattern(plain), 4, num_epochs=2, seed=2, deterministic=True,
                                  drop_remainder=False, options=opts))
    stream = plain.all_ids("train")
    for epoch in range(2):
        got = ids[epoch * 40:(epoch + 1) * 40]
        windows = [(0, 16), (16, 32), (32, 40)]  # the last window of an epoch is short
        for a, b in windows:
            assert sorted(got[a:b]) == sorted(stream[a:b])
        assert got != stream
    assert ids[:40] != ids[40:]  # new permutations every epoch


def test_drop_remainder_gives_full_batches_and_known_cardinality(plain):
    ds = train_dataset(_pattern(plain), 6, num_epochs=1)
    sizes = [int(f["count"].shape[0]) for f, _ in ds]
    assert sizes == [6] * 6 and int(ds.cardinality()) == 6  # 40 // 6


def test_forever_by_default(plain, mode):
    ds = train_dataset(_pattern(plain), 16, options=mode)
    assert ds.cardinality() == tf.data.INFINITE_CARDINALITY
    assert len(fx.ids_of(ds.take(10))) == 160  # 4 epochs worth, no end
    skipping = train_dataset(_pattern(plain), 16, options=mode, skip_corrupt=True)
    assert skipping.cardinality() == tf.data.INFINITE_CARDINALITY


def test_pipeline_left_without_records_is_empty_not_an_error(tmp_path, mode):
    # Record-level sharding with more pipelines than records: the last ones get none.
    o = fx.write_output(tmp_path / "tiny", {"train": (2,)})
    ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=2)
    ds = train_dataset(str(o.root / "train-*"), 2, input_context=ctx, seed=1, options=mode)
    assert fx.ids_of(ds.take(3)) == []


def test_seeded_deterministic_order_reproduces_and_shuffles(plain, mode):
    def build(seed):
        return train_dataset(
            _pattern(plain), 4, num_epochs=2, seed=seed, deterministic=True, shuffle_buffer=16,
            options=mode,
        )

    ds = build(11)
    first, again, other = fx.ids_of(ds), fx.ids_of(build(11)), fx.ids_of(build(12))
    assert first == again
    assert first != other
    assert first[:40] != sorted(first[:40])  # actually shuffled
    assert first[:40] != first[40:]  # reshuffled each epoch
    assert fx.ids_of(ds) != first  # a second iteration (a new Keras epoch) is reshuffled too


def test_shard_pattern_and_directory_with_split_select_the_same(plain):
    by_dir = train_dataset(str(plain.root), 10, split="train", num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(by_dir)) == plain.all_ids("train")
    one_shard = train_dataset(
        str(plain.shard_path("train", 1)), 4, num_epochs=1, drop_remainder=False
    )
    assert sorted(fx.ids_of(one_shard)) == plain.ids["train"][1]
    with pytest.raises(ShardSelectionError, match="split="):
        train_dataset(str(plain.root), 4)


def test_features_subset_and_no_label(plain):
    ds = train_dataset(_pattern(plain), 4, features=["count", "vec"], label_key=None, num_epochs=1)
    assert isinstance(ds.element_spec, dict) and set(ds.element_spec) == {"count", "vec"}
    assert sorted(fx.ids_of(ds, labelled=False)) == plain.all_ids("train")

    everything = train_dataset(_pattern(plain), 4, label_key=None, num_epochs=1)
    assert set(everything.element_spec) == {"num", "vec", "count", "ids", "raw"}

    as_label = train_dataset(_pattern(plain), 4, label_key="num", features=["count"], num_epochs=1)
    for features, label in as_label.take(2):
        np.testing.assert_allclose(label.numpy()[:, 0], features["count"].numpy()[:, 0] * 0.5)

    with pytest.raises(KeyError, match="nope"):
        train_dataset(_pattern(plain), 4, features=["nope"])
    with pytest.raises(ValueError, match="is the label"):
        train_dataset(_pattern(plain), 4, features=["label", "num"])


def test_dataset_without_label_in_metadata_yields_features_only(tmp_path):
    o = fx.write_output(tmp_path / "nolabel", {"train": (5, 5)}, label_key=None)
    ds = train_dataset(str(o.root / "train-*"), 5, num_epochs=1)
    assert isinstance(ds.element_spec, dict) and "label" not in ds.element_spec


# ---------------------------------------------------------------- eval


def test_eval_order_cardinality_and_partial_batch(out):
    ds = eval_dataset(_pattern(out, "eval"), 4)
    assert int(ds.cardinality()) == math.ceil(10 / 4)
    batches = list(ds)
    assert [int(f["count"].shape[0]) for f, _ in batches] == [4, 4, 2]
    order = fx.ids_of(batches)
    assert order == out.all_ids("eval")  # metadata order: shard by shard, file order
    assert fx.ids_of(eval_dataset(_pattern(out, "eval"), 4)) == order


def test_eval_metadata_order_with_many_shards_and_parallel_reads(tmp_path):
    o = fx.write_output(tmp_path / "many", {"eval": (5, 1, 7, 3, 4, 6, 2)})
    ds = eval_dataset(str(o.root / "eval-*"), 3, options=ReadOptions(cycle_length=3))
    assert fx.ids_of(ds) == o.all_ids("eval")
    assert int(ds.cardinality()) == math.ceil(28 / 3)


def test_eval_order_without_the_private_interleave_class(plain, monkeypatch):
    # eval_dataset bounds per-shard read-ahead through a private TF class; if a
    # TF upgrade removes it, the public fallback must give the same order.
    from tensorflow.python.data.ops import interleave_op

    monkeypatch.delattr(interleave_op, "_ParallelInterleaveDataset")
    ds = eval_dataset(_pattern(plain), 4, options=ReadOptions(cycle_length=3))
    assert fx.ids_of(ds) == plain.all_ids("train")
    assert int(ds.cardinality()) == 10


def test_train_without_the_private_tfrecord_class(plain, monkeypatch):
    # Shards are read through TensorFlow's private _TFRecordDataset (quicker to
    # build); without it the public TFRecordDataset must give the same records.
    import readers.shards

    public, calls = tf.data.TFRecordDataset, []

    def spy(*args, **kwargs):
        calls.append(args)
        return public(*args, **kwargs)

    monkeypatch.setattr(readers.shards, "_private_tfrecord_class", lambda: None)
    monkeypatch.setattr(tf.data, "TFRecordDataset", spy)
    ds = train_dataset(_pattern(plain), 5, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == plain.all_ids("train")
    assert calls  # the public class read the shards


def test_the_private_tfrecord_class_is_called_by_keyword(tmp_path, monkeypatch):
    # A TF release that reorders _TFRecordDataset's parameters must not get the
    # compression type as the buffer size: the private class reads gzip shards.
    import readers.shards

    gz = fx.write_output(tmp_path / "gz", compression="GZIP")
    real, calls = readers.shards._private_tfrecord_class(), []

    def reordered(filenames, buffer_size=None, compression_type=None, name=None):
        calls.append((buffer_size, compression_type))
        return real(filenames, compression_type=compression_type, buffer_size=buffer_size)

    def no_public(*args, **kwargs):
        raise AssertionError("fell back to the public TFRecordDataset")

    monkeypatch.setattr(readers.shards, "_private_tfrecord_class", lambda: reordered)
    monkeypatch.setattr(tf.data, "TFRecordDataset", no_public)
    ds = train_dataset(_pattern(gz), 5, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == gz.all_ids("train")
    assert calls and all(c == "GZIP" and isinstance(b, int) for b, c in calls)


def test_the_private_interleave_class_is_called_by_keyword(plain, monkeypatch):
    # A TF release that swaps cycle_length and block_length in
    # _ParallelInterleaveDataset's signature must not change eval's order.
    from tensorflow.python.data.ops import interleave_op

    real, calls = interleave_op._ParallelInterleaveDataset, []

    def reordered(input_dataset, map_func, block_length, cycle_length, num_parallel_calls, **kwargs):
        calls.append((cycle_length, block_length))
        return real(input_dataset, map_func, cycle_length, block_length, num_parallel_calls, **kwargs)

    monkeypatch.setattr(interleave_op, "_ParallelInterleaveDataset", reordered)
    ds = eval_dataset(_pattern(plain), 4, options=ReadOptions(cycle_length=3))
    assert fx.ids_of(ds) == plain.all_ids("train")
    assert calls and calls[0][0] == 3  # the private class read the shards, 3 open at once


def test_fixed_len_parse_matches_tf_io_parse_example():
    from readers.parsing import _parse_fixed

    def example(**features):
        def feature(v):
            if isinstance(v[0], bytes):
                return tf.train.Feature(bytes_list=tf.train.BytesList(value=v))
            if isinstance(v[0], float):
                return tf.train.Feature(float_list=tf.train.FloatList(value=v))
            return tf.train.Feature(int64_list=tf.train.Int64List(value=v))

        return tf.train.Example(
            features=tf.train.Features(feature={k: feature(v) for k, v in features.items()})
        ).SerializeToString()

    spec = {
        "x": tf.io.FixedLenFeature([], tf.float32),
        "ids": tf.io.FixedLenFeature([3], tf.int64),
        "grid": tf.io.FixedLenFeature([2, 2], tf.float32),
        "s": tf.io.FixedLenFeature([], tf.string),
        "d": tf.io.FixedLenFeature([2], tf.int64, default_value=[7, 8]),
        "e": tf.io.FixedLenFeature([], tf.float32, default_value=-1.0),
        # defaults are made once per distinct value: d2 shares d's, d3 differs only in dtype
        "d2": tf.io.FixedLenFeature([2], tf.int64, default_value=[7, 8]),
        "d3": tf.io.FixedLenFeature([2], tf.float32, default_value=[7.0, 8.0]),
        "g2": tf.io.FixedLenFeature([2, 2], tf.float32, default_value=[1.0, 2.0, 3.0, 4.0]),
        "s2": tf.io.FixedLenFeature([], tf.string, default_value=b"zz"),
    }
    rows = tf.constant([
        example(x=[1.5], ids=[1, 2, 3], grid=[1.0, 2.0, 3.0, 4.0], s=[b"a"], d=[4, 5]),
        example(x=[-2.0], ids=[9, 8, 7], grid=[0.5, 0.5, 0.5, 0.5], s=[b""], e=[3.0], d2=[1, 2],
                s2=[b"y"]),
    ])
    got, want = _parse_fixed(rows, spec), tf.io.parse_example(rows, spec)
    assert set(got) == set(want)
    for k in spec:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert got[k].numpy().tolist() == want[k].numpy().tolist(), k
    missing = tf.constant([example(x=[1.0])])
    for parse in (_parse_fixed, tf.io.parse_example):
        with pytest.raises(tf.errors.InvalidArgumentError, match="ids"):
            parse(missing, {"ids": spec["ids"]})


# ---------------------------------------------------------------- cache


@pytest.mark.parametrize("cache", ["memory", "dir"])
def test_cache_gives_the_same_data(plain, tmp_path, cache, mode):
    cache_arg = "memory" if cache == "memory" else str(tmp_path / "cache")

    def run(c, options):
        return fx.ids_of(
            train_dataset(
                _pattern(plain),
                8,
                num_epochs=3,
                seed=5,
                deterministic=True,
                drop_remainder=False,
                cache=c,
                options=options,
            )
        )

    # A cache replays the first epoch, so the next one cannot start early: with a
    # cache the pipeline is the one without epoch_lookahead, and matches it.
    cached, uncached = run(cache_arg, mode), run(None, mode.replace(epoch_lookahead=False))
    assert cached[:40] == uncached[:40]  # first epoch: cache is transparent
    assert Counter(cached) == Counter(uncached) == Counter(plain.all_ids("train") * 3)
    assert cached[40:80] != cached[80:]  # later epochs (replayed from cache) still reshuffled
    if cache == "dir":
        files = list((tmp_path / "cache").iterdir())
        assert any(f.name.endswith(".index") for f in files), files
        assert (
            fx.ids_of(
                train_dataset(
                    _pattern(plain),
                    8,
                    num_epochs=1,
                    seed=5,
                    deterministic=True,
                    drop_remainder=False,
                    cache=cache_arg,
                    options=mode,
                )
            )
            == cached[:40]
        )


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("cache", [None, "memory"])
def test_checkpoint_mid_epoch_resumes_exactly(plain, tmp_path, cache, mode):
    def build():
        return train_dataset(
            _pattern(plain),
            4,
            num_epochs=3,
            seed=21,
            deterministic=True,
            shuffle_buffer=16,
            cache=cache,
            options=mode,
        )

    reference = fx.ids_of(build().take(14))

    it = iter(build())
    for _ in range(6):  # mid-first-epoch (10 batches per epoch)
        next(it)
    path = tf.train.Checkpoint(iterator=it).save(str(tmp_path / "ckpt" / "it"))
    resumed = iter(build())
    tf.train.Checkpoint(iterator=resumed).restore(path).assert_consumed()
    after = [next(resumed) for _ in range(8)]
    assert fx.ids_of(after) == reference[6 * 4 :]


# ---------------------------------------------------------------- input_context sharding


def test_input_context_shards_files_disjoint_and_complete(plain, caplog):
    per_pipeline = []
    for pid in range(3):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=3, input_pipeline_id=pid, num_replicas_in_sync=3
        )
        ds = train_dataset(
            _pattern(plain), 4, num_epochs=1, drop_remainder=False, input_context=ctx
        )
        per_pipeline.append(fx.ids_of(ds))
    flat = [i for ids in per_pipeline for i in ids]
    assert sorted(flat) == plain.all_ids("train") and len(flat) == len(set(flat))
    # file-level: pipeline 0 gets shards 0 and 3, 1 gets shard 1, 2 gets shard 2
    assert sorted(per_pipeline[0]) == sorted(plain.ids["train"][0] + plain.ids["train"][3])
    assert sorted(per_pipeline[1]) == plain.ids["train"][1]
    assert "record-level" not in caplog.text


def test_fewer_files_than_pipelines_falls_back_to_records_with_warning(tmp_path, caplog):
    o = fx.write_output(tmp_path / "two", {"train": (9, 8)})
    per_pipeline = []
    with caplog.at_level(logging.WARNING, logger="readers"):
        for pid in range(3):
            ctx = tf.distribute.InputContext(num_input_pipelines=3, input_pipeline_id=pid)
            ds = train_dataset(
                str(o.root / "train-*"),
                3,
                num_epochs=1,
                drop_remainder=False,
                input_context=ctx,
                seed=4,
            )  # unseeded file shuffle would be disabled
            per_pipeline.append(fx.ids_of(ds))
            assert int(ds.cardinality()) == math.ceil(len(range(pid, 17, 3)) / 3)
    assert "record-level sharding" in caplog.text
    flat = [i for ids in per_pipeline for i in ids]
    assert sorted(flat) == o.all_ids("train") and len(flat) == len(set(flat))
    assert [len(p) for p in per_pipeline] == [6, 6, 5]


# ---------------------------------------------------------------- arguments and options


def test_argument_validation(plain):
    with pytest.raises(ValueError, match="batch_size"):
        train_dataset(_pattern(plain), 0)
    with pytest.raises(ValueError, match="num_epochs"):
        train_dataset(_pattern(plain), 4, num_epochs=0)
    with pytest.raises(TypeError, match="options"):
        train_dataset(_pattern(plain), 4, options={"cycle_length": 2})
    with pytest.raises(ValueError, match="batch_size"):
        eval_dataset(_pattern(plain, "eval"), -1)
    with pytest.raises(ValueError, match="shuffle_mode must be one of 'window', 'buffer', found 'x'"):
        ReadOptions(shuffle_mode="x")


def test_explicit_options_are_honoured(plain):
    opts = ReadOptions(
        cycle_length=1,
        num_parallel_calls=1,
        read_buffer_bytes=4096,
        shuffle_buffer=0,
        shuffle_files=False,
        prefetch=2,
        deterministic=True,
    )
    ds = train_dataset(_pattern(plain), 5, num_epochs=1, options=opts)
    # cycle 1, no shuffling at all: exactly the metadata order
    assert fx.ids_of(ds) == plain.all_ids("train")
    assert ds.options().deterministic is True
    assert ds.options().experimental_optimization.map_parallelization is True


def test_readers_namespace_exports():
    """``readers`` exports exactly ``__all__``, each name the object its own
    module defines; ``import readers`` loads neither TensorFlow nor Beam until
    a dataset function is asked for."""
    import importlib
    import subprocess
    import sys

    assert set(readers.__all__) >= {
        "train_dataset",
        "eval_dataset",
        "load_info",
        "keras_inputs",
        "wait_for_dataset",
        "ReadOptions",
        "DatasetIncompleteError",
    }
    assert len(set(readers.__all__)) == len(readers.__all__)
    star: dict = {}
    exec("from readers import *", star)  # noqa: S102 - what a user's star import gets
    assert set(star) - {"__builtins__"} == set(readers.__all__)
    for name in readers.__all__:
        obj = getattr(readers, name)
        home = importlib.import_module(obj.__module__)
        # (SpecError is convert.spec's: the on-disk contract's own error; StagingError and
        # ShardNotFoundError are the stores', which raise them while staging)
        assert obj.__module__.split(".")[0] in ("readers", "convert", "stores") and getattr(home, name) is obj, name
        assert callable(obj), name
    with pytest.raises(AttributeError, match="no attribute 'train_datasets'"):
        readers.train_datasets  # noqa: B018 - a misspelling is an AttributeError, not None
    probe = ("import sys, readers\n"
             "print(sorted(m for m in ('tensorflow', 'apache_beam') if m in sys.modules))\n"
             "readers.train_dataset\n"
             "print('tensorflow' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["[]", "True"]
