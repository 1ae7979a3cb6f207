"""Per-split statistics of what a conversion writes: what ``recordprep report``
and the drift checks (``convert.drift``) read, so neither opens a shard.

The convert pass feeds every finished batch to a ``StatsAccumulator``
(``add``: the prepared batch, its finished columns and each row's split) and
every error-output line to ``add_errors``; work units' accumulators merge
(``merge``) and ``to_json`` gives the document stored beside the shards as
``stats.json``. Unlike the analysis (training split only), the statistics
cover every split, and only the records written (a rejected record is in the
rejection groups instead).

Per feature and split: ``rows`` and ``missing`` rows (``None`` where the
written columns cannot tell: a numeric feature finished without its raw values
and without ``missing_indicator``), numbers as a ``ValueSketch`` ``before``
and ``after`` the transform, list lengths, the most frequent terms with the
count of every item, distinct terms and out-of-vocabulary items (vocabulary
and text features; text counts the tokens it writes, the first ``max_len``).
Hash and cross features have no terms (their ids are not terms): their
``items`` (every id written, every position of a multi-valued one) and the
number of their ``buckets`` the split's ids used (``used_buckets``, exact: a
bitmap of the ids seen, ORed on merging; ``None`` above
``MAX_COUNTED_BUCKETS``, see docs/data-report.md#hash-buckets).

Numbers are kept as a log-bucketed histogram (``ValueSketch``: 64 buckets
per power of two, from the float32 exponent and the top 6 mantissa bits):
a bucket is fixed by the value alone, so sketches of any splits, units or
outputs merge and compare on bins chosen later, and quantiles read from one
are within 1/64 of the value, relative. One side, ``before`` or ``after``, is
gathered; ``to_json`` derives the other (see docs/data-report.md#number-sketches).

Pure Python and numpy: no Beam, no TensorFlow.
"""

from __future__ import annotations

import copy
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from convert.analysis import PendingTermCounts
from convert.columns import LabelTerms, Numbers, TermIndexes
from convert.config import Config, FeatureConfig
from convert.prepare import PreparedBatch
from convert.spec import short_repr
from convert.stats_checks import problems_message, stats_problems
from convert.term_counts import TermSummary
from convert.transforms import transform_of
from convert.value_sketch import StatsFormatError, ValueSketch
from convert.vectorize import VectorBatch

#: File beside the shards (listed in the metadata as ``stats_file``).
STATS_FILENAME = "stats.json"
#: Version of the document ``to_json`` writes; readers refuse newer ones.
STATS_VERSION = 1
#: Terms kept per feature and split in the document, most frequent first.
TOP_TERMS = 1000
#: Rejected records quoted per (field, reason) group.
EXAMPLES_PER_GROUP = 3
#: (field, reason) groups kept; the rest are summed into one "other" group.
MAX_GROUPS = 200
#: ``hash``/``cross`` features with at most this many buckets have their used buckets counted:
#: a bitmap of ``buckets`` bits (2 MiB at most) per feature and split, in each work unit's
#: accumulator and once per feature and split where the units merge. Above it (``buckets`` may
#: reach ``config_model.MAX_HASH_BUCKETS``) ``used_buckets`` is ``None``: not counted.
MAX_COUNTED_BUCKETS = 1 << 24


# ---------------------------------------------------------------- features


def _kind(f: FeatureConfig) -> str:
    """How a feature is summarized (``Transform.stats_kind``): numeric, categorical (terms),
    timestamp, hash, bytes, or other (any other transform: its written numbers, as written)."""
    return transform_of(f).stats_kind


