"""What the Ray Data and Petastorm workers share, run inside their own virtualenvs.

Imports nothing of recordprep (``convert``/``pipelines``/``readers`` are not
installed there), only numpy, pyarrow, orjson and PyYAML. It restates three of
recordprep's rules so the peers do the same job on the same records:

- the split: BLAKE2b of the record's canonical JSON (sorted keys, timestamps as
  their epoch milliseconds), train/eval 0.9/0.1 (as ``bench.naive.split_index``);
- text tokens: ASCII letters lower-cased, split on every ASCII character that is
  not a letter, digit or ``_`` (docs/feature-config.md, ``text``);
- the feature plan of ``bench/features.yaml``: each feature's transform, source
  and options, plus the label.

It also holds the feeding measurement (:func:`fit_rate`), so every feeding row
runs the same trivial Keras model and the same clock.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import re
import time
from pathlib import Path
from typing import Any

CONFIG = str(Path(__file__).resolve().parent / "features.yaml")
SPLITS = (("train", 0.9), ("eval", 0.1))
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_DELIMS = re.compile(r"[\x00-\x2f\x3a-\x40\x5b-\x5e\x60\x7b-\x7f]+")


def load_plan(config: str = CONFIG) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The config's features (each with ``source`` filled in) and its label."""
    import yaml

    cfg = yaml.safe_load(Path(config).read_text())
    feats = [dict(f, source=f.get("source", f["name"])) for f in cfg["features"]]
    label = dict(cfg["label"], name=cfg["label"].get("name", cfg["label"]["source"]))
    return feats, label


def tokens(text: str | None) -> list[str]:
    """recordprep's ``text`` tokens of one string (lower-cased ASCII, split on ASCII non-word characters)."""
    if not text:
        return []
    lowered = text.encode("utf-8", "surrogatepass").lower().decode("utf-8", "surrogatepass")
    return [t for t in _DELIMS.split(lowered) if t]


def _plain(v: Any) -> Any:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:  # Parquet's timestamp without a zone: UTC, as the Avro writer stored it
            v = v.replace(tzinfo=_dt.UTC)
        return (v - _EPOCH) // _dt.timedelta(milliseconds=1)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def split_indexes(rows: list[dict[str, Any]]) -> list[int]:
    """recordprep's split (0 = train, 1 = eval) of each record, as Python dicts of the source."""
    import orjson

    total = sum(w for _, w in SPLITS)
    bounds, acc = [], 0.0
    for _, w in SPLITS:
        acc += w / total
        bounds.append(acc)
    out = []
    for rec in rows:
        blob = orjson.dumps({k: _plain(v) for k, v in rec.items()},
                            option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
        h = (int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 11) / float(1 << 53)
        out.append(next((i for i, b in enumerate(bounds) if h < b), len(bounds) - 1))
    return out


def flat_columns(table: Any, feats: list[dict[str, Any]], label: dict[str, Any]) -> dict[str, Any]:
    """Each feature's (and the label's) source column of a pyarrow table, nested paths
    (``user.segment``) flattened, as Python/numpy-friendly pyarrow arrays keyed by feature name."""
    import pyarrow.compute as pc

    out = {}
    for f in [*feats, {"name": label["name"], "source": label["source"]}]:
        parts = f["source"].split(".")
        col = table.column(parts[0])
        for p in parts[1:]:
            col = pc.struct_field(col, p)
        out[f["name"]] = col
    return out


def train_table(files: list[str]) -> Any:
    """The training split of the Parquet files as one pyarrow table (what the layers adapt on)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    parts = []
    for path in files:
        t = pq.read_table(path)
        keep = np.array(split_indexes(t.to_pylist()), dtype=np.int64) == 0
        parts.append(t.filter(pa.array(keep)))
    return pa.concat_tables(parts)


# ----------------------------------------------------------------- feeding


def trivial_model(feature_names: list[str]) -> Any:
    """A model that costs next to nothing per example, so the input pipeline sets the pace:
    every feature cast to float32, summed per example, one Dense unit."""
    import keras
    import tensorflow as tf

    inputs = {n: keras.Input(shape=(None,), name=n, dtype="float32") for n in feature_names}

    class SumAll(keras.layers.Layer):
        def call(self, xs):
            return tf.add_n([tf.reduce_sum(tf.cast(x, tf.float32), axis=1, keepdims=True) for x in xs.values()])

    out = keras.layers.Dense(1)(SumAll()(inputs))
    model = keras.Model(inputs, out)
    model.compile(optimizer="sgd", loss="mse")
    return model


def fit_rate(ds: Any, feature_names: list[str], batch: int, seconds: float, steps: int = 20,
             warmup_steps: int = 5) -> dict[str, Any]:
    """Examples/s of ``model.fit`` on ``ds`` (repeated batches of ``(features, label)``).

    One fit of ``warmup_steps`` first (tracing, the pipeline's start); then
    epochs of ``steps`` batches until ``seconds`` have passed (at least 4);
    the rate is the median over those epochs but the first (each ``fit`` starts
    the input pipeline again). ``time_to_first_batch_s`` is the
    warm-up fit's wall time (building the iterator and the first batches)."""
    import statistics

    import keras

    model = trivial_model(feature_names)
    t0 = time.perf_counter()
    model.fit(ds, steps_per_epoch=warmup_steps, epochs=1, verbose=0)
    warm = time.perf_counter() - t0
    times: list[float] = []

    class Clock(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            times.append(time.perf_counter() - self.t)
            if sum(times) >= seconds and len(times) >= 4:
                self.model.stop_training = True

    model.fit(ds, steps_per_epoch=steps, epochs=10_000, verbose=0, callbacks=[Clock()])
    rates = [steps * batch / t for t in times[1:]]  # the first window restarts the input pipeline
    return {"examples_per_s": statistics.median(rates), "windows": len(times), "batch": batch,
            "steps_per_window": steps, "warmup_s": round(warm, 3), "measured_s": round(sum(times), 3)}
