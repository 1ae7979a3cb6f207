"""A Keras encoder built from an output's feature spec: each feature as its ``encoding`` says.

``feature_encoder(info)`` returns the model's inputs (a ``tf.keras.Input`` per
feature it encodes) and one float tensor, every feature encoded and concatenated:

- ``embedding`` (an id ``0..vocab_size-1``): an embedding ``embedding_dim(vocab_size)`` wide;
- ``tokens`` (ids padded with 0): the mean of the embeddings of the row's non-zero ids
  (``MaskedMeanEmbedding``; zeros for a row without any);
- ``weighted_tokens`` (ids padded with 0, and the float32 weights of the feature their
  params' ``weights`` names: a bag of words' counts, tf-idf): the weighted mean of the
  embeddings of the non-zero ids (``WeightedMeanEmbedding``, the "mean" combiner of
  TensorFlow's weighted embedding columns); the weights are an input of the model too;
- ``scaled`` (floats scaled by the training split): as they are;
- ``indicator`` (0/1): as a float.

``raw`` features (written as the input had them) and ``aux`` ones (a list's
length, which the pooling's mask already holds) are not encoded: naming one in
``features`` is an error that says what to do. A model built on the encoder
takes a subset of the shards' features, which ``readers.train_dataset(...,
features=list(inputs))`` yields and ``readers.export_serving`` feeds as it is.
Its layers are Keras built-ins and ``MaskedMeanEmbedding``, registered for
loading under the package ``recordprep`` (``recordprep export`` imports this
module before loading a ``.keras`` file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from convert.spec import DatasetInfo, FeatureSpec
from readers.info import TF_DTYPE_NAMES, label_and_features

#: Encodings the encoder takes as model inputs.
ENCODED = ("embedding", "tokens", "weighted_tokens", "scaled", "indicator")
#: Widest embedding ``embedding_dim`` gives by default.
MAX_EMBEDDING_DIM = 64


def embedding_dim(vocab_size: int, max_dim: int = MAX_EMBEDDING_DIM) -> int:
    """``min(max_dim, round(1.6 * vocab_size ** 0.56))``, at least 1: the rule of thumb
    fast.ai's tabular models use, which grows slowly with the number of ids."""
    return max(1, min(max_dim, round(1.6 * vocab_size**0.56)))


@tf.keras.utils.register_keras_serializable(package="recordprep")
class MaskedMeanEmbedding(tf.keras.layers.Layer):
    """``(batch, n)`` int ids -> ``(batch, output_dim)``: the mean of the embeddings of the
    non-zero ids of each row (0 is padding); zeros for a row without any id."""

    def __init__(self, input_dim: int, output_dim: int, embeddings_regularizer: Any = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.input_dim, self.output_dim = int(input_dim), int(output_dim)
        self.embeddings_regularizer = tf.keras.regularizers.get(embeddings_regularizer)
        self.embedding = tf.keras.layers.Embedding(self.input_dim, self.output_dim, name="embedding",
                                                   embeddings_regularizer=self.embeddings_regularizer)

    def build(self, input_shape: Any) -> None:
        self.embedding.build(input_shape)
        super().build(input_shape)

    def call(self, ids: tf.Tensor) -> tf.Tensor:
        emb = self.embedding(ids)
        mask = tf.cast(tf.not_equal(ids, 0), emb.dtype)[..., None]
        total = tf.reduce_sum(emb * mask, axis=1)
        return total / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0], self.output_dim)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "input_dim": self.input_dim, "output_dim": self.output_dim,
                "embeddings_regularizer": tf.keras.regularizers.serialize(self.embeddings_regularizer)
                if self.embeddings_regularizer is not None else None}


@tf.keras.utils.register_keras_serializable(package="recordprep")
class WeightedMeanEmbedding(MaskedMeanEmbedding):
    """``[(batch, n) int ids, (batch, n) float weights]`` -> ``(batch, output_dim)``: the mean of
    the embeddings of the non-zero ids of each row weighted by their weights, ``sum(w e) /
    sum(w)``; zeros for a row without any id (or whose weights sum to 0)."""

    def build(self, input_shape: Any) -> None:
        super().build(input_shape[0])

    def call(self, inputs: Any) -> tf.Tensor:
        ids, weights = inputs
        emb = self.embedding(ids)
        w = tf.where(tf.not_equal(ids, 0), tf.cast(weights, emb.dtype), tf.zeros_like(weights, emb.dtype))[..., None]
        return tf.math.divide_no_nan(tf.reduce_sum(emb * w, axis=1), tf.reduce_sum(w, axis=1))

    def compute_output_shape(self, input_shape: Any) -> tuple[Any, ...]:
        return (input_shape[0][0], self.output_dim)


