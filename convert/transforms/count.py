"""``count``: how many items a list (or a path through lists, ``items[]``) or a map holds,
standardized by the training split (a null or missing list counts 0)."""

from __future__ import annotations

import numpy as np

from convert.derive import Scaled
from convert.transforms.base import ScaledTransform


class Count(ScaledTransform):
    name = "count"
    summary = ("how many items a list (or path through lists, items[]) or map holds, "
               "standardized by the training split")
    serving = "readers.transforms.count"
    # The count itself, not its log: integers, a mean and a std make (x - mean) / std exact IEEE arithmetic
    # in numpy and TensorFlow alike; a log1p differs by an ulp between the two, which the subtraction of
    # a mean close to it turns into a different float32.
    scaled = Scaled(lambda col: np.maximum(col, 0).astype(np.float64), missing_is_value=True)
    counts_items = True
    prepared_as = "count"
    accepts = (frozenset({"array", "map"}), "a list or a map (or a path through lists, items[])")
    not_taken_why = {"max_len": "it gives one number per record"}


TRANSFORM = Count()