class _FeatureSplit:
    """One feature's accumulators for one split."""

    __slots__ = ("missing", "before", "after", "lengths", "terms", "items", "oov", "used")

    def __init__(self, kind: str, multi: bool, raw: bool = False, buckets: int = 0) -> None:
        self.missing: int | None = 0
        #: One sketch: of the raw values (``raw``: the prepared batch has them), else of the written ones.
        self.before = ValueSketch() if kind == "numeric" and raw else None
        self.after = ValueSketch() if kind in ("numeric", "timestamp", "other") and not raw else None
        self.lengths: np.ndarray | None = np.zeros(0, dtype=np.int64) if multi else None
        #: A summary (``TermSummary``) where the counts were merged per partition of the terms.
        self.terms: TermCounts | TermSummary | None = TermCounts() if kind in ("categorical", "label") else None
        self.items = 0
        self.oov = 0
        #: ``hash``/``cross``: the ids seen, where ``buckets`` is counted (``MAX_COUNTED_BUCKETS``).
        self.used = _UsedBuckets(buckets) if kind == "hash" and 0 < buckets <= MAX_COUNTED_BUCKETS else None

    def merge(self, o: _FeatureSplit) -> None:
        self.missing = None if self.missing is None or o.missing is None else self.missing + o.missing
        for a, b in ((self.before, o.before), (self.after, o.after)):
            if a is not None and b is not None:
                a.merge(b)
        if self.lengths is not None and o.lengths is not None:
            self.lengths = _add_counts(self.lengths, o.lengths)
        if self.terms is not None and o.terms is not None:
            self.terms.merge(o.terms)  # type: ignore[arg-type]
        self.items += o.items
        self.oov += o.oov
        if self.used is not None and o.used is not None:
            self.used.merge(o.used)


#: ``_UsedBuckets.add`` marks a batch's ids in a mask of every bucket where there are at most
#: this many buckets per id (zeroing and packing the mask beats sorting the ids), else sorts them.
_MASK_IDS_PER_BUCKET = 64


