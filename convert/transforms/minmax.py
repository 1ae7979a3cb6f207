"""``minmax``: ``(x - min) / (max - min)`` of the training split (0 when the split has one value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.base import NUM_OPTIONS, NumericTransform
from convert.transforms.zscore import NUMERIC_LIST_WHY

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig


class Minmax(NumericTransform):
    name = "minmax"
    summary = "(x - min) / (max - min) of the training split"
    options = NUM_OPTIONS
    serving = "readers.transforms.minmax"
    learns_scaling = True
    fill_default = "mean"
    not_taken_why = {"max_len": NUMERIC_LIST_WHY}

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        lo, hi = stats.get("min"), stats.get("max")
        return (x - lo) / (hi - lo) if lo is not None and hi is not None and hi > lo else np.zeros_like(x)


TRANSFORM = Minmax()
