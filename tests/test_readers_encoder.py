"""Features a model learns from: each feature's ``encoding`` in the spec, and
``readers.feature_encoder`` built from it (trained, saved, loaded, exported, served)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import readers
from convert.spec import DatasetInfo, FeatureSpec, SpecError
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from readers.encoder import MaskedMeanEmbedding, embedding_dim

CONFIG = """
label: {source: y, dtype: int64}
features:
  - {name: ts, transform: timestamp, unit: s, parts: [hour, day_of_week], missing_indicator: true}
  - {name: n_tags, source: tags, transform: count}
  - {name: tags, transform: vocabulary, max_len: 3}
  - {name: tags_mi, source: tags, transform: label_vocabulary, max_len: 3, min_diff_from_avg: 0}
  - {name: country, transform: vocabulary}
  - {name: uid, transform: hash, buckets: 64}
  - {name: q, transform: text, max_len: 4}
  - {name: q_tfidf, source: q, transform: tfidf, max_len: 3, ngram_range: [1, 2]}
  - {name: q_bow, source: q, transform: bag_of_words, max_len: 3, length: false}
  - {name: age, transform: zscore, missing_indicator: true}
  - {name: raw_age, source: age, transform: identity}
"""


def _record(i: int) -> dict:
    return {"y": i % 2, "ts": None if i % 17 == 0 else 1_767_225_600 + i * 3_600, "tags": ["a", "b", "c"][: i % 4],
            "country": ["US", "FR", "DE"][i % 3], "uid": f"u{i % 40}", "q": "cheap red shoes"[: 4 + i % 11],
            "age": None if i % 7 == 0 else 20 + i % 50}


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("enc")
    (root / "in.jsonl").write_text("".join(json.dumps(_record(i)) + "\n" for i in range(400)))
    (root / "features.yaml").write_text(CONFIG)
    run_convert(ConvertOptions(inputs=(str(root / "in.jsonl"),), config=str(root / "features.yaml"),
                               output=str(root / "out"), num_shards=1))
    return root / "out"


def test_every_feature_states_how_a_model_consumes_it(output):
    info = readers.load_info(str(output))
    got = {f.name: f.encoding for f in info.features}
    assert got == {"ts": "scaled", "ts_hour": "embedding", "ts_day_of_week": "embedding", "ts_missing": "indicator",
                   "n_tags": "scaled", "tags": "tokens", "tags_len": "aux", "tags_mi": "tokens", "tags_mi_len": "aux", "country": "embedding",
                   "uid": "embedding", "q": "tokens", "q_len": "aux", "q_tfidf": "weighted_tokens",
                   "q_tfidf_weights": "aux", "q_tfidf_len": "aux", "q_bow": "weighted_tokens", "q_bow_counts": "aux", "age": "scaled", "age_missing": "indicator",
                   "raw_age": "raw", "y": "label"}
    # No helper feeds an int64 feature without a vocabulary as a number: every one is an id, an indicator or aux.
    for f in info.features:
        if f.dtype == "int64" and f.role != "label":
            assert f.params.get("vocab_size") or f.encoding in ("indicator", "aux"), f


def test_timestamps_and_counts_are_floats_about_unit_range(output):
    batch = next(iter(readers.eval_dataset(f"{output}/eval-*", batch_size=1000)))[0]
    for name in ("ts", "n_tags"):
        x = batch[name].numpy()
        assert x.dtype == np.float32 and np.abs(x).max() < 5, (name, x.min(), x.max())


def test_metadata_without_encoding_derives_it_an_old_timestamp_is_raw_and_it_is_always_written():
    old = FeatureSpec.from_json({"name": "ts", "dtype": "int64", "shape": [1], "transform": "timestamp"})
    assert old.encoding == "raw"
    count = FeatureSpec.from_json({"name": "n", "dtype": "int64", "shape": [1], "transform": "count"})
    assert count.encoding == "raw"
    ids = FeatureSpec.from_json({"name": "c", "dtype": "int64", "shape": [1], "transform": "vocabulary",
                                 "params": {"vocab_size": 5}})
    assert ids.encoding == "embedding" and ids.to_json()["encoding"] == "embedding"  # always stated
    stated = FeatureSpec.from_json({"name": "c", "dtype": "float32", "shape": [1], "encoding": "raw",
                                    "transform": "zscore"})
    assert stated.encoding == "raw" and stated.to_json()["encoding"] == "raw"
    with pytest.raises(SpecError, match="encoding 'bogus' is not one of"):
        FeatureSpec.from_json({"name": "c", "dtype": "float32", "shape": [1], "encoding": "bogus"})


def test_masked_mean_pooling_averages_the_non_zero_ids_and_gives_zeros_without_any():
    layer = MaskedMeanEmbedding(5, 3)
    out = layer(tf.constant([[1, 2, 0], [0, 0, 0], [3, 0, 0]], dtype=tf.int64)).numpy()
    table = layer.embedding.embeddings.numpy()
    np.testing.assert_allclose(out[0], (table[1] + table[2]) / 2, rtol=1e-6)
    np.testing.assert_array_equal(out[1], np.zeros(3, dtype=np.float32))
    np.testing.assert_allclose(out[2], table[3], rtol=1e-6)


def test_embedding_widths_grow_slowly_with_the_vocabulary():
    assert [embedding_dim(n) for n in (2, 24, 65, 10_000)] == [2, 9, 17, 64]
    assert embedding_dim(10_000, max_dim=8) == 8


def test_the_encoder_takes_every_encodable_feature_and_refuses_raw_ones(output):
    info = readers.load_info(str(output))
    inputs, encoded = readers.feature_encoder(info)
    encoded_names = {f.name for f in info.features if f.encoding in ("embedding", "tokens", "weighted_tokens", "scaled",
                                                                      "indicator")}
    assert set(inputs) == encoded_names | {"q_tfidf_weights", "q_bow_counts"}  # a weighted feature's weights too
    assert encoded.shape[-1] == sum(embedding_dim(f.params["vocab_size"]) if "tokens" in f.encoding
                                    or f.encoding == "embedding" else f.size
                                    for f in info.features if f.name in encoded_names)
    with pytest.raises(ValueError, match="'raw_age' \\(raw\\).*zscore"):
        readers.feature_encoder(info, ["age", "raw_age"])
    with pytest.raises(ValueError, match="'tags_len' \\(aux\\)"):
        readers.feature_encoder(info, ["tags_len"])


@pytest.mark.slow
def test_a_model_on_the_encoder_trains_saves_exports_and_scores_raw_records(output, tmp_path):
    """One training step, saved as .keras, exported by `recordprep export` (the CLI loads the
    file), and served raw records: the SavedModel's scores are the Keras model's on the shards."""
    info = readers.load_info(str(output))
    inputs, h = readers.feature_encoder(info)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, activation="sigmoid")(h))
    model.compile(optimizer="adam", loss="binary_crossentropy")
    names = list(inputs)
    model.fit(readers.train_dataset(f"{output}/train-*", 32, seed=0, features=names), steps_per_epoch=1, verbose=0,
              shuffle=False)  # the dataset shuffles; Keras warns on its default for a Dataset
    model.save(tmp_path / "m.keras")
    export = tmp_path / "export"
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "export", str(output), str(tmp_path / "m.keras"),
                        str(export)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    records = [_record(i) for i in range(30)]
    layer = readers.transform_layer(str(output))
    features, errors = layer.transform_records(records)
    assert not any(errors)
    want = model({n: tf.constant(features[n]) for n in names}, training=False).numpy()
    served = tf.saved_model.load(str(export)).signatures["serving_default"]
    wire, rejected = readers.serving.wire_of_export(str(export)).encode(records)
    assert not rejected
    got = served(**{k: tf.constant(v) for k, v in wire.items()})["outputs"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_dataset_info_of_an_older_output_without_encodings_still_loads(output):
    d = json.loads((output / "dataset_info.json").read_text())
    for f in d["features"]:
        f.pop("encoding", None)
    info = DatasetInfo.from_json(d)
    assert info.feature("ts").encoding == "scaled"


def test_weighted_mean_embedding_weighs_non_zero_ids():
    from readers.encoder import WeightedMeanEmbedding

    layer = WeightedMeanEmbedding(5, 2)
    ids = tf.constant([[1, 3, 0], [0, 0, 0], [2, 2, 0]], tf.int64)
    w = tf.constant([[1.0, 3.0, 9.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.0]])
    out = layer([ids, w]).numpy()
    emb = layer.embedding.embeddings.numpy()
    np.testing.assert_allclose(out[0], (emb[1] + 3 * emb[3]) / 4, rtol=1e-6)
    np.testing.assert_array_equal(out[1], [0.0, 0.0])  # no id: zeros, not NaN
    np.testing.assert_allclose(out[2], emb[2], rtol=1e-6)
    again = WeightedMeanEmbedding.from_config(layer.get_config())
    assert again.input_dim == 5 and again.output_dim == 2


def test_a_weighted_feature_without_its_weights_is_refused(output):
    info = readers.load_info(str(output))
    d = json.loads((output / "dataset_info.json").read_text())
    for f in d["features"]:
        if f["name"] == "q_tfidf":
            f["params"]["weights"] = "nope"
    with pytest.raises(ValueError, match="'q_tfidf' \\(weighted_tokens\\) names no weights feature"):
        readers.feature_encoder(DatasetInfo.from_json(d), ["q_tfidf"])
    assert readers.feature_encoder(info, ["q_tfidf"])[0].keys() == {"q_tfidf", "q_tfidf_weights"}
