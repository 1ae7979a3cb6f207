"""A reader gets exactly one dataset while ``recordprep convert --overwrite`` replaces its output:
the old one whole, or an error saying the output was replaced, never records of both runs
(docs/reading.md#one-dataset-per-reader). Locally and on the emulated gs:// of tests/_remote.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pipelines_data import make_records, write_dataset

pytestmark = pytest.mark.slow

#: The replacing run's ids start here: every record says which run wrote it.
_NEW_IDS = 100_000
_SHARDS = "8"


def _inputs(root: Path, *, new: bool) -> dict[str, Path]:
    """Old: 800 records, ids below 800. New: 1,600 records (every shard at least as long
    as the old one, so a mix cannot end early), ids from ``_NEW_IDS``."""
    records = make_records(1600 if new else 800, seed=7 if new else 3)
    if new:
        records = [{**r, "id": r["id"] + _NEW_IDS} for r in records]
    return write_dataset(root, records)


def _convert(inputs: str, config: Path, out: str, *extra: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "convert", "-i", inputs, "-c", str(config), "-o", out,
         "--num-shards", _SHARDS, *extra],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr}"


def _read_across_replacement(make_dataset, replace) -> tuple[list[int], Exception | None]:
    """The ids a dataset yields when ``replace()`` runs after its first batch, and the error it
    ended with (None when it read to the end)."""
    import tensorflow as tf

    ids: list[int] = []
    it = iter(make_dataset())
    ids += next(it)[0]["id"].numpy().ravel().tolist()
    replace()
    try:
        for features, _ in it:
            ids += features["id"].numpy().ravel().tolist()
    except tf.errors.InvalidArgumentError as e:
        return ids, e
    return ids, None


def _assert_one_dataset(ids: list[int], error: Exception | None, old_ids: set[int]) -> None:
    mixed = sorted(i for i in ids if i not in old_ids)
    assert not mixed, f"{len(mixed)} of {len(ids)} records came from the replacing run: {mixed[:5]}"
    if error is None:
        assert sorted(ids) == sorted(old_ids)
    else:
        assert "replaced by another conversion" in str(error) and "rebuild the dataset" in str(error), error


def _datasets(pattern: str):
    import readers

    # One shard open at a time, little read-ahead: most shards are opened after the replacement.
    opts = readers.ReadOptions(cycle_length=1, num_parallel_calls=1, prefetch=1)
    return {
        "eval": lambda: readers.eval_dataset(pattern, 4, options=opts),
        # A small window: a default one would hold the whole split before the first batch.
        "train": lambda: readers.train_dataset(pattern, 4, num_epochs=1, drop_remainder=False,
                                               shuffle_buffer=8, options=opts),
    }


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_local_reader_mid_epoch_never_mixes_runs(tmp_path, kind):
    import readers

    old, new = _inputs(tmp_path / "old", new=False), _inputs(tmp_path / "new", new=True)
    out = tmp_path / "out"
    _convert(str(old["json"]), old["config"], str(out))
    old_ids = set(_all_ids(str(out / "train-*")))
    first_run = readers.load_info(str(out)).extra.get("run_id")

    ids, error = _read_across_replacement(
        _datasets(str(out / "train-*"))[kind],
        lambda: _convert(str(new["json"]), new["config"], str(out), "--overwrite"))

    _assert_one_dataset(ids, error, old_ids)
    info = readers.load_info(str(out))
    assert info.extra["run_id"] != first_run
    assert all(info.extra["run_id"] in s.file for s in info.splits["train"].shards)
    assert {int(i) for i in _all_ids(str(out / "train-*"))} <= set(range(_NEW_IDS, _NEW_IDS + 1600))


def test_gcs_reader_mid_epoch_never_mixes_runs(tmp_path, remote_stack):
    old, new = _inputs(tmp_path / "old", new=False), _inputs(tmp_path / "new", new=True)
    urls = {}
    for name in ("old", "new"):
        upload = tmp_path / f"upload-{name}"
        upload.mkdir()
        for p in (tmp_path / name).glob("*.jsonl"):
            (upload / p.name).write_bytes(p.read_bytes())
        urls[name] = remote_stack.upload_dir(upload, f"onedataset/{name}")
    out = f"gs://{remote_stack.bucket}/onedataset/out"
    _convert(f"{urls['old']}/*.jsonl", old["config"], out)
    old_ids = {int(i) for i in _all_ids(out + "/train-*")}

    ids, error = _read_across_replacement(
        _datasets(out + "/train-*")["eval"],
        lambda: _convert(f"{urls['new']}/*.jsonl", new["config"], out, "--overwrite"))

    _assert_one_dataset(ids, error, old_ids)
    assert min(int(i) for i in _all_ids(out + "/train-*")) >= _NEW_IDS


def _all_ids(pattern: str) -> list[int]:
    import readers

    return [int(i) for f, _ in readers.eval_dataset(pattern, 64) for i in f["id"].numpy().ravel()]
