"""``zscore_per_key``: a number standardized by the mean and standard deviation of its key's
group in the training split (TF Transform's ``tft.scale_to_z_score_per_key(x, key)``).

``key`` names the source path of a categorical field (its values read as
vocabulary terms, ``convert.records.term``). The analysis keeps, per key of
the training split, the count, mean, M2, min and max of the feature's values
(``KeyedMoments``: mergeable, Chan's parallel update, merged in the same order
as every numeric statistic so the same input gives the same bits), beside the
feature's global statistics (the ``zscore`` ones).

Each record is written ``(x - mean[key]) / std[key]`` in float64, rounded once
to float32 (subnormals flushed, as ``zscore``): a key with a standard deviation
of 0 (one value, or one record) is divided by 1, as ``zscore`` and TF Transform
do. A key the training split never had, or a missing key, takes the **global**
mean and standard deviation. TF Transform instead gives such a key mean 0 and
variance 0, which writes ``x`` unscaled: a price of 900 then sits among values of
about unit size, and a model cannot tell it from an extreme z-score; the
global statistics keep it on the feature's scale. A missing value takes
``fill`` (``"mean"``, the default: its key's mean, so it is written 0.0).

The per-key statistics are held whole by every process that applies them, like
a vocabulary without ``top_k``; ``MAX_KEYS`` bounds them (a key is a category
such as a country, not an identifier).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.columns import Columns, Numbers
from convert.transforms.base import NUM_OPTIONS, Need, StandardizingTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.value_sketch import ValueSketch

#: Distinct keys of the training split a feature may have: each is a row of the statistics
#: every converter and serving layer holds (and of ``analysis.json``).
MAX_KEYS = 1_000_000
_F64_TINY = 2.2250738585072014e-308
_F32_TINY = np.float32(np.finfo(np.float32).tiny)


def _daz(x: float) -> float:
    """``convert.spec.daz``: zero of its sign below the smallest normal double (TensorFlow's kernels)."""
    return math.copysign(0.0, x) if abs(x) < _F64_TINY else x


@dataclasses.dataclass
class KeyedMoments:
    """Per key: count, mean, M2 (sum of squared deviations), min and max of the values added.

    Struct of arrays in first-seen key order (``index`` maps a key to its row).
    ``add`` folds a batch's per-key moments in with Chan's update; ``merge``
    does the same with another accumulator's, so a merge in a fixed order
    gives fixed bits. ``finish`` is independent of the keys' row order.
    """

    keys: list[str] = dataclasses.field(default_factory=list)
    count: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
    mean: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    min: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    max: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        self.index = {k: i for i, k in enumerate(self.keys)}

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("keys", "count", "mean", "m2", "min", "max")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__post_init__()

    def _rows(self, keys: Sequence[str]) -> np.ndarray:
        """Each key's row, new keys appended (with empty moments)."""
        out = np.empty(len(keys), dtype=np.int64)
        for i, k in enumerate(keys):
            j = self.index.get(k)
            if j is None:
                j = self.index[k] = len(self.keys)
                self.keys.append(k)
            out[i] = j
        grow = len(self.keys) - self.count.size
        if grow:
            self.count = np.concatenate([self.count, np.zeros(grow, np.int64)])
            self.mean = np.concatenate([self.mean, np.zeros(grow)])
            self.m2 = np.concatenate([self.m2, np.zeros(grow)])
            self.min = np.concatenate([self.min, np.full(grow, np.inf)])
            self.max = np.concatenate([self.max, np.full(grow, -np.inf)])
        return out

    def add(self, keys: Sequence[str | None], x: np.ndarray, present: np.ndarray) -> None:
        """Add one value per row: ``x[i]`` (float64) to key ``keys[i]`` where ``present[i]``
        and the key is not None (a row without a key adds to no key's moments)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        take = np.asarray(present, dtype=bool).reshape(-1) & np.fromiter((k is not None for k in keys), bool, len(keys))
        if not take.any():
            return
        rows = np.flatnonzero(take)
        uniq, inv = np.unique(np.array([keys[i] for i in rows.tolist()], dtype=object), return_inverse=True)
        vals = x[rows]
        n = np.bincount(inv, minlength=uniq.size)
        mean = np.bincount(inv, weights=vals, minlength=uniq.size) / n
        m2 = np.bincount(inv, weights=(vals - mean[inv]) ** 2, minlength=uniq.size)
        lo = np.full(uniq.size, np.inf)
        hi = np.full(uniq.size, -np.inf)
        np.minimum.at(lo, inv, vals)
        np.maximum.at(hi, inv, vals)
        self._fold(self._rows(uniq.tolist()), n, mean, m2, lo, hi)

    def _fold(self, rows: np.ndarray, n: np.ndarray, mean: np.ndarray, m2: np.ndarray,
              lo: np.ndarray, hi: np.ndarray) -> None:
        """Chan et al.'s parallel update of ``rows`` with another set's moments (``NumericStats.merge``'s)."""
        c0 = self.count[rows]
        total = c0 + n
        d = mean - self.mean[rows]
        self.mean[rows] += d * n / total
        self.m2[rows] += m2 + d * d * c0 * n / total
        self.count[rows] = total
        self.min[rows] = np.minimum(self.min[rows], lo)
        self.max[rows] = np.maximum(self.max[rows], hi)

    def merge(self, other: KeyedMoments) -> KeyedMoments:
        if other.keys:
            has = other.count > 0
            rows = self._rows([k for k, h in zip(other.keys, has.tolist(), strict=True) if h])
            self._fold(rows, other.count[has], other.mean[has], other.m2[has], other.min[has], other.max[has])
        return self

    def __len__(self) -> int:
        return len(self.keys)

    def finish(self) -> dict[str, list[Any]]:
        """The per-key statistics as the analysis records them: ``keys`` sorted, and per key
        ``count``, ``mean``, ``std`` (population, as ``zscore``'s), ``min``, ``max``."""
        order = sorted(range(len(self.keys)), key=self.keys.__getitem__)
        order = [i for i in order if self.count[i] > 0]
        cnt = self.count[order]
        std = np.sqrt(self.m2[order] / np.maximum(cnt, 1))
        return {"keys": [self.keys[i] for i in order], "count": cnt.tolist(), "mean": self.mean[order].tolist(),
                "std": std.tolist(), "min": self.min[order].tolist(), "max": self.max[order].tolist()}


def per_key_problems(name: str, per_key: Any) -> list[str]:
    """What in a feature's recorded per-key statistics the converter never writes (``finish``)."""
    if not isinstance(per_key, dict):
        return [f"per-key stats of {name!r} must be a mapping, found {type(per_key).__name__}"]
    keys = per_key.get("keys")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys) or len(set(keys)) != len(keys):
        return [f"per-key stats of {name!r}: 'keys' must be a list of distinct strings"]
    out = []
    for col in ("count", "mean", "std", "min", "max"):
        vals = per_key.get(col)
        if not isinstance(vals, list) or len(vals) != len(keys):
            out.append(f"per-key stats of {name!r}: {col!r} must be a list of one number per key")
        elif not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in vals):
            out.append(f"per-key stats of {name!r}: {col!r} holds a value that is not a finite number")
        elif col in ("count", "std") and any(v < 0 for v in vals):
            out.append(f"per-key stats of {name!r}: {col!r} holds a negative value")
    return out


