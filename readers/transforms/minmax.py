"""``minmax``: ``(x - min) / (max - min)`` of the training split; 0.0 over an empty range."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convert.config import FeatureConfig
from readers.transforms.base import LINEAR, ZERO, NumericStep, NumericTransform


class Minmax(NumericTransform):
    """``LINEAR`` with the min and the range where ``max > min``, else ``ZERO``."""

    name = "minmax"

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        lo, hi = stats.get("min"), stats.get("max")
        if lo is not None and hi is not None and hi > lo:
            return LINEAR, {"a": lo, "b": hi - lo}
        return ZERO, {}


TRANSFORM = Minmax()
