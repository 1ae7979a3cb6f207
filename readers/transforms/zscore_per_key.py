"""``zscore_per_key`` in TensorFlow: the serving twin of ``convert.transforms.zscore_per_key``.

The key's term is looked up in a static table of the training keys (a key it
lacks, or a missing key, takes the global row), its mean and divisor gathered
from the converter's own ``KeyTable`` constants, and ``(x - mean) / divisor``
computed in float64 then rounded once to float32: the converter's operations
in its order, so the bits agree (the kernels flush subnormals as the converter
does explicitly).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from convert.config import FeatureConfig
from convert.transforms.zscore_per_key import TRANSFORM as CONVERTER
from convert.transforms.zscore_per_key import KeyTable
from readers._serving_kinds import KIND_NESTED, KIND_NULL
from readers.serving_ops import reason
from readers.transforms.base import Checks, Layer, NumericTransform


def key_table(table: KeyTable) -> tf.lookup.StaticHashTable:
    """Key term (UTF-8) -> its row of ``table``; the global row for a key it lacks."""
    keys = sorted(table.rows, key=table.rows.__getitem__)
    init = tf.lookup.KeyValueTensorInitializer(
        tf.constant([k.encode("utf-8", "surrogatepass") for k in keys] or [b""], tf.string),
        tf.constant(np.arange(len(keys), dtype=np.int64) if keys else np.array([len(keys)], np.int64)),
        key_dtype=tf.string, value_dtype=tf.int64)
    return tf.lookup.StaticHashTable(init, default_value=len(keys))


class KeyLookup:
    """A ``KeyTable`` as graph constants: the key -> row table and the per-row mean and divisor."""

    def __init__(self, table: KeyTable, lookup: tf.lookup.StaticHashTable | None = None):
        self.global_row = len(table.rows)
        self.table = lookup if lookup is not None else key_table(table)
        self.means = tf.constant(table.means)
        self.divisors = tf.constant(table.divisors)

    def rows(self, terms: tf.Tensor, has_key: tf.Tensor) -> tf.Tensor:
        """Each row's table row: its key term's, or the global row where ``has_key`` is False or the key is unknown."""
        fallback = tf.fill(tf.shape(terms), tf.constant(self.global_row, tf.int64))
        return tf.where(has_key, self.table.lookup(terms), fallback)


def scale_per_key(x: tf.Tensor, present: tf.Tensor, rows: tf.Tensor, lookup: KeyLookup,
                  fill: float | str | None) -> tf.Tensor:
    """``convert.transforms.zscore_per_key.scale_per_key`` in a graph: ``x`` float64 ``[batch]``
    -> ``[batch, 1]`` float32."""
    mean = tf.gather(lookup.means, rows)
    if fill in ("mean", None):
        filler = mean
    else:
        filler = tf.fill(tf.shape(x), tf.constant(float(fill), tf.float64))
    out = (tf.where(present, x, filler) - mean) / tf.gather(lookup.divisors, rows)
    return tf.reshape(tf.cast(out, tf.float32), [-1, 1])


class ZscorePerKey(NumericTransform):
    """The number read and checked as every numeric feature's (``Layer.numeric``), its key's
    row from the layer's table of the training keys, then ``scale_per_key``."""

    name = "zscore_per_key"

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        return ("number", "term")

    def paths(self, f: FeatureConfig) -> tuple[str, ...]:
        return (f.source, f.key) if f.key and f.key != f.source else (f.source,)

    def term_paths(self, f: FeatureConfig) -> tuple[str, ...]:
        return (f.key,) if f.key else ()

    def grouped_numeric(self, f: FeatureConfig) -> bool:
        return False

    def own_table(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tf.lookup.StaticHashTable | None:
        return key_table(CONVERTER.table(stats))

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        k = layer.wire.by_path(f.key or f.source)
        kind = inputs[k.kind_name]
        nested = tf.equal(kind, KIND_NESTED)
        bad.append((nested, reason(k.path, "a key needs a single value, found a record or list")))
        lookup = KeyLookup(CONVERTER.table(layer.stats(f.name)), layer.table(f.name))
        rows = lookup.rows(inputs[k.input_name("term")], ~(tf.equal(kind, KIND_NULL) | nested))

        def values(f: FeatureConfig, x: tf.Tensor, present: tf.Tensor, in_list: Any, stats: Any, bad: Checks) -> tf.Tensor:
            return scale_per_key(x[:, 0], present[:, 0], rows, lookup, f.fill)

        return layer.numeric(f, layer.wire.by_path(f.source), inputs, bad, values=values)


TRANSFORM = ZscorePerKey()
