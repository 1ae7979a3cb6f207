"""``zscore_per_key`` in TensorFlow: the serving twin of ``convert.transforms.zscore_per_key``.

The key's term is looked up in a static table of the training keys (a key it
lacks, or a missing key, takes the global row), its mean and divisor gathered
from the converter's own ``KeyTable`` constants, and ``(x - mean) / divisor``
computed in float64 then rounded once to float32: the converter's operations
in its order, so the bits agree (the kernels flush subnormals as the converter
does explicitly).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from convert.transforms.zscore_per_key import KeyTable


class KeyLookup:
    """A ``KeyTable`` as graph constants: the key -> row table and the per-row mean and divisor."""

    def __init__(self, table: KeyTable):
        keys = sorted(table.rows, key=table.rows.__getitem__)
        self.global_row = len(keys)
        if keys:
            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant([k.encode("utf-8", "surrogatepass") for k in keys], tf.string),
                tf.constant(np.arange(len(keys), dtype=np.int64)), key_dtype=tf.string, value_dtype=tf.int64)
            self.table: tf.lookup.StaticHashTable | None = tf.lookup.StaticHashTable(init, default_value=self.global_row)
        else:
            self.table = None
        self.means = tf.constant(table.means)
        self.divisors = tf.constant(table.divisors)

    def rows(self, terms: tf.Tensor, has_key: tf.Tensor) -> tf.Tensor:
        """Each row's table row: its key term's, or the global row where ``has_key`` is False or the key is unknown."""
        fallback = tf.fill(tf.shape(terms), tf.constant(self.global_row, tf.int64))
        if self.table is None:
            return fallback
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
