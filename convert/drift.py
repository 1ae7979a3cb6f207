"""Drift and skew checks on two sets of per-split statistics (``convert.stats``).

*Skew*: the training split against another split of the same output. *Drift*:
one output's split against the same split of an earlier output (``recordprep
report OUT --against OLD``). Both compare two statistics documents, never a
shard, with these measures (``convert.config.DRIFT_MEASURES``):

- ``linf``: categorical features (and a class label): the L-infinity distance
  of the two term distributions, ``max_t |p(t) - q(t)|`` (TFDV's measure for
  categorical drift). Computed over the terms the documents keep
  (``stats.TOP_TERMS`` per split); a term beyond both lists differs by at most
  the smaller of the two lists' last shares.
- ``new_terms``: categorical: how much more of the compared side's items are
  terms the base lacks. Within one output (skew), the rise of the OOV share
  (both splits map through the same vocabulary: exactly what the model loses)
  beyond what a random sample of the base's distribution would show: the
  share of the base's items whose term it saw once (``once``), the Good-Turing
  estimate of the mass of terms it never saw, plus ``UNSEEN_STD_ERRORS``
  standard errors of that share in a sample the compared side's size. A
  random split of a high-cardinality field (ids, where most terms are seen
  once) then passes, while new terms the training split's distribution does
  not explain fail; of a field whose terms are nearly all seen once, new
  terms are what a random sample shows too, so only ``missing`` can flag it.
  Between outputs (drift), the share of the compared side's items whose term
  is not among the base's kept terms, less the base's own share beyond them
  (0 when it kept every term): terms the base never had, not its long tail.
- ``js``: numeric features: the Jensen-Shannon divergence (base 2, 0..1) of
  the two histograms on common bins: 20 bins of equal mass on the base
  side (its 5%-quantiles, from its sketch), plus one open bin below and one
  above, where values outside the base's range land.
- ``missing``: every feature whose missing rows are known: the absolute
  change of the missing rate.
- ``mean_shift``: numeric: ``|mean - base mean|`` in base standard deviations.

Timestamps are compared on ``missing`` only: their values move with time.
A measure that cannot be computed (an empty split, missing counts the columns
cannot tell) is left out, never counted as drift.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from convert.config import DRIFT_MEASURES
from convert.stats import ValueSketch

#: Thresholds used where neither the config nor a flag sets one.
DEFAULT_THRESHOLDS: dict[str, float] = {"linf": 0.1, "js": 0.1, "new_terms": 0.1, "missing": 0.1, "mean_shift": 0.5}
#: Standard errors of the unseen terms' share a random split may show beyond its expectation (``new_terms``).
UNSEEN_STD_ERRORS = 3.0
#: Equal-mass bins of the base side for ``js``.
JS_BINS = 20

_MEASURES_OF = {
    "categorical": ("linf", "new_terms", "missing"),
    "label": ("linf", "new_terms"),
    "numeric": ("js", "mean_shift", "missing"),
    "other": ("js", "mean_shift"),
    "timestamp": ("missing",),
    "hash": ("missing",),
    "bytes": ("missing",),
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One measure of one feature: its value, the threshold it is held to."""

    feature: str
    measure: str
    value: float
    threshold: float

    @property
    def over(self) -> bool:
        return self.value > self.threshold

    def to_json(self) -> dict[str, Any]:
        return {"feature": self.feature, "measure": self.measure, "value": _finite(self.value),
                "threshold": self.threshold, "over": self.over}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Every finding of one comparison, ``base`` and ``other`` naming the two sides."""

    base: str
    other: str
    findings: tuple[Finding, ...]

    @property
    def over(self) -> list[Finding]:
        return [f for f in self.findings if f.over]

    def features_over(self) -> list[str]:
        """Features with a measure over its threshold, in the order compared."""
        return list(dict.fromkeys(f.feature for f in self.over))

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "other": self.other, "features_over": self.features_over(),
                "findings": [f.to_json() for f in self.findings]}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def thresholds(config: Mapping[str, Any] | None, overrides: Mapping[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Per feature name, the threshold of each measure: ``DEFAULT_THRESHOLDS``,
    then the config's top-level ``drift``, then the feature's own ``drift``,
    then ``overrides`` (flags: what the user typed for this run wins). ``config``
    is the config as JSON (the metadata's ``config``); features it does not
    list get the key ``""``'s."""
    base = dict(DEFAULT_THRESHOLDS)
    base.update((config or {}).get("drift") or {})
    flags = dict(overrides or {})
    out = {"": {**base, **flags}}
    feats = list((config or {}).get("features") or [])
    if (config or {}).get("label"):
        feats.append({"name": config["label"].get("name")})  # type: ignore[index]
    for f in feats:
        out[str(f.get("name"))] = {**base, **(f.get("drift") or {}), **flags}
    return out


def check_overrides(pairs: Mapping[str, float]) -> dict[str, float]:
    """Threshold flags (``measure -> value``); raises ValueError naming a bad one."""
    for k, v in pairs.items():
        if k not in DRIFT_MEASURES:
            raise ValueError(f"unknown drift measure {k!r}; measures: {', '.join(DRIFT_MEASURES)}")
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
            raise ValueError(f"drift threshold {k}={v!r} must be a number >= 0")
    return dict(pairs)


