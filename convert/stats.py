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
Hash and cross features have counts only: their ids are not terms.

Numbers are kept as a log-bucketed histogram (``ValueSketch``): a value's
bucket is fixed by the value alone (64 buckets per power of two, so a bucket
is at most 1/64 of its values wide), which makes sketches of any two splits,
units or outputs mergeable and comparable on any bins chosen later. Quantiles
read from it are within 1/64 of the value, relative.

Pure Python and numpy: no Beam, no TensorFlow.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from convert.config import Config, FeatureConfig
from convert.spec import short_repr
from convert.vectorize import PreparedBatch, VectorBatch

#: File beside the shards (listed in the metadata as ``stats_file``).
STATS_FILENAME = "stats.json"
#: Version of the document ``to_json`` writes; readers refuse newer ones.
STATS_VERSION = 1
#: Terms kept per feature and split in the document, most frequent first.
TOP_TERMS = 1000
#: Buckets per power of two of ``ValueSketch``.
SUB_BUCKETS = 64
#: Rejected records quoted per (field, reason) group.
EXAMPLES_PER_GROUP = 3
#: (field, reason) groups kept; the rest are summed into one "other" group.
MAX_GROUPS = 200
#: Quantiles stored with each sketch (a report's table; drift recomputes its own).
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
#: |x| below this is counted as zero (a bucket of its own).
_TINY = 2.0 ** -120
#: Offset keeping bucket keys positive: frexp exponents of float64 are >= -1073.
_EXP_OFFSET = 1100


class StatsFormatError(ValueError):
    """A stats document is malformed, or from a newer recordprep."""


# ----------------------------------------------------------------- numbers


def _keys(a: np.ndarray) -> np.ndarray:
    """Bucket key of each |value| (> 0): exponent and 1/SUB_BUCKETS of the mantissa."""
    m, e = np.frexp(a)  # a = m * 2**e, m in [0.5, 1)
    sub = ((m - 0.5) * (2 * SUB_BUCKETS)).astype(np.int64)
    return (e.astype(np.int64) + _EXP_OFFSET) * SUB_BUCKETS + np.minimum(sub, SUB_BUCKETS - 1)


def _key_value(k: np.ndarray) -> np.ndarray:
    """The middle of bucket ``k`` (its representative value)."""
    e = k // SUB_BUCKETS - _EXP_OFFSET
    sub = k % SUB_BUCKETS
    return np.ldexp(0.5 + (sub + 0.5) / (2 * SUB_BUCKETS), e)


