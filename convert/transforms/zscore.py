"""``zscore``: ``(x - mean) / std`` of the training split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.base import NUM_OPTIONS, NumericTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig

#: Why ``zscore`` and ``minmax`` take no ``max_len``.
NUMERIC_LIST_WHY = "numeric lists support identity, clip and log1p (per element)"


class Zscore(NumericTransform):
    name = "zscore"
    summary = "(x - mean) / std of the training split"
    options = NUM_OPTIONS
    serving = "readers.transforms.zscore"
    learns_scaling = True
    fill_default = "mean"
    not_taken_why = {"max_len": NUMERIC_LIST_WHY}

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        std = stats.get("std") or 1.0
        return (x - (stats.get("mean") or 0.0)) / std


TRANSFORM = Zscore()
