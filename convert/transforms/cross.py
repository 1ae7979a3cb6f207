"""``cross``: two or more categorical ``sources`` hashed together -> id ``1..buckets`` (0: a source missing)."""

from __future__ import annotations

from typing import Any

from convert.transforms.base import HashedTransform, Need


class Cross(HashedTransform):
    name = "cross"
    summary = "two or more categorical 'sources' hashed together -> id 1..buckets"
    options = ("sources", "buckets")
    serving = "readers.transforms.cross"
    reads_sources = True
    prepared_as = "cross"
    not_taken_why = {"max_len": "it combines single values", "source": "it reads its fields from 'sources'"}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        if "sources" not in kw:
            need("transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths)")
        if "buckets" not in kw:
            need("transform 'cross' needs 'buckets: N' (number of hash buckets for the combinations)")


TRANSFORM = Cross()