@dataclasses.dataclass(frozen=True)
class KeyTable:
    """The per-key constants as the transform uses them: each key's row, and per row
    the mean and the divisor (std, 1.0 where it is 0), read as TensorFlow reads
    constants (``daz``). Row ``len(keys)`` holds the global ones: a key the
    training split lacks, or a missing key, reads it."""

    rows: Mapping[str, int]
    means: np.ndarray
    divisors: np.ndarray

    @classmethod
    def of(cls, per_key: Mapping[str, Any], global_stats: Mapping[str, Any]) -> KeyTable:
        keys = list(per_key.get("keys") or [])
        means = [_daz(float(m)) for m in per_key.get("mean") or []] + [_daz(float(global_stats.get("mean") or 0.0))]
        divisors = [_daz(float(s)) for s in per_key.get("std") or []] + [_daz(float(global_stats.get("std") or 0.0))]
        divisors = [s or 1.0 for s in divisors]
        return cls({k: i for i, k in enumerate(keys)}, np.array(means, np.float64), np.array(divisors, np.float64))

    def lookup(self, keys: Sequence[str | None]) -> np.ndarray:
        """Each row's table row: its key's, or the global row (``len(rows)``)."""
        fallback = len(self.rows)
        get = self.rows.get
        return np.fromiter((fallback if k is None else get(k, fallback) for k in keys), np.int64, len(keys))


