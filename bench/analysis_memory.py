"""Analysis memory vs distinct terms: the same records with 10x the distinct ids.

One string column ``id`` (``vocabulary``, ``top_k: 1000``) of ``records``
Avro records holding exactly ``distinct`` ids, converted by ``recordprep
convert`` with local worker processes; the launcher and every worker process
are sampled apart (peak RSS of each), since the claim is per process: the
largest process grows by no more than the terms ``recordprep estimate``'s
model says a process holds (``pipelines.estimate.held_terms``: a unit's own
distinct terms or a merge partition's, at ``bytes_per_held_term``), plus 30%
of the first peak as slack (docs/benchmarks.md#analysis-memory). With many
units the model's growth is nil, so that is at most 1.3x: flat memory; with
few units a unit's own terms grow with the distinct ids, and the check
allows that much more.

``python -m bench.analysis_memory --records 2000000 --distinct 200000 2000000``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parent.parent
CONFIG = "features:\n  - {name: id, transform: vocabulary, top_k: 1000}\n"
FILES = 16


def make_data(root: Path, records: int, distinct: int, seed: int = 0) -> Path:
    """``root/avro/part-*.avro``: ``records`` ids, each of ``distinct`` ids at least once (reused if there)."""
    import fastavro

    d = root / f"ids-{records}-{distinct}"
    if (d / "DONE").exists():
        return d
    shutil.rmtree(d, ignore_errors=True)
    (d / "avro").mkdir(parents=True)
    ids = np.random.default_rng(seed).permutation(np.arange(records) % distinct)
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]})
    for i, chunk in enumerate(np.array_split(ids, FILES)):
        with open(d / "avro" / f"part-{i:05d}.avro", "wb") as f:
            fastavro.writer(f, schema, ({"id": f"u{x:09d}"} for x in chunk.tolist()), codec="deflate")
    (d / "config.yaml").write_text(CONFIG)
    (d / "DONE").touch()
    return d


def run_convert(data: Path, out: Path, workers: int, shards: int, extra: list[str],
                env: dict[str, str] | None = None) -> dict:
    """Convert ``data`` and sample each process of the tree: launcher and workers' peak RSS (MB)."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "pipelines.cli", "convert", "-i", str(data / "avro"), "-c", str(data / "config.yaml"),
           "-o", str(out), "--workers", str(workers), "--num-shards", str(shards), "--order", "input", *extra]
    penv = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=REPO, env=penv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    root = psutil.Process(p.pid)
    peaks: dict[int, int] = {}
    while p.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            procs = [root]
        for q in procs:
            try:
                peaks[q.pid] = max(peaks.get(q.pid, 0), q.memory_info().rss)
            except psutil.Error:
                pass
        time.sleep(0.2)
    log = p.stdout.read().decode(errors="replace") if p.stdout else ""
    if p.returncode != 0:
        raise RuntimeError(f"convert failed ({p.returncode}): {log[-2000:]}")
    launcher = peaks.pop(p.pid, 0)
    workers_mb = sorted((round(v / 2**20) for v in peaks.values()), reverse=True)
    return {"launcher_mb": round(launcher / 2**20), "largest_worker_mb": workers_mb[0] if workers_mb else 0,
            "workers_mb": workers_mb, "wall_s": round(time.perf_counter() - t0, 1)}


#: Per ``make bench`` size: records, and the two distinct-id counts (10x apart).
SIZES = {"small": (200_000, (20_000, 200_000)), "default": (2_000_000, (200_000, 2_000_000)),
         "large": (2_000_000, (200_000, 2_000_000))}
#: The largest process' peak may grow by the model's growth (``expected_peak_mb``) plus
#: this ratio less one of its first peak, for 10x the distinct ids.
MAX_RATIO = 1.3


def expected_peak_mb(first_peak_mb: float, records: int, first_distinct: int, distinct: int, shards: int) -> float:
    """The largest process' peak at ``distinct`` ids as the estimate's model predicts it from the peak
    measured at ``first_distinct``: that peak plus the growth of the terms a process holds."""
    from pipelines.estimate import MEASURED, held_terms

    grown = held_terms(records, distinct, shards)["held_terms"] - held_terms(records, first_distinct, shards)["held_terms"]
    return first_peak_mb + grown * MEASURED["bytes_per_held_term"] / 2**20


def judge(rows: list[dict], shards: int) -> dict:
    """The largest process' growth over the rows (first = fewest distinct ids), the model's, and
    whether the measured peak stayed within the model's prediction plus ``MAX_RATIO - 1`` of the first peak."""
    largest = [max(r["launcher_mb"], r["largest_worker_mb"]) for r in rows]
    first, last = rows[0], rows[-1]
    model = expected_peak_mb(largest[0], first["records"], first["distinct"], last["distinct"], shards)
    return {"largest_ratio": round(largest[-1] / largest[0], 2), "model_ratio": round(model / largest[0], 2),
            "ok": largest[-1] <= model + (MAX_RATIO - 1) * largest[0]}


def run_table(size: str, *, log=print, root: Path | None = None, workers: int = 2, shards: int = 128) -> dict:
    """The bench table: one row per distinct-id count, and whether the largest process stayed flat."""
    records, distinct = SIZES[size]
    root = root or Path("/tmp/recordprep-analysis-memory")
    rows = {}
    for d in distinct:
        data = make_data(root, records, d)
        rows[f"{d}"] = {"records": records, "distinct": d, **run_convert(data, root / f"out-{d}", workers, shards, [])}
        log(f"analysis memory: {rows[f'{d}']}")
    return {"rows": rows, "shards": shards, **judge(list(rows.values()), shards)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--distinct", type=int, nargs="+", default=[200_000, 2_000_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=128)
    ap.add_argument("--dir", default="/tmp/recordprep-analysis-memory")
    ap.add_argument("--json", help="also write the rows here")
    args, extra = ap.parse_known_args()
    root = Path(args.dir)
    rows = []
    for d in args.distinct:
        data = make_data(root, args.records, d)
        row = {"records": args.records, "distinct": d,
               **run_convert(data, root / f"out-{d}", args.workers, args.shards, extra)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(json.dumps(judge(rows, args.shards)), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
