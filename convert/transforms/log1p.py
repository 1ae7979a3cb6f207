"""``log1p``: ``log(1 + x)`` for ``x > -1`` (or a list with ``max_len``); values at or below -1 are rejected."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.base import NumericListTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.value_sketch import ValueSketch


class Log1p(NumericListTransform):
    name = "log1p"
    summary = "log(1 + x) for x > -1 (or list with max_len)"
    serving = "readers.transforms.log1p"
    domain_above = -1.0

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        if present is None:  # a sketch's points: values the preparer accepted
            return np.log1p(x)
        neg = (x <= -1) & present  # rejected rows (see Preparer); computed on 0 instead
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.log1p(np.where(neg, 0.0, x))

    def before_from_after(self, after: ValueSketch) -> ValueSketch | None:
        return after.mapped(np.expm1) if after.count else after


TRANSFORM = Log1p()
