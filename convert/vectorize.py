"""Analyzers and vectorizers: records in, fixed-shape numpy columns out.

Two passes over the training data, like tf.Transform:

1. ``Analyzer`` accumulates what transforms need (vocabulary counts,
   count/mean/M2/min/max) over the *training split only*; accumulators merge,
   so the pipeline runs them as a Beam combiner. ``Analyzer.result()`` gives
   an ``Analysis`` (JSON-serializable; ``--analysis-from`` reuses one).
2. ``Vectorizer`` maps a batch of records to numpy columns with the analysis
   fixed, and reports every record it rejects with the field and reason.

Id layout for vocabulary and hash features (recorded in the feature spec):
``0`` = missing/padding, ``1..num_oov_buckets`` = out-of-vocabulary buckets,
then vocabulary terms by descending frequency (ties by term). ``hash``
features use ``0`` = missing and ``1..buckets`` for values. So null, ``""``,
``0`` and ``False`` never share an id.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from convert.config import Config, FeatureConfig
from convert.spec import FeatureSpec

_TOKEN_RE = re.compile(r"\w+", re.UNICODE)
_F32_MAX = float(np.finfo(np.float32).max)


# ------------------------------------------------------------------ helpers


def getter(path: str) -> Callable[[Any], Any]:
    """Value at a dotted path, ``None`` when any step is missing or null."""
    keys = path.split(".")
    if len(keys) == 1:
        k = keys[0]
        return lambda r: r.get(k) if isinstance(r, dict) else None

    def get(r: Any) -> Any:
        for k in keys:
            if not isinstance(r, dict):
                return None
            r = r.get(k)
        return r

    return get


def term(v: Any) -> str:
    """Canonical string form of a categorical value (vocabulary key)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "backslashreplace")
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


@functools.lru_cache(maxsize=1 << 18)
def stable_hash(s: str) -> int:
    """64-bit hash, the same on every machine, run and Python version."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    return _TOKEN_RE.findall(text.lower() if lowercase else text)


def _to_float(x: int | float) -> float:
    """``float(x)``; integers beyond the float range become +-inf (then ``on_nan`` applies)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _as_list(v: Any) -> list[Any]:
    if v is None:
        return []
    if isinstance(v, list | tuple):
        return list(v)
    return [v]


# ----------------------------------------------------------------- analysis


@dataclasses.dataclass
class NumericStats:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    missing: int = 0

    def add(self, x: np.ndarray, missing: int) -> None:
        self.missing += missing
        if x.size == 0:
            return
        other = NumericStats(int(x.size), float(x.mean()), float(((x - x.mean()) ** 2).sum()),
                             float(x.min()), float(x.max()))
        self.merge(other)

    def merge(self, o: NumericStats) -> None:
        """Chan et al. parallel variance: exact-enough and order-insensitive."""
        self.missing += o.missing
        if o.count == 0:
            return
        n = self.count + o.count
        d = o.mean - self.mean
        self.mean += d * o.count / n
        self.m2 += o.m2 + d * d * self.count * o.count / n
        self.count = n
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "missing": self.missing, "mean": self.mean, "std": self.std,
                "min": self.min if self.count else None, "max": self.max if self.count else None}


@dataclasses.dataclass
class Analysis:
    """What the vectorize pass needs, computed on the training split."""

    vocabularies: dict[str, list[str]]
    stats: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"vocabularies": self.vocabularies, "stats": self.stats}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Analysis:
        return cls(vocabularies=dict(d["vocabularies"]), stats=dict(d["stats"]))


