"""Petastorm's feeding row, run inside the peer virtualenv (``bench/.peers/petastorm-venv``).

Started by :mod:`bench.petastorm_peer` through :func:`bench.measure.run_child`
with the peer's interpreter; imports Petastorm, its pinned pyarrow and
TensorFlow, and nothing of recordprep.

``feed``
    ``make_batch_reader`` on the Parquet files (no Spark session; plain
    Parquet, ``num_epochs=None``: it reads the files again each pass), a
    ``TransformSpec`` that turns each row group into the fixed-shape columns
    TensorFlow takes (:func:`bench.keras_prep.raw_columns`; Petastorm's
    ``make_petastorm_dataset`` carries neither nulls in strings nor ragged
    lists), ``make_petastorm_dataset`` -> ``unbatch().batch(--batch)`` ->
    Keras preprocessing layers adapted on the train split
    (:class:`bench.keras_prep.Prep`) in a ``map`` -> ``model.fit`` of
    :func:`bench.peer_common.trivial_model`.

Petastorm's schema inference leaves out struct columns, so it reads a
flattened copy of the Parquet files (``user.segment`` -> a top-level
``user__segment`` column), written before the clock starts into ``--flat-dir``: the
step a team feeding such data through Petastorm has to add.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.measure import child_main
from bench.peer_common import load_plan


def flatten(files: list[str], out_dir: str) -> list[str]:
    """Each Parquet file with its struct columns' fields as top-level ``<struct>__<field>`` columns,
    large strings and lists as plain ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    out = []
    for path in files:
        target = os.path.join(out_dir, os.path.basename(path))
        if not os.path.exists(target):
            t = pq.read_table(path)
            while any(pa.types.is_struct(f.type) for f in t.schema):
                t = t.flatten()
            t = t.rename_columns([n.replace(".", "__") for n in t.column_names])  # namedtuple fields
            # Petastorm's schema inference skips polars' large strings and lists and its
            # dictionary-encoded enums: plain strings and lists.
            t = t.cast(pa.schema([pa.field(f.name, _plain_type(f.type)) for f in t.schema]))
            pq.write_table(t, target + ".tmp", row_group_size=pq.ParquetFile(path).metadata.row_group(0).num_rows)
            os.replace(target + ".tmp", target)
        out.append(target)
    return out


def _plain_type(t: Any) -> Any:
    import pyarrow as pa

    if pa.types.is_dictionary(t):
        return _plain_type(t.value_type)
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_plain_type(t.value_type))
    return t


def _flat_plan(feats: list[dict[str, Any]], label: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The plan with nested sources read from the flattened columns (``user.segment`` -> ``user__segment``)."""
    return ([dict(f, source=f["source"].replace(".", "__")) for f in feats],
            dict(label, source=label["source"].replace(".", "__")))


def _feed(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import tensorflow as tf
    from petastorm import make_batch_reader
    from petastorm.tf_utils import make_petastorm_dataset
    from petastorm.transform import TransformSpec
    from petastorm.unischema import UnischemaField

    from bench import keras_prep
    from bench.peer_common import fit_rate

    feats, label = load_plan(args.config)
    files = flatten(args.inputs, args.flat_dir)
    t0 = time.perf_counter()
    prep = keras_prep.Prep(feats, label, args.inputs)  # adapted on the original files' train split
    adapt_s = time.perf_counter() - t0
    sig = keras_prep.raw_signature(feats, label)
    ffeats, flabel = _flat_plan(feats, label)

    def to_raw(df: Any) -> Any:
        cols = keras_prep.raw_columns(pa.Table.from_pandas(df, preserve_index=False), ffeats, flabel)
        return pd.DataFrame({k: list(v) if v.ndim > 1 else v for k, v in cols.items()})

    edit = []
    for name, spec in sig.items():
        dtype = {tf.float64: np.float64, tf.int64: np.int64, tf.string: np.str_}[spec.dtype]
        edit.append(UnischemaField(name, dtype, tuple(spec.shape[1:]), None, False))
    spec = TransformSpec(to_raw, edit_fields=edit, selected_fields=list(sig))
    reader = make_batch_reader(["file://" + os.path.abspath(p) for p in files], num_epochs=None,
                               transform_spec=spec, workers_count=args.workers)
    try:
        with reader:
            ds = make_petastorm_dataset(reader).unbatch().batch(args.batch, drop_remainder=True)
            ds = ds.map(lambda x: prep({k: getattr(x, k) for k in sig}),
                        num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
            res = fit_rate(ds, prep.feature_names, args.batch, args.seconds)
    finally:
        reader.stop()
        reader.join()
    return {**res, "adapt_s": round(adapt_s, 3)}


def _add_args(ap: argparse.ArgumentParser) -> None:
    from bench.peer_common import CONFIG

    ap.add_argument("--case", choices=("feed",), required=True)
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--flat-dir", required=True, help="where the flattened Parquet copies go (made once, kept)")
    ap.add_argument("--workers", type=int, default=2, help="make_batch_reader workers_count: the cores used")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--seconds", type=float, default=10.0)


def main() -> None:
    child_main("one Petastorm measurement", _add_args, _feed)


if __name__ == "__main__":
    main()
