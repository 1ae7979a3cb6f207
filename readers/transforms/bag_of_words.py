"""``bag_of_words``' TensorFlow twin: each row's distinct ids, ascending, with their counts.

``convert.transforms.bag_of_words`` defines the output; the same integer
operations give the same ids and counts (float32 whole numbers, exact).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from readers.transforms.base import Checks, Layer
from readers.transforms.ngrams import TermsTransform


def distinct_ids(ids: tf.Tensor, rows: tf.Tensor, span: int | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(row, id, occurrences)`` of every distinct (row, id) pair of the flat ``ids`` (int64,
    each below ``span``) and their ``rows``, by row then id: the pairs as one int64 key
    ``row * span + id``, sorted, counted."""
    keys = tf.sort(rows * span + ids)
    uniq, _, occ = tf.unique_with_counts(keys, out_idx=tf.int64)
    return uniq // span, uniq % span, occ


def place(rows: tf.Tensor, batch: tf.Tensor, n: int, *columns: tf.Tensor) -> list[tf.Tensor]:
    """``[batch, n]`` of each of ``columns`` (values ordered by row): a row's first ``n``
    values at its columns ``0..``, zeros after (``convert.transforms.bag_of_words.place``)."""
    at = tf.range(tf.shape(rows, out_type=tf.int64)[0])
    starts = tf.math.unsorted_segment_min(at, rows, batch)
    rank = at - tf.gather(starts, rows)
    keep = rank < n
    where = tf.stack([tf.boolean_mask(rows, keep), tf.boolean_mask(rank, keep)], axis=1)
    shape = tf.stack([batch, tf.constant(n, tf.int64)])
    return [tf.scatter_nd(where, tf.boolean_mask(c, keep), shape) for c in columns]


def bag_of_ids(ids: tf.Tensor, rows: tf.Tensor, batch: tf.Tensor, span: int | tf.Tensor,
               max_len: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, occurrences)``, ``[batch, max_len]``: each row's distinct ids ascending (int64,
    0 after them) and their counts in the row (float32)."""
    r, uniq, occ = distinct_ids(ids, rows, span)
    out_ids, out_occ = place(r, batch, max_len, uniq, tf.cast(occ, tf.float32))
    return out_ids, out_occ


class BagOfWords(TermsTransform):
    """Each row's distinct term ids ascending, ``<name>_counts`` and ``<name>_len``."""

    name = "bag_of_words"

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        terms, ids, _ = self.document(layer, f, inputs, bad)
        span = layer.table(f.name).size() + 1 + f.num_oov_buckets  # above every id
        out, occ = bag_of_ids(ids, terms.indices[:, 0], terms.dense_shape[0], span, f.max_len)
        return {f.name: out, f"{f.name}_counts": occ, f"{f.name}_len": tf.math.count_nonzero(out, axis=1)[:, None]}


TRANSFORM = BagOfWords()
