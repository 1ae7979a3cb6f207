"""The bench transforms done in TensorFlow, for the feeding rows that read Parquet every epoch.

Used inside the Ray Data and Petastorm virtualenvs (numpy, pyarrow, TensorFlow,
Keras; nothing of recordprep). Two halves:

:func:`raw_columns`
    A pyarrow table of the Parquet files -> fixed-shape numpy columns (what
    both peers must hand TensorFlow: neither carries ragged lists or nulls
    into a tensor): numbers as float64 with NaN for null, timestamps as epoch
    milliseconds, terms as strings with ``""`` for null (booleans as
    ``"true"``/``"false"``, integers as their decimal string), lists padded
    to ``max_len`` with ``<name>__n`` their length, the label as int64.
:class:`Prep`
    Keras preprocessing layers adapted on the train split (recordprep's split
    rule, :func:`bench.peer_common.train_table`), called in a ``tf.data`` map
    on each batch: ``Normalization`` (z-score; a null is the mean, i.e. 0),
    ``StringLookup`` with ``mask_token=""`` and one OOV index (recordprep's
    layout: 0 missing/padding, 1 out of vocabulary, then terms by frequency;
    ``max_tokens`` = ``top_k`` + 2), ``TextVectorization`` (recordprep's
    tokens, ``output_sequence_length`` = ``max_len``), ``Hashing`` (FarmHash
    ``Fingerprint64`` mod buckets, + 1: recordprep's ids), and plain TF ops
    for min-max (training min/max), log1p, clip and identity. Keras has no
    ``min_frequency``; ties between terms of equal count may order differently.
"""

from __future__ import annotations

from typing import Any

from bench.peer_common import flat_columns, train_table

NUMERIC = ("identity", "zscore", "minmax", "log1p", "clip")
_STANDARDIZE = r"[\x00-\x2f\x3a-\x40\x5b-\x5e\x60\x7b-\x7f]+"


