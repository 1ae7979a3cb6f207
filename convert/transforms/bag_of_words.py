"""``bag_of_words``: the distinct term ids of a text, ascending, and how often each occurs.

TF Transform's ``tft.bag_of_words(tokens, ngram_range, separator)`` (the set of
a row's distinct n-grams) then ``tft.compute_and_apply_vocabulary``, with the
counts beside the ids: ``<name>`` holds a document's distinct ids (tokens,
or n-grams with ``ngram_range``; out-of-vocabulary buckets included) in
ascending order, padded with 0 to ``max_len``, and ``<name>_counts`` (float32)
how many times each occurs in the document. TF Transform leaves the order of
its bag unspecified; ascending ids make it a function of the set. A document
with more than ``max_len`` distinct ids keeps the ``max_len`` smallest: the
out-of-vocabulary buckets, then the most frequent terms of the training split.
The vocabulary is ``text``'s (``ngrams``'s with ``ngram_range``), learned over
every term of the document.

The serving twin is ``readers.transforms.bag_of_words``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from convert.spec import FeatureSpec
from convert.transforms.base import Need
from convert.transforms.ngrams import UNIGRAMS, TermsTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.columns import Columns
    from convert.config_model import FeatureConfig


def distinct_ids(ids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's distinct ids, ascending, from ``ids`` (flat int64, row ``i`` owning
    ``counts[i]`` consecutive ones): ``(row, id, occurrences)`` of every distinct pair,
    by row then id."""
    ids = np.asarray(ids, dtype=np.int64)
    rows = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    if ids.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    order = np.lexsort((ids, rows))
    r, i = rows[order], ids[order]
    start = np.ones(r.size, dtype=bool)
    start[1:] = (r[1:] != r[:-1]) | (i[1:] != i[:-1])
    at = np.flatnonzero(start)
    return r[at], i[at], np.diff(np.append(at, r.size))


def place(rows: np.ndarray, n_rows: int, n: int, *columns: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """``(rows, n)`` matrices of ``columns`` (values ordered by row), each row's first ``n``
    values at its columns ``0..``, zeros after; and how many each row kept."""
    per_row = np.bincount(rows, minlength=n_rows).astype(np.int64)
    rank = np.arange(rows.size, dtype=np.int64) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    keep = rank < n
    out = []
    for col in columns:
        m = np.zeros((n_rows, n), dtype=col.dtype)
        m[rows[keep], rank[keep]] = col[keep]
        out.append(m)
    return out, np.minimum(per_row, n)


def bag_of_ids(ids: np.ndarray, counts: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, occurrences, lengths)``: each row's distinct ids ascending (int64, 0 after them)
    and their counts in the row (float32, 0.0 after them), both ``(rows, max_len)``, and how
    many ids each row kept."""
    counts = np.asarray(counts, dtype=np.int64)
    rows, uniq, occ = distinct_ids(ids, counts)
    (out_ids, out_occ), lens = place(rows, counts.size, max_len, uniq, occ.astype(np.float32))
    return out_ids, out_occ, lens


class BagTransform(TermsTransform):
    """A text's distinct term ids (``ngram_range``: tokens or n-grams), ascending, with a float32
    weight each in ``<name>_<weights>``: the ``bags`` stage of ``convert.prepare`` keeps every
    term of a document (``TermBags``), and ``finish_bag`` makes the columns from their ids."""

    prepared_as = "bags"
    encoding = "weighted_tokens"
    #: The weights column's suffix: ``<name>_<weights>``.
    weights: ClassVar[str]

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        if "max_len" not in kw:
            need(f"transform {self.name!r} needs 'max_len: N' (distinct terms kept per record, smallest ids first)")
        kw.setdefault("ngram_range", UNIGRAMS)

    def outputs(self, f: FeatureConfig) -> list[str]:
        return [f.name, f"{f.name}_{self.weights}"]

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        n = f.max_len or 1
        weights = f"{f.name}_{self.weights}"
        return [FeatureSpec(f.name, "int64", (n,), 0, f.source, self.name, {**params, "weights": weights},
                            encoding=self.encoding),
                FeatureSpec(weights, "float32", (n,), 0.0, f.source, f"{self.name}_{self.weights}", {"of": f.name},
                            role="aux", encoding="aux")]

    def bag_constants(self, f: FeatureConfig, analysis: Any) -> Any:
        """What ``finish_bag`` needs of the analysis (``convert.analysis.Analysis``), made once per analysis."""
        return None

    def finish_bag(self, f: FeatureConfig, ids: np.ndarray, counts: np.ndarray, constants: Any) -> Columns:
        """The columns of a batch whose rows have ``counts`` term ids each in ``ids`` (flat int64)."""
        out, occ, lens = bag_of_ids(ids, counts, f.max_len or 1)
        return {f.name: ("int64", out), f"{f.name}_len": ("int64", lens.reshape(-1, 1)),
                f"{f.name}_{self.weights}": ("float32", occ)}


class BagOfWords(BagTransform):
    name = "bag_of_words"
    summary = ("string -> its distinct token (or n-gram) ids, ascending, padded to max_len + their counts in "
               "<name>_counts + <name>_len")
    serving = "readers.transforms.bag_of_words"
    weights = "counts"


TRANSFORM = BagOfWords()