def compare(base: Mapping[str, Any], base_split: str, other: Mapping[str, Any], other_split: str,
            limits: Mapping[str, Mapping[str, float]], base_name: str, other_name: str) -> Comparison:
    """Compare split ``base_split`` of the stats document ``base`` with
    ``other_split`` of ``other``, feature by feature (the features both have,
    in ``base``'s order); ``limits`` from ``thresholds``."""
    findings: list[Finding] = []
    for name, feat in base["features"].items():
        ofeat = other["features"].get(name)
        if ofeat is None or ofeat.get("kind") != feat.get("kind"):
            continue
        a, b = feat["splits"].get(base_split), ofeat["splits"].get(other_split)
        if not a or not b or not a.get("rows") or not b.get("rows"):
            continue  # an empty split: nothing to compare
        lim = limits.get(name) or limits[""]
        for measure in _MEASURES_OF.get(feat.get("kind"), ()):
            value = _new_terms(a, b, same=base is other) if measure == "new_terms" else _MEASURE[measure](a, b)
            if value is not None:
                findings.append(Finding(name, measure, value, float(lim[measure])))
    return Comparison(base_name, other_name, tuple(findings))


def skew(doc: Mapping[str, Any], limits: Mapping[str, Mapping[str, float]]) -> list[Comparison]:
    """The first split (training) against each other split of one output."""
    splits = list(doc.get("splits") or {})
    return [compare(doc, splits[0], doc, s, limits, splits[0], s) for s in splits[1:]]


def drift(new: Mapping[str, Any], old: Mapping[str, Any], limits: Mapping[str, Mapping[str, float]],
          new_name: str = "new", old_name: str = "old") -> list[Comparison]:
    """Each split ``new`` and ``old`` both have, old (base) against new."""
    return [compare(old, s, new, s, limits, f"{old_name}:{s}", f"{new_name}:{s}")
            for s in (new.get("splits") or {}) if s in (old.get("splits") or {})]


# ---------------------------------------------------------------- measures


def _shares(d: Mapping[str, Any]) -> tuple[dict[str, float], float]:
    """Each kept term's share of the items, and the smallest kept share (0 when every term is kept)."""
    items = d.get("items") or sum(c for _, c in d.get("terms") or ())
    if not items:
        return {}, 0.0
    shares = {t: c / items for t, c in d.get("terms") or ()}
    complete = d.get("distinct", len(shares)) <= len(shares)
    return shares, 0.0 if complete or not shares else min(shares.values())


def _linf(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    p, _ = _shares(a)
    q, _ = _shares(b)
    if not p or not q:
        return None
    return max(abs(p.get(t, 0.0) - q.get(t, 0.0)) for t in p.keys() | q.keys())


def _new_terms(a: Mapping[str, Any], b: Mapping[str, Any], same: bool = False) -> float | None:
    if same and "oov" in a and "oov" in b:
        if not a.get("items") or not b.get("items"):
            return None
        unseen = a.get("once", 0) / a["items"]  # expected share of terms the base never saw, in a random sample
        noise = UNSEEN_STD_ERRORS * math.sqrt(unseen * (1 - unseen) / b["items"])  # that share's sampling error
        return max(0.0, b["oov"] / b["items"] - a["oov"] / a["items"] - unseen - noise)
    p, _ = _shares(a)
    q, _ = _shares(b)
    if not q or not p:
        return None
    tail = max(0.0, 1.0 - sum(p.values()))  # the base's items beyond its kept terms
    return max(0.0, sum(share for t, share in q.items() if t not in p) - tail)


def _missing(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    if a.get("missing") is None or b.get("missing") is None:
        return None
    return abs(b["missing"] / b["rows"] - a["missing"] / a["rows"])


def _sketch(d: Mapping[str, Any]) -> ValueSketch | None:
    raw = d.get("before") or d.get("after")
    if not raw or not raw.get("count"):
        return None
    return ValueSketch.from_json(raw)


def js_bins(base: ValueSketch) -> list[float]:
    """Bin edges for ``js``: the base side's 5%-quantiles (distinct), and an
    open bin below and above."""
    qs = base.quantiles(np.linspace(0, 1, JS_BINS + 1).tolist())
    inner = sorted({float(x) for x in qs if x is not None})
    if len(inner) == 1:  # a constant: the value's own bin
        inner = [inner[0], math.nextafter(inner[0], math.inf)]
    return [-math.inf, *inner[:-1], math.nextafter(inner[-1], math.inf), math.inf]


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence of two count vectors, base 2 (0: same, 1: disjoint)."""
    p = p / p.sum()
    q = q / q.sum()
    m = (p + q) / 2

    def kl(x: np.ndarray) -> float:
        nz = x > 0
        return float((x[nz] * np.log2(x[nz] / m[nz])).sum())

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def _js(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    sa, sb = _sketch(a), _sketch(b)
    if sa is None or sb is None:
        return None
    edges = js_bins(sa)
    return js_divergence(np.asarray(sa.histogram(edges), dtype=np.float64),
                         np.asarray(sb.histogram(edges), dtype=np.float64))


def _mean_shift(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    sa, sb = _sketch(a), _sketch(b)
    if sa is None or sb is None:
        return None
    d = abs(sb.mean - sa.mean)
    if sa.std == 0:
        return 0.0 if d == 0 else math.inf
    return d / sa.std


_MEASURE = {"linf": _linf, "missing": _missing, "js": _js, "mean_shift": _mean_shift}
