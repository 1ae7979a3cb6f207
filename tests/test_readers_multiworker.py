"""Two ``MultiWorkerMirroredStrategy`` processes on 127.0.0.1 (TF_CONFIG) train from
``train_dataset(..., input_context=ctx)`` through ``distribute_datasets_from_function``
(examples/multiworker.py): each reads its own shards, disjoint, together the whole split."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import _readers_fixtures as fx
import pytest
from _ports import free_port

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "multiworker.py"
TIMEOUT_S = 240.0
SHARDS = (12, 9, 11, 7, 10, 8)


def test_two_workers_read_disjoint_shards_whose_union_is_the_split(tmp_path):
    out = fx.write_output(tmp_path / "out", {"train": SHARDS})
    cluster = {"worker": [f"127.0.0.1:{free_port()}" for _ in range(2)]}
    procs = []
    try:
        for i in range(2):
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                   "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
            log = open(tmp_path / f"worker{i}.log", "wb")
            procs.append((subprocess.Popen(
                [sys.executable, str(EXAMPLE), str(out.root), "--features", "num", "vec", "--steps", "3",
                 "--global-batch", "8", "--ids-out", str(tmp_path / f"ids{i}.json")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env), log))
        for i, (proc, log) in enumerate(procs):
            try:
                code = proc.wait(TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = None
            log.close()
            tail = (tmp_path / f"worker{i}.log").read_text(errors="replace")[-3000:]
            assert code == 0, f"worker {i} (pid {proc.pid}) {'timed out' if code is None else f'exited {code}'}:\n{tail}"
            assert f"worker {i} of 2: trained 3 steps" in tail, tail
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
            log.close()
    seen = [json.loads((tmp_path / f"ids{i}.json").read_text()) for i in range(2)]
    assert [s["pipeline"] for s in seen] == [0, 1] and {s["pipelines"] for s in seen} == {2}
    a, b = (set(s["ids"]) for s in seen)
    assert not a & b
    assert sorted(seen[0]["ids"] + seen[1]["ids"]) == sorted(out.all_ids("train"))
    # File-level sharding: worker i has exactly the records of shards i, i+2, ...
    for i, s in enumerate(seen):
        assert set(s["ids"]) == {r for shard in out.ids["train"][i::2] for r in shard}
