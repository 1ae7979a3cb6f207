"""``ngrams``' TensorFlow twin: a batch's tokens -> their n-grams, in the converter's order.

``convert.transforms.ngrams`` defines the output: the n-grams of each row's
tokens with ``lo <= n <= hi``, ``separator`` between their tokens, by start
position then by size (TF Transform's ``tft.ngrams`` order, built as it builds
them: shifted copies of the tokens joined, windows crossing a row's end masked).
"""

from __future__ import annotations

import tensorflow as tf


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
