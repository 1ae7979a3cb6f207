"""``cyclical`` in TensorFlow: the serving twin of ``convert.transforms.cyclical``.

The part's slot is computed from int64 epoch seconds with int64 ops (floor
division and modulo as numpy's), and the sine and cosine are gathered from the
converter's own float32 tables (``convert.transforms.cyclical.part_table``),
embedded as constants: the layer writes the converter's bits by construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tensorflow as tf

from convert.config import FeatureConfig
from convert.transforms.cyclical import DAY_SECONDS, DEFAULT_PARTS, part_table, slot_offsets
from readers.transforms.base import Checks, Layer
from readers.transforms.timestamp import Timestamp, _seconds


def _i64(v: int) -> tf.Tensor:
    return tf.constant(v, tf.int64)


def civil_from_days(days: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``convert.transforms.cyclical.civil_from_days`` in int64 ops: ``(year, month, day)``."""
    fd = tf.math.floordiv
    z = days + 719_468
    era = fd(z, _i64(146_097))
    doe = z - era * 146_097
    yoe = fd(doe - fd(doe, _i64(1460)) + fd(doe, _i64(36_524)) - fd(doe, _i64(146_096)), _i64(365))
    doy = doe - (365 * yoe + fd(yoe, _i64(4)) - fd(yoe, _i64(100)))
    mp = fd(5 * doy + 2, _i64(153))
    day = doy - fd(153 * mp + 2, _i64(5)) + 1
    month = tf.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + tf.cast(month <= 2, tf.int64)
    return year, month, day


def _leap(year: tf.Tensor) -> tf.Tensor:
    m = tf.math.floormod
    return tf.equal(m(year, _i64(4)), 0) & (tf.not_equal(m(year, _i64(100)), 0) | tf.equal(m(year, _i64(400)), 0))


_CUMULATIVE = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334)
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def part_slots(secs: tf.Tensor, part: str) -> tf.Tensor:
    """``convert.transforms.cyclical.part_slots`` in int64 ops."""
    days = tf.math.floordiv(secs, _i64(DAY_SECONDS))
    if part == "hour":
        return tf.math.floordiv(tf.math.floormod(secs, _i64(DAY_SECONDS)), _i64(3600))
    if part == "day_of_week":
        return tf.math.floormod(days + 3, _i64(7))
    year, month, day = civil_from_days(days)
    if part == "month":
        return month - 1
    leap = tf.cast(_leap(year), tf.int64)
    if part == "day_of_month":
        length = tf.gather(tf.constant(_MONTH_DAYS, tf.int64), month - 1) + leap * tf.cast(tf.equal(month, 2), tf.int64)
        offsets = slot_offsets(part)
        start = tf.gather(tf.constant([offsets[n] for n in sorted(offsets)], tf.int64), length - min(offsets))
        return start + day - 1
    if part == "day_of_year":
        doy = tf.gather(tf.constant(_CUMULATIVE, tf.int64), month - 1) + leap * tf.cast(month > 2, tf.int64) + day - 1
        return leap * slot_offsets(part)[366] + doy
    raise ValueError(f"cyclical part {part!r} is not one the converter writes")


def cyclical_columns(name: str, secs: tf.Tensor, present: tf.Tensor, parts: Sequence[str]) -> dict[str, tf.Tensor]:
    """``convert.transforms.cyclical.cyclical_columns`` in a graph: ``[batch, 1]`` float32
    sin and cos per part, 0.0 where ``present`` is False. ``secs``: int64 ``[batch]``."""
    out: dict[str, tf.Tensor] = {}
    safe = tf.where(present, secs, tf.zeros_like(secs))
    for p in parts:
        slot = part_slots(safe, p)
        for fn, table in zip(("sin", "cos"), part_table(p), strict=True):
            col = tf.gather(tf.constant(np.asarray(table)), slot)
            out[f"{name}_{p}_{fn}"] = tf.reshape(tf.where(present, col, tf.zeros_like(col)), [-1, 1])
    return out


class Cyclical(Timestamp):
    """A timestamp's values as ``timestamp`` reads them (epoch numbers and ISO strings side by
    side), then the sine and cosine of each part from the converter's tables."""

    name = "cyclical"

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        s = layer.wire.by_path(f.source)
        secs, present = _seconds(inputs[s.kind_name], inputs[s.input_name("int")], inputs[s.input_name("number")],
                                 inputs[s.input_name("term")], f.unit or "ms", s.path, bad)
        cols = cyclical_columns(f.name, secs, present, f.parts or DEFAULT_PARTS)
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = tf.cast(~present, tf.int64)[:, None]
        return cols


TRANSFORM = Cyclical()
