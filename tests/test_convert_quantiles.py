"""The bucketize quantile sketch: exact when small, within 1% rank when large,
bounded, deterministic and mergeable in any grouping."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convert.quantiles import QuantileSketch


def _rank_error(data: np.ndarray, value: float, q: float) -> float:
    s = np.sort(data)
    lo = np.searchsorted(s, value, side="left") / s.size
    hi = np.searchsorted(s, value, side="right") / s.size
    return 0.0 if lo <= q <= hi else min(abs(lo - q), abs(hi - q))


def test_exact_below_k():
    s = QuantileSketch(k=64)
    s.add(np.arange(1, 51, dtype=float))
    assert s.quantiles([0.0, 0.5, 1.0]) == [1.0, 25.0, 50.0]
    assert s.boundaries(5) == [10.0, 20.0, 30.0, 40.0]


def test_large_stream_within_one_percent_and_bounded():
    rng = np.random.default_rng(0)
    data = rng.lognormal(size=1_000_000)
    s = QuantileSketch()
    for chunk in np.array_split(data, 250):
        s.add(chunk)
    assert s.count == data.size
    assert sum(lv.size for lv in s.levels) <= s.k * len(s.levels)
    assert len(s.levels) <= 12
    for q, v in zip([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99], s.quantiles([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99]), strict=True):
        assert _rank_error(data, v, q) < 0.01, (q, v)


def test_deterministic_and_merge_matches_rank_accuracy():
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=30_000) for _ in range(8)]

    def run():
        sk = [QuantileSketch(k=256) for _ in parts]
        for s, p in zip(sk, parts, strict=True):
            s.add(p)
        m = sk[0]
        for s in sk[1:]:
            m.merge(pickle.loads(pickle.dumps(s)))
        return m

    a, b = run(), run()
    assert a.boundaries(10) == b.boundaries(10)
    data = np.concatenate(parts)
    for i, v in enumerate(a.boundaries(10), start=1):
        assert _rank_error(data, v, i / 10) < 0.02


def test_non_finite_values_are_ignored_and_empty_gives_nothing():
    s = QuantileSketch(k=16)
    assert s.quantiles([0.5]) == [] and s.boundaries(4) == []
    s.add([np.nan, np.inf, -np.inf, 3.0])
    assert s.count == 1 and s.quantiles([0.5]) == [3.0]


def test_few_distinct_values_give_fewer_distinct_boundaries():
    s = QuantileSketch(k=16)
    s.add([1.0] * 500 + [2.0] * 500)
    assert s.boundaries(4) == [1.0, 2.0]


def test_argument_checks():
    with pytest.raises(ValueError, match="at least 8"):
        QuantileSketch(k=2)
    with pytest.raises(ValueError, match="at least 2 buckets"):
        QuantileSketch().boundaries(1)
    with pytest.raises(ValueError, match="sizes? 16 and 32|size 16 and 32"):
        QuantileSketch(16).merge(QuantileSketch(32))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), min_size=1, max_size=400),
       st.integers(min_value=1, max_value=7))
def test_small_inputs_exact_in_any_split(values, parts):
    whole = QuantileSketch(k=512)
    whole.add(values)
    pieces = [QuantileSketch(k=512) for _ in range(parts)]
    for i, v in enumerate(values):
        pieces[i % parts].add([v])
    m = pieces[0]
    for p in pieces[1:]:
        m.merge(p)
    assert m.quantiles([0.0, 0.3, 0.5, 1.0]) == whole.quantiles([0.0, 0.3, 0.5, 1.0])
    assert whole.quantiles([0.0, 1.0]) == [min(values), max(values)]
