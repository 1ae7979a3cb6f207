"""Worker processes under a memory cap (``prlimit --as``) convert a column
whose distinct terms the output statistics' one merge (``StatsMerger``) would
not fit in that cap: the statistics' term counts are merged per partition of
the terms (``pipelines.analyze.merge_stats_terms``). With one merge the
largest worker's address space peaked at about 1,040 MB on this data, 735 MB
partitioned (docs/benchmarks.md#analysis-memory)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import fastavro
import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
RECORDS = 1_000_000  # each id once: 1M distinct terms
CAP_MB = 900
TIMEOUT_S = 600

# The CLI with each worker started under ``prlimit --as`` (Beam runs the worker command through a shell).
LAUNCH = f"""
import sys
import pipelines.local.worker, pipelines.local.runner
pipelines.local.runner.worker_command = lambda schemes: "prlimit --as={CAP_MB << 20} -- " + pipelines.local.worker.command(schemes)
sys.argv = ["recordprep", *sys.argv[1:]]
from pipelines.cli import main
main()
"""


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit (util-linux)")
def test_capped_workers_convert_a_million_distinct_ids(tmp_path):
    ids = np.random.default_rng(3).permutation(RECORDS)
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]})
    (tmp_path / "in").mkdir()
    for i, chunk in enumerate(np.array_split(ids, 8)):
        with open(tmp_path / "in" / f"part-{i}.avro", "wb") as f:
            fastavro.writer(f, schema, ({"id": f"u{x:09d}"} for x in chunk.tolist()), codec="deflate")
    (tmp_path / "features.yaml").write_text("features:\n  - {name: id, transform: vocabulary, top_k: 1000}\n")
    out = tmp_path / "out"
    cmd = [sys.executable, "-c", LAUNCH, "convert", "-i", str(tmp_path / "in"), "-c", str(tmp_path / "features.yaml"),
           "-o", str(out), "--workers", "2", "--num-shards", "16", "--order", "input", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "RECORDPREP_WARM_WORKERS": "0"}  # started, so capped, workers
    p = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        log, _ = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # its own session: only what it started
        log, _ = p.communicate()
    assert p.returncode == 0, log.decode(errors="replace")[-3000:]
    stats = json.loads((out / "stats.json").read_text())["features"]["id"]["splits"]
    assert sum(s["distinct"] for s in stats.values()) == RECORDS
    assert sum(s["once"] for s in stats.values()) == RECORDS
    info = json.loads((out / "dataset_info.json").read_text())
    assert sum(sp["num_records"] for sp in info["splits"].values()) == RECORDS
