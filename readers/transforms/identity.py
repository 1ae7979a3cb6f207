"""``identity``: a number (or a list's first ``max_len``) as float32, unchanged."""
from __future__ import annotations

from readers.transforms.base import NumericTransform


class Identity(NumericTransform):
    """The value as it is (the base's ``IDENTITY`` step)."""

    name = "identity"
    zero_past_list = False  # the fill leaves 0.0 past a list's items


TRANSFORM = Identity()
