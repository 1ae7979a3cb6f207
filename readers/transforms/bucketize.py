"""``bucketize``: a number -> bucket id ``1..num_buckets`` cut at the training split's quantiles."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from convert.config import FeatureConfig
from readers.transforms.base import Checks, NumericTransform


class Bucketize(NumericTransform):
    """Ids by a search of the boundaries, not a float step: never in the grouped numeric op."""

    name = "bucketize"

    def grouped_numeric(self, f: FeatureConfig) -> bool:
        return False

    def values(self, f: FeatureConfig, x: tf.Tensor, present: tf.Tensor, in_list: tf.Tensor | None,
               stats: Mapping[str, Any], bad: Checks) -> tf.Tensor:
        """``[batch, 1]`` int64: the bucket of ``x`` (``side="right"``, as the converter's
        ``searchsorted``), 0 where missing; 1 for all when the analysis has no boundaries."""
        bounds = [float(b) for b in stats.get("boundaries") or []]
        if bounds:
            pos = tf.searchsorted(tf.constant(bounds, tf.float64), tf.reshape(x, [-1]), side="right", out_type=tf.int64)
            ids = tf.reshape(pos, [-1, 1]) + 1
        else:
            ids = tf.ones_like(x, dtype=tf.int64)
        return tf.where(present, ids, tf.zeros_like(ids))


TRANSFORM = Bucketize()
