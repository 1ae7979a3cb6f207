"""convert._example (the C Example encoder) against the numpy path of
``convert.example.encode_examples``, which tests/test_convert_example.py checks
against TensorFlow: the same bytes and lengths on random batches, long values
and wide lists; the arguments it refuses; and the C code built with
AddressSanitizer and UBSan on random batches."""

from __future__ import annotations

import numpy as np
import pytest
from _example_strategies import INT64_MIN, column_sets
from _sanitized import run_sanitized
from hypothesis import HealthCheck, given, settings

from convert import example

try:
    from convert import _example as native
except ImportError:
    native = None
needs_native = pytest.mark.skipif(native is None, reason="convert._example is not built (no C compiler at install)")


def _numpy_path(columns: dict, rows: int) -> tuple[bytes, list[int]]:
    saved = example._encode_c
    example._encode_c = None
    try:
        buf, lengths = example.encode_examples(columns, rows)
    finally:
        example._encode_c = saved
    return buf.tobytes(), lengths.tolist()


def _c_path(columns: dict, rows: int) -> tuple[bytes, list[int]]:
    data, lengths = native.encode(example._c_columns(columns, rows), rows)
    return bytes(data), np.frombuffer(lengths, np.int64).tolist()



def test_the_c_encoder_is_built():
    """`make install` builds it wherever a C compiler is (CI has one): a silent
    fallback to the numpy path would hide what the bench measures."""
    assert native is not None, "convert._example is not built: install a C compiler, then `make install`"
    assert example._encode_c is native.encode


@needs_native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(column_sets(max_rows=300))
def test_the_c_encoder_writes_the_numpy_paths_bytes(data):
    columns, rows = data
    assert _c_path(columns, rows) == _numpy_path(columns, rows)


@needs_native
def test_the_c_encoder_on_long_values_and_wide_lists():
    """Prefixes of 3 bytes and more: a 70 kB bytes value, 5,000 floats and 5,000 10-byte varints."""
    rng = np.random.default_rng(1)
    columns = {"s": ("string", [b"x" * 70_000, b"", bytes(range(256)) * 300]),
               "f": ("float32", rng.standard_normal((3, 5000)).astype(np.float32)),
               "i": ("int64", rng.integers(INT64_MIN, 0, size=(3, 5000), dtype=np.int64)),
               "e": ("int64", np.zeros((3, 0), np.int64)), "k" * 300: ("float32", np.ones((3, 1), np.float32))}
    assert _c_path(columns, 3) == _numpy_path(columns, 3)


@needs_native
def test_every_short_copy_length():
    """Keys, bytes values and float lists of every length up to 80 bytes: the short
    copies the C encoder makes inline, each size class and its edges."""
    rows = 81
    values = [bytes(range(65, 65 + k % 26)) * (k // 26) + bytes(range(97, 97 + k % 26)) for k in range(rows)]
    for size in range(1, 81):
        columns = {"s": ("string", values), "k" * size: ("int64", np.arange(rows)[:, None] * 37),
                   "f": ("float32", np.arange(rows * (size % 21), dtype=np.float32).reshape(rows, -1))}
        assert _c_path(columns, rows) == _numpy_path(columns, rows), size


@needs_native
def test_no_columns_give_examples_of_empty_features():
    assert _c_path({}, 2) == _numpy_path({}, 2) == (b"\x0a\x00" * 2, [2, 2])


@needs_native
@pytest.mark.parametrize("columns, error", [
    ([(b"x", 0, 2, np.zeros(3, np.float32))], "2 values of 4 bytes has 12 bytes"),
    ([(b"x", 1, 1, np.zeros(2, np.int64))], "1 values of 8 bytes has 16 bytes"),
    ([(b"x", 2, 1, [b"a", b"b"])], "one bytes value per row"),
    ([(b"x", 2, 1, (b"a", b"b", b"c"))], "one bytes value per row"),
    ([(b"x", 2, 1, [b"a", "b", b"c"])], "bytes objects only"),
    ([(b"x", 7, 1, np.zeros(3, np.int64))], "unknown column kind 7"),
    ([(b"x", 1, -1, np.zeros(3, np.int64))], "value count is out of range"),
    ([("x", 0, 1, np.zeros(3, np.float32))], "bytes"),
    ([(b"x", 0, 1)], "4"),
    ([(b"x", 0, 1, np.zeros((3, 2), np.float32)[:, :1])], "contiguous"),
])
def test_the_c_encoder_refuses_what_breaks_its_contract(columns, error):
    with pytest.raises((ValueError, TypeError), match=error):
        native.encode(columns, 3)


#: Random batches through the C encoder built with AddressSanitizer and UBSan, against the numpy path.
_SANITIZED_RUN = r"""
import random, sys
import numpy as np
from convert import example
example._encode_c = None  # encode_examples: the numpy path
rnd = random.Random(11)
rng = np.random.default_rng(11)
edges = np.array([0, 1, 127, 128, 16383, 16384, -1, -(2**63), 2**63 - 1], np.int64)
for t in range(400):
    rows = rnd.choice([1, 2, 7, 64, 500])
    columns = {}
    for c in range(rnd.randint(0, 8)):
        name = "".join(rnd.choice("ab_\u00e9\U0001f600") for _ in range(rnd.choice([1, 3, 200])))
        kind = rnd.choice(["float32", "int64", "string"])
        n = rnd.choice([0, 1, 3, 40, 600])
        if kind == "float32":
            columns[name] = (kind, rng.standard_normal((rows, n)).astype(np.float32))
        elif kind == "int64":
            v = rng.integers(-(2**63), 2**63 - 1, size=(rows, n), dtype=np.int64, endpoint=True)
            v[rng.random((rows, n)) < 0.5] = rng.choice(edges, size=1)
            columns[name] = (kind, v)
        else:
            columns[name] = (kind, [bytes(rng.integers(0, 256, size=rnd.choice([0, 5, 200, 20000]), dtype=np.uint8))
                                    for _ in range(rows)])
    want_buf, want_lens = example.encode_examples(columns, rows)
    data, lens = mod.encode(example._c_columns(columns, rows), rows)
    assert bytes(data) == want_buf.tobytes() and np.frombuffer(lens, np.int64).tolist() == want_lens.tolist(), t
for bad in ([(b"x", 0, 2, np.zeros(3, np.float32))], [(b"x", 2, 1, [b"a"])], [(b"x", 2, 1, [b"a", 1, b"c"])]):
    assert refused((ValueError, TypeError), mod.encode, bad, 3), bad
print("ok")
"""


@pytest.mark.slow
@needs_native
def test_the_c_encoder_is_memory_safe_under_address_sanitizer(tmp_path):
    """Built with AddressSanitizer and UBSan (any finding aborts), the C encoder runs
    hundreds of random batches (long names and values, prefixes of 1 to 3 bytes,
    10-byte varints, empty lists) and broken arguments, and agrees with the numpy path."""
    run_sanitized("_example", _SANITIZED_RUN, tmp_path)
