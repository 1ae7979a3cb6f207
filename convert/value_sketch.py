"""``ValueSketch``: one feature's numeric values in one split as a mergeable
sketch (exact counts of float32 bit-pattern buckets, from which the
quantiles, histogram and drift measures of ``stats.json`` are read).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Buckets per power of two of ``ValueSketch``.
SUB_BUCKETS = 64


#: Quantiles stored with each sketch (a report's table; drift recomputes its own).
QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


#: A float32's bits shifted right by this keep its exponent and the top
#: log2(SUB_BUCKETS) bits of its mantissa: the bucket key of |x|.
_KEY_SHIFT = 23 - 6


#: Keys at and above this are infinities and NaNs (exponent 255).
_NONFINITE_KEY = 255 << 6


class StatsFormatError(ValueError):
    """A stats document is malformed, or from a newer recordprep."""


def _keys(x32: np.ndarray) -> np.ndarray:
    """Bucket key of each |value| of a float32 array (int32; 0 holds zero and subnormals)."""
    return (x32.view(np.int32) & 0x7FFFFFFF) >> _KEY_SHIFT


def _key_value(k: np.ndarray) -> np.ndarray:
    """The middle of bucket ``k`` (its representative value; 0.0 for key 0)."""
    k = np.asarray(k, dtype=np.int64)
    mid = ((k << _KEY_SHIFT) | (1 << (_KEY_SHIFT - 1))).astype(np.int32).view(np.float32).astype(np.float64)
    return np.where(k == 0, 0.0, mid)


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
        x = np.asarray(x).ravel()
        if not x.size:
            return
        with np.errstate(over="ignore", invalid="ignore"):
            x32 = x if x.dtype == np.float32 else x.astype(np.float32)  # beyond float32: inf, not bucketed
        keys = _keys(x32)
        finite = keys < _NONFINITE_KEY
        if not finite.all():
            self.nonfinite += int(x.size - np.count_nonzero(finite))
            x, x32, keys = x[finite], x32[finite], keys[finite]
            if not x.size:
                return
        mean = float(x.mean(dtype=np.float64))
        d = x.astype(np.float64) - mean
        # einsum, not d @ d: BLAS' dot may wake its thread pool, slow on a busy host
        self._merge_moments(int(x.size), mean, float(np.einsum("i,i->", d, d)), float(x.min()), float(x.max()))
        negative = x32.view(np.int32) < 0
        zero = keys == 0
        if zero.any():
            self.zero += int(np.count_nonzero(zero))
            keep = ~zero
            keys, negative = keys[keep], negative[keep]
        if negative.any():
            self.neg.add_keys(keys[negative])
            self.pos.add_keys(keys[~negative])
        else:
            self.pos.add_keys(keys)

    @classmethod
    def of_points(cls, values: np.ndarray, counts: np.ndarray) -> ValueSketch:
        """A sketch of ``counts[i]`` copies of ``values[i]`` (a transformed sketch's buckets)."""
        s = cls()
        values = np.asarray(values, dtype=np.float64)
        counts = np.asarray(counts, dtype=np.int64)
        ok = (counts > 0) & np.isfinite(values)
        values, counts = values[ok], counts[ok]
        n = int(counts.sum())
        if not n:
            return s
        mean = float((values * counts).sum() / n)
        s._merge_moments(n, mean, float((counts * (values - mean) ** 2).sum()), float(values.min()), float(values.max()))
        keys = _keys(values.astype(np.float32))
        negative = values < 0
        zero = keys == 0
        s.zero = int(counts[zero].sum())
        for dense, sel in ((s.neg, negative & ~zero), (s.pos, ~negative & ~zero)):
            if sel.any():
                lo = int(keys[sel].min())
                dense.add(lo, np.bincount(keys[sel] - lo, weights=counts[sel]).astype(np.int64))
        return s

    def mapped(self, fn: Any) -> ValueSketch:
        """The sketch of ``fn`` (vectorized, monotone or not) applied to every value,
        from the bucket representatives: moments approximate to a bucket's width."""
        values, counts = self.buckets()
        with np.errstate(all="ignore"):
            return ValueSketch.of_points(fn(values), counts)

    def _merge_moments(self, n: int, mean: float, m2: float, lo: float, hi: float) -> None:
        """Chan et al.'s parallel variance, as ``convert.analysis.NumericStats``."""
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
