"""convert._tokens (the C token indexer of text columns) against the Python paths
of ``convert.prepare_values.token_codes``: the same codes, counts and term index, on
random Unicode of every plane (lone surrogates too), NULs, every ASCII
character, and over a unit's batches where the two paths take turns; and the
C code built with AddressSanitizer and UBSan on random columns."""

from __future__ import annotations

import numpy as np
import pytest
from _sanitized import run_sanitized
from _text_strategies import SPECIAL, texts
from hypothesis import given, settings
from hypothesis import strategies as st

from convert import prepare_values as prepare
from convert.config import parse_config
from convert.prepare_values import Rejection
from convert.prepare_values import TermIndex as _TermIndex
from convert.prepare_values import token_codes as _token_codes
from convert.records import tokenize

try:
    from convert import _tokens as native
except ImportError:
    native = None
needs_native = pytest.mark.skipif(native is None, reason="convert._tokens is not built (no C compiler at install)")

#: Strings and nulls (the column the C path takes), with NULs and the special characters often.
COLUMN = st.lists(st.one_of(st.none(), texts(), st.sampled_from(SPECIAL), st.text("aZ_0 \x00-\u00e9", max_size=12)),
                  max_size=25)


def _feature(lowercase: bool):
    return parse_config({"features": [{"name": "t", "transform": "text", "max_len": 4, "lowercase": lowercase}]}).features[0]


def _codes(values: list, lowercase: bool, index: _TermIndex, use_native: bool) -> tuple[list, list, dict]:
    bad: dict[int, Rejection] = {}
    saved = prepare._TokenTable
    prepare._TokenTable = saved if use_native else None
    try:
        codes, counts = _token_codes(_feature(lowercase), values, bad, index)
    finally:
        prepare._TokenTable = saved
    return codes.tolist(), counts.tolist(), bad


def _fresh() -> _TermIndex:
    return _TermIndex({"\x00": -1})


def test_the_module_is_built():
    """`make install` builds it wherever a C compiler is (CI has one): a silent
    fallback to the Python path would hide what the bench measures."""
    assert native is not None, "convert._tokens is not built: install a C compiler, then `make install`"
    assert prepare._TokenTable is native.TokenTable


@needs_native
@settings(max_examples=300, deadline=None)
@given(COLUMN, st.booleans())
def test_native_equals_python_paths(values, lowercase):
    py_index, c_index = _fresh(), _fresh()
    want = _codes(values, lowercase, py_index, use_native=False)
    got = _codes(values, lowercase, c_index, use_native=True)
    assert got == want
    assert list(c_index.items()) == list(py_index.items())  # the same terms, indexes and order


@needs_native
@settings(max_examples=100, deadline=None)
@given(st.lists(COLUMN, min_size=1, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6), st.booleans())
def test_batches_of_a_unit_share_the_index_whichever_path_takes_each(batches, native_turns, lowercase):
    """A unit's index carries over its batches; a batch the C path declines (a
    surrogate) or that runs without it adds terms to the dict only, which the
    table must then find there, not index anew."""
    py_index, c_index = _fresh(), _fresh()
    for values, use_native in zip(batches, native_turns, strict=False):
        want = _codes(values, lowercase, py_index, use_native=False)
        assert _codes(values, lowercase, c_index, use_native) == want
    assert list(c_index.items()) == list(py_index.items())


@needs_native
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), texts(surrogates=False)), max_size=20), st.booleans())
def test_codes_are_the_tokens_of_each_row(values, lowercase):
    """Without surrogates the C path takes every column: each row's codes are the
    indexes of ``tokenize(row)``, in order."""
    index = _fresh()
    got = index.tokens().codes(index, values, lowercase)
    assert got is not None
    codes = np.frombuffer(got[0], np.int32).tolist()
    counts = np.frombuffer(got[1], np.int64).tolist()
    k = 0
    for v, n in zip(values, counts, strict=True):
        toks = tokenize(v, lowercase) if v is not None else []
        assert codes[k:k + n] == [index[t] for t in toks], repr(v)
        k += n
    assert k == len(codes)