def _encoded_specs(info: DatasetInfo, features: Sequence[str] | None) -> list[FeatureSpec]:
    """The features to encode: every one of an ``ENCODED`` encoding, or exactly those named."""
    _, specs = label_and_features(info, None, features)
    if features is None:
        return [f for f in specs if f.encoding in ENCODED]
    refused = [f"{f.name!r} ({f.encoding})" for f in specs if f.encoding not in ENCODED]
    if refused:
        raise ValueError(
            f"feature_encoder: {', '.join(refused)} cannot be encoded as written: a 'raw' feature holds the input's "
            f"values unscaled (convert it with a scaling transform such as zscore, or scale it in your model from "
            f"readers.keras_inputs), an 'aux' one is a helper column (a list's length); leave them out of features")
    return specs


def _encode(spec: FeatureSpec, inputs: Mapping[str, Any], dims: Mapping[str, int], max_dim: int,
            regularizer: Any) -> tf.Tensor:
    """One feature's input (``inputs[spec.name]``; a weighted one's weights too) -> a float
    ``(batch, width)`` tensor, by its encoding."""
    name = spec.name
    x = inputs[name]
    if spec.encoding in ("embedding", "tokens", "weighted_tokens"):
        vocab = int(spec.params["vocab_size"])
        dim = int(dims.get(name, embedding_dim(vocab, max_dim)))
        if spec.encoding == "tokens":
            return MaskedMeanEmbedding(vocab, dim, regularizer, name=f"tokens_{name}")(x)
        if spec.encoding == "weighted_tokens":
            weights = inputs[spec.params["weights"]]
            return WeightedMeanEmbedding(vocab, dim, regularizer, name=f"weighted_tokens_{name}")([x, weights])
        emb = tf.keras.layers.Embedding(vocab, dim, embeddings_regularizer=regularizer, name=f"embedding_{name}")(x)
        return tf.keras.layers.Flatten(name=f"flat_{name}")(emb)
    if spec.encoding == "indicator":
        # Rescaling(1) casts to float32 and, unlike a Lambda, loads without trusting Python code.
        return tf.keras.layers.Rescaling(1.0, name=f"indicator_{name}")(x)
    return x  # scaled


def _weights_of(spec: FeatureSpec, info: DatasetInfo) -> FeatureSpec:
    """The feature holding a ``weighted_tokens`` feature's weights (its params' ``weights``)."""
    found = [f for f in info.features if f.name == spec.params.get("weights") and f.shape == spec.shape]
    if not found:
        raise ValueError(f"feature_encoder: {spec.name!r} (weighted_tokens) names no weights feature of its shape in "
                         f"this dataset (params.weights {spec.params.get('weights')!r}); the metadata was edited or "
                         f"is damaged: re-convert the output")
    return found[0]


def feature_encoder(
    info: DatasetInfo,
    features: Sequence[str] | None = None,
    *,
    embedding_dims: Mapping[str, int] | None = None,
    max_embedding_dim: int = MAX_EMBEDDING_DIM,
    embeddings_regularizer: Any = None,
) -> tuple[dict[str, Any], tf.Tensor]:
    """``(inputs, encoded)``: a ``tf.keras.Input`` per encoded feature (and the weights of a
    ``weighted_tokens`` one), and their encodings concatenated.

    Args:
      info: from :func:`readers.load_info`.
      features: the features to encode (in this order); default every non-label
        feature whose ``encoding`` is one of ``ENCODED``, in metadata order.
      embedding_dims: a width per feature name, instead of ``embedding_dim(vocab_size)``.
      max_embedding_dim: the widest embedding ``embedding_dim`` gives.
      embeddings_regularizer: a Keras regularizer (or its name) of every embedding table.

    Raises:
      ValueError: a named feature is ``raw`` or ``aux``, or there is nothing to encode.
      KeyError: a named feature is not in the dataset.
    """
    specs = _encoded_specs(info, features)
    if not specs:
        raise ValueError("feature_encoder: this dataset has no feature a model can take as written "
                         f"(encodings {', '.join(ENCODED)}); see each feature's encoding in `recordprep inspect`")
    dims = dict(embedding_dims or {})
    # A weighted feature's weights (an aux column) are an input too, after the features encoded.
    weights = [_weights_of(f, info) for f in specs if f.encoding == "weighted_tokens"]
    inputs = {f.name: tf.keras.Input(shape=tuple(f.shape), dtype=TF_DTYPE_NAMES[f.dtype], name=f.name)
              for f in [*specs, *weights]}
    parts = [_encode(f, inputs, dims, max_embedding_dim, embeddings_regularizer) for f in specs]
    encoded = parts[0] if len(parts) == 1 else tf.keras.layers.Concatenate(name="encoded")(parts)
    return inputs, encoded
