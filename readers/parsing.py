"""Parsing recordprep's ``tf.train.Example`` batches: the parse plan from
``dataset_info.json`` (fixed shapes, metadata defaults, packed features) and
the per-batch parse every reader (in-process or on a tf.data service worker)
ends with.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from convert.spec import (
    PACKED_KEYS,
    DatasetInfo,
    FeatureSpec,
    SpecError,
)
from readers.info import label_and_features

logger = logging.getLogger("readers")

_TF_DTYPES = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}
_NP_DTYPES = {"float32": np.float32, "int64": np.int64, "string": object}


class FromMetadata:
    """Default of ``label_key``: use ``dataset_info.json``'s ``label_key``."""

    def __repr__(self) -> str:
        return "<label_key from dataset_info.json>"


FROM_METADATA: Any = FromMetadata()


# --------------------------------------------------------------------------- parsing


def _fixed_len_feature(spec: FeatureSpec) -> tf.io.FixedLenFeature:
    dtype = _TF_DTYPES[spec.dtype]
    if spec.default is None:
        return tf.io.FixedLenFeature(spec.shape, dtype)
    values = np.asarray(spec.default, dtype=_NP_DTYPES[spec.dtype])
    if values.size == 1 and spec.size != 1:
        values = np.full(spec.shape, values.reshape(()).item(), dtype=_NP_DTYPES[spec.dtype])
    elif values.size != spec.size:
        raise SpecError(
            f"feature {spec.name!r}: default has {values.size} value(s) but shape {spec.shape} "
            f"needs {spec.size} (or one to broadcast); the metadata is inconsistent, re-run the conversion"
        )
    return tf.io.FixedLenFeature(spec.shape, dtype, default_value=values.reshape(spec.shape))


def feature_spec(info: DatasetInfo, names: Sequence[str]) -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_example`` spec for ``names`` (fixed shapes, metadata defaults)."""
    return {name: _fixed_len_feature(info.feature(name)) for name in names}


# The functions given to tf.data below use no Python control flow on tensors,
# so AutoGraph is switched off for them: converting them is source transformation
# at every dataset build, most of the time to first batch (docs/benchmarks.md#design-readers).
plain = tf.autograph.experimental.do_not_convert


def parse_plan(info: DatasetInfo, names: Sequence[str]) -> tuple[dict[str, tf.io.FixedLenFeature], Any]:
    """How to get ``names`` out of a batch of serialized Examples.

    Returns ``(spec, unpack)``: the ``tf.io.parse_example`` spec of what is on
    disk, and a function from that parse's result to one tensor per name
    (shape ``(batch, *feature.shape)``). With the ``features`` layout the spec
    is :func:`feature_spec` and ``unpack`` returns its input; with ``packed``
    the spec holds the packed Features (``convert.spec.PACKED_KEYS``) and
    ``unpack`` slices each feature out of them.
    """
    slices = info.packing
    if slices is None:
        return feature_spec(info, names), (lambda parsed: parsed)
    where = {name: (dtype, i) for dtype, parts in slices.items() for i, (name, _, _) in enumerate(parts)}
    spec: dict[str, tf.io.FixedLenFeature] = {}
    for name in names:
        if name in where:
            dtype = where[name][0]
            spec[PACKED_KEYS[dtype]] = tf.io.FixedLenFeature([sum(w for *_, w in slices[dtype])], _TF_DTYPES[dtype])
        else:
            spec[name] = _fixed_len_feature(info.feature(name))
    shapes = {name: info.feature(name).shape for name in names}

    def unpack(parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        # One split per packed Feature (not a slice per feature): fewer ops to
        # trace, so building the pipeline stays quick.
        pieces = {dtype: tf.split(parsed[PACKED_KEYS[dtype]], [w for *_, w in slices[dtype]], axis=1)
                  for dtype in slices if PACKED_KEYS[dtype] in parsed}
        out = {}
        for name in names:
            if name not in where:
                out[name] = parsed[name]
                continue
            t = pieces[where[name][0]][where[name][1]]
            out[name] = t if len(shapes[name]) == 1 else tf.reshape(t, [-1, *shapes[name]])
        return out

    return spec, unpack


def _parse_fixed(serialized: tf.Tensor, spec: dict[str, tf.io.FixedLenFeature]) -> dict[str, tf.Tensor]:
    """``tf.io.parse_example(serialized, spec)`` for a spec of ``FixedLenFeature``s only.

    The same ``ParseExampleV2`` op that function builds, called directly so
    that features without a default share one empty default per dtype: its
    wrapper makes a graph constant per feature, a measurable share of the
    time to the first batch (docs/benchmarks.md#design-readers). Same results
    (tests/test_readers_dataset.py compares the two).
    """
    keys = sorted(spec)
    # One constant per distinct default, already in the feature's shape
    # (tf.constant reshapes it): a reshape per feature was 2 more graph ops each.
    consts: dict[tuple[Any, ...], tf.Tensor] = {}
    defaults = []
    for k in keys:
        f = spec[k]
        if f.default_value is None:
            key: tuple[Any, ...] = (f.dtype, None)
            if key not in consts:
                consts[key] = tf.constant([], f.dtype)
        else:
            value = np.asarray(f.default_value, f.dtype.as_numpy_dtype).reshape(f.shape)
            raw = repr(value.tolist()) if value.dtype == object else value.tobytes()
            key = (f.dtype, value.shape, raw)
            if key not in consts:
                consts[key] = tf.constant(value, f.dtype)
        defaults.append(consts[key])
    no_keys = tf.constant([], tf.string)
    out = tf.raw_ops.ParseExampleV2(
        serialized=serialized,
        names=no_keys,
        sparse_keys=no_keys,
        dense_keys=tf.constant(keys, tf.string),
        ragged_keys=no_keys,
        dense_defaults=defaults,
        num_sparse=0,
        sparse_types=[],
        ragged_value_types=[],
        ragged_split_types=[],
        dense_shapes=[spec[k].shape for k in keys],
    )
    return dict(zip(keys, out.dense_values, strict=True))


def _make_parse_fn(plan: tuple[dict[str, tf.io.FixedLenFeature], Any], label_key: str | None):
    parse_spec, unpack = plan

    @plain
    def parse(serialized: tf.Tensor):
        parsed = unpack(_parse_fixed(serialized, parse_spec))
        if label_key is None:
            return parsed
        label = parsed.pop(label_key)
        return parsed, label

    return parse


def parse_batches(batches: tf.data.Dataset, plan: tuple[dict[str, tf.io.FixedLenFeature], Any],
                   label: str | None, prefetch: int) -> tf.data.Dataset:
    """Parse each batch of serialized records with one vectorized parse (the
    batch-then-parse form of map-and-batch), then prefetch: the tail both
    readers share.

    The parse keeps batch order even for ``deterministic=False`` reads: every
    batch costs the same to parse, so overtaking buys nothing here, while
    reordered batches would carry records of the next epoch ahead of the
    current one's last batches (shuffle before repeat must keep epochs apart).
    """
    batches = batches.map(_make_parse_fn(plan, label), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return batches.prefetch(prefetch)


def resolve_label(info: DatasetInfo, label_key: Any, features: Sequence[str] | None):
    key = info.label_key if isinstance(label_key, FromMetadata) else label_key
    if key is not None and not isinstance(key, str):
        raise TypeError(f"label_key must be a feature name or None, found {key!r}")
    return label_and_features(info, key, features)
