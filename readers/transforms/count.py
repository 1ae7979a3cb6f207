"""``count``: how many items a list (or a path through lists) holds, standardized by the training split."""
from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig, count_path
from readers.serving_ops import scaled_base
from readers.transforms.base import Checks, Layer, ServingTransform


class Count(ServingTransform):
    """Only the list's length travels (``lens``; null or absent: -1, counted 0)."""

    name = "count"

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        return ()

    def wire_path(self, path: str) -> str:
        return count_path(path)

    def is_list(self, f: FeatureConfig) -> bool:
        return True

    def list_use(self, f: FeatureConfig) -> tuple[str, int]:
        return ("items", 0)

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        lens = tf.cast(inputs[layer.wire.by_path(count_path(f.source)).len_name], tf.int64)
        return {f.name: scaled_base(tf.cast(tf.maximum(lens, 0), tf.float64), None, layer.stats(f.name))[:, None]}


TRANSFORM = Count()
