"""Vocabulary term counts partitioned by term, so that no process holds them all.

Each unit's counts are written to one file, cut into ``partitions`` blocks by
a stable hash of the term (``partition_of``); a partition's merge reads its
block of every unit file, so it holds about ``1 / partitions`` of the distinct
terms. A term's whole count lands in one partition, so the vocabulary is the
merge of each partition's best ``top_k`` (``top_terms``, ``merge_top``) and
equals ``Analyzer.result``'s: count descending, ties by term ascending,
``min_frequency`` filtered, cut at ``top_k``.

File layout: an 8-byte little-endian index length, the pickled index
``{(feature, partition): (offset, length)}`` (offsets after the index), then
the LZ4-compressed pickled ``(terms, counts)`` blocks.
"""

from __future__ import annotations

import pickle
import struct
import zlib
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import lz4.frame
import numpy as np

_LEN = struct.Struct("<Q")


def partition_of(term: str, partitions: int) -> int:
    """The partition of ``term``: the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(term.encode("utf-8", "surrogatepass")) % partitions


def write_unit_counts(out: BinaryIO, counts: Mapping[str, Counter], partitions: int) -> None:
    """Write one unit's term counts per feature, cut into ``partitions`` blocks."""
    write_term_arrays(out, {name: (list(c), np.fromiter(c.values(), dtype=np.int64, count=len(c)))
                            for name, c in counts.items()}, partitions)


def write_term_arrays(out: BinaryIO, arrays: Mapping[Hashable, tuple[list[str], np.ndarray]], partitions: int) -> None:
    """Write distinct terms and their counts per key (a feature, or a feature and split),
    cut into ``partitions`` blocks."""
    blocks: list[bytes] = []
    index: dict[tuple[Hashable, int], tuple[int, int]] = {}
    offset = 0
    for name, (terms, counts) in arrays.items():
        where = np.fromiter((partition_of(t, partitions) for t in terms), dtype=np.int64, count=len(terms))
        counts = np.asarray(counts, dtype=np.int64)
        for p in range(partitions):
            at = np.flatnonzero(where == p)
            if not at.size:
                continue
            part = ([terms[i] for i in at.tolist()], counts[at])
            block = lz4.frame.compress(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
            index[(name, p)] = (offset, len(block))
            blocks.append(block)
            offset += len(block)
    head = pickle.dumps(index, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(_LEN.pack(len(head)) + head)
    for block in blocks:
        out.write(block)


def read_partition(f: BinaryIO, name: str, partition: int) -> tuple[list[str], np.ndarray]:
    """One feature's terms and counts of one partition from a file of ``write_unit_counts``."""
    (n,) = _LEN.unpack(f.read(_LEN.size))
    index = pickle.loads(f.read(n))
    where = index.get((name, partition))
    if where is None:
        return [], np.zeros(0, dtype=np.int64)
    f.seek(_LEN.size + n + where[0])
    return pickle.loads(lz4.frame.decompress(f.read(where[1])))


def read_partitions(f: BinaryIO, partition: int) -> dict[Any, tuple[list[str], np.ndarray]]:
    """Every key's terms and counts of one partition from a file of ``write_term_arrays``."""
    (n,) = _LEN.unpack(f.read(_LEN.size))
    index = pickle.loads(f.read(n))
    out = {}
    for (name, p), (offset, length) in sorted(index.items(), key=lambda kv: kv[1][0]):
        if p == partition:
            f.seek(_LEN.size + n + offset)
            out[name] = pickle.loads(lz4.frame.decompress(f.read(length)))
    return out


def add_counts(total: Counter, terms: list[str], counts: np.ndarray) -> None:
    """Add one block's counts to ``total``."""
    if not total:
        total.update(dict(zip(terms, counts.tolist(), strict=True)))
        return
    for t, k in zip(terms, counts.tolist(), strict=True):
        total[t] += k


def top_terms(counts: Counter, min_frequency: int, top_k: int | None) -> list[tuple[str, int]]:
    """``(term, count)`` with count >= ``min_frequency``, count descending, ties by
    term, the first ``top_k`` (all without it): ``Analyzer.result``'s order."""
    terms = [t for t, n in counts.items() if n >= min_frequency]
    terms.sort()
    terms.sort(key=counts.__getitem__, reverse=True)
    return [(t, counts[t]) for t in (terms[:top_k] if top_k else terms)]


def merge_top(lists: Iterable[list[tuple[str, int]]], top_k: int | None) -> list[tuple[str, int]]:
    """The best ``top_k`` of ranked lists of distinct terms, in the same order."""
    merged = [tc for lst in lists for tc in lst]
    merged.sort(key=lambda tc: (-tc[1], tc[0]))
    return merged[:top_k] if top_k else merged


def top_counted(terms: list[str], counts: np.ndarray, k: int) -> list[list[Any]]:
    """``[term, count]`` of the ``k`` most frequent of distinct ``terms``, ties in term
    order: only the terms counted at least as often as the ``k``-th are sorted."""
    cand: Any = range(len(terms))
    if len(terms) > k:
        kth = np.partition(counts, counts.size - k)[counts.size - k]
        cand = np.flatnonzero(counts >= kth).tolist()
    top = sorted(zip([terms[i] for i in cand], counts[cand].tolist(), strict=True), key=lambda kv: (-kv[1], kv[0]))
    return [[t, c] for t, c in top[:k]]


@dataclass
class TermSummary:
    """What the statistics document keeps of a feature's term counts in one split: the
    ``k`` most frequent terms (``top_counted``), the distinct terms, the items
    (counts' sum) and the terms counted once. Summaries of disjoint sets of terms
    (partitions) merge exactly: a term's whole count is in one of them."""

    top: list[list[Any]]
    distinct: int
    total: int
    once: int

    @classmethod
    def of(cls, terms: list[str], counts: np.ndarray, k: int) -> TermSummary:
        counts = np.asarray(counts, dtype=np.int64)
        return cls(top_counted(terms, counts, k), len(terms), int(counts.sum()), int((counts == 1).sum()))

    def merge(self, o: TermSummary, k: int) -> TermSummary:
        """The summary of both sets of terms (disjoint)."""
        top = sorted(self.top + o.top, key=lambda tc: (-tc[1], tc[0]))[:k]
        return TermSummary(top, self.distinct + o.distinct, self.total + o.total, self.once + o.once)

    def summary(self) -> TermSummary:
        return self
