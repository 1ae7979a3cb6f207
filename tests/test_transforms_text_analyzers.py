"""The math of ``ngrams``, ``bag_of_words`` and ``tfidf``: TF Transform's documented results,
merge-order independence of the analysis, and the TensorFlow twins bit for bit."""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert.prepare_values import TermIndex
from convert.records import tokenize
from convert.transforms.bag_of_words import bag_of_ids
from convert.transforms.ngrams import (
    document_terms,
    ngram_counts,
    ngram_range_problem,
    ngrams_of,
    separator_problem,
)
from convert.transforms.tfidf import (
    DocumentFrequencies,
    document_counts,
    idf,
    idf_table,
    tfidf_weights,
)

tf = pytest.importorskip("tensorflow")

from readers.transforms import bag_of_words as tf_bag  # noqa: E402
from readers.transforms import ngrams as tf_ngrams  # noqa: E402
from readers.transforms import tfidf as tf_tfidf  # noqa: E402

_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _feature(lowercase: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(source="query", lowercase=lowercase)


# -- ngrams


def test_ngrams_in_tft_order():
    # tft.ngrams' docstring: rows ['One', 'was', 'Johnny'] and ['Two', 'was', 'a', 'rat'], (1, 3), ' '.
    assert ngrams_of(["One", "was", "Johnny"], 1, 3, " ") == [
        "One", "One was", "One was Johnny", "was", "was Johnny", "Johnny"]
    assert ngrams_of(["Two", "was", "a", "rat"], 1, 3, " ") == [
        "Two", "Two was", "Two was a", "was", "was a", "was a rat", "a", "a rat", "rat"]
    assert ngrams_of(["a", "b", "c"], 2, 2, "_") == ["a_b", "b_c"]
    assert ngrams_of(["a"], 2, 3, " ") == []
    assert ngrams_of([], 1, 2, " ") == []


def test_ngram_counts_match_ngrams_of():
    rng = random.Random(3)
    for _ in range(200):
        lo = rng.randint(1, 4)
        hi = rng.randint(lo, 5)
        k = rng.randint(0, 9)
        assert ngram_counts(np.array([k]), lo, hi)[0] == len(ngrams_of(["t"] * k, lo, hi, " "))


def test_document_terms_are_the_text_tokenizers():
    values = ["The cat, the HAT", None, "x", "", "a b c d"]
    index = TermIndex({"\x00": -1})
    bad: dict = {}
    codes, counts = document_terms(_feature(), values, (1, 2), " ", bad, index)
    names = list(index)[1:]
    got = [names[c] for c in codes.tolist()]
    want = [g for v in values for g in ngrams_of(tokenize(v) if v else [], 1, 2, " ")]
    assert got == want and not bad
    assert counts.tolist() == [7, 0, 1, 0, 7]
    # Tokens only: the text transform's codes, through the same index.
    index1 = TermIndex({"\x00": -1})
    codes1, counts1 = document_terms(_feature(lowercase=False), ["A b A"], (1, 1), " ", bad, index1)
    assert [list(index1)[1:][c] for c in codes1.tolist()] == ["A", "b", "A"] and counts1.tolist() == [3]


def test_document_terms_reject_what_text_rejects():
    bad: dict = {}
    codes, counts = document_terms(_feature(), ["ok now", 5, ["x"]], (1, 2), " ", bad, TermIndex({"\x00": -1}))
    assert sorted(bad) == [1, 2] and "expected text" in bad[1].reason and bad[1].field == "query"
    assert counts.tolist() == [3, 0, 0] and codes.size == 3


def test_option_problems():
    assert ngram_range_problem([1, 2]) is None and ngram_range_problem((2, 2)) is None
    for bad in ([0, 1], [2, 1], [1, 9], [1], "1,2", [1.0, 2], [True, 2], None):
        assert "ngram_range" in ngram_range_problem(bad)
    assert separator_problem(" ") is None and separator_problem("") is None and separator_problem("_+_") is None
    for bad in ("\n", "a\tb", 3, "x" * 17, None):
        assert "separator" in separator_problem(bad)


# -- bag of words


def test_bag_of_ids_sorted_unique_counted():
    ids = np.array([7, 3, 7, 7, 2, 5, 5, 9, 1], dtype=np.int64)
    counts = np.array([4, 0, 5])
    out, occ, lens = bag_of_ids(ids, counts, 3)
    assert out.tolist() == [[3, 7, 0], [0, 0, 0], [1, 2, 5]] and lens.tolist() == [2, 0, 3]
    assert occ.dtype == np.float32 and occ.tolist() == [[1.0, 3.0, 0.0], [0.0, 0.0, 0.0], [1.0, 1.0, 2.0]]
    out, occ, _ = bag_of_ids(np.zeros(0, dtype=np.int64), np.array([0, 0]), 2)
    assert out.tolist() == [[0, 0], [0, 0]] and occ.tolist() == [[0.0, 0.0], [0.0, 0.0]]


# -- tf-idf


def test_tfidf_is_tft_docstring_example():
    # tft.tfidf's docstring: ["I", "like", "pie", "pie", "pie"], ["yum", "yum", "pie"] with the ids of
    # compute_and_apply_vocabulary (pie 0, yum 1, like 2, I 3), vocab_size 4.
    ids = np.array([3, 2, 0, 0, 0, 1, 1, 0], dtype=np.int64)
    counts = np.array([5, 3])
    index = ids.astype(np.int32)  # term index = id here
    df = document_counts(index, counts, 4)
    assert df.tolist() == [2, 1, 1, 1]
    table = idf_table(df.tolist(), 2, True, 0)
    out, w, _ = tfidf_weights(ids, counts, table, 0, 4)
    assert out.tolist() == [[0, 2, 3, 0], [0, 1, 0, 0]]
    want = np.array([[0.6, 0.28109303, 0.28109303, 0], [0.33333334, 0.9369768, 0, 0]], dtype=np.float32)
    assert w.dtype == np.float32 and np.array_equal(w, want)


def test_idf_formulas():
    df = np.array([1, 2, 10, 0])
    smooth = idf(df, 10, True)
    assert smooth.dtype == np.float32
    assert np.array_equal(smooth, (np.log(np.float32(11) / (np.float32(1) + df.astype(np.float32))).astype(np.float32)
                                   + np.float32(1)))
    plain = idf(df, 10, False)
    assert plain[2] == np.float32(1.0) and np.isinf(plain[3]) and np.isclose(plain[0], np.log(10) + 1)


def test_tfidf_out_of_vocabulary_counts_in_size_only():
    # ids 1 (an OOV bucket) are not weighted, but make the document 4 terms long.
    table = idf_table([3, 1], 4, True, 2)
    out, w, _ = tfidf_weights(np.array([1, 2, 1, 3]), np.array([4]), table, 2, 4)
    assert out.tolist() == [[2, 3, 0, 0]]
    assert w[0, 0] == np.float32(0.25) * table[2] and w[0, 1] == np.float32(0.25) * table[3]


def test_document_frequencies_merge_in_any_order():
    rng = random.Random(5)
    vocab = [f"t{i}" for i in range(30)]
    parts = []
    for _ in range(12):
        docs = [[rng.choice(vocab) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(1, 8))]
        index = TermIndex({None: -1})
        codes = np.fromiter((index[t] for d in docs for t in d), dtype=np.int32)
        counts = np.array([len(d) for d in docs])
        acc = DocumentFrequencies()
        acc.add(list(index)[1:], document_counts(codes, counts, len(index) - 1), len(docs))
        parts.append((acc, docs))
    truth = {t: sum(t in d for _, docs in parts for d in docs) for t in vocab}
    for _ in range(5):
        rng.shuffle(parts)
        total = DocumentFrequencies()
        for acc, _ in parts:
            total.merge(DocumentFrequencies(acc.documents, acc.terms.copy()))
        assert total.of(vocab) == [truth[t] for t in vocab]
        assert total.documents == sum(len(docs) for _, docs in parts)


# -- the TensorFlow twins, bit for bit


def _ragged(docs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.array([x for d in docs for x in d], dtype=np.int64)
    return ids, np.array([len(d) for d in docs], dtype=np.int64)


_DOCS = st.lists(st.lists(st.integers(1, 40), max_size=12), min_size=1, max_size=12)


@_SETTINGS
@given(_DOCS, st.integers(1, 6))
def test_bag_of_words_serving_twin_is_exact(docs, max_len):
    ids, counts = _ragged(docs)
    want_ids, want_occ, _ = bag_of_ids(ids, counts, max_len)
    rows = np.repeat(np.arange(len(docs)), counts)
    got_ids, got_occ = tf_bag.bag_of_ids(tf.constant(ids), tf.constant(rows, tf.int64),
                                         tf.constant(len(docs), tf.int64), 41, max_len)
    assert np.array_equal(got_ids.numpy(), want_ids) and np.array_equal(got_occ.numpy(), want_occ)
    assert got_occ.dtype == tf.float32


@_SETTINGS
@given(_DOCS, st.integers(1, 6), st.integers(1, 5000), st.booleans(), st.integers(1, 4))
def test_tfidf_serving_twin_is_exact(docs, max_len, documents, smooth, first_id):
    ids, counts = _ragged(docs)
    rng = np.random.default_rng(len(ids))
    df = rng.integers(1, documents + 1, size=41 - first_id).tolist()
    table = idf_table(df, documents, smooth, first_id)
    want_ids, want_w, _ = tfidf_weights(ids, counts, table, first_id, max_len)
    rows = np.repeat(np.arange(len(docs)), counts)
    got_ids, got_w = tf_tfidf.tfidf_weights(tf.constant(ids), tf.constant(rows, tf.int64),
                                            tf.constant(len(docs), tf.int64), tf.constant(table), first_id, max_len)
    assert np.array_equal(got_ids.numpy(), want_ids)
    assert got_w.numpy().tobytes() == want_w.tobytes()


_WORDS = st.lists(st.sampled_from(["a", "b", "cc", "d", "é", "x_1"]), max_size=9)


@_SETTINGS
@given(st.lists(_WORDS, min_size=1, max_size=8), st.integers(1, 4), st.integers(0, 3), st.sampled_from([" ", "", "_", "--"]))
def test_ngrams_serving_twin_is_exact(docs, lo, extra, sep):
    hi = lo + extra
    flat = [t.encode() for d in docs for t in d]
    indices = [[i, j] for i, d in enumerate(docs) for j in range(len(d))]
    width = max([len(d) for d in docs] + [0])
    tokens = tf.SparseTensor(tf.constant(indices, tf.int64, shape=[len(indices), 2]), tf.constant(flat, tf.string),
                             tf.constant([len(docs), width], tf.int64))
    got = tf_ngrams.ngrams(tokens, lo, hi, sep)
    rows = got.indices.numpy()[:, 0].tolist()
    values = [v.decode() for v in got.values.numpy().tolist()]
    for i, d in enumerate(docs):
        assert [v for r, v in zip(rows, values, strict=True) if r == i] == ngrams_of(d, lo, hi, sep)
    cols = got.indices.numpy()[:, 1].tolist()
    assert cols == [c for d in docs for c in range(len(ngrams_of(d, lo, hi, sep)))]
