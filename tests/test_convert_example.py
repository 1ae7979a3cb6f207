"""convert.example: bulk tf.train.Example encoding, checked against TensorFlow itself.

TensorFlow is the oracle: ``encode_examples`` must produce exactly the bytes of
``tf.train.Example(...).SerializeToString(deterministic=True)`` and parse with
``tf.io.parse_example`` to the values it was given. Every test runs on both
encoders, the numpy path and the C one (``convert/_example.c``, compared with
the numpy path in tests/test_convert_example_c.py).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from _example_strategies import INT64_MAX, INT64_MIN, column_sets
from hypothesis import HealthCheck, given, settings

from convert import example
from convert.example import decode_example, encode_examples, split_buffer

tf = pytest.importorskip("tensorflow")

from google.protobuf.internal import api_implementation  # noqa: E402  (installed with TensorFlow)

# Deterministic map-key order is implementation-specific; the encoder matches
# upb, the runtime TensorFlow's protobuf uses by default.
needs_upb = pytest.mark.skipif(api_implementation.Type() != "upb",
                               reason="byte identity is checked against protobuf's upb runtime (map key order)")

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

try:
    from convert import _example as native
except ImportError:
    native = None
needs_native = pytest.mark.skipif(native is None, reason="convert._example is not built (no C compiler at install)")


@pytest.fixture(autouse=True, scope="module", params=["c", "numpy"])
def encoder(request):
    """Each test of this module once per encoder ``encode_examples`` can take."""
    if request.param == "c" and native is None:
        pytest.skip("convert._example is not built (no C compiler at install)")
    saved = example._encode_c
    example._encode_c = saved if request.param == "c" else None
    yield request.param
    example._encode_c = saved




# ----------------------------------------------------------------- oracle


def tf_example_bytes(columns: dict, rows: int) -> list[bytes]:
    """What TensorFlow's own protobuf serializes for the same rows."""
    out = []
    for r in range(rows):
        feature = {}
        for name, (kind, value) in columns.items():
            if kind == "float32":
                vals = np.asarray(value, dtype=np.float32).reshape(rows, -1)[r].tolist()
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=vals))
            elif kind == "int64":
                vals = np.asarray(value, dtype=np.int64).reshape(rows, -1)[r].tolist()
                feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=vals))
            else:
                feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value[r]]))
        ex = tf.train.Example(features=tf.train.Features(feature=feature))
        out.append(ex.SerializeToString(deterministic=True))
    return out


def tf_parse(serialized: list[bytes], columns: dict, rows: int) -> dict:
    spec = {}
    for name, (kind, value) in columns.items():
        if kind == "string":
            spec[name] = tf.io.FixedLenFeature([1], tf.string)
        else:
            n = np.asarray(value).reshape(rows, -1).shape[1]
            spec[name] = tf.io.FixedLenFeature([n], tf.float32 if kind == "float32" else tf.int64)
    parsed = tf.io.parse_example(tf.constant(serialized, dtype=tf.string), spec)
    return {k: v.numpy() for k, v in parsed.items()}


def assert_same_values(columns: dict, rows: int, got: dict) -> None:
    """``got[name]`` (rows, n) arrays equal the column values, floats bit-for-bit."""
    for name, (kind, value) in columns.items():
        if kind == "float32":
            want = np.asarray(value, dtype=np.float32).reshape(rows, -1)
            have = np.asarray(got[name], dtype=np.float32).reshape(want.shape)
            np.testing.assert_array_equal(have.view(np.uint32), want.view(np.uint32), err_msg=name)
        elif kind == "int64":
            want = np.asarray(value, dtype=np.int64).reshape(rows, -1)
            np.testing.assert_array_equal(np.asarray(got[name], dtype=np.int64).reshape(want.shape), want, err_msg=name)
        else:
            assert [bytes(x) for x in np.asarray(got[name], dtype=object).reshape(-1)] == list(value), name


def decoded_columns(serialized: list[bytes], columns: dict, rows: int) -> dict:
    per_row = [decode_example(s) for s in serialized]
    for d in per_row:
        assert set(d) == set(columns)
    out = {}
    for name, (kind, _) in columns.items():
        assert all(d[name][0] == kind for d in per_row), name
        out[name] = np.array([d[name][1] for d in per_row], dtype=object if kind == "string" else
                             (np.float32 if kind == "float32" else np.int64))
    return out


# ------------------------------------------------------------- strategies

# ------------------------------------------------------------------ tests


@needs_upb
@SETTINGS
@given(column_sets())
def test_encode_examples_is_byte_identical_to_tensorflow_serialization(data):
    columns, rows = data
    buf, lengths = encode_examples(columns, rows)
    assert buf.dtype == np.uint8 and lengths.shape == (rows,)
    assert int(lengths.sum()) == buf.size
    assert split_buffer(buf, lengths) == tf_example_bytes(columns, rows)


@SETTINGS
@given(column_sets())
def test_encode_examples_parses_with_tf_io_parse_example_to_same_values(data):
    columns, rows = data
    buf, lengths = encode_examples(columns, rows)
    got = tf_parse(split_buffer(buf, lengths), columns, rows)
    assert_same_values(columns, rows, got)


@SETTINGS
@given(column_sets())
def test_decode_example_round_trips_encode_examples(data):
    columns, rows = data
    buf, lengths = encode_examples(columns, rows)
    got = decoded_columns(split_buffer(buf, lengths), columns, rows)
    assert_same_values(columns, rows, got)


