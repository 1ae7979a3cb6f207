"""``zscore``: ``(x - mean) / std`` of the training split."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convert.config import FeatureConfig
from readers.transforms.base import LINEAR, NumericStep, NumericTransform


class Zscore(NumericTransform):
    """``LINEAR`` with the mean and std (0 and 1 where the analysis has none)."""

    name = "zscore"

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        return LINEAR, {"a": stats.get("mean") or 0.0, "b": stats.get("std") or 1.0}


TRANSFORM = Zscore()
