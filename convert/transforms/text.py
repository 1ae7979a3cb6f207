"""``text``: a string -> ``max_len`` word ids (a vocabulary of tokens) + ``<name>_len``."""

from __future__ import annotations

from typing import Any

from convert.transforms.base import ID_LENGTH_OF_WHY, VOCAB_OPTIONS, Need, Transform


class Text(Transform):
    name = "text"
    summary = "string -> max_len word ids (a vocabulary of tokens) + <name>_len"
    options = ("max_len", "lowercase", *VOCAB_OPTIONS, "length")
    serving = "readers.transforms.text"
    vocabulary = True
    tokens = True
    list_capable = True
    stats_kind = "categorical"
    prepared_as = "terms"
    accepts = (frozenset({"string"}), "strings")
    not_taken_why = {"missing_indicator": "a missing text has length 0 already", "length_of": ID_LENGTH_OF_WHY}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        if "max_len" not in kw:
            need("transform 'text' needs 'max_len: N' (tokens kept per record; shorter texts are padded)")


TRANSFORM = Text()