@needs_upb
def test_boundary_values_match_tensorflow_bytes_and_parse():
    """Hand-picked extremes: int64 range ends, NaN/inf/-0.0/denormals, empty and non-UTF-8 bytes."""
    ints = np.array([[INT64_MIN, -1], [0, 127], [128, INT64_MAX]], dtype=np.int64)
    floats = np.array([[np.nan, -0.0, np.inf], [-np.inf, 1e-45, 3.4028235e38], [0.0, -1.0, 0.1]], dtype=np.float32)
    columns = {
        "ids": ("int64", ints),
        "x": ("float32", floats),
        "raw": ("string", [b"", b"\xff\xfe\xfd", b"y" * 300]),
        "\u00e9t\u00e9/\u65e5\u672c": ("float32", np.array([1.0, 2.0, 3.0], dtype=np.float32)),
        "a": ("int64", np.array([[1], [2], [3]])),
        "a_len": ("int64", np.array([[1], [1], [1]])),
        "wide": ("float32", np.arange(3 * 70, dtype=np.float32).reshape(3, 70)),  # 280-byte list: 2-byte length
    }
    buf, lengths = encode_examples(columns, 3)
    serialized = split_buffer(buf, lengths)
    assert serialized == tf_example_bytes(columns, 3)
    assert_same_values(columns, 3, tf_parse(serialized, columns, 3))
    assert_same_values(columns, 3, decoded_columns(serialized, columns, 3))


@needs_upb
def test_zero_width_numeric_list_matches_tensorflow():
    """A (rows, 0) column is an empty FloatList/Int64List: TF writes no packed field at all."""
    columns = {"f": ("float32", np.zeros((2, 0), np.float32)), "i": ("int64", np.zeros((2, 0), np.int64)),
               "k": ("int64", np.array([[5], [6]]))}
    buf, lengths = encode_examples(columns, 2)
    serialized = split_buffer(buf, lengths)
    assert serialized == tf_example_bytes(columns, 2)
    assert decode_example(serialized[0]) == {"f": ("float32", []), "i": ("int64", []), "k": ("int64", [5])}


def test_zero_rows_give_empty_buffer_and_lengths():
    columns = {"x": ("float32", np.zeros((0, 3), np.float32)), "s": ("string", [])}
    buf, lengths = encode_examples(columns, 0)
    assert buf.dtype == np.uint8 and buf.size == 0
    assert lengths.size == 0
    assert split_buffer(buf, lengths) == []


def test_examples_are_independent_of_row_neighbours():
    """Row r's bytes do not depend on the other rows of the batch (bulk layout is per row)."""
    rng = np.random.default_rng(0)
    ints = rng.integers(INT64_MIN, INT64_MAX, size=(20, 3), dtype=np.int64, endpoint=True)
    ints[::3] = rng.integers(0, 100, size=(7, 3))  # mix of 1-byte and 10-byte varints
    strs = [bytes(rng.integers(0, 256, size=int(k), dtype=np.uint8)) for k in rng.integers(0, 150, size=20)]
    columns = {"i": ("int64", ints), "s": ("string", strs)}
    whole = split_buffer(*encode_examples(columns, 20))
    for r in (0, 7, 19):
        single = split_buffer(*encode_examples({"i": ("int64", ints[r:r + 1]), "s": ("string", strs[r:r + 1])}, 1))
        assert single == [whole[r]]


@needs_upb
def test_length_prefixes_of_one_to_three_bytes_in_one_batch_match_tensorflow():
    """The encoder lays rows out side by side: rows whose length prefixes
    (Example, map entry, Feature, list) take 1, 2 and 3 bytes share a batch."""
    strs = [b"", b"a" * 127, b"b" * 128, b"c" * 16383, b"d" * 16384, b"e" * 300]
    ints = np.array([[0, 1], [127, 128], [2**20, -1], [5, 5], [16384, 0], [-(2**63), 2**63 - 1]], dtype=np.int64)
    small = np.array([[1], [2], [3], [4], [5], [6]], dtype=np.int64)  # one byte each: a fixed-width entry
    columns = {"s": ("string", strs), "i": ("int64", ints), "k": ("int64", small),
               "f": ("float32", np.arange(6 * 40, dtype=np.float32).reshape(6, 40))}
    assert split_buffer(*encode_examples(columns, 6)) == tf_example_bytes(columns, 6)


def test_unknown_dtype_raises_naming_feature():
    with pytest.raises(ValueError, match="'q'.*float64"):
        encode_examples({"q": ("float64", np.zeros((1, 1)))}, 1)


def test_the_encoders_varint_lengths_match_protobuf_sizes():
    from convert.example import _varint_matrix

    vals = np.array([0, 127, 128, 2**14 - 1, 2**14, 2**63 - 1, -1, INT64_MIN], dtype=np.int64)
    want = [1, 1, 2, 2, 3, 9, 10, 10]
    assert [len(tf.train.Int64List(value=[v]).SerializeToString()) - 2 for v in vals.tolist()] == want
    assert _varint_matrix(vals.reshape(-1, 1))[2].tolist() == want  # per row (one value each)
    assert _varint_matrix(vals[:5].reshape(-1, 1))[2].tolist() == want[:5]  # the 32-bit path


def test_decode_example_rejects_malformed_bytes():
    good = split_buffer(*encode_examples({"x": ("float32", np.ones((1, 4), np.float32))}, 1))[0]
    with pytest.raises(ValueError):
        decode_example(good[:-3])
    with pytest.raises(ValueError):
        decode_example(b"\x0a\xff")
    # a float list body whose packed payload is not a multiple of 4 bytes
    bad = b"\x0a\x0e\x0a\x0c\x0a\x01x\x12\x07\x12\x05\x0a\x03\x00\x00\x00"
    with pytest.raises((ValueError, struct.error)):
        decode_example(bad)

