"""TF Transform rows, run inside the peer virtualenv (``bench/.peers/tft-venv``).

Started by :mod:`bench.tft` through :func:`bench.measure.run_child` with the
peer's interpreter; it imports TensorFlow Transform, its own TensorFlow and
Beam, and nothing of recordprep (``convert``/``pipelines``/``readers`` are
not installed there). Two cases:

``convert``
    The job a TFX user writes for the bench workload: ``ReadFromAvro`` ->
    per-record instance dict -> ``Partition`` by recordprep's split rule
    (BLAKE2b of the record's canonical JSON, train/eval 0.9/0.1) ->
    ``AnalyzeAndTransformDataset`` on the train split, ``TransformDataset``
    on eval -> ``tf.train.Example`` (tfx_bsl's C++ RecordBatch encoder) ->
    ``WriteToTFRecord`` (gzip, the shard counts recordprep wrote), and
    ``WriteTransformFn`` (what the layer rows load). FnApiRunner, with the
    worker processes recordprep chose for the same input.
``layer``
    ``TFTransformOutput(transform_fn).transform_features_layer()`` inside a
    ``tf.function``: batches of 1,024 parsed raw records (records/s from the
    median batch time) and one record (median latency).

The preprocessing_fn is built from ``bench/features.yaml`` with TF
Transform's own analyzers: zscore -> ``scale_to_z_score``, minmax ->
``scale_to_0_1``, vocabulary/text -> ``compute_and_apply_vocabulary``
(``top_k``, ``frequency_threshold``; ids shifted to recordprep's layout,
0 = missing/padding, 1 = out of vocabulary), hash -> ``hash_strings``
(1..buckets, 0 = missing), text -> lower-case, ``\\W+`` split, lists padded
or truncated to ``max_len`` with ``<name>_len``; nulls as in recordprep
(z-score fill = the mean, i.e. 0; other fills 0; ``<name>_missing``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import WorkTimer, child_main

NUMERIC = ("identity", "zscore", "minmax", "log1p", "clip")
SPLITS = (("train", 0.9), ("eval", 0.1))
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


# ------------------------------------------------------------- raw records


def _avro_kind(schema_type: Any) -> tuple[str, bool]:
    """(base kind, nullable) of an Avro field type: kind in string/long/double/bool/list-*."""
    nullable = False
    if isinstance(schema_type, list):
        nullable = "null" in schema_type
        schema_type = next(t for t in schema_type if t != "null")
    if isinstance(schema_type, dict):
        if schema_type.get("type") == "array":
            return "list-" + _avro_kind(schema_type["items"])[0], nullable
        if schema_type.get("type") == "enum":
            return "string", nullable
        schema_type = schema_type.get("type")
    return {"int": "long", "long": "long", "float": "double", "double": "double", "boolean": "bool",
            "string": "string", "bytes": "string"}[schema_type], nullable


def _field_types(schema: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for f in schema["fields"]:
        t = f["type"]
        if isinstance(t, dict) and t.get("type") == "record":
            out.update(_field_types(t, prefix + f["name"] + "."))
        else:
            out[prefix + f["name"]] = t
    return out


def load_features(config: str, avro_file: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Features of the bench config (+ the label as ``__label``) with their raw kind from the Avro schema."""
    import fastavro
    import yaml

    cfg = yaml.safe_load(Path(config).read_text())
    with open(avro_file, "rb") as f:
        types = _field_types(fastavro.reader(f).writer_schema)
    feats = [dict(f, source=f.get("source", f["name"])) for f in cfg["features"]]
    feats.append({"name": cfg["label"].get("name", "label"), "source": cfg["label"]["source"],
                  "transform": "label"})
    for f in feats:
        f["kind"], f["nullable"] = _avro_kind(types[f["source"]])
    return feats, cfg


def raw_feature_spec(feats: list[dict[str, Any]]) -> dict[str, Any]:
    import tensorflow as tf

    spec = {}
    for f in feats:
        kind = f["kind"].removeprefix("list-")
        dtype = {"string": tf.string, "double": tf.float32, "long": tf.int64, "bool": tf.int64}[kind]
        if f["kind"].startswith("list-") or f["nullable"]:
            spec[f["name"]] = tf.io.VarLenFeature(dtype)
        else:
            spec[f["name"]] = tf.io.FixedLenFeature([], dtype)
    return spec


def _get(rec: Any, path: str) -> Any:
    for k in path.split("."):
        rec = rec.get(k) if isinstance(rec, dict) else None
    return rec


