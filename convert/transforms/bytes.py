"""``bytes``: bytes or a string passed through unvectorized (images)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convert.spec import FeatureSpec
from convert.transforms.base import Transform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig


class Bytes(Transform):
    name = "bytes"
    summary = "bytes or string passed through unvectorized (images)"
    serving = "readers.transforms.bytes"
    stats_kind = "bytes"
    prepared_as = "bytes"
    accepts = (frozenset({"string", "bytes"}), "bytes or strings")
    not_taken_why = {"max_len": "it stores one value per record"}

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        return [FeatureSpec(f.name, "string", (1,), "", f.source, self.name, params, encoding=self.encoding)]


TRANSFORM = Bytes()
