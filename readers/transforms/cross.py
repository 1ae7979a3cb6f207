"""``cross``: two or more categorical ``sources`` hashed together -> id ``1..buckets``."""
from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from convert.derive import CROSS_SEPARATOR
from readers._serving_kinds import KIND_NESTED, KIND_NULL
from readers.serving_ops import reason
from readers.transforms.base import Checks, Layer, ServingTransform


class Cross(ServingTransform):
    """The sources' terms joined by ``CROSS_SEPARATOR``, hashed; 0 where any is null."""

    name = "cross"
    reads_terms = True

    def hashed(self, f: FeatureConfig) -> str | None:
        return f"transform {self.name!r}"

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        missing = None
        terms = []
        for path in f.sources or ():
            s = layer.wire.by_path(path)
            kind = inputs[s.kind_name]
            nested = tf.equal(kind, KIND_NESTED)
            bad.append((nested, reason(path, "cross needs single values, found a record or list; cross scalar fields only")))
            m = tf.equal(kind, KIND_NULL) | nested
            missing = m if missing is None else missing | m
            terms.append(inputs[s.input_name("term")])
        ids = tf.strings.to_hash_bucket_fast(tf.strings.join(terms, separator=CROSS_SEPARATOR), f.buckets) + 1
        return {f.name: tf.where(missing, tf.zeros_like(ids), ids)[:, None]}


TRANSFORM = Cross()
