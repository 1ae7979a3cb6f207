"""``identity``: a number (or a list of them with ``max_len``) written as float32, unchanged."""

from __future__ import annotations

from convert.transforms.base import (
    NUM_LIST_OPTIONS,
    NUM_OPTIONS,
    NUMERIC_LENGTH_WHY,
    NumericTransform,
)
from convert.value_sketch import ValueSketch


class Identity(NumericTransform):
    name = "identity"
    summary = "number (or list with max_len) as float32, unchanged"
    options = (*NUM_OPTIONS, *NUM_LIST_OPTIONS)
    serving = "readers.transforms.identity"
    list_capable = True
    not_taken_why = {"length": NUMERIC_LENGTH_WHY}

    def before_from_after(self, after: ValueSketch) -> ValueSketch | None:
        return after


TRANSFORM = Identity()