class _UsedBuckets:
    """The hash ids ``1..buckets`` seen: a packed bitmap (bit ``id - 1``, most significant
    first as ``np.packbits``), ``ceil(buckets / 8)`` bytes allocated at the first id. Merging
    ORs the bitmaps: exact, and the same in any order. Pickled zlib-compressed (a unit's
    bitmap is mostly zeros where its ids are few)."""

    __slots__ = ("buckets", "bits")

    def __init__(self, buckets: int) -> None:
        self.buckets = buckets
        self.bits: np.ndarray | None = None

    def add(self, ids: np.ndarray) -> None:
        """Mark ``ids`` (each in ``1..buckets``) used."""
        if not ids.size:
            return
        if self.bits is None:
            self.bits = np.zeros((self.buckets + 7) // 8, dtype=np.uint8)
        if self.buckets <= _MASK_IDS_PER_BUCKET * ids.size:  # a mask of every bucket: no sort
            seen = np.zeros(self.bits.size * 8, dtype=bool)
            seen[ids.ravel().astype(np.int64) - 1] = True
            np.bitwise_or(self.bits, np.packbits(seen), out=self.bits)
            return
        # Sorted, so each byte's bits are adjacent: OR-reduced per byte, one write per byte
        # (``np.unique`` and ``bitwise_or.at`` cost several times this sort).
        i = np.sort(ids.ravel().astype(np.int64)) - 1
        byte = i >> 3
        first = np.flatnonzero(np.concatenate(([True], byte[1:] != byte[:-1])))
        self.bits[byte[first]] |= np.bitwise_or.reduceat((128 >> (i & 7)).astype(np.uint8), first)

    def merge(self, o: _UsedBuckets) -> None:
        if o.bits is None:
            return
        if self.bits is None:
            self.bits = o.bits.copy()
        else:
            np.bitwise_or(self.bits, o.bits, out=self.bits)

    def count(self) -> int:
        """How many buckets were used."""
        return 0 if self.bits is None else int(np.bitwise_count(self.bits).sum())

    def __getstate__(self) -> tuple[int, bytes | None]:
        return self.buckets, None if self.bits is None else zlib.compress(self.bits.tobytes(), 1)

    def __setstate__(self, state: tuple[int, bytes | None]) -> None:
        self.buckets, packed = state
        self.bits = None if packed is None else np.frombuffer(zlib.decompress(packed), dtype=np.uint8).copy()


class _Ids(dict):
    """term -> dense id; a term missing is given the next id (as the preparer's term indexes)."""

    def __missing__(self, term: str) -> int:
        i = self[term] = len(self)
        return i


class TermCounts:
    """A feature's count of each term in one split.

    Counts are added a chunk at a time (``add``: distinct terms and their
    counts, a unit's or a batch's): the first chunk is kept as it is, later
    ones are numbered through a term -> id dict (one C-level lookup per
    term; a new term costs a ``__missing__`` call) and added into an array,
    instead of a dict update per term and chunk. Pickled packed (``_Terms``):
    that is how a worker's merged statistics (``StatsMerger``) travel to the
    commit step; an unpickled one stays packed until it is read or added
    to, and merging it into another reads it without unpacking it for good."""

    __slots__ = ("_terms", "_ids", "_counts", "_packed")

    def __init__(self) -> None:
        self._terms: list[str] = []  # the first chunk's terms (no ``_ids`` yet)
        self._ids: _Ids | None = None
        self._counts = np.zeros(0, dtype=np.int64)  # by id; may run past the terms (grows by doubling)
        self._packed: _Terms | None = None  # what pickling gave or unpickling took, until the counts change

    def add(self, terms: list[str], counts: np.ndarray) -> None:
        """Count ``counts[i]`` (positive) more of ``terms[i]``; the terms of one call are distinct."""
        if not terms:
            return
        self._unpack()
        self._packed = None
        counts = np.asarray(counts, dtype=np.int64)
        if self._ids is None and not self._terms:
            self._terms, self._counts = list(terms), counts.copy()
            return
        if self._ids is None:
            self._ids = _Ids(zip(self._terms, range(len(self._terms)), strict=True))
            self._terms = []
        ids = self._ids
        at = np.fromiter(map(ids.__getitem__, terms), dtype=np.intp, count=len(terms))
        if self._counts.size < len(ids):
            grown = np.zeros(max(len(ids), 2 * self._counts.size), dtype=np.int64)
            grown[: self._counts.size] = self._counts
            self._counts = grown
        np.add.at(self._counts, at, counts)

    def update(self, items: Iterable[str]) -> None:
        """Count each of ``items`` once (as ``Counter.update``)."""
        c = Counter(items)
        self.add(list(c), np.fromiter(c.values(), dtype=np.int64, count=len(c)))

    def merge(self, o: TermCounts) -> None:
        self.add(*(o._packed.arrays() if o._packed is not None and o._empty() else o.summed()))

    def _empty(self) -> bool:
        return self._ids is None and not self._terms

    def _unpack(self) -> None:
        if self._packed is not None and self._empty():
            self._terms, self._counts = self._packed.arrays()

    def summed(self) -> tuple[list[str], np.ndarray]:
        """The distinct terms (in the order first added) and the total count of each."""
        self._unpack()
        if self._ids is None:
            return self._terms, self._counts
        return list(self._ids), self._counts[: len(self._ids)]

    def as_dict(self) -> dict[str, int]:
        terms, counts = self.summed()
        return dict(zip(terms, counts.tolist(), strict=True))

    def summary(self) -> TermSummary:
        """What the document keeps of these counts (``TOP_TERMS`` terms)."""
        return TermSummary.of(*self.summed(), TOP_TERMS)

    def __getstate__(self) -> _Terms:
        if self._packed is None:  # a unit's result may be pickled more than once
            self._packed = _Terms(*self.summed())
        return self._packed

    def __setstate__(self, packed: _Terms) -> None:
        self._terms, self._ids, self._counts, self._packed = [], None, np.zeros(0, dtype=np.int64), packed


class _Terms:
    """Term counts packed for the trip to the commit step: the counts in the
    narrowest unsigned type that holds them, then the terms' UTF-8 joined by
    NUL (or, where a term holds a NUL, preceded by their lengths), as one
    zlib-compressed buffer. The commit step holds every unit's accumulator,
    and Beam keeps the units' results encoded on the way there (see
    docs/benchmarks.md for what the packing saves); ``arrays`` gives the
    exact terms and counts back."""

    __slots__ = ("packed", "n", "lens_dtype", "counts_dtype")

    def __init__(self, terms: list[str], counts: np.ndarray):
        n = self.n = len(terms)
        counts = np.asarray(counts, dtype=np.int64)
        counts_dt = _narrowest(counts)
        joined = "\x00".join(terms)
        if n and joined.count("\x00") == n - 1:  # no term holds a NUL: split on it
            lens = b""
            self.lens_dtype = ""
            blob = joined.encode("utf-8", "surrogatepass")
        else:
            encoded = [t.encode("utf-8", "surrogatepass") for t in terms]
            lens_a = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
            lens_dt = _narrowest(lens_a)
            self.lens_dtype = lens_dt.str
            lens = lens_a.astype(lens_dt).tobytes()
            blob = b"".join(encoded)
        self.counts_dtype = counts_dt.str
        self.packed = zlib.compress(counts.astype(counts_dt).tobytes() + lens + blob, 1)  # level 1: most of the saving for little CPU

    def arrays(self) -> tuple[list[str], np.ndarray]:
        """The terms and their counts (int64), in packing order."""
        raw = zlib.decompress(self.packed)
        counts_dt, n = np.dtype(self.counts_dtype), self.n
        counts = np.frombuffer(raw, dtype=counts_dt, count=n).astype(np.int64)
        at = n * counts_dt.itemsize
        if not self.lens_dtype:
            return (raw[at:].decode("utf-8", "surrogatepass").split("\x00") if n else []), counts
        lens_dt = np.dtype(self.lens_dtype)
        lens = np.frombuffer(raw, dtype=lens_dt, count=n, offset=at).astype(np.int64)
        blob = raw[at + n * lens_dt.itemsize:]
        ends = np.cumsum(lens)
        terms = [blob[a:b].decode("utf-8", "surrogatepass") for a, b in zip((ends - lens).tolist(), ends.tolist(), strict=True)]
        return terms, counts

    def as_dict(self) -> dict[str, int]:
        terms, counts = self.arrays()
        return dict(zip(terms, counts.tolist(), strict=True))


def _narrowest(a: np.ndarray) -> np.dtype:
    """The smallest unsigned integer type holding every value of ``a`` (non-negative)."""
    top = int(a.max()) if a.size else 0
    for dt in (np.uint8, np.uint16, np.uint32, np.uint64):
        if top <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"a term count of {top} does not fit 64 bits")


