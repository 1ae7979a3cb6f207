"""``cyclical``: calendar parts of a timestamp as points on a circle (sin, cos).

The input is read as ``timestamp`` reads it (an epoch count in ``unit`` or an
ISO 8601 string, ``convert.derive.epoch_seconds``). For each of ``parts`` the
feature writes ``<name>_<part>_sin`` and ``<name>_<part>_cos`` (float32): the
sine and cosine of ``2 pi * position / period``, where (UTC, proleptic
Gregorian):

==============  ==========================  ================================
part            position                    period
==============  ==========================  ================================
``hour``        hour of day, 0..23          24
``day_of_week`` 0 = Monday .. 6             7
``day_of_month`` day - 1, 0..30             the days of that month (28..31)
``day_of_year`` day - 1, 0..365             the days of that year (365, 366)
``month``       month - 1, 0..11            12
==============  ==========================  ================================

so the last day of a month or year lies next to the first of the next one. A
missing timestamp writes 0.0 to both (the circle's centre, no position);
``missing_indicator`` adds ``<name>_missing``. Nothing is learned from the
training split.

Why a table: a part has at most a few hundred (position, period) pairs, so
every sine and cosine the feature can take is computed once, here, in float64
(``math.sin``, ``math.cos``) and rounded to float32 (``part_table``). The
converter and the serving layer (``readers.transforms.cyclical``) both
compute the part's slot with integer arithmetic and read the same table: the
two agree bit for bit on every machine, which ``np.sin`` and ``tf.sin`` (each
with its own vectorized approximation) do not promise.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.columns import Columns
from convert.derive import epoch_seconds
from convert.spec import FeatureSpec
from convert.transforms.base import Need, Transform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig

#: The calendar parts and the period each is read against (0: the days of that month or year).
PARTS: dict[str, int] = {"hour": 24, "day_of_week": 7, "day_of_month": 0, "day_of_year": 0, "month": 12}
#: Parts written when the config names none.
DEFAULT_PARTS = ("hour", "day_of_week")
DAY_SECONDS = 86_400
#: Periods a variable part's slot is cut by: month lengths, year lengths.
_MONTH_LENGTHS = (28, 29, 30, 31)
_YEAR_LENGTHS = (365, 366)


def output_names(name: str, parts: Sequence[str]) -> list[str]:
    """The columns a ``cyclical`` feature writes, in order: ``<name>_<part>_sin``, ``<name>_<part>_cos`` per part."""
    return [f"{name}_{p}_{fn}" for p in parts for fn in ("sin", "cos")]


def _periods(part: str) -> tuple[int, ...]:
    fixed = PARTS[part]
    if fixed:
        return (fixed,)
    return _MONTH_LENGTHS if part == "day_of_month" else _YEAR_LENGTHS


def slot_offsets(part: str) -> dict[int, int]:
    """Period -> the table row of its position 0: a part's periods laid one after another."""
    out, at = {}, 0
    for p in _periods(part):
        out[p] = at
        at += p
    return out


@functools.cache
def part_table(part: str) -> tuple[np.ndarray, np.ndarray]:
    """``(sin, cos)`` float32 of every slot of ``part``: slot ``offset[period] + position``
    holds ``sin(2 pi position / period)`` computed in float64 and rounded once to float32.
    Read-only arrays (shared by every caller)."""
    if part not in PARTS:
        raise ValueError(f"cyclical part must be one of {', '.join(PARTS)}, got {part!r}")
    angles = [2.0 * math.pi * k / p for p in _periods(part) for k in range(p)]
    sin = np.array([math.sin(a) for a in angles], dtype=np.float64).astype(np.float32)
    cos = np.array([math.cos(a) for a in angles], dtype=np.float64).astype(np.float32)
    sin.flags.writeable = False
    cos.flags.writeable = False
    return sin, cos


