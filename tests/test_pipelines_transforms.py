"""bucketize, timestamp and cross through the real job, read back with
TensorFlow, checked against values computed independently (numpy quantiles,
datetime, TensorFlow's to_hash_bucket_fast)."""

from __future__ import annotations

import datetime as dt
import json

import fastavro
import numpy as np
import pytest

from convert.config import ConfigError, parse_config
from pipelines.job import run_convert
from pipelines.options import ConvertOptions

pytestmark = pytest.mark.slow

SCHEMA = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    {"name": "price", "type": ["null", "double"]},
    {"name": "country", "type": "string"},
    {"name": "device", "type": {"type": "record", "name": "D", "fields": [{"name": "os", "type": "string"}]}},
    {"name": "y", "type": "int"},
]}

CONFIG = """
label: y
features:
  - {name: id, transform: identity}
  - {name: ts, transform: timestamp, unit: ms, parts: [hour, day_of_week, month], missing_indicator: true}
  - {name: price_bucket, source: price, transform: bucketize, num_buckets: 5}
  - {name: country_x_os, transform: cross, sources: [country, device.os], buckets: 97}
"""


def _records(n: int = 400) -> list[dict]:
    rng = np.random.default_rng(5)
    out = []
    for i in range(n):
        out.append({
            "id": i,
            # some far outside datetime's range (year 10000+), some before 1970, some null
            "ts": None if i % 17 == 0 else int(rng.integers(-10**12, 3 * 10**14)) if i % 5 else int(rng.integers(1.6e12, 1.8e12)),
            "price": None if i % 13 == 0 else float(np.round(rng.lognormal(3, 1), 2)),
            "country": str(rng.choice(["US", "FR", "", "JP"])),
            "device": {"os": str(rng.choice(["ios", "android"]))},
            "y": i % 2,
        })
    return out


