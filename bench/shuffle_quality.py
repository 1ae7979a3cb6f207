"""Shuffle quality: are training batches fair samples of input sorted by time?

The bench's input is sorted by ``ts`` across its 16 files (``bench.make_data``:
record ``i`` of the dataset has ``ts = T0 + 1000 i + noise``, so its file is
``i // records_per_file``). Each row reads one epoch of the **train split** in
batches of 1 024 and reports:

``spread``
    the standard deviation of the per-batch means of ``ts`` divided by what
    iid batches give (``std(ts) / sqrt(1024)``): 1.0 is ideal, 10 means
    batches swing ten times more than random sampling makes them.
``files``
    the mean share of the input files a batch draws records from (100% ideal
    at this batch size).

Rows: ``readers.train_dataset(seed=1)`` with its defaults, and
``make_batched_features_dataset`` with a 10 000-record shuffle buffer, on the
output converted with recordprep's defaults (shuffled) and with
``--no-shuffle`` (input order, as before the shuffle existed); and an ideal
permutation (numpy) of the same ``ts`` values. Targets (issue 18): spread
<= 1.5 and files >= 90% with recordprep's defaults.

    python -m bench.shuffle_quality [--size default] [--out DIR] [--result FILE]

Part of ``make bench`` (``bench.run``; ``--skip-shuffle`` leaves it out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

BATCH = 1024
#: ``ts`` of the dataset's first record, before its noise (``bench.make_data``).
T0 = 1_767_225_600_000
ROOT = Path(__file__).resolve().parent


def _convert(size: str, out: Path, order: str) -> None:
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    shutil.rmtree(out, ignore_errors=True)
    run_convert(ConvertOptions(inputs=(str(ROOT / "data" / size / "avro"),), config=str(ROOT / "features.yaml"),
                               output=str(out), order=order))


def _quality(ts_batches: list[np.ndarray], per_file: int, files: int) -> dict[str, float]:
    all_ts = np.concatenate(ts_batches)
    iid = all_ts.std() / np.sqrt(BATCH)
    means = np.array([b.mean() for b in ts_batches])
    # ts is stored as float32 (1 ulp is ~131 s here): the file of a record at a
    # file boundary can come out one off, never more
    shares = [len(np.unique(np.clip(((b - T0) // 1000) // per_file, 0, files - 1))) / min(files, BATCH)
              for b in ts_batches]
    return {"spread": round(float(means.std() / iid), 2), "files": round(100 * float(np.mean(shares)), 1),
            "batches": len(ts_batches)}


def _train_dataset(out: Path) -> list[np.ndarray]:
    import readers

    ds = readers.train_dataset(str(out / "train-*"), BATCH, seed=1, num_epochs=1, features=["ts"])
    return [x["ts"].numpy().ravel().astype(np.float64) for x, _ in ds]


def _batched_features(out: Path) -> list[np.ndarray]:
    import tensorflow as tf

    import readers

    info = readers.load_info(str(out))
    files = [str(out / s.file) for s in info.split("train").shards]
    ds = tf.data.experimental.make_batched_features_dataset(
        files, BATCH, {"ts": tf.io.FixedLenFeature([1], tf.float32)}, reader=lambda f: tf.data.TFRecordDataset(
            f, compression_type="GZIP"), num_epochs=1, shuffle=True, shuffle_buffer_size=10_000, shuffle_seed=1,
        drop_final_batch=True)
    return [b["ts"].numpy().ravel().astype(np.float64) for b in ds]


#: row key -> label; ``<reader>:<order>`` read the output converted with that ``--order``.
LABELS = {
    "train_dataset:shuffled": "readers.train_dataset, --order shuffled (default)",
    "mbfd:shuffled": "make_batched_features_dataset (10,000 buffer), --order shuffled",
    "train_dataset:input": "readers.train_dataset, --order input (--no-shuffle)",
    "mbfd:input": "make_batched_features_dataset (10,000 buffer), --order input",
    "ideal": "ideal permutation (numpy)",
}


def measure(size: str, out_root: Path) -> dict[str, Any]:
    """Convert ``size`` both ways under ``out_root`` and score every row of :data:`LABELS`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    manifest = json.loads((ROOT / "data" / size / "MANIFEST.json").read_text())
    per_file, files = manifest["avro"]["files"][0]["records"], len(manifest["avro"]["files"])
    outs = {order: out_root / order for order in ("shuffled", "input")}
    for order, out in outs.items():
        _convert(size, out, order)
    batches = {}
    for order, out in outs.items():
        batches[f"train_dataset:{order}"] = _train_dataset(out)
        batches[f"mbfd:{order}"] = _batched_features(out)
    every = np.concatenate(batches["train_dataset:input"])
    perm = np.random.default_rng(1).permutation(every)
    batches["ideal"] = [perm[i:i + BATCH] for i in range(0, len(perm) - BATCH + 1, BATCH)]
    rows = {key: {"label": LABELS[key], **_quality(batches[key], per_file, files)} for key in LABELS}
    return {"rows": rows, "batch": BATCH, "input_files": files, "records": manifest["records"]}


def run_table(size: str, *, log, log_dir: Path, out_root: Path) -> dict[str, Any]:
    """:func:`measure` in a fresh child process (``make bench``): its rows, or ``error`` when it failed."""
    from bench.measure import run_child

    log(f"shuffle quality: convert {size} shuffled and --no-shuffle, read one epoch per row")
    m = run_child("bench.shuffle_quality", ["--size", size, "--out", str(out_root)], log_dir=log_dir, timeout=1800)
    if not m.ok:
        log(f"  -> FAILED: {m.error} (log: {m.log})")
        return {"rows": {}, "error": m.error, "wall_s": m.wall_s}
    for r in m.result["rows"].values():
        log(f"  -> {r['label']}: spread {r['spread']:.2f}, files {r['files']:.1f}%")
    return {**m.result, "wall_s": m.wall_s, "peak_rss_mb": m.peak_rss_mb}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default")
    ap.add_argument("--out", default=str(ROOT / "data" / "shuffle_quality"))
    ap.add_argument("--result", default=None, help="also write the rows as JSON to this file")
    args = ap.parse_args()
    res = measure(args.size, Path(args.out))
    if args.result:
        Path(args.result).write_text(json.dumps(res))
    print(f"{'row':<62} {'spread':>7} {'files':>7} {'batches':>8}")
    for q in res["rows"].values():
        print(f"{q['label']:<62} {q['spread']:>7.2f} {q['files']:>6.1f}% {q['batches']:>8}")


if __name__ == "__main__":
    main()