def _plain(v: Any) -> Any:
    if isinstance(v, _dt.datetime):
        return (v - _EPOCH) // _dt.timedelta(milliseconds=1)
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def make_instance(feats: list[dict[str, Any]]):
    """Avro record (as ReadFromAvro yields it) -> (split index, TF Transform instance dict)."""
    import orjson

    total = sum(w for _, w in SPLITS)
    bounds = []
    acc = 0.0
    for _, w in SPLITS:
        acc += w / total
        bounds.append(acc)
    plan = [(f["name"], f["source"], f["kind"], f["nullable"] or f["kind"].startswith("list-")) for f in feats]

    def to_instance(rec: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        row = {k: _plain(v) for k, v in rec.items()}
        blob = orjson.dumps(row, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS, default=str)
        h = (int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "little") >> 11) / float(1 << 53)
        split = next((i for i, b in enumerate(bounds) if h < b), len(bounds) - 1)
        inst = {}
        for name, source, kind, varlen in plan:
            v = _get(row, source)
            if kind == "bool" or kind == "list-bool":
                v = None if v is None else [int(x) for x in v] if isinstance(v, list) else int(v)
            if varlen:
                v = [] if v is None else v if isinstance(v, list) else [v]
            inst[name] = v
        return split, inst

    return to_instance


# -------------------------------------------------------- preprocessing_fn


