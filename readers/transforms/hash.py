"""``hash``: a category (or a list's first ``max_len``) -> a stable hash id ``1..buckets``."""
from __future__ import annotations

import tensorflow as tf

from convert.config import FeatureConfig
from readers.transforms.base import IdTransform, Layer


class Hash(IdTransform):
    """FarmHash buckets of the term (``to_hash_bucket_fast``, the converter's hash) + 1."""

    name = "hash"

    def hashed(self, f: FeatureConfig) -> str | None:
        return f"transform {self.name!r}"

    def ids(self, layer: Layer, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        return tf.strings.to_hash_bucket_fast(terms, f.buckets) + 1


TRANSFORM = Hash()
