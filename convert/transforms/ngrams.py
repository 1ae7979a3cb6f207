"""``ngrams``: a text's token n-grams -> ``max_len`` ids of a vocabulary of n-grams + ``<name>_len``.

TF Transform's ``tft.ngrams(tokens, ngram_range, separator)`` then
``tft.compute_and_apply_vocabulary``: the tokens are the ``text`` transform's
(``convert.records.tokenize``: ASCII-lowercased, runs of letters, digits,
``_`` and non-ASCII characters), an n-gram is ``separator`` joined between
``n`` consecutive tokens, and a document's n-grams come in TF Transform's
order: by start position, then by size (``a, a b, b, b c, c`` for ``a b c``
and ``ngram_range: [1, 2]``). The vocabulary is learned over the n-grams of
the whole document (every n-gram counts, not only the first ``max_len``),
with ``text``'s options and id layout: 0 = padding, ``1..num_oov_buckets``
out-of-vocabulary, then the n-grams by descending count, ties by term.

``bag_of_words`` and ``tfidf`` read a document's terms through ``ngram_range``
too (``document_terms``); with ``[1, 1]``, the default, their terms are the
tokens and ``token_codes`` (the C tokenizer) gives them directly.

The serving twin is ``readers.transforms.ngrams``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from convert.transforms.base import ID_LENGTH_OF_WHY, VOCAB_OPTIONS, Need, Transform

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.prepare_values import Rejection, TermIndex

#: Largest n of an n-gram: a document of ``L`` tokens has about ``L x (max - min + 1)``
#: n-grams, each up to this many tokens long.
MAX_NGRAM_SIZE = 8
#: Characters of a ``separator``: it is repeated inside every n-gram (a vocabulary term).
MAX_SEPARATOR_CHARS = 16
#: The default ``ngram_range`` of ``bag_of_words`` and ``tfidf`` (tokens); ``ngrams`` has no default.
UNIGRAMS = (1, 1)
#: The default ``separator``, TF Transform's choice for word tokens.
DEFAULT_SEPARATOR = " "


def ngram_range_problem(value: Any) -> str | None:
    """Why ``value`` is not an ``ngram_range`` (``[min, max]``, ``1 <= min <= max <= MAX_NGRAM_SIZE``), or None."""
    ok = (isinstance(value, list | tuple) and len(value) == 2
          and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
          and 1 <= value[0] <= value[1] <= MAX_NGRAM_SIZE)
    if ok:
        return None
    return (f"'ngram_range' must be [min, max], two integers with 1 <= min <= max <= {MAX_NGRAM_SIZE} "
            f"(n-gram sizes kept, both included: [1, 2] is tokens and pairs of tokens)")


def separator_problem(value: Any) -> str | None:
    """Why ``value`` is not a ``separator`` (a string of at most ``MAX_SEPARATOR_CHARS``
    characters without control characters: it is inside every vocabulary term, and a
    vocabulary file holds one term a line), or None."""
    if (isinstance(value, str) and len(value) <= MAX_SEPARATOR_CHARS
            and not any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in value)):
        return None
    return (f"'separator' must be a string of at most {MAX_SEPARATOR_CHARS} characters without control "
            f"characters (put between the tokens of an n-gram; default ' ')")


def ngrams_of(tokens: Sequence[str], lo: int, hi: int, separator: str) -> list[str]:
    """The n-grams of ``tokens`` with ``lo <= n <= hi``, in TF Transform's order: by start
    position, then by size."""
    if lo == hi == 1:
        return list(tokens)
    k = len(tokens)
    return [separator.join(tokens[i:i + n]) for i in range(k) for n in range(lo, min(hi, k - i) + 1)]


def ngram_counts(counts: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The n-grams per document of ``counts`` tokens each: ``sum(max(0, L - n + 1))`` over ``lo..hi``."""
    counts = np.asarray(counts, dtype=np.int64)
    return sum((np.maximum(counts - n + 1, 0) for n in range(lo, hi + 1)), np.zeros_like(counts))