def make_preprocessing_fn(feats: list[dict[str, Any]]):
    import tensorflow as tf
    import tensorflow_transform as tft

    def dense(x, default):
        if isinstance(x, tf.SparseTensor):
            return tf.squeeze(tft.sparse_tensor_to_dense_with_shape(x, [None, 1], default_value=default), 1)
        return x

    def present(x):  # 1 where a row of a nullable scalar holds a value
        rows = tf.cast(x.indices[:, 0], tf.int32)
        return tf.minimum(tf.math.bincount(rows, minlength=tf.cast(x.dense_shape[0], tf.int32), dtype=tf.int64), 1)

    def pad(ragged, max_len, default):
        return ragged.to_tensor(default_value=default, shape=[None, max_len])

    def fn(inputs: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for f in feats:
            name, t, x = f["name"], f["transform"], inputs[f["name"]]
            is_list = f["kind"].startswith("list-")
            if t == "label":
                out[name] = x
            elif t in NUMERIC and is_list:
                r = tf.RaggedTensor.from_sparse(x)
                out[name] = pad(tf.cast(r, tf.float32), f["max_len"], 0.0)
                out[name + "_len"] = tf.minimum(r.row_lengths(), f["max_len"])
            elif t in NUMERIC:
                v = tf.cast(x, tf.float32) if not isinstance(x, tf.SparseTensor) else tf.SparseTensor(
                    x.indices, tf.cast(x.values, tf.float32), x.dense_shape)
                if t == "zscore":
                    y = dense(tft.scale_to_z_score(v), 0.0)  # null -> the mean -> 0
                elif t == "minmax":
                    y = dense(tft.scale_to_0_1(v), 0.0)
                elif t == "log1p":
                    y = tf.math.log1p(dense(v, 0.0))
                elif t == "clip":
                    y = tf.clip_by_value(dense(v, 0.0), f.get("clip_min", -3e38), f.get("clip_max", 3e38))
                else:
                    y = dense(v, 0.0)
                out[name] = y
                if f.get("missing_indicator"):
                    out[name + "_missing"] = 1 - present(x) if isinstance(x, tf.SparseTensor) else tf.zeros_like(
                        y, tf.int64)
            elif t == "hash":
                s = x if x.dtype == tf.string else tf.strings.as_string(x.values if isinstance(x, tf.SparseTensor) else x)
                if isinstance(x, tf.SparseTensor):
                    h = tf.SparseTensor(x.indices, tft.hash_strings(s, f["buckets"]) + 1, x.dense_shape)
                    out[name] = dense(h, tf.constant(0, tf.int64))
                else:
                    out[name] = tft.hash_strings(s, f["buckets"]) + 1
            elif t in ("vocabulary", "text"):
                if t == "text":
                    s = dense(x, "")
                    if f.get("lowercase", True):
                        s = tf.strings.lower(s)
                    terms = tf.strings.split(tf.strings.regex_replace(s, r"\W+", " "))
                elif is_list or isinstance(x, tf.SparseTensor):
                    terms = tf.RaggedTensor.from_sparse(x)
                else:
                    terms = tf.expand_dims(x, 1)
                if terms.dtype != tf.string:
                    terms = tf.strings.as_string(terms)
                ids = tft.compute_and_apply_vocabulary(
                    terms, top_k=f.get("top_k"), frequency_threshold=f.get("min_frequency", 0) or None,
                    num_oov_buckets=0, default_value=-1, vocab_filename=name) + 2  # 0 missing, 1 OOV
                if t == "text" or is_list:
                    out[name] = pad(ids, f["max_len"], tf.constant(0, tf.int64))
                    out[name + "_len"] = tf.minimum(ids.row_lengths(), f["max_len"])
                elif isinstance(ids, tf.RaggedTensor):
                    out[name] = tf.squeeze(pad(ids, 1, tf.constant(0, tf.int64)), 1)
                else:
                    out[name] = tf.squeeze(ids, 1)
            else:
                raise ValueError(f"feature {name!r}: transform {t!r} has no TF Transform equivalent in this bench")
        return out

    return fn


# ------------------------------------------------------------------ cases


def _convert(args: argparse.Namespace, make_fn=None) -> dict[str, Any]:
    """The ``convert`` case; ``make_fn(feats)``: another preprocessing_fn than the config's (``make_preprocessing_fn``)."""
    import apache_beam as beam
    import tensorflow_transform.beam as tft_beam
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from tensorflow_transform.tf_metadata import dataset_metadata, schema_utils
    from tfx_bsl.coders.example_coder import RecordBatchToExamplesEncoder

    feats, _ = load_features(args.config, args.inputs[0])
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(raw_feature_spec(feats)))
    out = Path(args.output)
    if out.exists():
        import shutil

        shutil.rmtree(out)
    out.mkdir(parents=True)
    shards = dict(zip(("train", "eval"), args.shards, strict=True))
    flags = ["--direct_num_workers", str(args.workers), "--direct_running_mode", "multi_processing"] \
        if args.workers > 1 else []
    to_instance = make_instance(feats)
    preprocessing_fn = (make_fn or make_preprocessing_fn)(feats)

    def encode(batch):
        rb, _ = batch
        return RecordBatchToExamplesEncoder().encode(rb)

    with WorkTimer() as t:
        with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(flags)) as p, \
                tft_beam.Context(temp_dir=str(out / "tmp")):
            rows = (p | "Files" >> beam.Create(args.inputs) | "Read" >> beam.io.ReadAllFromAvro()
                    | "Instance" >> beam.Map(to_instance))
            parts = rows | "Split" >> beam.Partition(lambda kv, n: kv[0], len(SPLITS))
            train = parts[0] | "TrainValues" >> beam.Map(lambda kv: kv[1])
            evals = parts[1] | "EvalValues" >> beam.Map(lambda kv: kv[1])
            (train_t, _), transform_fn = (train, metadata) | tft_beam.AnalyzeAndTransformDataset(
                preprocessing_fn, output_record_batches=True)
            eval_t, _ = ((evals, metadata), transform_fn) | tft_beam.TransformDataset(output_record_batches=True)
            _ = transform_fn | tft_beam.WriteTransformFn(str(out / "transform_fn"))
            for split, data in (("train", train_t), ("eval", eval_t)):
                _ = (data | f"Encode{split}" >> beam.FlatMap(encode)
                     | f"Write{split}" >> beam.io.WriteToTFRecord(
                         str(out / split), file_name_suffix=".tfrecord.gz", num_shards=shards[split],
                         compression_type=CompressionTypes.GZIP))
    written = {split: _count(sorted(str(p) for p in out.glob(f"{split}-*.tfrecord.gz"))) for split in shards}
    return {**t.to_json(), "records": sum(written.values()), "written": written,
            "shards": {s: len(list(out.glob(f"{s}-*.tfrecord.gz"))) for s in shards},
            "output_mb": round(sum(p.stat().st_size for p in out.glob("*.tfrecord.gz")) / 1e6, 2)}