def raw_columns(table: Any, feats: list[dict[str, Any]], label: dict[str, Any]) -> dict[str, Any]:
    """The fixed-shape numpy columns of ``table`` that :class:`Prep` takes (see the module docstring)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = flat_columns(table, feats, label)
    out: dict[str, Any] = {}
    for f in feats:
        name, col, t = f["name"], cols[f["name"]], f["transform"]
        if t in NUMERIC and not f.get("max_len"):
            if pa.types.is_timestamp(col.type):
                col = col.cast(pa.int64())
            out[name] = col.cast(pa.float64()).to_numpy(zero_copy_only=False)
        elif f.get("max_len") and t != "text":
            n = f["max_len"]
            lists = col.to_pylist()
            if t in NUMERIC:
                arr = np.zeros((len(lists), n), dtype="float64")
                for i, v in enumerate(lists):
                    v = (v or [])[:n]
                    arr[i, :len(v)] = v
            else:
                arr = np.full((len(lists), n), "", dtype=object)
                for i, v in enumerate(lists):
                    v = (v or [])[:n]
                    arr[i, :len(v)] = ["" if x is None else str(x) for x in v]
            out[name] = arr
            out[name + "__n"] = np.array([min(len(v or []), n) for v in lists], dtype="int64")
        else:
            if pa.types.is_boolean(col.type):
                col = pc.if_else(col, "true", "false")
            out[name] = pc.fill_null(col.cast(pa.string()), "").to_numpy(zero_copy_only=False).astype(object)
    out[label["name"]] = cols[label["name"]].cast(pa.int64()).to_numpy(zero_copy_only=False)
    return out


def raw_signature(feats: list[dict[str, Any]], label: dict[str, Any]) -> dict[str, Any]:
    """``tf.TensorSpec`` of each :func:`raw_columns` column, batched."""
    import tensorflow as tf

    sig = {}
    for f in feats:
        name, t, n = f["name"], f["transform"], f.get("max_len")
        if t in NUMERIC:
            sig[name] = tf.TensorSpec([None, n] if n else [None], tf.float64)
        else:
            sig[name] = tf.TensorSpec([None, n] if n and t != "text" else [None], tf.string)
        if n and t != "text":
            sig[name + "__n"] = tf.TensorSpec([None], tf.int64)
    sig[label["name"]] = tf.TensorSpec([None], tf.int64)
    return sig


class Prep:
    """Keras preprocessing layers adapted on the train split; ``prep(batch)`` -> ``(features, label)``
    with recordprep's feature names, dtypes and shapes."""

    def __init__(self, feats: list[dict[str, Any]], label: dict[str, Any], files: list[str]) -> None:
        import keras
        import numpy as np

        self.feats, self.label = feats, label
        train = raw_columns(train_table(files), feats, label)
        self.layers: dict[str, Any] = {}
        self.consts: dict[str, tuple[float, float]] = {}
        self.feature_names: list[str] = []
        for f in feats:
            name, t, n = f["name"], f["transform"], f.get("max_len")
            x = train[name]
            self.feature_names.append(name)
            if f.get("missing_indicator"):
                self.feature_names.append(name + "_missing")
            if n:
                self.feature_names.append(name + "_len")
            if t == "zscore":
                layer = keras.layers.Normalization(axis=None)
                layer.adapt(x[~np.isnan(x)].astype("float32"))
                self.layers[name] = layer
            elif t == "minmax":
                v = x[~np.isnan(x)]
                self.consts[name] = (float(v.min()), float(v.max()))
            elif t == "vocabulary":
                terms = x.reshape(-1) if n else x
                layer = keras.layers.StringLookup(max_tokens=f["top_k"] + 2 if f.get("top_k") else None,
                                                  num_oov_indices=1, mask_token="")
                layer.adapt(terms[terms != ""].astype(str))
                self.layers[name] = layer
            elif t == "text":
                layer = keras.layers.TextVectorization(
                    max_tokens=f["top_k"] + 2 if f.get("top_k") else None, standardize=_standardize,
                    split="whitespace", output_mode="int", output_sequence_length=n)
                layer.adapt(x.astype(str))
                self.layers[name] = layer
            elif t == "hash":
                self.layers[name] = keras.layers.Hashing(num_bins=f["buckets"])

    def __call__(self, raw: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        import tensorflow as tf

        out = {}
        for f in self.feats:
            name, t, n = f["name"], f["transform"], f.get("max_len")
            x = raw[name]
            if t in NUMERIC:
                nan = tf.math.is_nan(x)
                if t == "zscore":
                    y = self.layers[name](tf.cast(x, tf.float32))
                elif t == "minmax":
                    lo, hi = self.consts[name]
                    y = tf.cast((x - lo) / (hi - lo) if hi > lo else x * 0.0, tf.float32)
                elif t == "log1p":
                    y = tf.cast(tf.math.log1p(x), tf.float32)
                elif t == "clip":
                    y = tf.cast(tf.clip_by_value(x, f["clip_min"], f["clip_max"]), tf.float32)
                else:
                    y = tf.cast(x, tf.float32)
                y = tf.where(nan, tf.zeros_like(y), y)
                out[name] = y if n else y[:, None]
                if f.get("missing_indicator"):
                    out[name + "_missing"] = tf.cast(nan, tf.int64)[:, None]
            elif t == "text":
                ids = self.layers[name](x)
                out[name] = ids
                words = tf.strings.split(_standardize(x))
                out[name + "_len"] = tf.minimum(words.row_lengths(), n)[:, None]
            elif t == "hash":
                out[name] = tf.where(x == "", tf.zeros_like(x, tf.int64), self.layers[name](x) + 1)[:, None]
            else:
                out[name] = self.layers[name](x) if n else self.layers[name](x)[:, None]
            if n and t != "text":
                out[name + "_len"] = raw[name + "__n"][:, None]
        return out, raw[self.label["name"]]


def _standardize(s: Any) -> Any:
    import tensorflow as tf

    return tf.strings.strip(tf.strings.regex_replace(tf.strings.lower(s), _STANDARDIZE, " "))
