"""The transforms as the serving layer applies them: one module per transform
(``readers.transforms.<name>``, the twin of the converter's
``convert.transforms.<name>``), each a ``ServingTransform``, and the one
registry mapping a config's transform name to it.

Adding a transform: its module here (a subclass of ``ServingTransform`` and its
``TRANSFORM`` instance), one line in ``_REGISTRY``, and its features in the
serving parity tests (``tests/test_readers_transforms.py`` checks both sides
name the same transforms).
"""
from __future__ import annotations

from convert.config import FeatureConfig
from readers.transforms import (
    bag_of_words,
    bucketize,
    bytes,
    clip,
    count,
    cross,
    cyclical,
    hash,
    identity,
    label_vocabulary,
    log1p,
    minmax,
    ngrams,
    robust_scale,
    text,
    tfidf,
    timestamp,
    vocabulary,
    zscore,
    zscore_per_key,
)
from readers.transforms.base import (
    IDENTITY,
    LINEAR,
    ZERO,
    Checks,
    IdTransform,
    Layer,
    NumericStep,
    NumericTransform,
    ServingTransform,
)

__all__ = [
    "IDENTITY",
    "LINEAR",
    "ZERO",
    "Checks",
    "IdTransform",
    "Layer",
    "NumericStep",
    "NumericTransform",
    "ServingTransform",
    "get",
    "names",
    "serving_of",
]

#: Every transform's serving side, in the order of the converter's table.
_REGISTRY: dict[str, ServingTransform] = {
    "identity": identity.TRANSFORM,
    "zscore": zscore.TRANSFORM,
    "minmax": minmax.TRANSFORM,
    "log1p": log1p.TRANSFORM,
    "clip": clip.TRANSFORM,
    "bucketize": bucketize.TRANSFORM,
    "vocabulary": vocabulary.TRANSFORM,
    "hash": hash.TRANSFORM,
    "text": text.TRANSFORM,
    "ngrams": ngrams.TRANSFORM,
    "bag_of_words": bag_of_words.TRANSFORM,
    "tfidf": tfidf.TRANSFORM,
    "bytes": bytes.TRANSFORM,
    "timestamp": timestamp.TRANSFORM,
    "cross": cross.TRANSFORM,
    "count": count.TRANSFORM,
    "cyclical": cyclical.TRANSFORM,
    "zscore_per_key": zscore_per_key.TRANSFORM,
    "label_vocabulary": label_vocabulary.TRANSFORM,
    "robust_scale": robust_scale.TRANSFORM,
}


def names() -> tuple[str, ...]:
    """The registered transforms' names."""
    return tuple(_REGISTRY)


def get(name: str) -> ServingTransform:
    """Transform ``name``'s serving side; raises KeyError naming the registered ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no serving transform {name!r}; registered: {', '.join(_REGISTRY)}") from None


def serving_of(feature: FeatureConfig) -> ServingTransform:
    """The serving side of ``feature``'s transform."""
    return get(feature.transform)