def scale_per_key(x: np.ndarray, present: np.ndarray, rows: np.ndarray, table: KeyTable,
                  fill: float | str | None) -> np.ndarray:
    """``(b, 1)`` float32: ``(x - mean) / divisor`` of each row's table row in float64, ``x``
    where ``present`` else the fill (``"mean"``/None: that row's mean, else the number);
    inputs and results below the smallest normal read as zero of their sign (TensorFlow's kernels)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    present = np.asarray(present, dtype=bool).reshape(-1)
    with np.errstate(invalid="ignore"):
        sub = (np.abs(x) < _F64_TINY) & (x != 0)
    if sub.any():
        x = np.where(sub, np.copysign(0.0, x), x)
    mean = table.means[rows]
    filler = mean if fill in ("mean", None) else np.full(x.shape, _daz(float(fill)))
    out = (np.where(present, x, filler) - mean) / table.divisors[rows]
    with np.errstate(over="ignore"):
        x32 = out.astype(np.float32)
    tiny = np.abs(x32) < _F32_TINY
    if tiny.any():
        x32[tiny] *= 0
    return x32.reshape(-1, 1)


class ZscorePerKey(StandardizingTransform):
    name = "zscore_per_key"
    summary = "(x - mean) / std of x's key group ('key': a categorical field) in the training split"
    options = (*NUM_OPTIONS, "key")
    serving = "readers.transforms.zscore_per_key"
    per_key = True
    prepared_as = "keyed_numbers"

    def __init__(self) -> None:
        #: The last analyses' key tables, by the identity of their per-key statistics.
        self._tables: dict[int, tuple[Any, KeyTable]] = {}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        super().complete(kw, need)
        if not kw.get("key"):
            need("transform 'zscore_per_key' needs 'key': the dotted path of the categorical field whose groups "
                 "x is standardized in (e.g. key: country)")

    def span(self, stats: Mapping[str, Any]) -> tuple[float, float] | None:
        return stats.get("mean") or 0.0, stats.get("std") or 1.0  # the global row's, as zscore's

    def spec_params(self, f: FeatureConfig, params: dict[str, Any]) -> None:
        """The spec keeps the global statistics and the number of keys; the per-key table is in
        ``analysis.json`` (what the converter and the serving layer read), not in every copy of the spec."""
        st = params.get("stats")
        if isinstance(st, dict) and "per_key" in st:
            params["stats"] = {k: v for k, v in st.items() if k != "per_key"}
            params["keys"] = len(st["per_key"].get("keys") or ())

    def after_from_before(self, f: FeatureConfig, before: ValueSketch, stats: Mapping[str, Any]) -> ValueSketch | None:
        return None  # each key has its own scaling: the written values do not follow from the raw ones alone

    def table(self, stats: Mapping[str, Any]) -> KeyTable:
        """The ``KeyTable`` of a feature's statistics, made once per analysis."""
        per_key = stats.get("per_key") or {}
        hit = self._tables.get(id(per_key))
        if hit is None or hit[0] is not per_key:
            if len(self._tables) > 16:
                self._tables.clear()
            hit = self._tables[id(per_key)] = (per_key, KeyTable.of(per_key, stats))
        return hit[1]

    def finish_numbers(self, f: FeatureConfig, prepared: Numbers, stats: Mapping[str, Any]) -> Columns:
        table = self.table(stats)
        keys = prepared.keys if prepared.keys is not None else [None] * prepared.values.shape[0]
        x32 = scale_per_key(prepared.values[:, 0], prepared.present[:, 0], table.lookup(keys), table, f.fill)
        cols: Columns = {f.name: ("float32", x32)}
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = ("int64", prepared.missing_row.astype(np.int64).reshape(-1, 1))
        return cols


TRANSFORM = ZscorePerKey()
