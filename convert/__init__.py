"""Record-level conversion logic: no Beam and no TensorFlow in here.

The public API (docs/api/convert.md): the feature config (``load_config``,
``parse_config``, ``Config``, ``FeatureConfig``, ``LabelConfig``,
``ConfigError``), drafting one from data (``infer_config``, ``render_yaml``)
and an output's analysis applied to new records (``apply_analysis``,
``OutputAnalysis``). The names are imported on first use, so that
``import convert`` (which every conversion worker does) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from convert.apply import OutputAnalysis, apply_analysis
    from convert.config import (
        Config,
        ConfigError,
        FeatureConfig,
        LabelConfig,
        load_config,
        parse_config,
    )
    from convert.infer import infer_config, render_yaml

__all__ = [
    "Config",
    "ConfigError",
    "FeatureConfig",
    "LabelConfig",
    "OutputAnalysis",
    "apply_analysis",
    "infer_config",
    "load_config",
    "parse_config",
    "render_yaml",
]

_LAZY = {"Config": "convert.config", "ConfigError": "convert.config", "FeatureConfig": "convert.config",
         "LabelConfig": "convert.config", "load_config": "convert.config", "parse_config": "convert.config",
         "infer_config": "convert.infer", "render_yaml": "convert.infer",
         "apply_analysis": "convert.apply", "OutputAnalysis": "convert.apply"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'convert' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
