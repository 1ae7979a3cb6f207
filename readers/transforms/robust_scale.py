"""``robust_scale``: ``(x - median) / (q75 - q25)`` of the training split."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from convert.config import FeatureConfig
from convert.transforms.robust_scale import TRANSFORM as CONVERTER
from readers.transforms.base import LINEAR, Checks, NumericStep, NumericTransform


class RobustScale(NumericTransform):
    """``LINEAR`` with the converter's own median and IQR (``RobustScale.span``), so the
    constants are its bits. Outside the grouped op: its default fill is the median, which
    the grouped op's shared fill (the mean) does not know."""

    name = "robust_scale"

    def grouped_numeric(self, f: FeatureConfig) -> bool:
        return False

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        a, b = CONVERTER.span(stats)
        return LINEAR, {"a": a, "b": b}

    def values(self, f: FeatureConfig, x: tf.Tensor, present: tf.Tensor, in_list: tf.Tensor | None,
               stats: Mapping[str, Any], bad: Checks) -> tf.Tensor:
        return super().values(f, x, present, in_list, CONVERTER.fill_stats(f, stats), bad)


TRANSFORM = RobustScale()
