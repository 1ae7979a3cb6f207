"""``zscore``: ``(x - mean) / std`` of the training split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convert.transforms.base import StandardizingTransform


class Zscore(StandardizingTransform):
    name = "zscore"
    summary = "(x - mean) / std of the training split"
    serving = "readers.transforms.zscore"

    def span(self, stats: Mapping[str, Any]) -> tuple[float, float] | None:
        return stats.get("mean") or 0.0, stats.get("std") or 1.0  # none: an empty training split


TRANSFORM = Zscore()
