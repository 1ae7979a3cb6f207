"""``minmax``: ``(x - min) / (max - min)`` of the training split (0 when the split has one value)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from convert.transforms.base import StandardizingTransform


class Minmax(StandardizingTransform):
    name = "minmax"
    summary = "(x - min) / (max - min) of the training split"
    serving = "readers.transforms.minmax"

    def span(self, stats: Mapping[str, Any]) -> tuple[float, float] | None:
        lo, hi = stats.get("min"), stats.get("max")
        return (lo, hi - lo) if lo is not None and hi is not None and hi > lo else None


TRANSFORM = Minmax()
