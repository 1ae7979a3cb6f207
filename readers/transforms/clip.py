"""``clip``: ``x`` limited to ``[clip_min, clip_max]`` (numpy's ``clip``: NaN stays, -0.0 too)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from convert.config import FeatureConfig
from readers.serving_ops import f64s, np_max, np_min
from readers.transforms.base import NumericStep, NumericTransform


def _clip(x: tf.Tensor, present: Callable[[], tf.Tensor], params: Mapping[str, list[Any]]) -> tuple[tf.Tensor, None]:
    return np_min(np_max(x, f64s(params["lo"])), f64s(params["hi"])), None


CLIP = NumericStep("clip", _clip)


class Clip(NumericTransform):
    """``CLIP`` with the config's bounds (an absent one: infinite)."""

    name = "clip"

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        return CLIP, {"lo": -np.inf if f.clip_min is None else f.clip_min,
                      "hi": np.inf if f.clip_max is None else f.clip_max}


TRANSFORM = Clip()
