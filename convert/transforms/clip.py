"""``clip``: ``x`` limited to ``[clip_min, clip_max]`` (or a list with ``max_len``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.base import NUM_LIST_OPTIONS, NUM_OPTIONS, Need, NumericListTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig


class Clip(NumericListTransform):
    name = "clip"
    summary = "x limited to [clip_min, clip_max] (or list with max_len)"
    options = (*NUM_OPTIONS, "clip_min", "clip_max", *NUM_LIST_OPTIONS)
    serving = "readers.transforms.clip"

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        if "clip_min" not in kw and "clip_max" not in kw:
            need("transform 'clip' needs 'clip_min' and/or 'clip_max'")
        super().complete(kw, need)

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        return np.clip(x, f.clip_min if f.clip_min is not None else -np.inf,
                       f.clip_max if f.clip_max is not None else np.inf)


TRANSFORM = Clip()
