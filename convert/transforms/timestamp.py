"""``timestamp``: an epoch number in ``unit`` or an ISO 8601 string -> epoch seconds scaled
by the training split, plus calendar ``parts`` (``<name>_hour``, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np

from convert.derive import Scaled
from convert.transforms.base import Need, ScaledTransform


class Timestamp(ScaledTransform):
    name = "timestamp"
    summary = ("epoch number in 'unit' or ISO 8601 string -> epoch seconds scaled by the training split "
               "+ calendar 'parts'")
    options = ("unit", "parts", "missing_indicator")
    serving = "readers.transforms.timestamp"
    # A missing timestamp is missing (written 0.0, the mean), not a value.
    scaled = Scaled(lambda col: col.astype(np.float64), missing_is_value=False)
    epoch_unit = True
    stats_kind = "timestamp"
    prepared_as = "timestamp"
    accepts = (frozenset({"number", "string"}), "epoch numbers or ISO 8601 strings")
    not_taken_why = {"max_len": "it takes one value per record"}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        kw.setdefault("unit", "ms")
        kw.setdefault("parts", ())


TRANSFORM = Timestamp()
