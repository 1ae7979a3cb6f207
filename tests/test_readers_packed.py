"""The packed layout (``--layout packed``): same tensors as one Feature per column."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from _pipelines_data import CONFIG, make_records, write_dataset

import readers
from convert.spec import PACKED_KEYS
from pipelines.cli.verify import verify_output
from pipelines.job import run_convert
from pipelines.options import ConvertOptions, OptionsError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    paths = write_dataset(root / "d", make_records(300))
    config = root / "features.yaml"  # the shared config plus a bytes feature (stays its own Feature)
    config.write_text(CONFIG + "  - {name: raw_text, source: text, transform: bytes}\n")
    out = {}
    for layout in ("features", "packed"):
        out[layout] = root / layout
        run_convert(ConvertOptions(inputs=(str(paths["avro"]),), config=str(config), output=str(out[layout]),
                                   num_shards=2, layout=layout))
    return out


def test_metadata_records_the_layout(outputs):
    plain, packed = readers.load_info(str(outputs["features"])), readers.load_info(str(outputs["packed"]))
    # both layouts are written as format_version 3 (FarmHash ids, ASCII-defined tokens)
    assert (plain.layout, plain.format_version) == ("features", 3)
    assert (packed.layout, packed.format_version) == ("packed", 3)
    assert packed.features == plain.features  # the logical features do not change


def test_examples_hold_the_packed_features_and_the_bytes_one(outputs):
    info = readers.load_info(str(outputs["packed"]))
    shard = outputs["packed"] / info.split("train").shards[0].file
    raw = next(iter(tf.data.TFRecordDataset(str(shard), compression_type="GZIP")))
    ex = tf.train.Example.FromString(raw.numpy())
    assert set(ex.features.feature) == {*PACKED_KEYS.values(), "raw_text"}
    n_int = sum(f.size for f in info.features if f.dtype == "int64")
    assert len(ex.features.feature[PACKED_KEYS["int64"]].int64_list.value) == n_int
    plain_info = readers.load_info(str(outputs["features"]))
    plain_shard = outputs["features"] / plain_info.split("train").shards[0].file
    assert shard.stat().st_size < plain_shard.stat().st_size  # no per-feature keys


@pytest.mark.parametrize("split", ["train", "eval"])
def test_readers_give_identical_tensors_from_both_layouts(outputs, split):
    got = {layout: list(readers.eval_dataset(str(out / f"{split}-*"), 64)) for layout, out in outputs.items()}
    assert len(got["features"]) == len(got["packed"]) > 0
    for (fa, la), (fb, lb) in zip(got["features"], got["packed"], strict=True):
        assert sorted(fa) == sorted(fb)
        for name in fa:
            assert fa[name].dtype == fb[name].dtype and fa[name].shape == fb[name].shape, name
            np.testing.assert_array_equal(fa[name].numpy(), fb[name].numpy(), err_msg=name)
        np.testing.assert_array_equal(la.numpy(), lb.numpy())


def test_train_dataset_subset_without_label_and_keras_inputs(outputs):
    kw = {"features": ["x", "raw_text", "tags"], "label_key": None, "num_epochs": 1, "seed": 7, "deterministic": True}
    a = list(readers.train_dataset(str(outputs["features"] / "train-*"), 32, **kw))
    b = list(readers.train_dataset(str(outputs["packed"] / "train-*"), 32, **kw))
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        assert sorted(x) == sorted(y) == ["raw_text", "tags", "x"]
        for name in x:
            np.testing.assert_array_equal(x[name].numpy(), y[name].numpy(), err_msg=name)
    inputs = readers.keras_inputs(readers.load_info(str(outputs["packed"])))
    assert set(inputs) >= {"x", "raw_text", "tags"}


def test_parse_plan_lets_other_pipelines_read_packed_shards(outputs):
    info = readers.load_info(str(outputs["packed"]))
    names = [f.name for f in info.features]
    spec, unpack = readers.parse_plan(info, names)
    assert set(spec) == {*PACKED_KEYS.values(), "raw_text"}
    files = [str(outputs["packed"] / s.file) for s in info.split("eval").shards]
    batch = next(iter(tf.data.TFRecordDataset(files, compression_type="GZIP").batch(1000)))
    mine = unpack(tf.io.parse_example(batch, spec))
    ref_info = readers.load_info(str(outputs["features"]))
    ref_spec, _ = readers.parse_plan(ref_info, names)
    ref_files = [str(outputs["features"] / s.file) for s in ref_info.split("eval").shards]
    ref = tf.io.parse_example(next(iter(tf.data.TFRecordDataset(ref_files, compression_type="GZIP").batch(1000))), ref_spec)
    for name in names:
        np.testing.assert_array_equal(mine[name].numpy(), ref[name].numpy(), err_msg=name)


def test_verify_and_inspect_understand_the_packed_layout(outputs):
    from pipelines.cli.inspect import inspect_output

    report = verify_output(str(outputs["packed"]))
    assert report.ok, report.problems
    text = "\n".join(inspect_output(str(outputs["packed"]), n_examples=1))
    assert "layout packed" in text and "  x: [" in text and "recordprep:" not in text.split("example 0", 1)[1]


def test_unknown_layout_is_refused():
    with pytest.raises(OptionsError, match="--layout must be one of"):
        ConvertOptions(inputs=("x",), config="c", output="o", layout="columnar")
