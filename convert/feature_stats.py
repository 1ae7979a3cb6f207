"""The check of one feature's statistics, as a reader loads them (``dataset_info.json``'s
feature params and statistics, ``analysis.json``, ``stats.json``'s sketches), and the small
value helpers it and the metadata's checks share (``convert.spec`` re-exports them).

Its own module so that ``convert.spec`` (the metadata contract) and ``convert.stats_checks``
(which imports ``convert.spec``) both use one check without importing each other. Pure Python.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping
from typing import Any

__all__ = ["MEAN_SLACK", "QUARTILES", "finite", "is_count", "short_repr", "statistics_problems"]

#: The quartiles ``robust_scale`` keeps (``convert.transforms.robust_scale.RANKS``), in rank order.
QUARTILES = ("q25", "median", "q75")


def finite(v: Any) -> bool:
    """A JSON number (not a bool) that is finite as a float: an integer past float's range
    (``10**400`` in a JSON file) is not, rather than an ``OverflowError``."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


#: How far (relative to the larger of ``|min|``, ``|max|``) a mean may stray outside
#: ``[min, max]`` by rounding: a merged mean of equal values is not always exact.
MEAN_SLACK = 1e-6


def statistics_problems(name: str, st: Mapping[str, Any]) -> list[str]:
    """What in one feature's statistics no data can give, for the keys present: a count
    or missing count that is not an exact non-negative integer, a mean or std that is not a
    finite number, ``std < 0``, a min or max that is not a finite number
    or null, ``min > max``, a mean outside ``[min, max]``, boundaries that are not finite
    and strictly increasing, quartiles (``q25``, ``median``, ``q75``) that are not finite
    numbers or null, out of order, or outside ``[min, max]``. Each problem names the feature, the key and the value.

    The one check of statistics shared by the metadata's feature params (every reader of
    ``dataset_info.json``), ``analysis.json`` (``--analysis-from``, ``verify``, the serving
    layer), ``stats.json``'s sketches (``convert.stats_checks``): an edited value would
    otherwise scale every value of the feature by it."""
    out = [f"stats of {name!r}: {key!r} must be a non-negative integer, found {short_repr(st[key])}"
           for key in ("count", "missing") if key in st and not is_count(st[key])]
    for key in ("mean", "std"):
        if key in st and not finite(st[key]):
            out.append(f"stats of {name!r}: {key!r} must be a finite number, found {short_repr(st[key])}")
    if finite(st.get("std")) and st["std"] < 0:
        out.append(f"stats of {name!r}: 'std' must be >= 0 (0: a constant feature, scaled by 1), "
                   f"found {short_repr(st['std'])}")
    lo, hi, mean = st.get("min"), st.get("max"), st.get("mean")
    for key, v in (("min", lo), ("max", hi)):
        if v is not None and not finite(v):
            out.append(f"stats of {name!r}: {key!r} must be a finite number or null, found {short_repr(v)}")
    if finite(lo) and finite(hi):
        if lo > hi:
            out.append(f"stats of {name!r}: 'min' {short_repr(lo)} is above 'max' {short_repr(hi)}")
        elif finite(mean):
            slack = MEAN_SLACK * max(abs(lo), abs(hi))
            if not lo - slack <= mean <= hi + slack:
                out.append(f"stats of {name!r}: 'mean' {short_repr(mean)} is outside 'min' {short_repr(lo)} .. "
                           f"'max' {short_repr(hi)} (no data has such a mean)")
    if "boundaries" in st:
        b = st["boundaries"]
        if not isinstance(b, list) or not all(finite(x) for x in b):
            out.append(f"stats of {name!r}: 'boundaries' must be a list of finite numbers, found {short_repr(b)}")
        elif any(x >= y for x, y in zip(b, b[1:], strict=False)):
            out.append(f"stats of {name!r}: 'boundaries' must increase strictly, found {short_repr(b)}")
    return out + _quartile_problems(name, st)


def _quartile_problems(name: str, st: Mapping[str, Any]) -> list[str]:
    """The quartiles ``robust_scale`` scales by (``median``, ``q25``, ``q75``; null when the
    training split had no value): each a finite number or null, ``q25 <= median <= q75``
    for those that are numbers, and each within ``[min, max]`` when both are finite numbers
    in order (``min > max`` is reported on its own). An edited one would shift or stretch
    every value of the feature.

    No slack on the range, unlike the mean's (``MEAN_SLACK``): a quartile is one of the
    values the sketch kept (``convert.quantiles.QuantileSketch.quantiles``), and the
    sketch and the min and max see the same values (``convert.analysis.NumericStats.add``)."""
    out = [f"stats of {name!r}: {key!r} must be a finite number or null, found {short_repr(st[key])}"
           for key in QUARTILES if key in st and st[key] is not None and not finite(st[key])]
    present = [(key, st[key]) for key in QUARTILES if finite(st.get(key))]
    for (k1, v1), (k2, v2) in zip(present, present[1:], strict=False):
        if v1 > v2:
            out.append(f"stats of {name!r}: {k1!r} {short_repr(v1)} is above {k2!r} {short_repr(v2)} "
                       f"(quartiles are ordered: q25 <= median <= q75)")
    lo, hi = st.get("min"), st.get("max")
    if finite(lo) and finite(hi) and lo <= hi:
        out.extend(f"stats of {name!r}: {key!r} {short_repr(v)} is outside 'min' {short_repr(lo)} .. 'max' "
                   f"{short_repr(hi)} (a quartile is a value of the data)"
                   for key, v in present if not lo <= v <= hi)
    return out


class _BoundedRepr(reprlib.Repr):
    """``repr`` cut to a bounded size whatever the value: one quoted in an error
    message may be an alias bomb, a megabyte string or an integer of a million digits."""

    def __init__(self) -> None:
        super().__init__()  # keyword arguments need Python 3.12
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 2, 80, 80, 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 8

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr of a huge int is slow, past 4300 digits an error
            return f"<integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_BOUNDED = _BoundedRepr()


def short_repr(value: Any, limit: int = 200) -> str:
    """A value for an error message: its bounded repr, at most ``limit`` characters."""
    s = _BOUNDED.repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."



def is_count(value: Any) -> bool:
    """An exact non-negative integer: not a bool, a float (``3.0``, NaN, infinity) or a string."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

