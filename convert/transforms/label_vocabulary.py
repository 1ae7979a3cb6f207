"""``label_vocabulary``: a vocabulary whose terms are ranked by their mutual information
with the label, as TF Transform's ``tft.vocabulary(x, labels=y)`` ranks them.

Ids are ``vocabulary``'s: 0 missing (or padding), ``1..num_oov_buckets`` out
of vocabulary, then the kept terms in rank order; only the ranking differs. A
list per record (``max_len``) is written as ``vocabulary`` writes one (its
first ``max_len`` ids, 0-padded, and ``<name>_len``).

The analysis counts, per term and label class, the term's occurrences in the
training records of that class (``LabelTermCounts``: ``n_ij``; a scalar
occurs once in its record; a list's items each once, as TF Transform counts a
batch of token lists: every item with its record's label, a term repeated in
one record once per occurrence, every item whatever ``max_len``, as
``vocabulary`` counts), and the records per class (``y_j``, every analyzed
record with a class, whether or not it holds a term: TF Transform's sentinel
counts records, not items; ``n`` their sum). Counts are integers, so they
merge exactly in any order, and a term's counts are cut by term like a
vocabulary's (``arrays``: one block of terms per class, partitioned by
``convert.term_counts.partition_of``): a term's score needs only its own
counts and the label's class counts (a handful of numbers).

The score of a term of ``x_i = sum_j n_ij`` occurrences is TF Transform's
(``beam/analyzer_impls._calculate_mutual_information_for_feature_value`` and
``info_theory``), in float64 from the exact counts:

- ``0`` when ``x_i == n`` (a constant has no information);
- refused when ``x_i > n`` (a term occurring more often than there are
  records: a list repeating terms within records), as TF Transform refuses it;
  mutual information reads a list as a set of terms;
- else the sum over the classes ``j`` with ``y_j > 0``, in class order, of
  ``m * ((log2(m) + log2(n)) - (log2(x_i) + log2(y_j)))`` with
  ``m = clip(n_ij / x_i, 1e-6, 1 - 1e-6) * x_i``, leaving out the classes where
  ``|x_i * y_j / n - m| < min_diff_from_avg``;
- ``adjusted`` (the default, TF Transform's ``use_adjusted_mutual_info``) less
  the expected mutual information of the same classes (``partial_emi``, the
  hypergeometric expectation, as TF Transform leaves it: not normalized).

``min_diff_from_avg`` defaults to TF Transform's recommendation for ``n``
records (``recommended_min_diff_from_avg``). Terms of fewer than
``min_frequency`` occurrences are dropped (TF Transform reads
``frequency_threshold`` as a threshold on the score once labels are given;
here it stays a count, as ``vocabulary``'s), the rest ranked by score
descending, ties by term ascending (``vocabulary``'s tie order; TF Transform
breaks them by term descending), the first ``top_k`` kept.

Deterministic: every score is a function of one term's integer counts and the
class counts, summed in class order, so no merge order changes a bit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.columns import LabelTerms, PreparedPart
from convert.transforms.base import ID_LIST_OPTIONS, VOCAB_OPTIONS, Need
from convert.transforms.vocabulary import Vocabulary

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig

MI_KINDS = ("adjusted", "plain")
_EPSILON = 1e-6
log2 = math.log2


def recommended_min_diff_from_avg(n: float) -> int:
    """TF Transform's ``calculate_recommended_min_diff_from_avg``: 2 up to 10,000 records, 25
    from 1,000,000, linear between, truncated to an integer."""
    lo, hi, small, large = 2, 25, 10_000, 1_000_000
    return int(min(hi, max(lo, (n - small) / (large - small) * (hi - lo) + lo)))


def partial_mi(n_ij: float, x_i: float, y_j: float, n: float) -> float:
    """TF Transform's ``info_theory.calculate_partial_mutual_information``: one cell's term
    of the sum (not divided by ``n``)."""
    if n_ij == 0 or x_i == 0 or y_j == 0:
        return 0.0
    return n_ij * ((log2(n_ij) + log2(n)) - (log2(x_i) + log2(y_j)))


def _logfactorial(k: float) -> float:
    return math.lgamma(k + 1)


def partial_emi(n: float, x_i: float, y_j: float) -> float:
    """TF Transform's ``info_theory.calculate_partial_expected_mutual_information``: the mutual
    information one cell is expected to have by chance (hypergeometric), in its order of operations."""
    if x_i == 0 or y_j == 0:
        return 0.0
    coefficient = -log2(x_i) - log2(y_j) + log2(n)
    start = int(round(max(0, x_i + y_j - n)))
    end = int(round(min(x_i, y_j)))
    numerator = _logfactorial(x_i) + _logfactorial(y_j) + _logfactorial(n - x_i) + _logfactorial(n - y_j)
    denominator = (_logfactorial(n) + _logfactorial(start) + _logfactorial(x_i - start)
                   + _logfactorial(y_j - start) + _logfactorial(n - x_i - y_j + start))
    total_p = 0.0
    result = 0.0
    for n_j in range(start, end + 1):
        p_j = math.exp(numerator - denominator)
        if n_j != end:
            denominator += (math.log(n_j + 1) - math.log(x_i - n_j) - math.log(y_j - n_j)
                            + math.log(n - x_i - y_j + n_j + 1))
        if n_j != 0:
            result += n_j * (coefficient + log2(n_j)) * p_j
        total_p += p_j
    return result / total_p


def term_score(per_class: Sequence[int], class_counts: Sequence[int], adjusted: bool,
               min_diff_from_avg: float) -> float:
    """The (adjusted) mutual information of one term with the label: ``per_class[j]`` records
    hold the term and class ``j``, ``class_counts[j]`` records have class ``j`` (same class order)."""
    n = float(sum(class_counts))
    x_i = float(sum(per_class))
    if n == 0:
        return math.nan
    if round(x_i) == round(n):
        return 0.0
    mi = 0.0
    emi = 0.0
    for n_ij, y_j in zip(per_class, class_counts, strict=True):
        if y_j == 0:
            continue
        y = float(y_j)
        m = min(max(n_ij / x_i, _EPSILON), 1 - _EPSILON) * x_i
        if abs(x_i * y / n - m) < min_diff_from_avg:
            continue
        mi += partial_mi(m, x_i, y, n)
        if adjusted:
            emi += partial_emi(n, x_i, y)
    return mi - emi if adjusted else mi


class TermOutnumbersRecords(ValueError):
    """A term occurs more often than there are records with a class: a list repeats it within
    records. Mutual information reads a record's list as a set of terms, and TF Transform
    refuses such a term as well (its ``x_i > n``)."""

    def __init__(self, term: str, occurrences: int, records: int, feature: str | None = None):
        who = f"feature {feature!r} (label_vocabulary): " if feature else ""
        super().__init__(
            f"{who}term {term!r} occurs {occurrences:,} times in the {records:,} training records with a class: "
            f"its list repeats terms within records, and mutual information (as TF Transform's) reads a record's "
            f"list as a set of terms; give each record distinct terms, or use transform: vocabulary")
        self.term, self.occurrences, self.records = term, occurrences, records


class LabelTermCounts:
    """Occurrences per (class, term) and records per class; mergeable exactly (integer counts).

    ``by_class[c][t]``: occurrences of term ``t`` in the records of class ``c``
    (a scalar's once per record, a list's once per item, as TF Transform counts
    them); ``classes[c]``: records of class ``c``.
    """

    def __init__(self) -> None:
        self.by_class: dict[str, Counter] = {}
        self.classes: Counter = Counter()

    def add(self, terms: Sequence[list[str] | str | None], classes: Sequence[str | None]) -> None:
        """One record per row: its term (a scalar's; a list's terms, each occurrence counted;
        None: none) and its class (None: no class, the record is not counted)."""
        for t, c in zip(terms, classes, strict=True):
            if c is None:
                continue
            self.classes[c] += 1
            if t is None:
                continue
            counter = self.by_class.setdefault(c, Counter())
            if isinstance(t, str):
                counter[t] += 1
            else:
                counter.update(t)

    def add_codes(self, terms: Sequence[str], codes: np.ndarray, classes: Sequence[str | None],
                  row_of: np.ndarray | None = None) -> None:
        """``add`` of a column as term indexes: ``codes[i]`` indexes ``terms`` (-1: no term) and
        belongs to row ``row_of[i]`` (None: one code per row, a scalar's); ``classes``: one per row."""
        codes = np.asarray(codes, dtype=np.int64).reshape(-1)
        labels = np.array([c if c is not None else "" for c in classes], dtype=object)
        has = np.fromiter((c is not None for c in classes), bool, len(classes))
        if not has.any():
            return
        uniq, inv = np.unique(labels[has], return_inverse=True)
        row_class = np.full(len(classes), -1, dtype=np.int64)  # each row's index in uniq (-1: no class)
        row_class[has] = inv
        code_class = row_class if row_of is None else row_class[np.asarray(row_of, dtype=np.int64)]
        for j, c in enumerate(uniq.tolist()):
            self.classes[c] += int(np.count_nonzero(inv == j))
            mine = codes[code_class == j]
            mine = mine[mine >= 0]
            if mine.size:
                at, counts = np.unique(mine, return_counts=True)
                counter = self.by_class.setdefault(c, Counter())
                for i, k in zip(at.tolist(), counts.tolist(), strict=True):
                    counter[terms[i]] += k

    def merge(self, other: LabelTermCounts) -> LabelTermCounts:
        for c, counter in other.by_class.items():
            self.by_class.setdefault(c, Counter()).update(counter)
        self.classes.update(other.classes)
        return self

    def arrays(self) -> dict[str, tuple[list[str], np.ndarray]]:
        """Per class: its terms and their counts (``convert.term_counts.write_term_arrays``' input,
        keyed by class; a term's counts in every class land in the same partition)."""
        return {c: (list(counter), np.fromiter(counter.values(), np.int64, len(counter)))
                for c, counter in self.by_class.items()}

    def add_arrays(self, arrays: Mapping[str, tuple[list[str], np.ndarray]]) -> None:
        """Add blocks read back (``arrays``' form, e.g. one partition of several units)."""
        for c, (terms, counts) in arrays.items():
            counter = self.by_class.setdefault(c, Counter())
            for t, k in zip(terms, np.asarray(counts).tolist(), strict=True):
                counter[t] += k


def class_order(classes: Iterable[str], label_ids: Mapping[str, int] | None) -> list[str]:
    """The label's classes in class order, the order scores sum in: a class label's ids
    (``label_ids``), or integer classes by value (TF Transform's label index)."""
    classes = list(classes)
    if label_ids is not None:
        return sorted(classes, key=lambda c: label_ids.get(c, len(label_ids)))
    return sorted(classes, key=lambda c: (int(c), c))


def rank_terms(by_class: Mapping[str, Mapping[str, int]], class_counts: Mapping[str, int], order: Sequence[str], *,
               adjusted: bool, min_diff_from_avg: float | None, min_frequency: int,
               top_k: int | None) -> list[tuple[str, float]]:
    """``(term, score)`` of the terms of ``min_frequency`` occurrences or more, score descending,
    ties by term, the first ``top_k``; ``by_class`` may hold a partition of the terms only
    (``class_counts`` are the whole label's). ``order``: every class, in class order.

    Raises ``TermOutnumbersRecords`` for a term occurring more often than there are records
    with a class (TF Transform refuses it too: no mutual information is defined for it)."""
    counts = [int(class_counts.get(c, 0)) for c in order]
    n = sum(counts)
    diff = recommended_min_diff_from_avg(n) if min_diff_from_avg is None else min_diff_from_avg
    terms: set[str] = set()
    for c in order:
        terms.update(by_class.get(c, ()))
    empty: dict[str, int] = {}
    scored = []
    for t in terms:
        per = [int(by_class.get(c, empty).get(t, 0)) for c in order]
        if sum(per) > n:
            raise TermOutnumbersRecords(t, sum(per), n)
        if sum(per) >= min_frequency:
            scored.append((t, term_score(per, counts, adjusted, diff)))
    scored.sort(key=lambda ts: (-ts[1], ts[0]))
    return scored[:top_k] if top_k else scored


def merge_ranked(lists: Iterable[list[tuple[str, float]]], top_k: int | None) -> list[tuple[str, float]]:
    """The best ``top_k`` of ranked lists of disjoint terms (partitions), in the same order."""
    merged = [ts for lst in lists for ts in lst]
    merged.sort(key=lambda ts: (-ts[1], ts[0]))
    return merged[:top_k] if top_k else merged


def row_classes(parts: Sequence[PreparedPart], label: Any) -> list[str | None]:
    """Each row's class as the label part of a prepared batch gives it: a class label's
    name, or an int64 label's value as its term."""
    part = next(p for p in reversed(parts) if p.name == label.name)
    if isinstance(part, LabelTerms):
        return list(part.terms)
    col = part.columns[label.name][1]  # type: ignore[union-attr]
    return [str(v) for v in np.asarray(col).reshape(-1).tolist()]


def label_kind_problem(feature: str, label: Any) -> str | None:
    """Why ``label`` (a ``LabelConfig`` or None) cannot rank ``feature``'s terms, or None: the label
    must be a class, an int64 number or a ``transform: vocabulary`` class label."""
    if label is None:
        return (f"feature {feature!r} (label_vocabulary): the config has no label; label_vocabulary ranks terms "
                f"by their mutual information with it: add a label (int64 classes, or transform: vocabulary)")
    if getattr(label, "transform", None) == "vocabulary" or getattr(label, "dtype", None) == "int64":
        return None
    return (f"feature {feature!r} (label_vocabulary): label {label.name!r} is {label.dtype}, not a class; mutual "
            f"information needs int64 classes or a class label (transform: vocabulary); bucketize a numeric target "
            f"into a class first, or use transform: vocabulary for this feature")


class LabelVocabulary(Vocabulary):
    """``vocabulary``'s ids and preparation, its terms ranked by mutual information with the label."""

    name = "label_vocabulary"
    summary = ("category (string, int, bool; or list with max_len) -> id, terms ranked by mutual information "
               "with the label (int64 classes)")
    options = (*VOCAB_OPTIONS, *ID_LIST_OPTIONS, "mutual_information", "min_diff_from_avg")
    serving = "readers.transforms.label_vocabulary"
    label_ranked = True

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        kw.setdefault("mutual_information", "adjusted")

    def takes_term_codes(self, f: FeatureConfig) -> bool:
        return True

    def config_problems(self, f: FeatureConfig, label: Any) -> list[str]:
        problem = label_kind_problem(f.name, label)
        return [problem] if problem else []

    def rank(self, f: FeatureConfig, counts: LabelTermCounts, classes: Mapping[str, int],
             label_ids: Mapping[str, int] | None) -> list[tuple[str, float]]:
        """``f``'s ranked ``(term, score)`` from ``counts`` (every term, or one partition's) and the
        label's records per class (``classes``, all of them). Raises ``TermOutnumbersRecords``
        (naming ``f``) for a list repeating a term within records more often than there are records."""
        try:
            return rank_terms(counts.by_class, classes, class_order(classes, label_ids),
                              adjusted=f.mutual_information != "plain", min_diff_from_avg=f.min_diff_from_avg,
                              min_frequency=f.min_frequency, top_k=f.top_k)
        except TermOutnumbersRecords as e:
            raise TermOutnumbersRecords(e.term, e.occurrences, e.records, f.name) from None


TRANSFORM = LabelVocabulary()
