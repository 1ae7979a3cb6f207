"""``tfidf``: a text's distinct in-vocabulary term ids, ascending, and each one's tf-idf weight.

TF Transform's ``tft.tfidf(x, vocab_size, smooth)`` over the ids of
``tft.compute_and_apply_vocabulary``, computed as it computes it:

- the term frequency of a term in a document is its count over the document's
  size (every term of the document, out-of-vocabulary ones included), in float64;
- the inverse document frequency, from ``N`` (documents of the training split:
  every record that was not rejected, an empty or missing text included) and
  ``df`` (training documents holding the term), in float32:
  ``log((N + 1) / (df + 1)) + 1`` with ``smooth`` (the default), else
  ``log(N / df) + 1``;
- the weight is ``float32(tf) * idf`` (a float32 product).

The analysis learns the vocabulary as ``text`` does (``ngrams`` with
``ngram_range``) and, beside each term's count, its document frequency and
``N``; ``idf_table`` turns them into float32 constants that the converter and
the serving twin (``readers.transforms.tfidf``) both read, so the weights are
the same bits in both (the log is taken once, here: TensorFlow's float32 log
differs from a correctly rounded one in the last places for some ratios, so the
serving layer never takes it).

Where TF Transform differs: ``tft.tfidf`` weights any id below ``vocab_size``,
so the out-of-vocabulary buckets of ``compute_and_apply_vocabulary``
(``num_oov_buckets``) are terms with a document frequency of their own, and an
out-of-vocabulary ``-1`` (no OOV bucket) wraps to ``vocab_size - 1``, the last
term's id. Here out-of-vocabulary terms count in the document's size but get
no weight and are not written: a bucket's document frequency (documents holding
any term outside the vocabulary that hashes to it) is not known until the
vocabulary is, and no second pass over the training split is made for it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.bag_of_words import BagTransform, distinct_ids, place
from convert.transforms.base import Need
from convert.transforms.ngrams import TERM_OPTIONS

if TYPE_CHECKING:  # pragma: no cover
    from convert.columns import Columns
    from convert.config_model import FeatureConfig


def document_counts(codes: np.ndarray, counts: np.ndarray, size: int) -> np.ndarray:
    """Per term index ``0..size-1``, the rows holding it at least once (``codes``: flat term
    indexes, row ``i`` owning ``counts[i]`` consecutive ones; negative codes are no term)."""
    counts = np.asarray(counts, dtype=np.int64)
    return row_document_counts(codes, np.repeat(np.arange(counts.size, dtype=np.int64), counts), size)


def row_document_counts(codes: np.ndarray, row_of: np.ndarray, size: int) -> np.ndarray:
    """``document_counts`` of term indexes ``codes`` whose rows are ``row_of``: the distinct
    (row, term) pairs, counted by term."""
    codes = np.asarray(codes, dtype=np.int64)
    hit = codes >= 0
    span = max(size, 1)
    pairs = np.unique(np.asarray(row_of, dtype=np.int64)[hit] * span + codes[hit])
    return np.bincount(pairs % span, minlength=size).astype(np.int64)


@dataclasses.dataclass
class DocumentFrequencies:
    """A mergeable count of training documents and, per term, of the documents holding it.

    Integer sums: merging in any order gives the same result."""

    documents: int = 0
    terms: Counter = dataclasses.field(default_factory=Counter)

    def add(self, terms: list[str], df: np.ndarray, documents: int) -> None:
        """Add ``documents`` documents in which ``terms[i]`` occurs in ``df[i]`` of them."""
        self.documents += int(documents)
        for t, k in zip(terms, np.asarray(df).tolist(), strict=True):
            if k:
                self.terms[t] += k

    def merge(self, other: DocumentFrequencies) -> DocumentFrequencies:
        self.documents += other.documents
        self.terms.update(other.terms)
        return self

    def of(self, vocabulary: list[str]) -> list[int]:
        """The document frequency of each term of ``vocabulary``, in its order."""
        return [self.terms.get(t, 0) for t in vocabulary]


def idf(df: np.ndarray, documents: int, smooth: bool = True) -> np.ndarray:
    """The inverse document frequency of terms in ``df`` of ``documents`` documents, float32,
    as TF Transform computes it (``tf_utils.document_frequency_to_idf`` with its baseline):
    the ratio in float32, its log rounded to float32, plus 1 in float32. Without
    ``smooth`` a ``df`` of 0 gives ``inf`` (TF Transform's division by zero)."""
    n = np.float32(documents)
    d = np.asarray(df, dtype=np.int64).astype(np.float32)
    one = np.float32(1.0)
    with np.errstate(divide="ignore"):
        ratio = (n + one) / (one + d) if smooth else n / d
        return (np.log(ratio.astype(np.float64)).astype(np.float32) + one).astype(np.float32)


def idf_table(df: list[int], documents: int, smooth: bool, first_id: int) -> np.ndarray:
    """Float32 idf by id: 0.0 at the ids below ``first_id`` (padding, out-of-vocabulary
    buckets), then the vocabulary's terms' (``df`` in id order)."""
    return np.concatenate([np.zeros(first_id, dtype=np.float32), idf(np.asarray(df, dtype=np.int64), documents, smooth)])


def tfidf_weights(ids: np.ndarray, counts: np.ndarray, table: np.ndarray, first_id: int,
                  max_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ids, weights, lengths)``: each row's distinct ids of at least ``first_id`` (the
    vocabulary's), ascending (int64, 0 after them), and their tf-idf (float32, 0.0 after
    them), both ``(rows, max_len)``, and how many ids each row kept. ``ids``: every term id
    of the rows, flat, row ``i`` owning ``counts[i]`` consecutive ones (its size); ``table``:
    ``idf_table``."""
    counts = np.asarray(counts, dtype=np.int64)
    rows, uniq, occ = distinct_ids(ids, counts)
    known = uniq >= first_id
    rows, uniq, occ = rows[known], uniq[known], occ[known]
    tf64 = occ.astype(np.float64) / counts[rows].astype(np.float64)
    weights = tf64.astype(np.float32) * table[uniq]
    (out_ids, out_w), lens = place(rows, counts.size, max_len, uniq, weights.astype(np.float32))
    return out_ids, out_w, lens


#: Why ``tfidf`` takes no ``num_oov_buckets``.
OOV_WHY = ("out-of-vocabulary terms count in a document's size but get no weight and no id (their document "
           "frequency is not known in one pass over the training split; see docs/feature-config.md#text-analyzers)")


class Tfidf(BagTransform):
    name = "tfidf"
    summary = ("string -> its distinct in-vocabulary token (or n-gram) ids, ascending, padded to max_len + "
               "their tf-idf in <name>_weights + <name>_len")
    options = ("max_len", "lowercase", "top_k", "min_frequency", *TERM_OPTIONS, "smooth", "length")
    serving = "readers.transforms.tfidf"
    weights = "weights"
    document_frequencies = True
    not_taken_why = {**BagTransform.not_taken_why, "num_oov_buckets": OOV_WHY}

    def check_options(self, kw: dict[str, Any], need: Need) -> None:
        super().check_options(kw, need)
        if "smooth" in kw and not isinstance(kw["smooth"], bool):
            need(f"'smooth' must be true (idf = log((N + 1) / (df + 1)) + 1, the default) or false "
                 f"(log(N / df) + 1), found {kw['smooth']!r:.60}")

    def bag_constants(self, f: FeatureConfig, analysis: Any) -> Any:
        d = analysis.document_frequencies[f.name]
        return idf_table(d["df"], d["documents"], f.smooth, 1 + f.num_oov_buckets)

    def finish_bag(self, f: FeatureConfig, ids: np.ndarray, counts: np.ndarray, constants: Any) -> Columns:
        out, w, lens = tfidf_weights(ids, counts, constants, 1 + f.num_oov_buckets, f.max_len or 1)
        return {f.name: ("int64", out), f"{f.name}_len": ("int64", lens.reshape(-1, 1)), f"{f.name}_weights": ("float32", w)}


TRANSFORM = Tfidf()
