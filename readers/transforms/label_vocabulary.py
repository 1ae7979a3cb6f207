"""``label_vocabulary``: served as ``vocabulary`` is (the same ids, table and OOV buckets); only
the converter's ranking of the terms differs (``convert.transforms.label_vocabulary``)."""
from __future__ import annotations

from readers.transforms.vocabulary import Vocabulary


class LabelVocabulary(Vocabulary):
    """A table lookup of the ranked terms; single values without OOV buckets share one table."""

    name = "label_vocabulary"


TRANSFORM = LabelVocabulary()
