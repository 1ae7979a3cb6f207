"""Analysis-free derived features: timestamps and feature crosses, a batch at a time.

``timestamp``: the input is an epoch count in a known ``unit`` (Avro
timestamp-millis/micros/nanos and local-timestamp-* arrive as their raw
integers, ``date`` as days; JSON numbers in the configured unit) or an ISO
8601 string. Its int64 epoch **seconds** (floor, exact) are computed here;
the feature written is those seconds scaled by the training split (``scaled_column``
below, float64 until the final float32), plus optional calendar parts in UTC: ``hour`` (0..23), ``day_of_week`` (0 = Monday .. 6) and
``month`` (1..12), each int64. Values outside Python's datetime range (year 0,
year 10000) are still computed from the integer, never through ``datetime``.

``cross``: several categorical fields hashed together into ``buckets`` ids
(``1..buckets``; ``0`` when any part is missing): the terms joined with
``CROSS_SEPARATOR``, then the same FarmHash ``Fingerprint64`` as ``hash``
features, so a cross is identical on every machine and run and in TensorFlow
(``tf.strings.to_hash_bucket_fast(tf.strings.join(parts, CROSS_SEPARATOR), buckets) + 1``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from farmhash import Fingerprint64 as _fingerprint64

#: input unit -> how many of it make one second (``days`` are handled apart)
UNITS: dict[str, int] = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
DAY_SECONDS = 86_400
TIMESTAMP_PARTS = ("hour", "day_of_week", "month")
CROSS_SEPARATOR = "\x1f"  # unit separator: cannot occur in the terms' usual text
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


#: Epoch seconds of 1900-01-01 and 2200-01-01: an instant outside them is implausible for event data.
PLAUSIBLE_SECONDS = (-2_208_988_800, 7_258_118_400)
#: Epoch seconds of 2000-01-01 and 2100-01-01: a present-day instant (``infer`` picks units by them too).
PRESENT_DAY_SECONDS = (946_684_800, 4_102_444_800)


def _year(secs: int) -> int:
    return 1970 + secs * 10_000 // (3_652_425 * DAY_SECONDS)


def _in_unit(value: int | float, per: int) -> int:
    """Epoch seconds of ``value`` counted in units of ``1/per`` s (``per`` 0: days), floored, exact for any int."""
    if isinstance(value, int):
        return value * DAY_SECONDS if per == 0 else value // per
    x = value * DAY_SECONDS if per == 0 else value / per
    return math.floor(x) if math.isfinite(x) else (10**30 if x > 0 else -(10**30))  # past float range: far off


def unit_mismatch(value: int | float, unit: str) -> str | None:
    """Why epoch ``value`` does not fit ``unit``, or None.

    It does not fit when read in ``unit`` it lies outside years 1900-2200 while
    read in another unit it is a present-day instant (2000-2100): nanoseconds
    read as ``unit: s``. A far-off sentinel (9999-12-31) fits no other unit
    either, so it is not reported.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and not math.isfinite(value)):
        return None
    secs = _in_unit(value, 0 if unit == "days" else UNITS[unit])
    if PLAUSIBLE_SECONDS[0] <= secs < PLAUSIBLE_SECONDS[1]:
        return None
    for other, per in UNITS.items():
        if other != unit and PRESENT_DAY_SECONDS[0] <= (there := _in_unit(value, per)) < PRESENT_DAY_SECONDS[1]:
            return (f"{value!r} read as epoch {unit!r} is the year {_year(secs):,}; it looks like epoch {other!r} "
                    f"(the year {_year(there)}): set unit: {other}")
    return None


def _from_iso(s: str) -> int:
    t = _dt.datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
    if t.tzinfo is None:  # naive: read as UTC (like Avro's local-timestamp-*)
        t = t.replace(tzinfo=_dt.UTC)
    return (t - _EPOCH) // _dt.timedelta(seconds=1)


def epoch_seconds(values: Sequence[Any], unit: str) -> tuple[np.ndarray, np.ndarray, dict[int, str]]:
    """``(seconds int64, present bool, bad {row: reason})`` for a batch of raw values.

    ``unit`` is one of ``s, ms, us, ns, days``. ``None`` is missing; booleans,
    containers and unparsable strings are bad (the row goes to the error output).
    """
    if unit != "days" and unit not in UNITS:
        raise ValueError(f"timestamp unit must be one of {', '.join([*UNITS, 'days'])}, got {unit!r}")
    n = len(values)
    types = set(map(type, values))
    if types <= {int, type(None)} and unit != "days":
        # Fast path: raw integers (Avro timestamp-*), floor-divided in numpy.
        present = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        try:
            raw = np.array([0 if v is None else v for v in values], dtype=np.int64)
        except OverflowError:
            pass  # beyond int64: the per-value path says which
        else:
            return np.floor_divide(raw, UNITS[unit]), present, {}
    secs = np.zeros(n, dtype=np.int64)
    present = np.zeros(n, dtype=bool)
    bad: dict[int, str] = {}
    for i, v in enumerate(values):
        if v is None:
            continue
        try:
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise TypeError(f"expected an epoch number or an ISO 8601 string, found {type(v).__name__}")
            if isinstance(v, str):
                s = _from_iso(v)
            elif isinstance(v, float):
                if not np.isfinite(v):
                    raise ValueError(f"timestamp is {v}")
                s = int(np.floor(v * DAY_SECONDS)) if unit == "days" else int(np.floor(v / UNITS[unit]))
            else:
                s = v * DAY_SECONDS if unit == "days" else v // UNITS[unit]
            if not _INT64_MIN <= s <= _INT64_MAX:
                raise ValueError(f"{v} {unit} is beyond int64 seconds")
        except (TypeError, ValueError, OverflowError) as e:
            bad[i] = f"not a timestamp ({e}); give an epoch count in {unit!r} or an ISO 8601 string"
            continue
        secs[i] = s
        present[i] = True
    return secs, present, bad


