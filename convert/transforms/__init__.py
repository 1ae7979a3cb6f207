"""Transforms, one module each: what a transform is and the parts of converting that differ by it.

A feature's transform object (``transform_of(feature)``, or ``get(name)``)
holds its summary and options, its option defaults and requirements, the
traits the shared machinery asks about (numeric? a vocabulary? hashed ids?
a list per record?), how it finishes its values, its statistics kind, the
feature spec(s) it writes, what input it accepts and ``serving``, the module
of its TensorFlow twin (``readers.transforms.<module>``; convert never
imports TensorFlow). The registry (``convert.transforms.registry``) lists
them, one line each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convert.transforms.base import HashedTransform, NumericTransform, ScaledTransform, Transform
from convert.transforms.registry import REGISTRY

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig

__all__ = [
    "HashedTransform",
    "NumericTransform",
    "ScaledTransform",
    "Transform",
    "find",
    "get",
    "names",
    "transform_of",
]


def get(name: str) -> Transform:
    """The transform called ``name``; KeyError naming the known ones when there is none."""
    t = REGISTRY.get(name)
    if t is None:
        raise KeyError(f"no transform {name!r}; the transforms are {', '.join(REGISTRY)}")
    return t


def find(name: str | None) -> Transform | None:
    """The transform called ``name``, or None (a label's pseudo-reader, a name no config can hold)."""
    return REGISTRY.get(name) if name is not None else None


def transform_of(feature: FeatureConfig) -> Transform:
    """``feature``'s transform object (``feature.transform`` names it)."""
    return get(feature.transform)


def names() -> tuple[str, ...]:
    """Every transform's name, in registry order (the order messages list them)."""
    return tuple(REGISTRY)
