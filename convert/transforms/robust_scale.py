"""``robust_scale``: ``(x - median) / (q75 - q25)`` of the training split (scikit-learn's
``RobustScaler``): outliers move neither the center nor the width, as they move a mean and std.

The quantiles come from the mergeable quantile sketch ``bucketize`` keeps (``convert.quantiles``),
so they are as reproducible as its boundaries. An IQR of 0 or an empty training split scales by 1,
as ``zscore`` does with a std of 0. ``fill: mean`` (the default) fills a missing value with the
center of the scaling, the median, so it is written 0.0 as ``zscore``'s default is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from convert.columns import Columns, Numbers
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

    def fill_stats(self, f: FeatureConfig, stats: Mapping[str, Any]) -> Mapping[str, Any]:
        """``stats`` as the shared fill reads them: ``fill: mean`` is the median (written 0.0)."""
        return {**stats, "mean": self.span(stats)[0]} if f.fill == "mean" else stats

    def finish_numbers(self, f: FeatureConfig, prepared: Numbers, stats: Mapping[str, Any]) -> Columns:
        return super().finish_numbers(f, prepared, self.fill_stats(f, stats))


TRANSFORM = RobustScale()
