"""``bytes``: bytes or a string passed through unvectorized (images)."""
from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from readers._serving_kinds import KIND_BYTES, KIND_NULL, KIND_STRING
from readers.serving_ops import isin, wrong_kind_reason
from readers.transforms.base import Checks, Layer, ServingTransform


class Bytes(ServingTransform):
    """The raw bytes (a string's UTF-8); null: empty; another kind rejects its record."""

    name = "bytes"

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        return ("raw",)

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        s = layer.wire.by_path(f.source)
        kind = inputs[s.kind_name]
        ok = isin(kind, (KIND_STRING, KIND_BYTES))
        bad.append((~ok & tf.not_equal(kind, KIND_NULL), wrong_kind_reason(s.path, kind, "expected bytes or a string, found ")))
        v = tf.where(ok, inputs[s.input_name("raw")], "")
        return {f.name: v[:, None]}


TRANSFORM = Bytes()
