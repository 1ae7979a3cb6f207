"""Ray Data rows, run inside the peer virtualenv (``bench/.peers/ray-venv``).

Started by :mod:`bench.ray_data` through :func:`bench.measure.run_child` with
the peer's interpreter; imports Ray, its own pyarrow and TensorFlow, and
nothing of recordprep. Ray starts in this process with ``num_cpus`` = the
cores recordprep uses, no dashboard, a small object store
(``--object-store-mb``), and is shut down (every process it started killed)
before the result is written; the parent samples the whole process tree.

``convert``
    The job a Ray user writes for the bench workload, Parquet in, TFRecords out:
    ``read_parquet`` -> ``map_batches`` (recordprep's split rule, nested fields
    flattened, missing indicators) -> ``materialize`` (every fit below is a pass
    over the data) -> ``filter`` per split -> a ``Chain`` of Ray's preprocessors
    fitted on the train split: ``OrdinalEncoder`` (``encode_lists``) for
    vocabularies, ``Tokenizer`` (recordprep's tokens) + ``OrdinalEncoder`` for
    text, ``StandardScaler`` for z-score, ``MinMaxScaler`` -> ``map_batches`` for what
    Ray has no preprocessor for (null fill, log1p, clip, per-value hashing with
    FarmHash ``Fingerprint64``, ids shifted to recordprep's layout, padding to
    ``max_len`` with ``<name>_len``) -> ``write_tfrecords`` (gzip) per split.
    The work phase includes ``ray.init`` (``init_s`` says how much of it).
    Ray's ``OrdinalEncoder`` has no ``top_k``/``min_frequency`` and numbers terms
    in sorted order; ``CountVectorizer`` has ``max_features`` but writes a count
    per vocabulary term (20,000 numbers per record for ``query``), not token ids,
    and ``FeatureHasher``/``HashingVectorizer`` hash column names or write a count
    vector of ``num_features`` entries, not one bucket id per value.
``feed``
    ``read_parquet(...).iter_tf_batches`` (batches of ``--batch``, the rows of
    both splits: the Parquet files hold no split) into a ``tf.data`` pipeline
    that applies Keras preprocessing layers adapted on the train split
    (:mod:`bench.keras_prep`), then ``model.fit`` of
    :func:`bench.peer_common.trivial_model` (:func:`bench.peer_common.fit_rate`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

from bench.measure import child_main
from bench.peer_common import flat_columns, load_plan, split_indexes, tokens

NUMERIC = ("identity", "zscore", "minmax", "log1p", "clip")


class TreeTimer:
    """Wall and CPU seconds of a block for this process and every process it started
    (Ray's raylet, GCS and workers live outside this process; they count)."""

    @staticmethod
    def _cpu() -> float:
        import psutil

        me = psutil.Process()
        total = 0.0
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def __enter__(self) -> TreeTimer:
        self.cpu0, self.t0 = self._cpu(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_s = self._cpu() - self.cpu0

    def to_json(self) -> dict[str, float]:
        return {"work_wall_s": round(self.wall_s, 4), "work_cpu_s": round(self.cpu_s, 4)}


def start_ray(cpus: int, object_store_mb: int) -> float:
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, object_store_memory=object_store_mb * 2**20,
             log_to_driver=False, configure_logging=False, _temp_dir=os.environ.get("RAY_TMPDIR") or None)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # Ray's own encoders find list columns by object dtype; with Arrow-backed pandas columns
    # (Ray's default) OrdinalEncoder(encode_lists=True) fails on list<string>.
    ctx.enable_arrow_backed_pandas_conversion = False
    return time.perf_counter() - t0


def stop_ray() -> None:
    """``ray.shutdown()``, then kill whatever of its process tree is still alive."""
    import psutil
    import ray

    ray.shutdown()
    for p in psutil.Process().children(recursive=True):
        try:
            p.kill()
        except psutil.Error:
            pass


# ------------------------------------------------------------------ convert


def _prepare(feats: list[dict[str, Any]], label: dict[str, Any]):
    """pyarrow batch -> pyarrow table of the feature sources (nested ones flattened), ``__split``,
    ``<name>_missing``, and ``__null_<name>`` for scalar vocabularies, whose nulls (recordprep's id 0)
    become a placeholder term: Ray's encoder has no notion of a missing value."""

    def prepare(batch: Any) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        cols = flat_columns(batch, feats, label)
        out = {"__split": pa.array(split_indexes(batch.to_pylist()), pa.int64())}
        for f in feats:
            name, col = f["name"], cols[f["name"]]
            if f["transform"] in NUMERIC and not f.get("max_len"):
                if pa.types.is_timestamp(col.type):  # its epoch milliseconds, as recordprep reads it
                    col = col.cast(pa.int64())
                out[name] = col.cast(pa.float64())
                if f.get("missing_indicator"):
                    out[name + "_missing"] = pc.is_null(col).cast(pa.int64())
            elif f["transform"] == "vocabulary" and not f.get("max_len"):
                if pa.types.is_boolean(col.type):  # recordprep's terms of a boolean
                    col = pc.if_else(col, "true", "false")
                col = col.cast(pa.string())
                out["__null_" + name] = pc.is_null(col)
                out[name] = pc.fill_null(col, "\x00null")
            elif f["transform"] == "vocabulary":  # a list of terms
                out[name] = col.cast(pa.list_(pa.string()))
            else:
                out[name] = col
        out[label["name"]] = cols[label["name"]].cast(pa.int64())
        return pa.table(out)

    return prepare


def _finish(feats: list[dict[str, Any]], label: dict[str, Any]):
    """pandas frame after Ray's preprocessors -> the columns recordprep writes, its dtypes and shapes
    (scalars as plain columns and lists as Python lists: ``write_tfrecords`` converts Ray's tensor
    columns value by value, far slower)."""

    def pad(seqs: Any, max_len: int, dtype: str, shift: int) -> tuple[Any, Any]:
        import numpy as np

        out = np.zeros((len(seqs), max_len), dtype=dtype)
        lens = np.zeros(len(seqs), dtype="int64")
        for i, s in enumerate(seqs):
            if s is None or (not hasattr(s, "__len__")):
                continue
            vals = [(1 if v is None or v != v else int(v) + shift) if shift else v for v in list(s)[:max_len]]
            out[i, :len(vals)] = vals
            lens[i] = len(vals)
        return out, lens

    def finish(df: Any) -> Any:
        import numpy as np
        import pandas as pd
        from farmhash import Fingerprint64

        out: dict[str, Any] = {}
        for f in feats:
            name, t, col = f["name"], f["transform"], df[f["name"]]
            if t in NUMERIC and not f.get("max_len"):
                x = col.to_numpy(dtype="float64", na_value=np.nan)
                if t == "log1p":
                    x = np.log1p(x)
                elif t == "clip":
                    x = np.clip(x, f["clip_min"], f["clip_max"])
                # z-score and min-max: Ray's scalers did it; a null is the mean (0 after z-score).
                fill = 0.0 if t in ("zscore", "log1p", "clip", "identity") else np.nanmean(x)
                out[name] = np.nan_to_num(x, nan=fill).astype("float32")
                if f.get("missing_indicator"):
                    out[name + "_missing"] = df[name + "_missing"].to_numpy("int64")
            elif t == "hash":
                ids = np.array([0 if v is None else 1 + Fingerprint64(str(v)) % f["buckets"] for v in col],
                               dtype="int64")
                out[name] = ids
            elif f.get("max_len"):  # lists and text: ids shifted (vocabulary) or values, padded
                dtype = "float32" if t in NUMERIC else "int64"
                vals, lens = pad(col.tolist(), f["max_len"], dtype, 0 if t in NUMERIC else 2)
                out[name], out[name + "_len"] = vals.tolist(), lens  # lists: Ray's fast path
            else:  # scalar vocabulary: 0 missing, 1 out of vocabulary (Ray: NaN), 2.. Ray's ids
                src = df["__null_" + name].to_numpy() if "__null_" + name in df else np.zeros(len(df), bool)
                x = col.to_numpy(dtype="float64", na_value=np.nan)
                ids = np.where(np.isnan(x), 1, np.nan_to_num(x) + 2).astype("int64")
                out[name] = np.where(src, 0, ids)
        out[label["name"]] = df[label["name"]].to_numpy("int64")
        return pd.DataFrame(out)

    return finish


def _convert(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.data.preprocessors import (
        Chain,
        MinMaxScaler,
        OrdinalEncoder,
        StandardScaler,
        Tokenizer,
    )

    feats, label = load_plan(args.config)
    by = lambda *ts: [f["name"] for f in feats if f["transform"] in ts]  # noqa: E731
    shutil.rmtree(args.output, ignore_errors=True)
    with TreeTimer() as t:
        init_s = start_ray(args.cpus, args.object_store_mb)
        ds = (ray.data.read_parquet(args.inputs)
              .map_batches(_prepare(feats, label), batch_format="pyarrow")
              .materialize())
        splits = {name: ds.filter(lambda r, i=i: r["__split"] == i) for i, name in enumerate(("train", "eval"))}
        # The encoders first: after a pandas transform, Ray hands a list column of strings on
        # as opaque Python objects, which OrdinalEncoder cannot count.
        chain = Chain(OrdinalEncoder(by("vocabulary"), encode_lists=True),
                      Tokenizer(by("text"), tokenization_fn=tokens),
                      OrdinalEncoder(by("text"), encode_lists=True),
                      StandardScaler(by("zscore")),
                      MinMaxScaler(by("minmax")))
        chain.fit(splits["train"])
        for name, part in splits.items():
            out = (chain.transform(part).map_batches(_finish(feats, label), batch_format="pandas"))
            out.write_tfrecords(os.path.join(args.output, name), arrow_open_stream_args={"compression": "gzip"})
        records = ds.count()
    stop_ray()  # after the timer: the CPU of Ray's processes is read while they live
    written = {name: _count_records(os.path.join(args.output, name)) for name in ("train", "eval")}
    files = [os.path.join(d, f) for d, _, fs in os.walk(args.output) for f in fs]
    return {**t.to_json(), "init_s": round(init_s, 3), "records": records, "written": written,
            "files_written": len(files), "output_mb": round(sum(os.path.getsize(p) for p in files) / 1e6, 2)}


def _count_records(directory: str) -> int:
    """Records in the gzip TFRecord files of ``directory`` (read back by TensorFlow)."""
    import tensorflow as tf

    files = sorted(os.path.join(directory, f) for f in os.listdir(directory))
    return int(tf.data.TFRecordDataset(files, compression_type="GZIP").reduce(0, lambda n, _: n + 1))


# --------------------------------------------------------------------- feed


def _feed(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    import tensorflow as tf

    from bench import keras_prep
    from bench.peer_common import fit_rate

    feats, label = load_plan(args.config)
    t0 = time.perf_counter()
    prep = keras_prep.Prep(feats, label, args.inputs)
    adapt_s = time.perf_counter() - t0
    init_s = start_ray(args.cpus, args.object_store_mb)
    ds = ray.data.read_parquet(args.inputs).map_batches(
        lambda t: keras_prep.raw_columns(t, feats, label), batch_format="pyarrow")

    def batches():
        while True:  # epochs: read the Parquet files again each pass
            yield from ds.iter_tf_batches(batch_size=args.batch, drop_last=True)

    sig = keras_prep.raw_signature(feats, label)
    data = (tf.data.Dataset.from_generator(batches, output_signature=sig)
            .map(prep, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
    try:
        res = fit_rate(data, prep.feature_names, args.batch, args.seconds)
    except BaseException:
        stop_ray()
        raise
    return {**res, "adapt_s": round(adapt_s, 3), "init_s": round(init_s, 3)}


def _feed_and_exit(args: argparse.Namespace) -> None:
    """:func:`_feed`, its result written, then every process Ray started killed and this one ended
    at once: ``tf.data``'s generator thread may still be inside ``iter_tf_batches``, and Ray's core
    worker ends the process with exit code 1 when that thread touches it after ``ray.shutdown()``."""
    import json

    import psutil

    try:
        out, code = _feed(args), 0
    except Exception as e:  # reported to the parent, as child_main does
        import traceback

        traceback.print_exc()
        out, code = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}, 1
    with open(args.result, "w") as f:
        json.dump(out, f, default=str)
    for p in psutil.Process().children(recursive=True):
        try:
            p.kill()
        except psutil.Error:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _add_args(ap: argparse.ArgumentParser) -> None:
    from bench.peer_common import CONFIG

    ap.add_argument("--case", choices=("convert", "feed"), required=True)
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--output", default=None)
    ap.add_argument("--cpus", type=int, default=2, help="ray.init(num_cpus=...): the cores recordprep uses")
    ap.add_argument("--object-store-mb", type=int, default=256)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=10.0)


def main() -> None:
    if "feed" in sys.argv[1:]:
        ap = argparse.ArgumentParser(description="one Ray Data feeding measurement")
        _add_args(ap)
        ap.add_argument("--result", required=True)
        _feed_and_exit(ap.parse_args())
    child_main("one Ray Data measurement", _add_args, _convert)


if __name__ == "__main__":
    main()