def timestamp_parts(secs: np.ndarray, parts: Sequence[str]) -> dict[str, np.ndarray]:
    """Calendar parts (UTC) of int64 epoch seconds, computed with integer arithmetic."""
    out: dict[str, np.ndarray] = {}
    days = np.floor_divide(secs, DAY_SECONDS)
    for p in parts:
        if p == "hour":
            out[p] = np.floor_divide(np.mod(secs, DAY_SECONDS), 3600)
        elif p == "day_of_week":
            out[p] = np.mod(days + 3, 7)  # 1970-01-01 was a Thursday (Monday = 0)
        elif p == "month":
            out[p] = _civil_month(days)
        else:
            raise ValueError(f"timestamp part must be one of {', '.join(TIMESTAMP_PARTS)}, got {p!r}")
    return out


def _civil_month(days: np.ndarray) -> np.ndarray:
    """Month (1..12) of days since the epoch, proleptic Gregorian; valid for
    any int64 day count (H. Hinnant's days_from_civil inverse, vectorized)."""
    z = days.astype(np.int64) + 719_468
    era = np.floor_divide(z, 146_097)
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    return np.where(mp < 10, mp + 3, mp - 9).astype(np.int64)


def cross_ids(parts: Sequence[Sequence[str | None]], buckets: int) -> np.ndarray:
    """Stable ids ``1..buckets`` of the rows' joined terms; ``0`` where any part is missing.

    ``parts[j][i]`` is the canonical term of source ``j`` in row ``i`` (or
    ``None``). Each distinct combination is hashed once.
    """
    if buckets < 1:
        raise ValueError(f"cross buckets must be positive, got {buckets}")
    n = len(parts[0]) if parts else 0
    ids = np.zeros(n, dtype=np.int64)
    cache: dict[str, int] = {}
    for i in range(n):
        row = [p[i] for p in parts]
        if any(t is None for t in row):
            continue
        key = CROSS_SEPARATOR.join(row)  # type: ignore[arg-type]
        h = cache.get(key)
        if h is None:
            try:
                fp = _fingerprint64(key)
            except UnicodeEncodeError:  # a lone surrogate: hashed as its surrogatepass bytes, like ``hash``
                fp = _fingerprint64(key.encode("utf-8", "surrogatepass"))
            h = cache[key] = fp % buckets + 1
        ids[i] = h
    return ids


# ---------------------------------------------------------------- scaled by the training split
#
# ``timestamp`` and ``count`` features are written as floats a model can take
# as they are: the base value (epoch seconds; a count of items) less its
# mean over the training split, divided by its standard deviation there. The
# analysis records those statistics of the base value; a missing timestamp is
# written 0.0 (the mean). The serving layer computes the same in float64
# (``readers.serving_ops.scaled_base``).


@dataclasses.dataclass(frozen=True)
class Scaled:
    """How a transform's int64 column becomes the float the statistics and the scaling take
    (``Transform.scaled`` of ``timestamp`` and ``count``, in their modules of ``convert.transforms``)."""

    #: the int64 column prepared -> float64 base values
    base: Callable[[np.ndarray], np.ndarray]
    #: whether a row without a value takes part (a null list counts 0 items) or is missing (a timestamp)
    missing_is_value: bool


def scaled_column(scaled: Scaled, col: np.ndarray, present: np.ndarray | None, stats: Mapping[str, Any]) -> np.ndarray:
    """float32 ``(base(col) - mean) / std`` (``scaled``: a transform's ``Transform.scaled``); rows not ``present`` 0.0.

    ``stats``: the feature's training statistics as ``convert.prepare.transform_constants``
    gives them; none (an empty training split) scale by mean 0, std 1.
    """
    x = scaled.base(col)
    std = stats.get("std") or 1.0
    x = (x - (stats.get("mean") or 0.0)) / std
    if present is not None and not scaled.missing_is_value:
        x = np.where(present.reshape(x.shape), x, 0.0)
    with np.errstate(over="ignore"):
        x32 = x.astype(np.float32)
    x32[np.abs(x32) < np.finfo(np.float32).tiny] *= 0  # subnormals flushed, as TensorFlow's kernels do
    return x32
