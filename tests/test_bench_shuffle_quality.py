"""bench.shuffle_quality's measures: 1.0 and 100% for random batches, far off for sorted ones."""

from __future__ import annotations

import numpy as np

from bench.shuffle_quality import BATCH, T0, _quality


def _ts(files: int = 16, per_file: int = 4096) -> np.ndarray:
    ids = np.arange(files * per_file)
    return (T0 + ids * 1000 + np.random.default_rng(0).integers(0, 1000, ids.size)).astype(np.float32).astype(np.float64)


def _batches(ts: np.ndarray) -> list[np.ndarray]:
    return [ts[i:i + BATCH] for i in range(0, len(ts) - BATCH + 1, BATCH)]


def test_random_batches_score_near_one_and_every_file():
    q = _quality(_batches(np.random.default_rng(1).permutation(_ts())), 4096, 16)
    assert 0.8 < q["spread"] < 1.2 and q["files"] == 100.0


def test_sorted_batches_score_far_off_and_one_file_each():
    q = _quality(_batches(_ts()), 4096, 16)
    assert q["spread"] > 20 and q["files"] < 1.5 * 100 / 16  # float32 ts: a boundary record may count once more