@needs_native
def test_every_ascii_character_splits_or_joins_as_tokenize_says():
    values = []
    for c in map(chr, range(128)):
        values += [f"a{c}b", f"{c}{c}Xy{c}", f"_{c}9 {c}", c]
    for lowercase in (True, False):
        assert _codes(values, lowercase, _fresh(), True) == _codes(values, lowercase, _fresh(), False)


@needs_native
@pytest.mark.parametrize("values", [
    ["ok", 3], ["ok", b"bytes"], ["ok", ["list"]], ["ok", "lone \ud800 surrogate"], [type("S", (str,), {})("sub")],
])
def test_declines_what_only_the_python_path_may_judge(values):
    """Non-strings (rejected by the Python path, with the record named) and
    strings without a UTF-8 form: None, and the index untouched."""
    index = _fresh()
    assert index.tokens().codes(index, values, True) is None
    assert dict(index) == {"\x00": -1}


@needs_native
def test_table_grows_past_its_first_size_and_keeps_every_index():
    index = _fresh()
    words = [f"w{i}" for i in range(20_000)]
    got = index.tokens().codes(index, [" ".join(words)], False)
    assert np.frombuffer(got[0], np.int32).tolist() == list(range(20_000))
    again = index.tokens().codes(index, [" ".join(reversed(words))], False)
    assert np.frombuffer(again[0], np.int32).tolist() == list(reversed(range(20_000)))
    assert index.tokens().size() == 20_000 and len(index) == 20_001


@needs_native
def test_long_and_empty_values():
    values = ["", "   ", "x" * 100_000, "\U0001f600" * 1000 + " A", None]
    for lowercase in (True, False):
        assert _codes(values, lowercase, _fresh(), True) == _codes(values, lowercase, _fresh(), False)


#: Random columns through the C path built with AddressSanitizer and UBSan, against the Python path.
_SANITIZED_RUN = r"""
import random, sys
import numpy as np
from convert import prepare_values as prepare
from convert.config import parse_config
feature = {lower: parse_config({"features": [{"name": "t", "transform": "text", "max_len": 4, "lowercase": lower}]})
           .features[0] for lower in (False, True)}
rnd = random.Random(7)
alphabet = "aZ_9 -.\x00\u00e9\u0130\U0001f600\ud800"
c_index, py_index = prepare.TermIndex({"\x00": -1}), prepare.TermIndex({"\x00": -1})
table = mod.TokenTable()
prepare._TokenTable = None  # _token_codes: the Python path; the sanitized table is called directly
for n in range(1500):
    values = [None if rnd.random() < 0.1 else 7 if rnd.random() < 0.01 else
              "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, rnd.choice([3, 40, 3000]))))
              for _ in range(rnd.randint(0, 30))]
    lower = bool(n % 2)
    want = prepare.token_codes(feature[lower], values, {}, py_index)
    got = table.codes(c_index, values, lower)
    if got is not None:
        assert np.frombuffer(got[0], np.int32).tolist() == want[0].tolist(), values
        assert np.frombuffer(got[1], np.int64).tolist() == want[1].tolist(), values
    else:  # declined: a surrogate or a non-string; the Python path indexes it for both
        prepare.token_codes(feature[lower], values, {}, c_index)
assert list(c_index.items()) == list(py_index.items())
print("ok", table.size())
"""


@pytest.mark.slow
def test_c_path_is_memory_safe_under_address_sanitizer(tmp_path):
    """The C code reads hostile text: built with AddressSanitizer and UBSan (any finding
    aborts), it runs thousands of random columns (long values, NULs, surrogates,
    astral characters, non-strings) and agrees with the Python path."""
    run_sanitized("_tokens", _SANITIZED_RUN, tmp_path)