class _Dense:
    """Counts per bucket key over a growing range ``[lo, lo + len(counts))``."""

    __slots__ = ("lo", "counts")

    def __init__(self, lo: int = 0, counts: np.ndarray | None = None):
        self.lo = lo
        self.counts = np.zeros(0, dtype=np.int64) if counts is None else counts

    def add(self, lo: int, counts: np.ndarray) -> None:
        if not counts.size:
            return
        if not self.counts.size:
            self.lo, self.counts = lo, counts.astype(np.int64, copy=True)
            return
        new_lo = min(self.lo, lo)
        new_hi = max(self.lo + self.counts.size, lo + counts.size)
        if new_lo != self.lo or new_hi != self.lo + self.counts.size:
            grown = np.zeros(new_hi - new_lo, dtype=np.int64)
            grown[self.lo - new_lo: self.lo - new_lo + self.counts.size] = self.counts
            self.lo, self.counts = new_lo, grown
        self.counts[lo - self.lo: lo - self.lo + counts.size] += counts

    def add_keys(self, keys: np.ndarray) -> None:
        if keys.size:
            lo = int(keys.min())
            self.add(lo, np.bincount(keys - lo))

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Keys with a count, and their counts."""
        nz = np.flatnonzero(self.counts)
        return nz + self.lo, self.counts[nz]

    def to_json(self) -> list[Any]:
        nz = np.flatnonzero(self.counts)
        if not nz.size:
            return [0, []]
        return [int(self.lo + nz[0]), self.counts[nz[0]: nz[-1] + 1].tolist()]

    @classmethod
    def from_json(cls, d: Any) -> _Dense:
        lo, counts = d
        return cls(int(lo), np.asarray(counts, dtype=np.int64))


class ValueSketch:
    """Mergeable summary of a set of finite numbers: count, mean, std, min,
    max, and a log-bucketed histogram (see the module docstring); values that
    are not finite are only counted (``nonfinite``)."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.zero = 0
        self.nonfinite = 0
        self.pos = _Dense()
        self.neg = _Dense()

    def add(self, x: np.ndarray) -> None:
        """Add the values of ``x`` (any shape, any float or int dtype)."""
        x = np.asarray(x, dtype=np.float64).ravel()
        if not x.size:
            return
        finite = np.isfinite(x)
        if not finite.all():
            self.nonfinite += int(x.size - np.count_nonzero(finite))
            x = x[finite]
            if not x.size:
                return
        mean = float(x.mean())
        self._merge_moments(int(x.size), mean, float(((x - mean) ** 2).sum()), float(x.min()), float(x.max()))
        a = np.abs(x)
        tiny = a < _TINY
        if tiny.any():
            self.zero += int(np.count_nonzero(tiny))
            x, a = x[~tiny], a[~tiny]
        keys = _keys(a)
        negative = x < 0
        if negative.any():
            self.neg.add_keys(keys[negative])
            self.pos.add_keys(keys[~negative])
        else:
            self.pos.add_keys(keys)

    def _merge_moments(self, n: int, mean: float, m2: float, lo: float, hi: float) -> None:
        """Chan et al.'s parallel variance, as ``convert.vectorize.NumericStats``."""
        if n == 0:
            return
        total = self.count + n
        d = mean - self.mean
        self.mean += d * n / total
        self.m2 += m2 + d * d * self.count * n / total
        self.count = total
        self.min = min(self.min, lo)
        self.max = max(self.max, hi)

    def merge(self, o: ValueSketch) -> None:
        self._merge_moments(o.count, o.mean, o.m2, o.min, o.max)
        self.zero += o.zero
        self.nonfinite += o.nonfinite
        self.pos.add(o.pos.lo, o.pos.counts)
        self.neg.add(o.neg.lo, o.neg.counts)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    def buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """Representative values (ascending) and their counts, clamped to [min, max]."""
        nk, nc = self.neg.items()
        pk, pc = self.pos.items()
        values = np.concatenate([-_key_value(nk)[::-1], np.zeros(1 if self.zero else 0), _key_value(pk)])
        counts = np.concatenate([nc[::-1], np.array([self.zero] if self.zero else [], dtype=np.int64), pc])
        if values.size:
            values = np.clip(values, self.min, self.max)
        return values, counts

    def quantiles(self, qs: Sequence[float]) -> list[float | None]:
        """The ``qs`` quantiles (0..1), each within a bucket's width; exact at 0 and 1."""
        if not self.count:
            return [None] * len(qs)
        values, counts = self.buckets()
        cum = np.cumsum(counts)
        out: list[float | None] = []
        for q in qs:
            if q <= 0:
                out.append(self.min)
            elif q >= 1:
                out.append(self.max)
            else:
                i = int(np.searchsorted(cum, q * cum[-1], side="left"))
                out.append(float(values[min(i, values.size - 1)]))
        return out

    def histogram(self, edges: Sequence[float]) -> list[int]:
        """Counts in the bins ``[edges[i], edges[i + 1])`` (the last bin closed),
        each bucket counted in the bin of its representative value."""
        values, counts = self.buckets()
        e = np.asarray(edges, dtype=np.float64)
        idx = np.searchsorted(e, values, side="right") - 1
        idx[values == e[-1]] = e.size - 2
        ok = (idx >= 0) & (idx < e.size - 1)
        return np.bincount(idx[ok], weights=counts[ok], minlength=e.size - 1).astype(np.int64).tolist()

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean if self.count else None, "std": self.std if self.count else None,
                "min": self.min if self.count else None, "max": self.max if self.count else None,
                "m2": self.m2, "zero": self.zero, "nonfinite": self.nonfinite,
                "pos": self.pos.to_json(), "neg": self.neg.to_json(),
                "quantiles": dict(zip((f"{q:g}" for q in QUANTILES), self.quantiles(QUANTILES), strict=True))}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ValueSketch:
        s = cls()
        s.count = int(d["count"])
        if s.count:
            s.mean, s.min, s.max = float(d["mean"]), float(d["min"]), float(d["max"])
        s.m2, s.zero, s.nonfinite = float(d["m2"]), int(d["zero"]), int(d["nonfinite"])
        s.pos, s.neg = _Dense.from_json(d["pos"]), _Dense.from_json(d["neg"])
        return s


# ---------------------------------------------------------------- features


def _kind(f: FeatureConfig) -> str:
    """How a feature is summarized: numeric, categorical (terms), timestamp, hash or bytes."""
    if f.transform == "bucketize" or f.is_numeric:
        return "numeric"
    if f.needs_vocabulary:
        return "categorical"
    return {"timestamp": "timestamp", "bytes": "bytes"}.get(f.transform, "hash")


