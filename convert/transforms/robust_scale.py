"""``robust_scale``: ``(x - median) / (q75 - q25)`` of the training split (scikit-learn's
``RobustScaler``): outliers move neither the center nor the width, as they move a mean and std.

The quantiles come from the mergeable quantile sketch ``bucketize`` keeps (``convert.quantiles``),
so they are as reproducible as its boundaries. An IQR of 0 or an empty training split scales by 1,
as ``zscore`` does with a std of 0. ``fill: median`` (the default) fills a missing value with the
center of the scaling, so it is written 0.0 as ``zscore``'s default is; ``fill: mean`` fills it
with the training mean (the moments every numeric feature's analysis keeps), scaled like a value:
``(mean - median) / IQR``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from convert.spec import daz
from convert.transforms.base import StandardizingTransform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.quantiles import QuantileSketch

#: The ranks kept of the sketch, by statistic.
RANKS = {"q25": 0.25, "median": 0.5, "q75": 0.75}


class RobustScale(StandardizingTransform):
    name = "robust_scale"
    summary = "(x - median) / (q75 - q25) of the training split"
    serving = "readers.transforms.robust_scale"
    quantiles = True
    sketch_keys = tuple(RANKS)
    fill_default = "median"
    fill_names = ("median", "mean")
    #: Before ``fill: median`` existed, robust_scale's ``fill: mean`` (its default) was the median,
    #: and its outputs' configs say ``mean``: the normalized form keeps that spelling for the
    #: median, so a config without ``fill`` keeps its hash and an old output's config loads back
    #: meaning what its shards hold; the training mean, new, is spelled ``training_mean`` there.
    fill_spelling = {"median": "mean", "mean": "training_mean"}

    def sketch_stats(self, f: FeatureConfig, sketch: QuantileSketch) -> dict[str, Any]:
        qs = sketch.quantiles(RANKS.values())
        return dict(zip(RANKS, qs, strict=True)) if qs else dict.fromkeys(RANKS)

    def span(self, stats: Mapping[str, Any]) -> tuple[float, float]:
        """The median and the IQR, each read as TensorFlow's kernels read a constant (``daz``);
        0 and 1 where the analysis has none (an empty training split), an IQR of 0 is 1.
        The serving twin takes its constants from here, so both sides compute the same bits."""
        med, lo, hi = (stats.get(k) for k in ("median", "q25", "q75"))
        if med is None or lo is None or hi is None:
            return 0.0, 1.0
        return daz(float(med)), daz(float(hi) - float(lo)) or 1.0

    def fill_of(self, f: FeatureConfig, stats: Mapping[str, Any]) -> float:
        """``median``: the center of ``span``, so a missing value is written 0.0; ``mean``: the
        training mean as TensorFlow's kernels read a constant (``daz``), so the serving twin's
        subtraction gives the same bits where the mean is below the smallest normal double."""
        if f.fill == "median":
            return self.span(stats)[0]
        return daz(super().fill_of(f, stats)) if f.fill == "mean" else super().fill_of(f, stats)


TRANSFORM = RobustScale()
