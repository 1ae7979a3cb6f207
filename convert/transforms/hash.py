"""``hash``: a category -> stable hash id ``1..buckets`` (identifiers, open-ended sets); 0 = missing."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from convert.transforms.base import ID_LENGTH_OF_WHY, ID_LIST_OPTIONS, HashedTransform, Need
from convert.transforms.vocabulary import CATEGORICAL_MISSING_WHY

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig


class Hash(HashedTransform):
    name = "hash"
    summary = "category -> stable hash id 1..buckets (identifiers, open-ended sets)"
    options = ("buckets", *ID_LIST_OPTIONS)
    serving = "readers.transforms.hash"
    list_capable = True
    prepared_as = "hash"
    not_taken_why = {"missing_indicator": CATEGORICAL_MISSING_WHY, "length_of": ID_LENGTH_OF_WHY}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        if "buckets" not in kw:
            need("transform 'hash' needs 'buckets: N' (number of hash buckets)")

    def takes_term_codes(self, f: FeatureConfig) -> bool:
        return not f.multi_valued  # a scalar column's distinct values are hashed once each


TRANSFORM = Hash()