def civil_from_days(days: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(year, month 1..12, day 1..31)`` of int64 days since 1970-01-01, proleptic Gregorian,
    for any int64 day count a timestamp gives: numpy's calendar units (``datetime64``) are
    exact integer calendar arithmetic."""
    d = np.asarray(days, dtype=np.int64).astype("datetime64[D]")
    months = d.astype("datetime64[M]")
    year = d.astype("datetime64[Y]").astype(np.int64) + 1970
    month = months.astype(np.int64) % 12 + 1
    day = (d - months.astype("datetime64[D]")).astype(np.int64) + 1
    return year, month, day


def _leap(year: np.ndarray) -> np.ndarray:
    return (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))


#: Days before the first of each month (index month - 1) in a common year.
_CUMULATIVE = np.array([0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334], dtype=np.int64)
#: Days of each month (index month - 1) in a common year.
_MONTH_DAYS = np.array([31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31], dtype=np.int64)


def part_slots(secs: np.ndarray, part: str) -> np.ndarray:
    """Each int64 epoch second's slot of ``part_table(part)``, by integer arithmetic."""
    secs = np.asarray(secs, dtype=np.int64)
    days = np.floor_divide(secs, DAY_SECONDS)
    if part == "hour":
        return np.floor_divide(np.mod(secs, DAY_SECONDS), 3600)
    if part == "day_of_week":
        return np.mod(days + 3, 7)  # 1970-01-01 was a Thursday (Monday = 0)
    year, month, day = civil_from_days(days)
    if part == "month":
        return month - 1
    leap = _leap(year)
    if part == "day_of_month":
        length = _MONTH_DAYS[month - 1] + (leap & (month == 2))
        return _month_offset(length) + day - 1
    if part == "day_of_year":
        doy = _CUMULATIVE[month - 1] + (leap & (month > 2)) + day - 1
        return np.where(leap, slot_offsets(part)[366], 0) + doy
    raise ValueError(f"cyclical part must be one of {', '.join(PARTS)}, got {part!r}")


def _month_offset(length: np.ndarray) -> np.ndarray:
    """The table row of position 0 for months of ``length`` days (28..31): the months' periods laid in order."""
    offsets = slot_offsets("day_of_month")
    table = np.array([offsets[n] for n in _MONTH_LENGTHS], dtype=np.int64)
    return table[length - _MONTH_LENGTHS[0]]


def cyclical_columns(name: str, secs: np.ndarray, present: np.ndarray,
                     parts: Sequence[str]) -> dict[str, tuple[str, np.ndarray]]:
    """The feature's columns for a batch: ``(b, 1)`` float32 sin and cos per part
    (``output_names`` order), 0.0 where ``present`` is False."""
    out: dict[str, tuple[str, np.ndarray]] = {}
    present = np.asarray(present, dtype=bool)
    for p in parts:
        sin, cos = part_table(p)
        slot = np.where(present, part_slots(np.where(present, secs, 0), p), 0)
        for fn, table in (("sin", sin), ("cos", cos)):
            col = np.where(present, table[slot], np.float32(0.0)).astype(np.float32)
            out[f"{name}_{p}_{fn}"] = ("float32", col.reshape(-1, 1))
    return out


class Cyclical(Transform):
    """Read as ``timestamp`` reads its input; finished by its own stage (``finish_values``), its
    statistics those of its first sine column (``outputs``)."""

    name = "cyclical"
    summary = "epoch number in 'unit' or ISO 8601 string -> sin and cos of calendar 'parts' (float32, no analysis)"
    options = ("unit", "parts", "missing_indicator")
    part_choices = tuple(PARTS)
    accepts = (frozenset({"number", "string"}), "epoch numbers or ISO 8601 strings")
    epoch_unit = True
    prepared_as = "own"
    stats_kind = "numeric"
    encoding = "scaled"
    serving = "readers.transforms.cyclical"
    not_taken_why = {"max_len": "it takes one value per record"}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        kw.setdefault("unit", "ms")
        if not kw.get("parts"):
            kw["parts"] = DEFAULT_PARTS

    def outputs(self, f: FeatureConfig) -> list[str]:
        return output_names(f.name, f.parts or DEFAULT_PARTS)

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        return [FeatureSpec(name, "float32", (1,), 0.0, f.source, self.name, params, encoding=self.encoding)
                for name in self.outputs(f)]

    def finish_values(self, f: FeatureConfig, values: list[Any]) -> tuple[Columns, np.ndarray, dict[int, str]]:
        secs, present, rejected = epoch_seconds(values, f.unit or "ms")
        cols: Columns = cyclical_columns(f.name, secs, present, f.parts or DEFAULT_PARTS)
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = ("int64", (~present).astype(np.int64).reshape(-1, 1))
        return cols, present, rejected


TRANSFORM = Cyclical()