class _FeatureSplit:
    """One feature's accumulators for one split."""

    __slots__ = ("missing", "before", "after", "lengths", "terms", "items", "oov")

    def __init__(self, kind: str, multi: bool) -> None:
        self.missing: int | None = 0
        self.before = ValueSketch() if kind == "numeric" else None
        self.after = ValueSketch() if kind in ("numeric", "timestamp") else None
        self.lengths: np.ndarray | None = np.zeros(0, dtype=np.int64) if multi else None
        self.terms: Counter | None = Counter() if kind in ("categorical", "label") else None
        self.items = 0
        self.oov = 0

    def merge(self, o: _FeatureSplit) -> None:
        self.missing = None if self.missing is None or o.missing is None else self.missing + o.missing
        for a, b in ((self.before, o.before), (self.after, o.after)):
            if a is not None and b is not None:
                a.merge(b)
        if self.lengths is not None and o.lengths is not None:
            self.lengths = _add_counts(self.lengths, o.lengths)
        if self.terms is not None and o.terms is not None:
            self.terms.update(o.terms)
        self.items += o.items
        self.oov += o.oov


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
            self.kinds[lab.name] = "label" if lab.transform == "vocabulary" else "numeric"
        self.feature: dict[str, list[_FeatureSplit]] = {
            name: [_FeatureSplit(kind, name in self._features and (self._features[name].multi_valued
                                                                  or self._features[name].transform == "text"))
                   for _ in self.splits]
            for name, kind in self.kinds.items()}
        for name, f in self._features.items():
            if f.is_numeric and f.transform != "bucketize" and not f.needs_stats and not f.missing_indicator:
                for fs in self.feature[name]:
                    fs.missing = None  # finished without raw values: null and fill look alike
        self.rejected = 0
        self.groups: dict[tuple[str, str], dict[str, Any]] = {}
        #: Per vocabulary feature: the unit's terms by index, and counts per (index, split).
        self._pending: dict[str, tuple[list[str], np.ndarray]] = {}

    # Unit accumulators travel to the commit step: flush the per-unit term tables first.
    def __getstate__(self) -> dict[str, Any]:
        self.flush()
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
        cols = vb.columns
        for name, kind, payload in batch.parts:
            f = self._features.get(name)
            acc = self.feature[name]
            if kind == "vocab":  # term indexes advance even when every row was rejected
                self._vocab(f, acc, payload, cols, keep, split_k, masks)
            elif not split_k.size:
                continue
            elif kind == "num":
                self._numeric(f, acc, payload, cols, keep, masks)
            elif kind == "label":
                terms = payload if keep.all() else [t for t, k in zip(payload, keep.tolist(), strict=True) if k]
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

    def _numeric(self, f: Any, acc: list[_FeatureSplit], payload: tuple, cols: dict, keep: np.ndarray,
                 masks: list[np.ndarray | None]) -> None:
        out, present, lens, missing_row = payload
        if not keep.all():
            out, present, lens, missing_row = out[keep], present[keep], lens[keep], missing_row[keep]
        after = cols[f.name][1]
        for s, m in enumerate(masks):
            if m is None:
                continue
            a = acc[s]
            a.missing += int(np.count_nonzero(missing_row[m]))  # type: ignore[operator]
            a.before.add(out[m][present[m]])  # type: ignore[union-attr]
            a.after.add(after[m] if not f.multi_valued else after[m][present[m]])  # type: ignore[union-attr]

    def _vocab(self, f: FeatureConfig, acc: list[_FeatureSplit], payload: tuple, cols: dict, keep: np.ndarray,
               split_k: np.ndarray, masks: list[np.ndarray | None]) -> None:
        first, new_terms, codes, lens = payload
        if not keep.all():
            codes = codes[keep]
            lens = lens[keep] if lens is not None else None
        n_split = len(self.splits)
        terms, counts = self._sync_terms(f.name, first, new_terms)
        valid = codes >= 0
        flat = codes[valid].astype(np.int64)
        if n_split > 1:
            flat = flat * n_split + np.broadcast_to(split_k[:, None], codes.shape)[valid]
        if flat.size:
            counts += np.bincount(flat, minlength=counts.size)
        ids = cols[f.name][1]
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
        """Features the preparer finished (no analysis): read their written columns."""
        col = cols[f.name][1]
        miss_col = cols.get(f"{f.name}_missing")
        len_col = cols.get(f"{f.name}_len")
        for s, m in enumerate(masks):
            if m is None:
                continue
            a = acc[s]
            if f.transform == "bytes":
                sel = col if len(masks) == 1 else [v for v, k in zip(col, m.tolist(), strict=True) if k]
                a.missing += sum(1 for v in sel if not v)  # type: ignore[operator]
                continue
            if f.transform in ("hash", "cross"):
                present = col[m] != 0
                a.items += int(np.count_nonzero(present))
                a.missing += int(np.count_nonzero(~present.any(axis=1)))  # type: ignore[operator]
            elif f.transform == "timestamp":
                missing = (miss_col[1][m, 0] != 0) if miss_col is not None else (col[m, 0] == 0)
                a.missing += int(np.count_nonzero(missing))  # type: ignore[operator]
                a.after.add(col[m, 0][~missing])  # type: ignore[union-attr]
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
                if f.transform == "identity":
                    a.before.add(x)  # type: ignore[union-attr]
                elif f.transform == "log1p":  # log1p is invertible: the input, to float32 precision
                    a.before.add(np.expm1(x.astype(np.float64)))  # type: ignore[union-attr]
            if len_col is not None:
                a.lengths = _add_counts(a.lengths, np.bincount(len_col[1][m, 0]))  # type: ignore[arg-type]

    def _sync_terms(self, name: str, first: int, new_terms: list[str]) -> tuple[list[str], np.ndarray]:
        """The unit's terms and counts per (term index, split); see ``Analyzer._sync_terms``."""
        if first == 0:
            self._flush(name)
        terms, counts = self._pending.get(name) or ([], np.zeros(0, dtype=np.int64))
        if len(terms) != first:
            raise ValueError(f"feature {name!r}: batches out of order (term index {first}, expected {len(terms)})")
        terms.extend(new_terms)
        need = len(terms) * len(self.splits)
        if counts.size < need:
            counts = np.concatenate([counts, np.zeros(max(need, 2 * counts.size) - counts.size, dtype=np.int64)])
        self._pending[name] = (terms, counts)
        return terms, counts

    def flush(self) -> None:
        for name in list(self._pending):
            self._flush(name)

    def _flush(self, name: str) -> None:
        pending = self._pending.pop(name, None)
        if pending is None:
            return
        terms, counts = pending
        n_split = len(self.splits)
        for s in range(n_split):
            c = counts[s: len(terms) * n_split: n_split]
            nz = np.flatnonzero(c)
            if nz.size:
                acc = self.feature[name][s].terms
                assert acc is not None
                acc.update(dict(zip([terms[i] for i in nz.tolist()], c[nz].tolist(), strict=True)))

    # -- rejections
    def add_errors(self, lines: Sequence[bytes]) -> None:
        """Group error-output lines (``pipelines.transforms._error_line``) by field and reason."""
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

    def to_json(self) -> dict[str, Any]:
        """The ``stats.json`` document (``features`` and ``rejections``; the commit adds splits and files)."""
        self.flush()
        features = {}
        specs = {f.name: f for f in self.config.features}
        for name, accs in self.feature.items():
            f = specs.get(name)
            per = {}
            for s, a in zip(self.splits, accs, strict=True):
                d: dict[str, Any] = {"rows": self.rows[self.splits.index(s)], "missing": a.missing}
                if a.before is not None and f is not None:
                    d["before"] = a.before.to_json() if (f is None or f.transform != "clip") else None
                if a.after is not None:
                    d["after"] = a.after.to_json()
                if a.lengths is not None:
                    d["lengths"] = a.lengths.tolist()
                if a.terms is not None:
                    top = sorted(a.terms.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_TERMS]
                    d.update(terms=[[t, c] for t, c in top], distinct=len(a.terms),
                             items=a.items if f is not None else sum(a.terms.values()))
                    if f is not None:
                        d["oov"] = a.oov
                elif f is not None and f.transform in ("hash", "cross"):
                    d["items"] = a.items
                per[s] = d
            features[name] = {"kind": self.kinds[name], "transform": f.transform if f is not None else "label",
                              "source": f.source if f is not None else (self.config.label.source if self.config.label else None),
                              "splits": per}
        groups = sorted(({"field": k[0], "reason": k[1], **g} for k, g in self.groups.items()),
                        key=lambda g: (-g["count"], g["field"], g["reason"]))
        return {"version": STATS_VERSION, "features": features,
                "rejections": {"count": self.rejected, "groups": groups}}


def load_stats(doc: Any, where: str = STATS_FILENAME) -> dict[str, Any]:
    """Check a loaded ``stats.json`` document's shape; return it. Raises StatsFormatError."""
    if not isinstance(doc, dict) or not isinstance(doc.get("features"), dict):
        raise StatsFormatError(f"{where}: not a recordprep statistics document; re-run the conversion")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > STATS_VERSION:
        raise StatsFormatError(f"{where}: statistics version {short_repr(version)} is newer than this recordprep "
                               f"reads ({STATS_VERSION}); upgrade recordprep")
    for name, feat in doc["features"].items():
        if not isinstance(feat, dict) or not isinstance(feat.get("splits"), dict):
            raise StatsFormatError(f"{where}: feature {short_repr(name)} has no per-split statistics; re-run the conversion")
    return doc
