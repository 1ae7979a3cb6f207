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
from collections.abc import Iterable, Mapping
from typing import BinaryIO

import lz4.frame
import numpy as np

_LEN = struct.Struct("<Q")


def partition_of(term: str, partitions: int) -> int:
    """The partition of ``term``: the same in every process (``hash`` is salted per process)."""
    return zlib.crc32(term.encode("utf-8", "surrogatepass")) % partitions


def write_unit_counts(out: BinaryIO, counts: Mapping[str, Counter], partitions: int) -> None:
    """Write one unit's term counts per feature, cut into ``partitions`` blocks."""
    blocks: list[bytes] = []
    index: dict[tuple[str, int], tuple[int, int]] = {}
    offset = 0
    for name, c in counts.items():
        parts: list[list[str]] = [[] for _ in range(partitions)]
        for t in c:
            parts[partition_of(t, partitions)].append(t)
        for p, terms in enumerate(parts):
            if not terms:
                continue
            n = np.fromiter((c[t] for t in terms), dtype=np.int64, count=len(terms))
            block = lz4.frame.compress(pickle.dumps((terms, n), protocol=pickle.HIGHEST_PROTOCOL))
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
