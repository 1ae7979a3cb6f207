"""``vocabulary``: a category (string, int, bool; or a list with ``max_len``) -> id by training frequency.

Ids: 0 = missing/padding, ``1..num_oov_buckets`` = out of vocabulary, then the
training split's terms by descending count (``convert.vectorize``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convert.transforms.base import ID_LENGTH_OF_WHY, ID_LIST_OPTIONS, VOCAB_OPTIONS, Transform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig

#: Why a categorical transform takes no ``missing_indicator``.
CATEGORICAL_MISSING_WHY = "categorical features map null to id 0 already"


class Vocabulary(Transform):
    name = "vocabulary"
    summary = "category (string, int, bool; or list with max_len) -> id by training frequency"
    options = (*VOCAB_OPTIONS, *ID_LIST_OPTIONS)
    serving = "readers.transforms.vocabulary"
    vocabulary = True
    list_capable = True
    stats_kind = "categorical"
    prepared_as = "terms"
    not_taken_why = {"missing_indicator": CATEGORICAL_MISSING_WHY, "length_of": ID_LENGTH_OF_WHY}

    def takes_term_codes(self, f: FeatureConfig) -> bool:
        return True


TRANSFORM = Vocabulary()
