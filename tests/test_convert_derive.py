"""Timestamps and crosses: exact integer arithmetic checked against datetime
where datetime can represent the value, and beyond it where it cannot."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convert.derive import cross_ids, epoch_seconds, timestamp_parts, unit_mismatch
from convert.records import stable_hash


def test_units_floor_to_seconds_including_before_1970():
    secs, present, bad = epoch_seconds([1_500, -1, None, 10**9], "ms")
    assert secs.tolist() == [1, -1, 0, 1_000_000] and present.tolist() == [True, True, False, True] and not bad
    assert epoch_seconds([2], "days")[0].tolist() == [172_800]
    assert epoch_seconds([1_700_000_000_123_456_789], "ns")[0].tolist() == [1_700_000_000]
    assert epoch_seconds([1.9], "s")[0].tolist() == [1]


def test_iso_strings_and_bad_values():
    secs, present, bad = epoch_seconds(["2026-11-22T10:30:00Z", "2026-11-22 10:30:00+01:00", "1970-01-01", "tuesday", True, [1]], "ms")
    t = int(dt.datetime(2026, 11, 22, 10, 30, tzinfo=dt.UTC).timestamp())
    assert secs[:3].tolist() == [t, t - 3600, 0]
    assert sorted(bad) == [3, 4, 5] and "ISO 8601" in bad[3]
    assert present.tolist() == [True, True, True, False, False, False]


def test_values_beyond_datetime_do_not_crash():
    # year 10000 and year 0 timestamps exist in real files
    far = 253_402_300_800_000  # 10000-01-01T00:00:00Z in ms
    secs, present, bad = epoch_seconds([far, -62_198_755_200_000, 2**63 - 1], "ms")
    assert not bad and present.all()
    parts = timestamp_parts(secs, ["hour", "day_of_week", "month"])
    assert parts["month"][:2].tolist() == [1, 1]
    assert parts["hour"][:2].tolist() == [0, 0]
    assert epoch_seconds([2**62], "days")[2]  # beyond int64 seconds: a clear rejection


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-62_135_596_800, max_value=253_402_300_799))
def test_parts_match_datetime(s):
    t = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=s)
    p = timestamp_parts(np.array([s], dtype=np.int64), ["hour", "day_of_week", "month"])
    assert (p["hour"][0], p["day_of_week"][0], p["month"][0]) == (t.hour, t.weekday(), t.month)


def test_cross_is_stable_and_missing_is_zero():
    ids = cross_ids([["US", "US", None, "FR"], ["ios", "ios", "web", "web"]], 1000)
    assert ids[0] == ids[1] == stable_hash("US\x1fios") % 1000 + 1
    assert ids[2] == 0
    assert ids[3] == stable_hash("FR\x1fweb") % 1000 + 1
    # pinned: tf.strings.to_hash_bucket_fast(["US\x1fios", "FR\x1fweb"], 1000) + 1 in TensorFlow 2.21
    assert ids.tolist() == [219, 219, 0, 504]


def test_argument_checks():
    with pytest.raises(ValueError, match="unit"):
        epoch_seconds([1], "minutes")
    with pytest.raises(ValueError, match="part"):
        timestamp_parts(np.zeros(1, dtype=np.int64), ["week"])
    with pytest.raises(ValueError, match="buckets"):
        cross_ids([["a"]], 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)), max_size=30),
       st.sampled_from(["s", "ms", "us", "ns"]))
def test_integer_fast_path_is_python_floor_division(values, unit):
    per = {"s": 1, "ms": 1000, "us": 10**6, "ns": 10**9}[unit]
    secs, present, bad = epoch_seconds(values, unit)
    assert not bad
    assert present.tolist() == [v is not None for v in values]
    assert secs.tolist() == [0 if v is None else v // per for v in values]


@pytest.mark.parametrize("value, unit, looks", [
    (1_767_225_600 * 10**9, "s", "ns"), (1_767_225_600 * 10**3, "days", "ms"), (1_767_225_600.5 * 10**6, "ms", "us"),
    (1_767_225_600, "s", None), (253_402_300_799, "s", None), (10**400, "ms", None), (-(10**400), "s", None),
    (1e308, "s", None), (1e308, "days", None), (-1e308, "days", None), (math.inf, "s", None), (True, "s", None), ("2026-01-01", "s", None), (None, "s", None),
])
def test_unit_mismatch_names_the_unit_a_value_fits(value, unit, looks):
    why = unit_mismatch(value, unit)
    assert (why is None) == (looks is None), why
    if looks:
        assert f"it looks like epoch {looks!r} (the year 2026): set unit: {looks}" in why
