"""Batches of feature columns for the Example encoders' tests (convert/example.py, convert/_example.c)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Feature names: any text without surrogates, unicode included; sorting by code
# point must agree with protobuf's sort of the UTF-8 keys.
names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=8)
special_floats = st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 3.4028235e38, -1.5])
special_ints = st.sampled_from([INT64_MIN, INT64_MIN + 1, -1, 0, 1, 127, 128, 16383, 16384, 2**32, INT64_MAX])


def _canonical_nan(a: np.ndarray) -> np.ndarray:
    # Python's float (which TensorFlow's protobuf goes through) quiets signaling
    # NaNs, so NaN payloads are not comparable; keep a quiet NaN with either sign.
    a = a.copy()
    nan = np.isnan(a)
    a[nan] = np.copysign(np.float32(np.nan), a[nan])
    return a


@st.composite
def column_sets(draw, min_rows=1, max_rows=50):
    rows = draw(st.integers(min_rows, max_rows))
    keys = draw(st.lists(names, min_size=1, max_size=6, unique=True))
    cols = {}
    for k in keys:
        kind = draw(st.sampled_from(["float32", "int64", "string"]))
        if kind == "string":
            cols[k] = (kind, draw(st.lists(st.binary(max_size=12) | st.sampled_from([b"", b"\xff\xfe\x80", b"x" * 200]),
                                           min_size=rows, max_size=rows)))
            continue
        n = draw(st.sampled_from([0, 1, 2, 3, 5, 40]))
        if kind == "float32":
            arr = draw(hnp.arrays(np.float32, (rows, n), elements=st.floats(width=32) | special_floats))
            arr = _canonical_nan(arr)
        else:
            arr = draw(hnp.arrays(np.int64, (rows, n), elements=st.integers(INT64_MIN, INT64_MAX) | special_ints))
        # also accept 1-D columns for single values
        if n == 1 and draw(st.booleans()):
            arr = arr.reshape(rows)
        cols[k] = (kind, arr)
    return cols, rows
