"""The registry: every transform, one line each, in the order messages list them.

Adding a transform is its module (a ``convert.transforms.base.Transform``
subclass and its ``TRANSFORM``), one line here and its tests; its serving
twin is ``readers.transforms.<module>`` (``Transform.serving``).
"""

from __future__ import annotations

from convert.transforms import (
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
from convert.transforms.base import Transform

REGISTRY: dict[str, Transform] = {
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