class Analyzer:
    """Mergeable accumulator for one config; see module docstring."""

    def __init__(self, config: Config):
        self.config = config
        self.counts: dict[str, Counter] = {f.name: Counter() for f in config.features if f.needs_vocabulary}
        self.numeric: dict[str, NumericStats] = {f.name: NumericStats() for f in config.features if f.needs_stats}
        self._get = {f.name: getter(f.source) for f in config.features}

    # Accumulators travel between Beam workers: pickle the counts, not the getters.
    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "counts": self.counts, "numeric": self.numeric}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._get = {f.name: getter(f.source) for f in self.config.features}

    def add_records(self, records: Sequence[Any]) -> None:
        for f in self.config.features:
            get = self._get[f.name]
            values = [get(r) for r in records]
            if f.name in self.counts:
                c = self.counts[f.name]
                if f.transform == "text":
                    for v in values:
                        if isinstance(v, str):
                            c.update(tokenize(v, f.lowercase))
                elif f.multi_valued:
                    # nested values are rejected by the vectorizer: never terms
                    for v in values:
                        items = _as_list(v)
                        if not any(isinstance(x, dict | list) for x in items):
                            c.update(term(x) for x in items if x is not None)
                else:
                    c.update(term(v) for v in values if v is not None and not isinstance(v, dict | list))
            if f.name in self.numeric:
                flat: list[float] = []
                missing = 0
                for v in values:
                    for x in (_as_list(v) if f.multi_valued else [v]):
                        if x is None:
                            missing += 1
                        elif isinstance(x, int | float) and math.isfinite(fx := _to_float(x)):
                            flat.append(fx)
                self.numeric[f.name].add(np.asarray(flat, dtype=np.float64), missing)

    def merge(self, other: Analyzer) -> Analyzer:
        for k, c in other.counts.items():
            self.counts[k].update(c)
        for k, s in other.numeric.items():
            self.numeric[k].merge(s)
        return self

    def result(self) -> Analysis:
        vocabs = {}
        by_name = {f.name: f for f in self.config.features}
        for name, c in self.counts.items():
            f = by_name[name]
            items = [(t, n) for t, n in c.items() if n >= f.min_frequency]
            items.sort(key=lambda tn: (-tn[1], tn[0]))
            if f.top_k:
                items = items[: f.top_k]
            vocabs[name] = [t for t, _ in items]
        return Analysis(vocabularies=vocabs, stats={k: s.to_json() for k, s in self.numeric.items()})


# --------------------------------------------------------------- vectorize


@dataclasses.dataclass
class Rejection:
    """A record the vectorizer could not convert."""

    index: int  # position in the batch
    field: str
    reason: str


@dataclasses.dataclass
class VectorBatch:
    """Fixed-shape columns for the records that converted (``keep`` mask)."""

    columns: dict[str, tuple[str, Any]]
    keep: np.ndarray
    rejections: list[Rejection]


class _Bad(Exception):
    pass


