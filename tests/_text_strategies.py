"""Text strategies for the tokenizer tests: every plane, and the characters case
and class tables disagree on."""

from __future__ import annotations

from hypothesis import strategies as st

#: Characters TensorFlow's and Python's case and class tables are known to disagree
#: on, or that split and NUL handling could trip on.
SPECIAL = ["\u0130", "\u0131", "\u00df", "\u017f", "\u03a3", "\u03c2", "\u03c3", "\u1e9e", "\u212a", "\ufb03",
           "e\u0301", "\u0345", "\x00", "\u00a0", "\u0085", "\u2028", "\u3000", "\u200b", "\ufeff", "\u05e9\u05dc\u05d5\u05dd",
           "\u0627\u0644\u0639", "\U0001f600", "\U0001f469\u200d\U0001f4bb", "\U000e0041", "\U0010ffff", "\x1f", "\x7f",
           "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", " ", "_", "A", "Z", "a", "z", "0", "9", "@", "[", "`", "{"]

#: Every code point of every plane (surrogates too when ``surrogates``).
def _chars(surrogates: bool) -> st.SearchStrategy[str]:
    return st.one_of(st.characters(codec=None, exclude_categories=() if surrogates else ("Cs",)),
                     st.sampled_from(SPECIAL), st.characters(max_codepoint=0x7F))


def texts(surrogates: bool = True, max_size: int = 40) -> st.SearchStrategy[str]:
    return st.lists(_chars(surrogates), max_size=max_size).map("".join)
