"""``ngrams``' TensorFlow twin: a batch's tokens -> their n-grams, in the converter's order.

``convert.transforms.ngrams`` defines the output: the n-grams of each row's
tokens with ``lo <= n <= hi``, ``separator`` between their tokens, by start
position then by size (TF Transform's ``tft.ngrams`` order, built as it builds
them: shifted copies of the tokens joined, windows crossing a row's end masked).
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from convert.config import FeatureConfig
from convert.transforms.ngrams import UNIGRAMS
from readers._serving_kinds import KIND_NULL, KIND_STRING
from readers.serving_ops import slots, text_tokens, wrong_kind_reason
from readers.transforms.base import Checks, Layer
from readers.transforms.text import Text


def ngrams(tokens: tf.SparseTensor, lo: int, hi: int, separator: str) -> tf.SparseTensor:
    """``[batch, n-grams]``: each row's n-grams of ``tokens`` (``[batch, tokens]``, each row's
    tokens at columns ``0..``, rows in order)."""
    if lo == hi == 1:
        return tokens
    values, rows = tokens.values, tokens.indices[:, 0]
    size = tf.shape(values)[:1]

    def shifted(t: tf.Tensor, s: int, fill: tf.Tensor) -> tf.Tensor:
        return tf.concat([t, tf.fill([s], fill)], 0)[s:][: size[0]] if s else t

    rows_at = [shifted(rows, s, tf.constant(-1, tf.int64)) for s in range(hi)]
    tokens_at = [shifted(values, s, tf.constant("")) for s in range(hi)]
    grams = tf.stack([tf.strings.join(tokens_at[:n], separator=separator) for n in range(lo, hi + 1)], axis=1)
    # Rows are in order, so a window lies in one row when its last token is in its first token's row.
    valid = tf.stack([tf.equal(rows_at[n - 1], rows) for n in range(lo, hi + 1)], axis=1)
    gram_rows = tf.boolean_mask(tf.tile(rows[:, None], [1, hi - lo + 1]), valid)
    grams = tf.boolean_mask(grams, valid)
    # Each n-gram's column: its place in the row-major order less its row's first place.
    starts = tf.math.unsorted_segment_min(tf.range(tf.shape(gram_rows, out_type=tf.int64)[0]), gram_rows,
                                          tokens.dense_shape[0])
    cols = tf.range(tf.shape(gram_rows, out_type=tf.int64)[0]) - tf.gather(starts, gram_rows)
    width = tf.maximum(tf.reduce_max(tf.concat([cols, [-1]], 0)) + 1, 0)
    return tf.SparseTensor(tf.stack([gram_rows, cols], axis=1), grams, tf.stack([tokens.dense_shape[0], width]))


class TermsTransform(Text):
    """A transform over a text's terms (``convert.transforms.ngrams.document_terms``): one
    string per record as ``text`` reads it, tokenized by ``text``'s tokenizer, then its
    n-grams (``ngram_range``); their ids are looked up as ``text``'s."""

    def document(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor],
                 bad: Checks) -> tuple[tf.SparseTensor, tf.Tensor, tf.Tensor]:
        """``(terms, ids, is_str)``: each row's terms ``[batch, terms]`` in order, their ids (flat),
        and which rows hold a string (the others are rejected, or null: no terms)."""
        s = layer.wire.by_path(f.source)
        kind = inputs[s.kind_name]
        is_str = tf.equal(kind, KIND_STRING)
        bad.append((~is_str & tf.not_equal(kind, KIND_NULL), wrong_kind_reason(s.path, kind, "expected text (a string), found ")))
        text = inputs[s.input_name("term")]
        text = tf.where(is_str, text, tf.zeros_like(text))  # a rejected row's terms are none
        if f.lowercase:
            text = tf.strings.lower(text)  # ASCII only, like convert.records.ascii_lower
        lo, hi = f.ngram_range or UNIGRAMS
        terms = ngrams(text_tokens(text), lo, hi, f.separator)
        return terms, layer.ids(f, terms.values), is_str


class Ngrams(TermsTransform):
    """The first ``max_len`` n-gram ids of each row, in order, and ``<name>_len``."""

    name = "ngrams"

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        terms, ids, _ = self.document(layer, f, inputs, bad)
        rows, cols = tf.unstack(terms.indices, num=2, axis=1)
        dense = slots(ids, rows, cols, f.max_len, terms.dense_shape[0])
        return {f.name: dense, f"{f.name}_len": tf.math.count_nonzero(dense, axis=1)[:, None]}  # an id is never 0


TRANSFORM = Ngrams()