class Vectorizer:
    """Maps record batches to columns with a fixed ``Analysis``."""

    def __init__(self, config: Config, analysis: Analysis):
        self.config = config
        self.analysis = analysis
        self._get = {f.name: getter(f.source) for f in config.features}
        self._vocab_ids: dict[str, dict[str, int]] = {}
        for f in config.features:
            if f.needs_vocabulary:
                terms = analysis.vocabularies.get(f.name)
                if terms is None:
                    raise ValueError(f"feature {f.name!r}: the analysis has no vocabulary for it (was it computed with another config?)")
                base = 1 + f.num_oov_buckets
                self._vocab_ids[f.name] = {t: base + i for i, t in enumerate(terms)}
        self._label_get = getter(config.label.source) if config.label else None

    # -- the feature spec this vectorizer produces
    def feature_specs(self) -> list[FeatureSpec]:
        specs = []
        for f in self.config.features:
            params: dict[str, Any] = {k: v for k, v in dataclasses.asdict(f).items()
                                      if k not in ("name", "source", "transform") and v is not None}
            if f.needs_stats:
                params["stats"] = self.analysis.stats.get(f.name)
            if f.needs_vocabulary:
                params["vocab_size"] = len(self._vocab_ids[f.name]) + 1 + f.num_oov_buckets
                params["vocabulary_file"] = f"vocab/{f.name}.txt"
                params["pad_id"] = 0
                params["oov_ids"] = list(range(1, 1 + f.num_oov_buckets))
            if f.transform == "hash":
                params["vocab_size"] = f.buckets + 1
                params["pad_id"] = 0
            n = f.max_len or 1
            if f.is_numeric:
                specs.append(FeatureSpec(f.name, "float32", (n,), 0.0, f.source, f.transform, params))
            elif f.transform == "bytes":
                specs.append(FeatureSpec(f.name, "string", (1,), "", f.source, "bytes", params))
            else:
                specs.append(FeatureSpec(f.name, "int64", (n,), 0, f.source, f.transform, params))
            if f.multi_valued:
                specs.append(FeatureSpec(f"{f.name}_len", "int64", (1,), 0, f.source, "length",
                                         {"of": f.name, "max_len": f.max_len}, role="aux"))
            if f.missing_indicator:
                specs.append(FeatureSpec(f"{f.name}_missing", "int64", (1,), 0, f.source, "missing_indicator",
                                         {"of": f.name}, role="aux"))
        if self.config.label:
            lab = self.config.label
            specs.append(FeatureSpec(lab.name, lab.dtype, (1,), 0 if lab.dtype == "int64" else 0.0,
                                     lab.source, "label", {}, role="label"))
        return specs

    # -- per-kind column builders; each returns arrays and marks bad rows
    def _numeric(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
        b = len(values)
        n = f.max_len or 1
        out = np.zeros((b, n), dtype=np.float64)
        present = np.ones((b, n), dtype=bool)
        missing_row = np.zeros(b, dtype=bool)
        lens = np.zeros(b, dtype=np.int64)
        stats = self.analysis.stats.get(f.name) or {}
        fill = stats.get("mean") if f.fill == "mean" else f.fill
        fill = 0.0 if fill is None else float(fill)
        if not f.multi_valued:
            # Fast path: one C-level conversion; per-value checks only if it fails.
            try:
                col = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
                if col.dtype != np.float64 or col.ndim != 1 or any(isinstance(v, str | bytes | bool) for v in values):
                    raise TypeError  # e.g. all values 1-element lists: numpy would accept them
                missing_row = np.fromiter((v is None for v in values), dtype=bool, count=b)
                out[:, 0] = col
            except (TypeError, ValueError, OverflowError):
                for i, v in enumerate(values):
                    if v is None:
                        missing_row[i] = True
                        out[i, 0] = np.nan
                    elif isinstance(v, bool):
                        out[i, 0] = float(v)
                    elif isinstance(v, int | float):
                        out[i, 0] = _to_float(v)
                    else:
                        bad.setdefault(i, Rejection(i, f.source, f"expected a number, found {type(v).__name__} {_short(v)}; use a categorical transform (vocabulary/hash) for this field or fix the data"))
                        out[i, 0] = 0.0
            present[:, 0] = ~missing_row
            lens[:] = 1
        else:
            for i, v in enumerate(values):
                if v is None:
                    missing_row[i] = True
                    continue
                items = v if isinstance(v, list | tuple) else [v]
                lens[i] = min(len(items), n)
                for j, x in enumerate(items[:n]):
                    if x is None:
                        present[i, j] = False
                    elif isinstance(x, int | float):
                        out[i, j] = _to_float(x)
                    else:
                        bad.setdefault(i, Rejection(i, f"{f.source}[{j}]", f"expected a number, found {type(x).__name__} {_short(x)}"))
            present &= np.arange(n)[None, :] < lens[:, None]
        finite = np.isfinite(out) | ~present
        if not finite.all():
            rows = np.nonzero(~finite.all(axis=1))[0]
            if f.on_nan == "error":
                for i in rows.tolist():
                    bad.setdefault(i, Rejection(i, f.source, f"value is NaN or infinite; set on_nan: fill or keep for feature {f.name!r} to accept it"))
            elif f.on_nan == "fill":
                present &= finite
        if f.multi_valued:
            out = np.where(present, out, np.where(np.arange(n)[None, :] < lens[:, None], fill, 0.0))
        else:
            out = np.where(present, out, fill)
        x = out
        if f.transform == "zscore":
            std = stats.get("std") or 1.0
            x = (x - (stats.get("mean") or 0.0)) / std
        elif f.transform == "minmax":
            lo, hi = stats.get("min"), stats.get("max")
            x = (x - lo) / (hi - lo) if lo is not None and hi is not None and hi > lo else np.zeros_like(x)
        elif f.transform == "log1p":
            with np.errstate(invalid="ignore", divide="ignore"):
                neg = (x <= -1) & present
                for i in np.nonzero(neg.any(axis=1))[0].tolist():
                    bad.setdefault(i, Rejection(i, f.source, "log1p needs values > -1; use 'clip' first or another transform"))
                x = np.log1p(np.where(neg, 0.0, x))
        elif f.transform == "clip":
            x = np.clip(x, f.clip_min if f.clip_min is not None else -np.inf, f.clip_max if f.clip_max is not None else np.inf)
        if f.multi_valued:
            x = np.where(np.arange(n)[None, :] < lens[:, None], x, 0.0)
        cols: dict[str, tuple[str, Any]] = {f.name: ("float32", x.astype(np.float32))}
        if f.multi_valued:
            cols[f"{f.name}_len"] = ("int64", lens.reshape(b, 1))
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = ("int64", missing_row.astype(np.int64).reshape(b, 1))
        return cols

    def _ids(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
        b = len(values)
        n = f.max_len or 1
        out = np.zeros((b, n), dtype=np.int64)
        lens = np.zeros(b, dtype=np.int64)
        if f.transform == "hash":
            buckets = f.buckets

            def to_id(t: str) -> int:
                return 1 + stable_hash(t) % buckets
        else:
            ids = self._vocab_ids[f.name]
            oov = f.num_oov_buckets

            def to_id(t: str) -> int:
                i = ids.get(t)
                return i if i is not None else 1 + (stable_hash(t) % oov if oov > 1 else 0)

        if f.transform == "text":
            for i, v in enumerate(values):
                if v is None:
                    continue
                if not isinstance(v, str):
                    bad.setdefault(i, Rejection(i, f.source, f"expected text (a string), found {type(v).__name__} {_short(v)}"))
                    continue
                toks = tokenize(v, f.lowercase)[:n]
                lens[i] = len(toks)
                out[i, : len(toks)] = [to_id(t) for t in toks]
        elif f.multi_valued:
            for i, v in enumerate(values):
                items = [x for x in _as_list(v) if x is not None][:n]
                if any(isinstance(x, dict | list) for x in items):
                    bad.setdefault(i, Rejection(i, f.source, "expected a list of scalar values, found nested records/lists; point 'source' at a leaf field"))
                    continue
                lens[i] = len(items)
                out[i, : len(items)] = [to_id(term(x)) for x in items]
        else:
            col = out[:, 0]
            for i, v in enumerate(values):
                if v is None:
                    continue
                if isinstance(v, dict | list):
                    bad.setdefault(i, Rejection(i, f.source, f"expected a scalar value, found {type(v).__name__}; set max_len for lists or point 'source' at a leaf field"))
                    continue
                col[i] = to_id(term(v))
        cols: dict[str, tuple[str, Any]] = {f.name: ("int64", out)}
        if f.multi_valued:
            cols[f"{f.name}_len"] = ("int64", lens.reshape(b, 1))
        return cols

    def _bytes(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
        out = []
        for i, v in enumerate(values):
            if v is None:
                out.append(b"")
            elif isinstance(v, bytes | bytearray):
                out.append(bytes(v))
            elif isinstance(v, str):
                out.append(v.encode("utf-8", "surrogatepass"))
            else:
                bad.setdefault(i, Rejection(i, f.source, f"expected bytes or a string, found {type(v).__name__}"))
                out.append(b"")
        return {f.name: ("string", out)}

    def _label(self, values: list[Any], bad: dict[int, Rejection]) -> dict[str, tuple[str, Any]]:
        lab = self.config.label
        assert lab is not None
        b = len(values)
        if lab.dtype == "int64":
            out = np.zeros((b, 1), dtype=np.int64)
            for i, v in enumerate(values):
                if isinstance(v, bool):
                    out[i, 0] = int(v)
                elif isinstance(v, int) and -(2**63) <= v < 2**63:
                    out[i, 0] = v
                elif isinstance(v, float) and v.is_integer() and -(2.0**63) <= v < 2.0**63:
                    out[i, 0] = int(v)
                else:
                    what = "missing (null)" if v is None else f"{type(v).__name__} {_short(v)}"
                    bad.setdefault(i, Rejection(i, lab.source, f"label must be an integer, found {what}; fix the record or set label dtype: float32"))
        else:
            out = np.zeros((b, 1), dtype=np.float32)
            for i, v in enumerate(values):
                if isinstance(v, int | float) and not isinstance(v, bool) and abs(_to_float(v)) <= _F32_MAX:
                    out[i, 0] = _to_float(v)  # finite, and stays finite as float32
                else:
                    what = "missing (null)" if v is None else f"{type(v).__name__} {_short(v)}"
                    bad.setdefault(i, Rejection(i, lab.source, f"label must be a finite number, found {what}"))
        return {lab.name: (lab.dtype, out)}

    def vectorize(self, records: Sequence[Any]) -> VectorBatch:
        """Columns for ``records``; rejected rows are masked out of every column."""
        b = len(records)
        bad: dict[int, Rejection] = {}
        for i, r in enumerate(records):
            if not isinstance(r, dict):
                bad[i] = Rejection(i, "<record>", f"expected a record (object), found {type(r).__name__}")
        cols: dict[str, tuple[str, Any]] = {}
        for f in self.config.features:
            values = [self._get[f.name](r) for r in records]
            if f.is_numeric:
                cols.update(self._numeric(f, values, bad))
            elif f.transform == "bytes":
                cols.update(self._bytes(f, values, bad))
            else:
                cols.update(self._ids(f, values, bad))
        if self._label_get is not None:
            cols.update(self._label([self._label_get(r) for r in records], bad))
        keep = np.ones(b, dtype=bool)
        if bad:
            keep[list(bad)] = False
            idx = np.nonzero(keep)[0]
            cols = {k: (kind, [v[i] for i in idx.tolist()] if kind == "string" else v[idx]) for k, (kind, v) in cols.items()}
        return VectorBatch(columns=cols, keep=keep, rejections=sorted(bad.values(), key=lambda r: r.index))


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."