def document_terms(f: FeatureConfig, values: list[Any], ngram_range: tuple[int, int], separator: str,
                   bad: dict[int, Rejection], index: TermIndex) -> tuple[np.ndarray, np.ndarray]:
    """The terms of each document of ``values`` as indexes of ``index`` (flat, int32) and the
    terms per row: its tokens (``ngram_range`` ``[1, 1]``) or its n-grams, in order.

    ``f``: the feature (its ``source`` and ``lowercase``). Tokens come from ``token_codes``,
    the ``text`` transform's tokenizer (a string or null per row; any other value is a
    ``Rejection``, and its row has no terms); ``index`` starts with the sentinel ``"\\x00"``
    at -1, as a text feature's does. N-grams are joined from those tokens: ``index`` then
    holds n-grams only."""
    from convert.prepare_values import TermIndex, token_codes  # convert.config imports this package

    lo, hi = ngram_range
    if lo == hi == 1:
        return token_codes(f, values, bad, index)
    tokens = TermIndex({"\x00": -1})
    codes, counts = token_codes(f, values, bad, tokens)
    names = list(tokens)[1:]  # index i's token at i (the sentinel dropped)
    flat = [names[c] for c in codes.tolist()]
    terms: list[str] = []
    at = 0
    for k in counts.tolist():
        terms += ngrams_of(flat[at:at + k], lo, hi, separator)
        at += k
    out = np.fromiter(map(index.__getitem__, terms), dtype=np.int32, count=len(terms))
    return out, ngram_counts(counts, lo, hi)



#: The options of the transforms over a document's terms (``ngrams``, ``bag_of_words``, ``tfidf``).
TERM_OPTIONS = ("ngram_range", "separator")
#: Why ``missing_indicator`` is not taken by the transforms over a text's terms.
TEXT_MISSING_WHY = "a missing text has no terms already (its ids are all 0)"


def check_term_options(kw: dict[str, Any], need: Need) -> None:
    """``ngram_range`` and ``separator`` checked, ``ngram_range`` normalized to a tuple."""
    if "ngram_range" in kw:
        problem = ngram_range_problem(kw["ngram_range"])
        if problem:
            need(f"{problem}, found {kw['ngram_range']!r:.60}")
        else:
            kw["ngram_range"] = tuple(kw["ngram_range"])
    if "separator" in kw:
        problem = separator_problem(kw["separator"])
        if problem:
            need(f"{problem}, found {kw['separator']!r:.60}")


class TermsTransform(Transform):
    """A transform over a text's terms (``document_terms``: its tokens, or their n-grams with
    ``ngram_range``), with a vocabulary of them as ``text`` has: ``text``'s tokenizer, options
    and id layout, and ``ngram_range`` and ``separator``."""

    options = ("max_len", "lowercase", *VOCAB_OPTIONS, *TERM_OPTIONS, "length")
    vocabulary = True
    tokens = True
    list_capable = True
    stats_kind = "categorical"
    analysis_options = (*VOCAB_OPTIONS, "lowercase", *TERM_OPTIONS)
    accepts = (frozenset({"string"}), "strings")
    not_taken_why = {"missing_indicator": TEXT_MISSING_WHY, "length_of": ID_LENGTH_OF_WHY}

    def check_options(self, kw: dict[str, Any], need: Need) -> None:
        check_term_options(kw, need)


#: The options ``ngrams`` cannot do without: how each is written, and what it is.
_NGRAMS_NEED = {"max_len": "N' (n-grams kept per record, in order; shorter texts are padded)",
                "ngram_range": "[min, max]' (n-gram sizes, e.g. [1, 2]: tokens and pairs)"}


class Ngrams(TermsTransform):
    name = "ngrams"
    summary = "string -> max_len ids of its token n-grams (a vocabulary of n-grams, ngram_range: [min, max]) + <name>_len"
    serving = "readers.transforms.ngrams"
    prepared_as = "terms"

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        for option, what in _NGRAMS_NEED.items():
            if option not in kw:
                need(f"transform 'ngrams' needs '{option}: {what}'")


TRANSFORM = Ngrams()
