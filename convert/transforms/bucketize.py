"""``bucketize``: a number -> bucket id ``1..num_buckets`` cut at the training split's quantiles (0: missing)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.columns import Columns, Numbers
from convert.spec import FeatureSpec
from convert.transforms.base import Need, NumericTransform, flush_subnormal_inputs
from convert.value_sketch import ValueSketch

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.quantiles import QuantileSketch


class Bucketize(NumericTransform):
    name = "bucketize"
    summary = "number -> bucket id 1..num_buckets cut at the training split's quantiles"
    options = ("num_buckets", "missing_indicator", "on_nan")
    serving = "readers.transforms.bucketize"
    learns_scaling = True
    quantiles = True
    sketch_keys = ("boundaries",)
    not_taken_why = {"fill": "a missing value gets id 0, values ids 1..num_buckets",
                     "max_len": "it takes one number per record"}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        kw.setdefault("num_buckets", 10)
        super().complete(kw, need)

    def sketch_stats(self, f: FeatureConfig, sketch: QuantileSketch) -> dict[str, Any]:
        return {"boundaries": sketch.boundaries(f.num_buckets or 10)}

    def spec_params(self, f: FeatureConfig, params: dict[str, Any]) -> None:
        bounds = (params.get("stats") or {}).get("boundaries") or []
        params.update(boundaries=bounds, vocab_size=len(bounds) + 2, pad_id=0)

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        return [FeatureSpec(f.name, "int64", (1,), 0, f.source, self.name, params, encoding=self.encoding)]

    def finish_numbers(self, f: FeatureConfig, prepared: Numbers, stats: Mapping[str, Any]) -> Columns:
        """0 = missing (or NaN with on_nan: fill), 1..B = buckets at the training quantiles."""
        out, present, missing_row = prepared.values, prepared.present, prepared.missing_row
        b, n = out.shape
        out = flush_subnormal_inputs(out)
        bounds = np.asarray(stats.get("boundaries") or [], dtype=np.float64)
        ids = np.where(present, 1 + np.searchsorted(bounds, out, side="right"), 0).astype(np.int64)
        cols: dict[str, tuple[str, Any]] = {f.name: ("int64", ids.reshape(b, n))}
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = ("int64", missing_row.astype(np.int64).reshape(b, 1))
        return cols

    def after_from_before(self, f: FeatureConfig, before: ValueSketch, stats: Mapping[str, Any]) -> ValueSketch:
        bounds = list(stats.get("boundaries") or [])
        counts = before.histogram([-math.inf, *bounds, math.inf])
        return ValueSketch.of_points(np.arange(1, len(counts) + 1), np.asarray(counts))


TRANSFORM = Bucketize()