def _read(out: str, split: str) -> dict[int, dict[str, np.ndarray]]:
    import readers

    rows = {}
    for batch, _label in readers.eval_dataset(f"{out}/{split}-*", batch_size=50).as_numpy_iterator():
        for i in range(len(batch["id"])):
            rows[int(batch["id"][i][0])] = {k: v[i] for k, v in batch.items()}
    return rows


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("tx")
    recs = _records()
    with open(root / "e.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, recs, codec="deflate", sync_interval=2000)
    (root / "features.yaml").write_text(CONFIG)
    out = root / "out"
    res = run_convert(ConvertOptions(inputs=(str(root / "e.avro"),), config=str(root / "features.yaml"),
                                     output=str(out), num_shards=2))
    return recs, root, str(out), res


def test_timestamps_are_seconds_scaled_by_the_training_split_and_exact_utc_parts(converted):
    """The base value: (epoch seconds - their training mean) / their training std, float32; missing 0.0."""
    recs, _, out, _ = converted
    train = _read(out, "train")
    rows = {**train, **_read(out, "eval")}
    assert len(rows) == len(recs)
    info = json.loads(open(f"{out}/dataset_info.json").read())
    stats = next(f for f in info["features"] if f["name"] == "ts")["params"]["stats"]
    train_secs = np.array([r["ts"] // 1000 for r in recs if r["id"] in train and r["ts"] is not None], dtype=np.float64)
    assert stats["count"] == train_secs.size
    assert stats["mean"] == pytest.approx(train_secs.mean(), rel=1e-12)
    assert stats["std"] == pytest.approx(train_secs.std(), rel=1e-9)
    for r in recs:
        got = rows[r["id"]]
        if r["ts"] is None:
            assert got["ts_missing"][0] == 1 and got["ts"][0] == 0 and got["ts_hour"][0] == 0
            continue
        secs = r["ts"] // 1000
        assert got["ts"][0] == np.float32((secs - stats["mean"]) / stats["std"]) and got["ts_missing"][0] == 0
        days, rem = divmod(secs, 86400)
        assert got["ts_hour"][0] == rem // 3600
        assert got["ts_day_of_week"][0] == (days + 3) % 7
        if -62_135_596_800 <= secs <= 253_402_300_799:  # where datetime can check the month
            assert got["ts_month"][0] == (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=secs)).month


def test_bucketize_uses_training_quantiles_only(converted):
    recs, _, out, res = converted
    info = json.loads(open(f"{out}/dataset_info.json").read())
    spec = next(f for f in info["features"] if f["name"] == "price_bucket")
    train = _read(out, "train")
    train_prices = np.array([r["price"] for r in recs if r["id"] in train and r["price"] is not None])
    expected = sorted(set(np.quantile(train_prices, [0.2, 0.4, 0.6, 0.8], method="inverted_cdf").tolist()))
    assert spec["params"]["boundaries"] == expected
    assert spec["dtype"] == "int64" and spec["params"]["vocab_size"] == len(expected) + 2
    rows = {**train, **_read(out, "eval")}
    for r in recs:
        want = 0 if r["price"] is None else 1 + int(np.searchsorted(expected, r["price"], side="right"))
        assert rows[r["id"]]["price_bucket"][0] == want


def test_cross_ids_are_stable_hashes_of_the_joined_terms(converted):
    recs, _, out, _ = converted
    rows = {**_read(out, "train"), **_read(out, "eval")}
    import tensorflow as tf

    keys = [f"{r['country']}\x1f{r['device']['os']}" for r in recs]
    want = tf.strings.to_hash_bucket_fast(keys, 97).numpy() + 1
    for r, w in zip(recs, want.tolist(), strict=True):
        assert rows[r["id"]]["country_x_os"][0] == w


def test_analysis_from_reuses_boundaries(converted, tmp_path):
    recs, root, out, _ = converted
    with open(tmp_path / "shifted.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, [{**r, "price": None if r["price"] is None else r["price"] * 10} for r in recs])
    res = run_convert(ConvertOptions(inputs=(str(tmp_path / "shifted.avro"),), config=str(root / "features.yaml"),
                                     output=str(tmp_path / "o2"), num_shards=1, analysis_from=out))
    a = json.loads(open(f"{out}/analysis.json").read())
    b = json.loads(open(tmp_path / "o2" / "analysis.json").read())
    assert a["stats"]["price_bucket"]["boundaries"] == b["stats"]["price_bucket"]["boundaries"]
    assert res.info["counts"]["read"] == len(recs)


@pytest.mark.parametrize("feature, message", [
    ({"name": "t", "transform": "timestamp", "unit": "minutes"}, "'unit' must be one of"),
    ({"name": "t", "transform": "timestamp", "parts": ["week"]}, "'parts' must be a list"),
    ({"name": "b", "transform": "bucketize", "num_buckets": 1}, "'num_buckets' must be an integer >= 2"),
    ({"name": "b", "transform": "bucketize", "fill": 3}, "does not take 'fill'"),
    ({"name": "c", "transform": "cross", "sources": ["a"], "buckets": 9}, "two or more"),
    ({"name": "c", "transform": "cross", "sources": ["a", "b"]}, "needs 'buckets"),
    ({"name": "z", "transform": "zscore", "unit": "ms"}, "'unit' applies to transforms timestamp / cyclical"),
])
def test_config_errors_name_the_feature_and_the_fix(feature, message):
    with pytest.raises(ConfigError, match=message) as e:
        parse_config({"features": [feature]})
    assert repr(feature["name"]) in str(e.value)


def test_a_pending_unit_that_fails_to_close_leaves_no_writer_thread_of_the_next_unit(tmp_path, monkeypatch):
    # The next unit is encoded (its gzip writer threads started) before the
    # pending one is closed; when that close fails, both units' threads stop.
    import threading

    from _pipelines_data import make_records, write_dataset

    from convert.analysis import Analyzer
    from convert.config import load_config
    from pipelines import analyze, convert_pass, tempfile_format
    from pipelines.plan import ByteRange, WorkUnit

    paths = write_dataset(tmp_path / "d", make_records(120))
    config = load_config(str(paths["config"]))
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.avro"))
    (tmp_path / "o" / ".recordprep-tmp").mkdir(parents=True)
    opts = ConvertOptions(inputs=tuple(files), config=str(paths["config"]), output=str(tmp_path / "o"), order="input")
    assert opts.compression_type == "GZIP"
    a = Analyzer(config)
    a.add_records(make_records(120))
    analysis = analyze.AnalysisValue(a.result().to_json())
    fn = convert_pass._ConvertUnit(config, opts, 3)
    fn.start_bundle()
    assert list(fn.process(WorkUnit(0, (ByteRange(files[0], 0, None),)), analysis)) == []

    def disk_full(self):
        raise OSError("disk full")

    monkeypatch.setattr(tempfile_format.ShardWriter, "close", disk_full)
    try:
        with pytest.raises(OSError, match="disk full"):
            list(fn.process(WorkUnit(1, (ByteRange(files[1], 0, None),)), analysis))
        assert fn._pending is None
        assert not [t.name for t in threading.enumerate() if t.name.startswith("recordprep-writer")]
    finally:
        fn.teardown()  # before the fix the next unit's threads outlived the test: stop them
