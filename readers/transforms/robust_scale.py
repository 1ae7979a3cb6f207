"""``robust_scale``: ``(x - median) / (q75 - q25)`` of the training split."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convert.config import FeatureConfig
from convert.transforms.robust_scale import TRANSFORM as CONVERTER
from readers.transforms.base import LINEAR, NumericStep, NumericTransform


class RobustScale(NumericTransform):
    """``LINEAR`` with the converter's own median and IQR (``RobustScale.span``), so the
    constants are its bits; its fill (the median, or the training mean) is the converter's
    too (``readers.serving_ops.fill_value``), so it runs in the grouped op as ``zscore`` does."""

    name = "robust_scale"

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        a, b = CONVERTER.span(stats)
        return LINEAR, {"a": a, "b": b}


TRANSFORM = RobustScale()
