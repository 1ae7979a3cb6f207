"""``timestamp``: an epoch number in ``unit`` or an ISO 8601 string -> epoch seconds
standardized by the training split, and the calendar ``parts``."""
from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from convert.derive import DAY_SECONDS, UNITS
from readers._serving_kinds import KIND_FLOAT, KIND_INT, KIND_NULL, KIND_STRING
from readers.serving_ops import civil_month, iso_seconds, reason, scaled_base, wrong_kind_reason
from readers.transforms.base import Checks, Layer, ServingTransform

#: Why an ISO 8601 string the layer does not parse is rejected (the converter may accept it).
ISO_UNSUPPORTED = ("this ISO 8601 form is not supported by the serving layer (it takes YYYY-MM-DD, optionally "
                   "followed by T or a space, hh[:mm[:ss[.f]]] and Z or +-hh[:mm]); send epoch numbers")


def _seconds(kind: tf.Tensor, ints: tf.Tensor, numbers: tf.Tensor, text: tf.Tensor, unit: str, path: str,
             bad: Checks) -> tuple[tf.Tensor, tf.Tensor]:
    """``(seconds, present)`` of the values of ``kind``: integers and floats as ``unit``
    counts, ISO strings parsed; a value the converter rejects appended to ``bad``."""
    why = f"; give an epoch count in {unit!r} or an ISO 8601 string"
    is_int, is_float, is_str = tf.equal(kind, KIND_INT), tf.equal(kind, KIND_FLOAT), tf.equal(kind, KIND_STRING)
    wrong = ~(is_int | is_float | is_str) & tf.not_equal(kind, KIND_NULL)
    bad.append((wrong, wrong_kind_reason(path, kind, "not a timestamp (expected an epoch number or an ISO 8601 string, found ", ")" + why)))
    v = ints
    if unit == "days":
        lo, hi = -((2**63) // DAY_SECONDS), (2**63 - 1) // DAY_SECONDS
        int_ok = (v >= lo) & (v <= hi)
        secs_i = tf.where(int_ok, v, 0) * DAY_SECONDS
    else:
        int_ok = tf.ones_like(is_int)
        secs_i = tf.math.floordiv(v, UNITS[unit])
    bad.append((is_int & ~int_ok, reason(path, f"not a timestamp (beyond int64 seconds){why}")))
    x = numbers
    finite = tf.math.is_finite(x)
    y = tf.floor(x * DAY_SECONDS) if unit == "days" else tf.floor(x / UNITS[unit])
    float_ok = finite & (y >= -(2.0**63)) & (y < 2.0**63)
    bad.append((is_float & ~float_ok, reason(path, f"not a timestamp (NaN, infinite or beyond int64 seconds){why}")))
    secs_f = tf.cast(tf.where(float_ok, y, tf.zeros_like(y)), tf.int64)
    # ISO strings are parsed only when the batch holds one (regex work per row).
    iso_secs, iso_ok, iso_known = tf.cond(
        tf.reduce_any(is_str), lambda: iso_seconds(text, is_str),
        lambda: (tf.zeros_like(v), tf.zeros_like(is_str), tf.zeros_like(is_str)))
    bad.append((is_str & ~iso_known, reason(path, ISO_UNSUPPORTED)))
    bad.append((is_str & iso_known & ~iso_ok, reason(path, f"not a timestamp (an invalid date or time){why}")))
    present = (is_int & int_ok) | (is_float & float_ok) | (is_str & iso_ok)
    secs = tf.where(is_int & int_ok, secs_i, tf.where(is_float & float_ok, secs_f, tf.zeros_like(secs_i)))
    return tf.where(is_str & iso_ok, iso_secs, secs), present


class Timestamp(ServingTransform):
    """Integers (int64), floats and strings travel side by side; seconds are scaled in
    float64 then cast, parts computed from the int64 seconds."""

    name = "timestamp"

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        return ("number", "term", "int")

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        s = layer.wire.by_path(f.source)
        secs, present = _seconds(inputs[s.kind_name], inputs[s.input_name("int")], inputs[s.input_name("number")],
                                 inputs[s.input_name("term")], f.unit or "ms", s.path, bad)
        cols: dict[str, tf.Tensor] = {f.name: scaled_base(tf.cast(secs, tf.float64), present, layer.stats(f.name))[:, None]}
        days = tf.math.floordiv(secs, DAY_SECONDS)
        for part in f.parts or ():
            if part == "hour":
                col = tf.math.floordiv(tf.math.floormod(secs, DAY_SECONDS), 3600)
            elif part == "day_of_week":
                col = tf.math.floormod(days + 3, 7)
            else:
                col = civil_month(days)
            cols[f"{f.name}_{part}"] = tf.where(present, col, tf.zeros_like(col))[:, None]
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = tf.cast(~present, tf.int64)[:, None]
        return cols


TRANSFORM = Timestamp()