def _add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.size < b.size:
        a, b = b, a
    a = a.copy()
    a[: b.size] += b
    return a


def _per_split(split: np.ndarray, n: int) -> list[np.ndarray | None]:
    """Row mask of each split (None where the split has no row)."""
    if n == 1:
        return [np.ones(split.size, dtype=bool)]
    return [m if m.any() else None for m in (split == s for s in range(n))]


#: Quoted values and numbers in a rejection reason, which vary from record to record.
_VARYING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|(?<![\w.])-?\d[\d.e+-]*")


def reason_group(reason: str) -> str:
    """A rejection reason with the values it quotes replaced by ``…``, so records
    rejected for the same cause share one group."""
    return _VARYING.sub("…", reason)


class StatsAccumulator:
    """Mergeable statistics of one conversion's written records and rejections."""

    def __init__(self, config: Config, splits: Sequence[str]):
        self.config = config
        self.splits = list(splits)
        self.rows = [0] * len(self.splits)
        self._features = {f.name: f for f in config.features}
        self.kinds = {f.name: _kind(f) for f in config.features}
        lab = config.label
        if lab is not None:
            self.kinds[lab.name] = "label" if lab.needs_vocabulary else "numeric"
        feats = self._features
        self.feature: dict[str, list[_FeatureSplit]] = {
            name: [_FeatureSplit(kind, name in feats and (feats[name].multi_valued or transform_of(feats[name]).tokens),
                                 raw=name in feats and feats[name].is_numeric and feats[name].needs_stats,
                                 buckets=(feats[name].buckets or 0) if name in feats else 0)
                   for _ in self.splits]
            for name, kind in self.kinds.items()}
        for name, f in self._features.items():
            if (self.kinds[name] == "other"
                    or (f.is_numeric and not transform_of(f).quantiles and not f.needs_stats and not f.missing_indicator)):
                for fs in self.feature[name]:
                    fs.missing = None  # finished without raw values: null and fill look alike
        self.rejected = 0
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        #: Per vocabulary feature: the unit's terms by index, and counts per (index, split).
        self._pending = PendingTermCounts(width=len(self.splits))

    def compact(self) -> StatsAccumulator:
        """Drain the pending term counts; pickling then packs them (``_Terms``) for the
        trip to the commit step, which holds every unit's accumulator."""
        self.flush()
        return self

    # Unit accumulators travel to the commit step: packed, without the per-unit term tables.
    def __getstate__(self) -> dict[str, Any]:
        self.compact()
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- records
    def add(self, batch: PreparedBatch, vb: VectorBatch, split: np.ndarray) -> None:
        """Count a finished batch: ``batch`` as prepared (all rows), ``vb`` its
        columns (kept rows), ``split`` the split index of every row."""
        keep = vb.keep
        split_k = split[keep] if split.size != int(np.count_nonzero(keep)) else split
        n_split = len(self.splits)
        masks = _per_split(split_k, n_split)
        for s, m in enumerate(masks):
            if m is not None:
                self.rows[s] += int(np.count_nonzero(m))
        cols = {**vb.unwritten, **vb.columns} if vb.unwritten else vb.columns
        for part in batch.parts:
            name = part.name
            f = self._features.get(name)
            acc = self.feature[name]
            if isinstance(part, TermIndexes):  # term indexes advance even when every row was rejected
                self._vocab(f, acc, part, cols, keep, split_k, masks)
            elif not split_k.size:
                continue
            elif isinstance(part, Numbers):
                self._numeric(f, acc, part, cols, keep, masks)
            elif isinstance(part, LabelTerms):
                terms = part.terms if keep.all() else [t for t, k in zip(part.terms, keep.tolist(), strict=True) if k]
                for s, m in enumerate(masks):
                    if m is not None:
                        c = acc[s].terms
                        assert c is not None
                        c.update(terms if n_split == 1 else [t for t, k in zip(terms, m.tolist(), strict=True) if k])
                        acc[s].items += int(np.count_nonzero(m))
            elif f is None:  # a numeric label
                col = cols[name][1]
                for s, m in enumerate(masks):
                    if m is not None:
                        acc[s].after.add(col[m])  # type: ignore[union-attr]
            else:
                self._finished(f, acc, cols, masks)

    def _numeric(self, f: Any, acc: list[_FeatureSplit], part: Numbers, cols: dict, keep: np.ndarray,
                 masks: list[np.ndarray | None]) -> None:
        out, present, lens, missing_row = part.values, part.present, part.lens, part.missing_row
        if not keep.all():
            out, present, lens, missing_row = out[keep], present[keep], lens[keep], missing_row[keep]
        for s, m in enumerate(masks):
            if m is None:
                continue
            a = acc[s]
            a.missing += int(np.count_nonzero(missing_row[m]))  # type: ignore[operator]
            a.before.add(out[m][present[m]] if len(masks) > 1 else out[present])  # type: ignore[union-attr]

    def _vocab(self, f: FeatureConfig, acc: list[_FeatureSplit], part: TermIndexes, cols: dict, keep: np.ndarray,
               split_k: np.ndarray, masks: list[np.ndarray | None]) -> None:
        first, new_terms, codes, lens = part.first, part.new_terms, part.codes, part.lens
        if not keep.all():
            codes = codes[keep]
            lens = lens[keep] if lens is not None else None
        n_split = len(self.splits)
        terms, counts = self._pending.sync(f.name, first, new_terms, self._drain)
        valid = codes >= 0
        flat = codes[valid].astype(np.int64)
        if n_split > 1:
            flat = flat * n_split + np.broadcast_to(split_k[:, None], codes.shape)[valid]
        if flat.size:
            c = np.bincount(flat)  # up to the batch's highest index, not the unit's
            counts[: c.size] += c
        ids = cols[part.ids_column][1]
        oov = (ids >= 1) & (ids <= f.num_oov_buckets)
        multi = lens is not None
        for s, m in enumerate(masks):
            if m is None:
                continue
            a = acc[s]
            a.oov += int(np.count_nonzero(oov[m]))
            a.items += int(np.count_nonzero(valid[m]))
            if multi:
                ls = np.bincount(lens[m])
                a.lengths = _add_counts(a.lengths, ls)  # type: ignore[arg-type]
                a.missing += int(ls[0]) if ls.size else 0  # type: ignore[operator]
            else:
                a.missing += int(np.count_nonzero(~valid[m, 0]))  # type: ignore[operator]

    def _finished(self, f: FeatureConfig, acc: list[_FeatureSplit], cols: dict, masks: list[np.ndarray | None]) -> None:
        """Features the preparer finished (no analysis): read their written columns (the first
        of ``Transform.outputs``: the feature's own, or a ``cyclical`` feature's first sine)."""
        col = cols[transform_of(f).outputs(f)[0]][1]
        miss_col = cols.get(f"{f.name}_missing")
        len_col = cols.get(f"{f.name}_len")
        kind = self.kinds[f.name]
        for s, m in enumerate(masks):
            if m is None:
                continue
            a = acc[s]
            if kind == "bytes":
                sel = col if len(masks) == 1 else [v for v, k in zip(col, m.tolist(), strict=True) if k]
                a.missing += sum(1 for v in sel if not v)  # type: ignore[operator]
                continue
            if kind == "hash":
                ids = col[m]
                present = ids != 0
                a.items += int(np.count_nonzero(present))
                if a.used is not None:
                    a.used.add(ids[present])
                a.missing += int(np.count_nonzero(~present.any(axis=1)))  # type: ignore[operator]
            elif kind == "timestamp":
                missing = (miss_col[1][m, 0] != 0) if miss_col is not None else (col[m, 0] == 0)
                a.missing += int(np.count_nonzero(missing))  # type: ignore[operator]
                a.after.add(col[m, 0][~missing])  # type: ignore[union-attr]
            elif kind == "other":
                if cols[f.name][0] != "string":
                    a.after.add(col[m])  # type: ignore[union-attr]
            else:  # numeric, finished at once: what is written
                x = col[m]
                if len_col is not None:
                    x = x[np.arange(x.shape[1])[None, :] < len_col[1][m]]
                if a.missing is not None and miss_col is not None:
                    missing = miss_col[1][m, 0] != 0
                    a.missing += int(np.count_nonzero(missing))
                    if len_col is None:
                        x = x[~missing]
                a.after.add(x)  # type: ignore[union-attr]
            if len_col is not None:
                a.lengths = _add_counts(a.lengths, np.bincount(len_col[1][m, 0]))  # type: ignore[arg-type]

    def flush(self) -> None:
        self._pending.drain_all(self._drain)

    def _drain(self, name: str, terms: list[str], counts: np.ndarray) -> None:
        n_split = len(self.splits)
        for s in range(n_split):
            c = counts[s: len(terms) * n_split: n_split]
            nz = np.flatnonzero(c)
            if nz.size:
                acc = self.feature[name][s].terms
                assert acc is not None
                acc.add(list(map(terms.__getitem__, nz.tolist())), c[nz])

    # -- rejections
    def add_errors(self, lines: Sequence[bytes]) -> None:
        """Group error-output lines (``pipelines.unit_input._error_line``) by field and reason."""
        for line in lines:
            self.rejected += 1
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                row = {}
            field = str(row.get("field", "?"))
            reason = str(row.get("reason", "?"))
            key = (field, reason_group(reason))
            g = self.groups.get(key)
            if g is None:
                if len(self.groups) >= MAX_GROUPS:
                    key = ("…", "other reasons")
                    g = self.groups.setdefault(key, {"count": 0, "examples": []})
                else:
                    g = self.groups[key] = {"count": 0, "examples": []}
            g["count"] += 1
            if len(g["examples"]) < EXAMPLES_PER_GROUP:
                where = {k: row[k] for k in ("file", "offset", "line", "record_in_block") if k in row}
                g["examples"].append({**where, "reason": short_repr(reason, 300),
                                      "record": short_repr(row.get("record"), 300)})

    # -- merging and the document
    def merge(self, other: StatsAccumulator) -> StatsAccumulator:
        self.flush()
        other.flush()
        for s in range(len(self.splits)):
            self.rows[s] += other.rows[s]
        for name, accs in self.feature.items():
            for a, b in zip(accs, other.feature[name], strict=True):
                a.merge(b)
        self.rejected += other.rejected
        for key, g in other.groups.items():
            mine = self.groups.get(key)
            if mine is None:
                if len(self.groups) >= MAX_GROUPS:
                    mine = self.groups.setdefault(("…", "other reasons"), {"count": 0, "examples": []})
                else:
                    self.groups[key] = {"count": g["count"], "examples": list(g["examples"])}
                    continue
            mine["count"] += g["count"]
            mine["examples"].extend(g["examples"][: EXAMPLES_PER_GROUP - len(mine["examples"])])
        return self

    def to_json(self, analysis_stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The ``stats.json`` document (``features`` and ``rejections``; the commit adds splits and files).

        ``analysis_stats``: the analysis' statistics per feature, which map a
        raw-value sketch to the written values' (``after``)."""
        self.flush()
        features = {}
        specs = {f.name: f for f in self.config.features}
        for name, accs in self.feature.items():
            f = specs.get(name)
            per = {}
            for s, a in zip(self.splits, accs, strict=True):
                d: dict[str, Any] = {"rows": self.rows[self.splits.index(s)], "missing": a.missing}
                before, after = _sides(f, a, (analysis_stats or {}).get(name))
                if f is not None and f.is_numeric:
                    d["before"] = before.to_json() if before is not None else None
                if after is not None:
                    d["after"] = after.to_json()
                if a.lengths is not None:
                    d["lengths"] = a.lengths.tolist()
                if a.terms is not None:
                    sm = a.terms.summary()
                    d.update(terms=sm.top, distinct=sm.distinct, items=a.items if f is not None else sm.total,
                             once=sm.once)  # drift: the unseen terms' expected share
                    if f is not None:
                        d["oov"] = a.oov
                elif f is not None and transform_of(f).hashed:
                    d.update(items=a.items, buckets=f.buckets,
                             used_buckets=a.used.count() if a.used is not None else None)
                per[s] = d
            features[name] = {"kind": self.kinds[name], "transform": f.transform if f is not None else "label",
                              "source": f.source if f is not None else (self.config.label.source if self.config.label else None),
                              "splits": per}
        groups = sorted(({"field": k[0], "reason": k[1], **g} for k, g in self.groups.items()),
                        key=lambda g: (-g["count"], g["field"], g["reason"]))
        return {"version": STATS_VERSION, "features": features,
                "rejections": {"count": self.rejected, "groups": groups}}


class StatsMerger:
    """Work units' statistics (``StatsAccumulator``) merged in whatever order they arrive,
    with the same result as merging them in unit order.

    Term counts are integers: they merge exactly in any order, so ``add``
    merges them at once. That is most of a merge's work (every term of every
    unit looked up), and it can then happen where the units were converted
    (a lifted combine: each worker merges its own units) instead of in the
    commit step, after every shard is written. Everything else holds
    floating-point moments, whose sums depend on the order: those parts are
    kept per unit, without their terms, and ``result`` merges them in unit
    order, so the same input always gives the same ``stats.json``.
    """

    def __init__(self, config: Config, splits: Sequence[str]):
        self.config = config
        self.splits = list(splits)
        self.terms: dict[tuple[str, int], TermCounts] = {}  # (feature, split index) -> merged counts
        self.units: dict[int, StatsAccumulator] = {}  # unit index -> its accumulator without term counts
        #: (feature, split index) -> the units' used hash buckets, ORed as they arrive (exact in any order).
        self.used: dict[tuple[str, int], _UsedBuckets] = {}
        #: (feature, split index) -> the units' term counts merged per partition, if they were spilled.
        self.term_summaries: dict[tuple[str, int], TermSummary] | None = None

    def add(self, unit: int, acc: StatsAccumulator) -> None:
        """Merge unit ``unit``'s accumulator (left unchanged; each unit once)."""
        if unit in self.units:
            raise ValueError(f"work unit {unit}'s statistics were added twice")
        acc.flush()
        rest = copy.copy(acc)
        rest.feature = {}
        for name, accs in acc.feature.items():
            kept = []
            for s, fs in enumerate(accs):
                if fs.terms is not None or fs.used is not None:
                    if fs.terms is not None:
                        self._add_terms((name, s), fs.terms)
                    if fs.used is not None:
                        self._add_used((name, s), fs.used)
                    fs = copy.copy(fs)
                    fs.terms = fs.used = None
                kept.append(fs)
            rest.feature[name] = kept
        self.units[unit] = rest

    def merge(self, other: StatsMerger) -> None:
        """Take ``other``'s units (none of them already here)."""
        twice = self.units.keys() & other.units.keys()
        if twice:
            raise ValueError(f"work unit {min(twice)}'s statistics were added twice")
        for key, terms in other.terms.items():
            self._add_terms(key, terms)
        for key, used in other.used.items():
            self._add_used(key, used)
        self.units.update(other.units)

    def _add_used(self, key: tuple[str, int], used: _UsedBuckets) -> None:
        mine = self.used.get(key)
        if mine is None:
            self.used[key] = mine = _UsedBuckets(used.buckets)
        mine.merge(used)

    def _add_terms(self, key: tuple[str, int], terms: TermCounts) -> None:
        mine = self.terms.get(key)
        if mine is None:
            self.terms[key] = mine = TermCounts()
        mine.merge(terms)

    def result(self) -> StatsAccumulator:
        """Every unit's statistics in one accumulator; the term counts are
        ``term_summaries``' where the units' counts were merged per partition
        of the terms (``pipelines.analyze.merge_stats_terms``)."""
        merged = StatsAccumulator(self.config, self.splits)
        for unit in sorted(self.units):
            merged.merge(self.units[unit])
        for (name, s), terms in self.terms.items():
            merged.feature[name][s].terms = terms
        for (name, s), used in self.used.items():
            merged.feature[name][s].used = used
        for (name, s), summary in (self.term_summaries or {}).items():
            merged.feature[name][s].terms = summary
        return merged


def _sides(f: FeatureConfig | None, a: _FeatureSplit, st: Mapping[str, Any] | None) -> tuple[ValueSketch | None, ValueSketch | None]:
    """A numeric feature's sketches before and after its transform, the one not
    gathered derived from the other (module docstring); None where unknown."""
    if f is None or not f.is_numeric:
        return None, a.after
    t = transform_of(f)
    if a.after is not None:  # gathered from the written values
        return t.before_from_after(a.after), a.after
    before = a.before
    assert before is not None
    if st is None or not before.count:
        return before, None if st is None else ValueSketch()
    return before, t.after_from_before(f, before, st)


def load_stats(doc: Any, where: str = STATS_FILENAME) -> dict[str, Any]:
    """Check a loaded ``stats.json`` document's shape and its counts (``stats_problems``);
    return it. Raises StatsFormatError naming the file, the feature and the field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("features"), dict):
        raise StatsFormatError(f"{where}: not a recordprep statistics document; re-run the conversion")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > STATS_VERSION:
        raise StatsFormatError(f"{where}: statistics version {short_repr(version)} is newer than this recordprep "
                               f"reads ({STATS_VERSION}); upgrade recordprep")
    for name, feat in doc["features"].items():
        if not isinstance(feat, dict) or not isinstance(feat.get("splits"), dict):
            raise StatsFormatError(f"{where}: feature {short_repr(name)} has no per-split statistics; re-run the conversion")
    problems = stats_problems(doc, where)
    if problems:
        raise StatsFormatError(problems_message(problems))
    return doc
