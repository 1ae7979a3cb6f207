"""``identity``: a number (or a list of them with ``max_len``) written as float32, unchanged."""

from __future__ import annotations

from convert.transforms.base import NumericListTransform
from convert.value_sketch import ValueSketch


class Identity(NumericListTransform):
    name = "identity"
    summary = "number (or list with max_len) as float32, unchanged"
    serving = "readers.transforms.identity"

    def before_from_after(self, after: ValueSketch) -> ValueSketch | None:
        return after


TRANSFORM = Identity()
