"""The analysis-memory bench's check (``bench.analysis_memory.judge``) allows what the estimate's
model says a process holds: a unit's own distinct terms with few units, nothing more with many."""

from __future__ import annotations

from bench.analysis_memory import judge


def _rows(records: int, peaks: tuple[int, int]) -> list[dict]:
    return [{"records": records, "distinct": d, "launcher_mb": 150, "largest_worker_mb": mb}
            for d, mb in zip((200_000, 2_000_000), peaks, strict=True)]


def test_at_four_units_a_units_own_terms_are_expected_growth():
    """230 -> 325 MB at 4 shards (2M records): each unit's distinct ids grow 200k -> 500k, which the model
    predicts (+94 MB); a flat 1.3x claimed the growth a failure."""
    got = judge(_rows(2_000_000, (230, 325)), shards=4)
    assert got["largest_ratio"] == 1.41 and got["model_ratio"] == 1.41 and got["ok"]
    assert not judge(_rows(2_000_000, (230, 500)), shards=4)["ok"]  # beyond the model and its slack


def test_at_many_units_memory_must_stay_flat():
    """At 128 shards a unit holds 15.6k records' terms whatever the distinct ids: the same growth fails."""
    got = judge(_rows(2_000_000, (230, 325)), shards=128)
    assert got["model_ratio"] == 1.0 and not got["ok"]
    assert judge(_rows(2_000_000, (167, 171)), shards=128)["ok"]
