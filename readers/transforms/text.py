"""``text``: a string -> its first ``max_len`` token ids (a vocabulary of tokens) and ``<name>_len``."""
from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from readers._serving_kinds import KIND_NULL, KIND_STRING
from readers.serving_ops import TEXT_PARTS, slots, text_tokens, wrong_kind_reason
from readers.transforms.base import Checks, Layer, ServingTransform
from readers.transforms.vocabulary import vocabulary_ids


def _token_ids(layer: Layer, f: FeatureConfig, text: tf.Tensor) -> tf.Tensor:
    """``[len(text), max_len]``: each string's token ids, zero-padded."""
    if f.lowercase:
        text = tf.strings.lower(text)  # ASCII only, like convert.records.ascii_lower
    tokens = text_tokens(text)
    # Every token is looked up, then summed into its row's slot (its position; past the
    # first n, segment -1, which the sum drops): cheaper than a ragged tensor's row
    # splits and to_tensor.
    rows, cols = tf.unstack(tokens.indices, num=2, axis=1)
    return slots(vocabulary_ids(layer, f, tokens.values), rows, cols, f.max_len, tokens.dense_shape[0])


class Text(ServingTransform):
    """One string per record (a path through lists: its strings joined), tokenized in-graph
    in ``TEXT_PARTS`` row ranges; tokens take vocabulary ids (OOV buckets by hash)."""

    name = "text"

    def is_list(self, f: FeatureConfig) -> bool:
        return False  # max_len counts its tokens

    def hashed(self, f: FeatureConfig) -> str | None:
        return f"transform {self.name!r}"

    def ids(self, layer: Layer, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        return vocabulary_ids(layer, f, terms)

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        s = layer.wire.by_path(f.source)
        kind = inputs[s.kind_name]
        is_str = tf.equal(kind, KIND_STRING)
        bad.append((~is_str & tf.not_equal(kind, KIND_NULL), wrong_kind_reason(s.path, kind, "expected text (a string), found ")))
        # Other kinds' rows are zeroed at the end (int ops), not emptied first (a string copy).
        name = s.input_name("term")
        batch = tf.shape(kind, out_type=tf.int64)[0]
        cuts = [batch * i // TEXT_PARTS for i in range(TEXT_PARTS + 1)]
        rows = inputs.rows  # readers.serving_ops.PackedColumns: rows cut from the packed input
        dense = tf.concat([_token_ids(layer, f, rows(name, cuts[i], cuts[i + 1])) for i in range(TEXT_PARTS)], axis=0)
        lens = tf.math.count_nonzero(dense, axis=1)  # a token's id is never 0 (padding)
        return {f.name: tf.where(is_str[:, None], dense, tf.zeros_like(dense)),
                f"{f.name}_len": tf.where(is_str, lens, tf.zeros_like(lens))[:, None]}


TRANSFORM = Text()
