"""``vocabulary``: a category (or a list's first ``max_len``) -> its id by training frequency."""
from __future__ import annotations

import tensorflow as tf

from convert.config import FeatureConfig
from readers.transforms.base import IdTransform, Layer


def vocabulary_ids(layer: Layer, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
    """Ids of ``terms`` in feature ``f``'s table; with ``num_oov_buckets`` > 1 a term it
    lacks (the table's 0) takes one of the OOV ids by hash, as the converter's does."""
    ids = layer.table(f.name).lookup(terms)
    if f.num_oov_buckets <= 1:
        return ids  # the table's default is the OOV id, 1
    oov = tf.strings.to_hash_bucket_fast(terms, f.num_oov_buckets) + 1
    return tf.where(tf.equal(ids, 0), oov, ids)


class Vocabulary(IdTransform):
    """A table lookup; single values without OOV buckets share one table."""

    name = "vocabulary"

    def hashed(self, f: FeatureConfig) -> str | None:
        return "out-of-vocabulary buckets" if f.num_oov_buckets > 1 else None

    def shares_table(self, f: FeatureConfig) -> bool:
        return not f.multi_valued and f.num_oov_buckets <= 1

    def ids(self, layer: Layer, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        return vocabulary_ids(layer, f, terms)


TRANSFORM = Vocabulary()