def _count(files: list[str]) -> int:
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(files, compression_type="GZIP")
    return int(ds.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def raw_batches(feats: list[dict[str, Any]], avro_file: str, n: int) -> list[bytes]:
    """The first ``n`` records of ``avro_file`` as serialized raw tf.train.Examples (the layer's parse input)."""
    import fastavro
    from tensorflow_transform import coders
    from tensorflow_transform.tf_metadata import schema_utils

    coder = coders.ExampleProtoCoder(schema_utils.schema_from_feature_spec(raw_feature_spec(feats)))
    to_instance = make_instance(feats)
    out = []
    with open(avro_file, "rb") as f:
        for rec in fastavro.reader(f):
            out.append(coder.encode(to_instance(rec)[1]))
            if len(out) == n:
                break
    return out


def _layer(args: argparse.Namespace) -> dict[str, Any]:
    import tensorflow as tf
    import tensorflow_transform as tft

    feats, _ = load_features(args.config, args.inputs[0])
    spec = raw_feature_spec(feats)
    serialized = raw_batches(feats, args.inputs[0], args.batch * args.num_batches)
    batches = [tf.io.parse_example(serialized[i * args.batch:(i + 1) * args.batch], spec)
               for i in range(args.num_batches)]
    singles = [tf.io.parse_example(serialized[i:i + 1], spec) for i in range(args.singles)]
    layer = tft.TFTransformOutput(args.transform_dir).transform_features_layer()

    # One trace with the batch dimension None, as a serving signature has,
    # called as its concrete function (see measure_layer).
    signature = [{k: tf.SparseTensorSpec([None, None], v.dtype) if isinstance(v, tf.io.VarLenFeature)
                  else tf.TensorSpec([None], v.dtype) for k, v in spec.items()}]
    fn = tf.function(lambda x: layer(x), input_signature=signature).get_concrete_function()
    return measure_layer(fn, fn, batches, singles, args.seconds)


def measure_layer(batch_fn, single_fn, batches: list[Any], singles: list[Any], seconds: float) -> dict[str, Any]:
    """Median time of ``batch_fn`` over ``batches`` and of ``single_fn`` over ``singles``
    (one record each), outputs fetched as numpy; every input is run once first
    (warm-up). Shared by both layers' rows (TensorFlow imported by the caller).

    Both layers are called the same way: the concrete function of one trace
    with the batch dimension None (what a SavedModel signature holds and TF
    Serving runs), not a Python ``tf.function``, whose per-call argument
    matching is a cost of the Python caller, not of the served graph. Python
    still binds each flat input tensor per call (TF Serving does that in C++)."""
    import tensorflow as tf

    def timed(fn, inputs):
        for x in inputs:
            tf.nest.map_structure(lambda t: t.numpy(), fn(x))
        times = []
        deadline = time.perf_counter() + seconds
        i = 0
        cpu0 = time.process_time()
        while time.perf_counter() < deadline or len(times) < 20:
            x = inputs[i % len(inputs)]
            t0 = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy(), fn(x))
            times.append(time.perf_counter() - t0)
            i += 1
        return times, (time.process_time() - cpu0) / len(times)

    with WorkTimer() as t:
        bt, bcpu = timed(batch_fn, batches)
        st, scpu = timed(single_fn, singles)
    batch = int(tf.shape(tf.nest.flatten(batch_fn(batches[0]))[0])[0])
    batch_s = statistics.median(bt)
    # CPU per call (all the process's threads, the loop's mean): unlike wall time, not
    # stretched by other processes on a shared host; with one intra- and one inter-op
    # thread (TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1) it is the call's own work.
    return {**t.to_json(), "records": batch, "batch": batch, "batch_median_ms": batch_s * 1e3,
            "batch_records_per_s": batch / batch_s, "batch_calls": len(bt),
            "batch_cpu_ms": bcpu * 1e3, "single_cpu_ms": scpu * 1e3,
            "single_median_ms": statistics.median(st) * 1e3,
            "single_p90_ms": sorted(st)[int(0.9 * len(st))] * 1e3, "single_calls": len(st),
            "outputs": len(batch_fn(batches[0]))}


CASES = {"convert": _convert, "layer": _layer}


def add_convert_args(ap: argparse.ArgumentParser) -> None:
    """The ``convert`` case's arguments (also ``bench.analyzers_text``'s cases')."""
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--output", default=None)
    ap.add_argument("--shards", type=int, nargs=2, default=(1, 1), metavar=("TRAIN", "EVAL"))
    ap.add_argument("--workers", type=int, default=1)


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    add_convert_args(ap)
    ap.add_argument("--transform-dir", default=None)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--num-batches", type=int, default=8)
    ap.add_argument("--singles", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="time per measured loop (batch, single)")


def peer_child_main(description: str, add_args: Any, work: Any) -> None:
    """``bench.measure.child_main`` for a child that imports TensorFlow and Beam: once its result
    is written, the process ends without their teardown, where their threads may crash."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        child_main(description, add_args, work)
    except SystemExit as e:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(e.code if isinstance(e.code, int) else 1)


def main() -> None:
    peer_child_main("one TF Transform measurement (peer virtualenv)", _add_args, lambda a: CASES[a.case](a))


if __name__ == "__main__":
    main()
