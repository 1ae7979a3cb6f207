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


def _row(key: str, spread: float, files: float) -> dict:
    from bench.shuffle_quality import LABELS

    return {"label": LABELS[key], "spread": spread, "files": files, "batches": 351}


def _shuffle_targets(shuffle: dict | None) -> dict[str, dict]:
    from bench import report

    res = {"size": "default", **({"shuffle": shuffle} if shuffle is not None else {})}
    return {t["key"]: t for t in report.evaluate_targets(res) if t["key"].startswith("shuffle_")}


def _shuffle(**rows: tuple[float, float]) -> dict:
    return {"rows": {k.replace("__", ":"): _row(k.replace("__", ":"), *v) for k, v in rows.items()},
            "batch": BATCH, "input_files": 16, "records": 400_000}


def test_report_targets_read_train_dataset_on_the_shuffled_output():
    from bench import report

    sh = _shuffle(train_dataset__shuffled=(1.4, 95.0), mbfd__shuffled=(1.0, 100.0), train_dataset__input=(60.0, 8.0),
                  mbfd__input=(40.0, 10.0), ideal=(1.0, 100.0))
    t = _shuffle_targets(sh)
    assert (t["shuffle_spread"]["value"], t["shuffle_spread"]["status"]) == (1.4, "MET")
    assert (t["shuffle_files"]["value"], t["shuffle_files"]["status"]) == (95.0, "MET")
    sh["rows"]["train_dataset:shuffled"].update(spread=1.6, files=89.9)
    t = _shuffle_targets(sh)
    assert t["shuffle_spread"]["status"] == t["shuffle_files"]["status"] == "NOT MET"
    md = "\n".join(report.shuffle_md({"shuffle": sh}))
    assert "| readers.train_dataset, --order shuffled (default) | 1.60 | 89.9% | 351 |" in md
    assert "| ideal permutation (numpy) | 1.00 | 100.0% | 351 |" in md
    assert "| 89.9% | ≥ 90.0% | NOT MET |" in "\n".join(report.targets_md(report.evaluate_targets(
        {"size": "default", "shuffle": sh})))


def test_report_says_why_shuffle_targets_are_not_measured():
    from bench import report

    for shuffle, why in ((None, "--skip-shuffle"), ({"rows": {}, "error": "exit code 1: boom"}, "boom")):
        t = _shuffle_targets(shuffle)
        assert {v["status"] for v in t.values()} == {"NOT MEASURED"}
        assert all(why in v["note"] for v in t.values())
    assert report.shuffle_md({"shuffle": {"rows": {}, "error": "boom"}}) == ["_FAILED: boom_"]
