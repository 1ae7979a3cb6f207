"""``log1p``: ``log(1 + x)``; a value at or below -1 rejects its record."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from convert.config import FeatureConfig
from readers.serving_ops import reason
from readers.transforms.base import NumericStep, NumericTransform


def _log1p(x: tf.Tensor, present: Callable[[], tf.Tensor], params: Mapping[str, list[Any]]) -> tuple[tf.Tensor, tf.Tensor]:
    neg = (x <= -1.0) & present()  # where present, x is the value the record held
    return tf.math.log1p(tf.where(neg, tf.zeros_like(x), x)), neg


LOG1P = NumericStep("log1p", _log1p)


class Log1p(NumericTransform):
    """``LOG1P``, rejecting values <= -1 with the converter's reason."""

    name = "log1p"

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        return LOG1P, {"reason": reason(f.source, "log1p needs values > -1; use 'clip' first or another transform")}


TRANSFORM = Log1p()
