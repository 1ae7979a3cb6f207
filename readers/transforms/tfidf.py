"""``tfidf``' TensorFlow twin: each row's distinct in-vocabulary ids and their tf-idf weights.

``convert.transforms.tfidf`` defines the output and computes the idf table
(float32, by id) once, at analysis; here, as there, the weight is
``float32(float64(count) / float64(size)) * idf[id]``: an IEEE division, one
rounding to float32 and a float32 product, so the same bits.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from convert.transforms.tfidf import idf_table
from readers.transforms.bag_of_words import distinct_ids, place
from readers.transforms.base import Checks, Layer
from readers.transforms.ngrams import TermsTransform


def tfidf_weights(ids: tf.Tensor, rows: tf.Tensor, batch: tf.Tensor, table: tf.Tensor, first_id: int,
                  max_len: int) -> tuple[tf.Tensor, tf.Tensor]:
    """``(ids, weights)``, ``[batch, max_len]``: each row's distinct ids of at least
    ``first_id``, ascending (int64), and their tf-idf (float32). ``ids``: every term id of
    the rows (flat int64, below ``len(table)``) and ``rows`` each one's row; ``table``:
    the float32 idf by id."""
    span = int(table.shape[0])
    sizes = tf.math.unsorted_segment_sum(tf.ones_like(rows), rows, batch)
    r, uniq, occ = distinct_ids(ids, rows, span)
    known = uniq >= first_id
    r, uniq, occ = tf.boolean_mask(r, known), tf.boolean_mask(uniq, known), tf.boolean_mask(occ, known)
    tf64 = tf.cast(occ, tf.float64) / tf.cast(tf.gather(sizes, r), tf.float64)
    weights = tf.cast(tf64, tf.float32) * tf.gather(table, uniq)
    out_ids, out_w = place(r, batch, max_len, uniq, weights)
    return out_ids, out_w


class Tfidf(TermsTransform):
    """Each row's distinct in-vocabulary term ids ascending, ``<name>_weights`` and ``<name>_len``;
    the idf table is the converter's (``convert.transforms.tfidf.idf_table``), a constant."""

    name = "tfidf"

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        terms, ids, _ = self.document(layer, f, inputs, bad)
        d = layer.document_frequencies(f.name)
        first = 1 + f.num_oov_buckets
        table = tf.constant(idf_table(d["df"], d["documents"], f.smooth, first))
        out, w = tfidf_weights(ids, terms.indices[:, 0], terms.dense_shape[0], table, first, f.max_len)
        return {f.name: out, f"{f.name}_weights": w, f"{f.name}_len": tf.math.count_nonzero(out, axis=1)[:, None]}


TRANSFORM = Tfidf()
