"""The serving twins of the keyed analyzers (issue 47) give the converter's bits:
``cyclical``'s slots and table lookups, ``zscore_per_key``'s lookup and scaling, on
random and edge inputs (negative epochs, leap years, unseen and missing keys, subnormals)."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from convert.transforms import cyclical as cyc  # noqa: E402
from convert.transforms import zscore_per_key as zk  # noqa: E402
from readers.transforms import cyclical as tcyc  # noqa: E402
from readers.transforms import zscore_per_key as tzk  # noqa: E402


def _secs(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    edges = np.array([0, -1, 86_399, 86_400, -86_401, 951_782_400, 951_868_799, 4_107_542_400, 1_735_603_200,
                      -62_135_596_800, 253_402_300_799, -(2**62), 2**62, 2**63 - 1, -(2**63)], dtype=np.int64)
    return np.concatenate([edges, rng.integers(-(2**40), 2**40, 5000), rng.integers(-(2**63), 2**63 - 1, 2000)])


@pytest.mark.parametrize("part", list(cyc.PARTS))
def test_cyclical_slots_match(part: str) -> None:
    secs = _secs(1)
    want = cyc.part_slots(secs, part)
    got = tcyc.part_slots(tf.constant(secs), part).numpy()
    np.testing.assert_array_equal(got, want)


def test_cyclical_columns_are_bit_identical() -> None:
    secs = _secs(2)
    present = np.random.default_rng(3).random(secs.size) > 0.1
    parts = list(cyc.PARTS)
    want = cyc.cyclical_columns("ts", secs, present, parts)
    got = tcyc.cyclical_columns("ts", tf.constant(secs), tf.constant(present), parts)
    assert list(got) == list(want)
    for name, (dtype, col) in want.items():
        g = got[name].numpy()
        assert dtype == "float32" and g.dtype == np.float32 and g.shape == col.shape
        np.testing.assert_array_equal(g.view(np.uint32), col.view(np.uint32), err_msg=name)


def _per_key(rng: np.random.Generator, keys: list[str]) -> dict:
    acc = zk.KeyedMoments()
    n = 3000
    ks = [keys[i] for i in rng.integers(0, len(keys), n)]
    x = np.concatenate([rng.lognormal(3, 2, n - 5), [5e-324, -1e-310, 3e38, -0.0, 7.0]])
    acc.add(ks, x, np.ones(n, bool))
    acc.add(["solo"], np.array([3.0]), np.ones(1, bool))  # std 0
    return acc.finish()


@pytest.mark.parametrize("fill", ["mean", 2.5, 0.0])
def test_zscore_per_key_is_bit_identical(fill) -> None:
    rng = np.random.default_rng(4)
    keys = ["US", "DE", "FR", "", "naïve", "日本"]
    table = zk.KeyTable.of(_per_key(rng, keys), {"mean": 42.5, "std": 3.25})
    n = 4000
    terms = [None if rng.random() < 0.05 else (keys + ["unseen", "solo"])[i] for i in rng.integers(0, len(keys) + 2, n)]
    x = np.concatenate([rng.lognormal(3, 2, n - 6), [5e-324, -2e-310, 1e308, -1e308, -0.0, 0.0]])
    rng.shuffle(x)
    present = rng.random(n) > 0.1
    rows = table.lookup(terms)
    want = zk.scale_per_key(x, present, rows, table, fill)

    lookup = tzk.KeyLookup(table)
    t_terms = tf.constant([(t or "").encode() for t in terms])
    t_rows = lookup.rows(t_terms, tf.constant([t is not None for t in terms]))
    np.testing.assert_array_equal(t_rows.numpy(), rows)
    got = tzk.scale_per_key(tf.constant(x), tf.constant(present), t_rows, lookup, fill).numpy()
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_zscore_per_key_without_keys_uses_the_global_row() -> None:
    table = zk.KeyTable.of({}, {"mean": 1.0, "std": 2.0})
    lookup = tzk.KeyLookup(table)
    rows = lookup.rows(tf.constant([b"a", b"b"]), tf.constant([True, False]))
    assert rows.numpy().tolist() == [0, 0]
    out = tzk.scale_per_key(tf.constant([3.0, 5.0], tf.float64), tf.constant([True, True]), rows, lookup, "mean")
    assert out.numpy()[:, 0].tolist() == [1.0, 2.0]


# ------------------------------------------------------------------ converted outputs: parity, encoder

KEYED_CONFIG = """
label: {source: clicked, dtype: int64}
features:
  - {name: country, transform: label_vocabulary, top_k: 8}
  - {name: device, transform: label_vocabulary, mutual_information: plain, num_oov_buckets: 2}
  - {name: age, transform: zscore_per_key, key: country, missing_indicator: true}
  - {name: income, transform: zscore_per_key, key: user.segment, fill: 0}
  - {name: age_by_tag, source: age, transform: zscore_per_key, key: 'tags[0]'}
  - {name: ts, transform: cyclical, parts: [hour, day_of_week, day_of_month, day_of_year, month], missing_indicator: true}
"""


@pytest.mark.parametrize("name", ["clicks-0.avro", "clicks-1.jsonl"])
def test_parity_on_examples_data(name, tmp_path):
    """The bundled click data through the converter and the serving layer: the shards' bytes."""
    from test_readers_serving import EXAMPLES, _convert_and_check

    cfg = tmp_path / "features.yaml"
    cfg.write_text(KEYED_CONFIG)
    _convert_and_check(EXAMPLES / name, cfg, tmp_path, [])


def test_the_encoder_takes_each_keyed_feature(tmp_path):
    """Each keyed analyzer's features have an encoding the Keras encoder consumes: ids embedded, floats as they are."""
    from test_readers_serving import EXAMPLES

    import readers
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    cfg = tmp_path / "features.yaml"
    cfg.write_text(KEYED_CONFIG)
    run_convert(ConvertOptions(inputs=(str(EXAMPLES / "clicks-0.avro"),), config=str(cfg), output=str(tmp_path / "out"),
                               num_shards=1))
    info = readers.load_info(str(tmp_path / "out"))
    enc = {f.name: f.encoding for f in info.features}
    assert enc["country"] == enc["device"] == "embedding"
    assert enc["age"] == enc["income"] == "scaled" and enc["age_missing"] == "indicator"
    assert all(enc[n] == "scaled" for n in cyc.output_names("ts", list(cyc.PARTS)))
    inputs, encoded = readers.feature_encoder(info)
    assert set(inputs) == set(enc) - {"clicked"}
    batch = next(iter(readers.eval_dataset(str(tmp_path / "out" / "train-*"), batch_size=16)))
    out = tf.keras.Model(inputs, encoded)({k: v for k, v in batch[0].items() if k in inputs})
    assert out.shape[0] == 16 and np.isfinite(out.numpy()).all()
