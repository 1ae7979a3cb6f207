"""The scheduling examples (examples/schedule/) run for real: a day's
conversion with the cron script, a training job that waits for it, a re-run
that does nothing, and the next day reusing the first day's analysis."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pipelines_data import make_records, write_dataset

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SCHEDULE = ROOT / "examples" / "schedule"
BIN = Path(sys.executable).parent

# Stands in for examples/train.py (which trains for real in `make demo`):
# what matters here is that it starts only once the dataset is complete.
_FAKE_TRAIN = """
import json, sys, pathlib
info = json.loads((pathlib.Path(sys.argv[1]) / "dataset_info.json").read_text())
print("training on", info["counts"]["read"], "records")
"""


@pytest.fixture
def layout(tmp_path):
    inputs, outputs = tmp_path / "events", tmp_path / "tfrecords"
    for day, seed in (("2026-11-21", 1), ("2026-11-22", 2)):
        paths = write_dataset(inputs / f"dt={day}", make_records(120, seed=seed))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(Path(paths["config"]).read_text())
    for day in ("2026-11-21", "2026-11-22"):  # partitions hold only data files
        (inputs / f"dt={day}" / "features.yaml").unlink()
        for j in (inputs / f"dt={day}").glob("*.jsonl"):
            j.unlink()
    train = tmp_path / "train.py"
    train.write_text(_FAKE_TRAIN)
    env = {**os.environ, "INPUT_ROOT": str(inputs), "OUTPUT_ROOT": str(outputs), "CONFIG": str(cfg),
           "RECORDPREP": str(BIN / "recordprep"), "PYTHON": sys.executable, "TRAIN": str(train),
           "WAIT_POLL": "0.2", "WAIT_TIMEOUT": "300"}
    env.pop("ANALYSIS_FROM", None)
    return env, outputs


def _run(script: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCHEDULE / script), *args], env=env, capture_output=True, text=True, timeout=300)


def test_training_waits_for_the_scheduled_conversion_and_reruns_are_noops(layout):
    env, outputs = layout
    day1, day2 = "2026-11-21", "2026-11-22"
    first = _run("convert_daily.sh", day1, env=env)
    assert first.returncode == 0, first.stderr
    assert (outputs / f"dt={day1}" / "dataset_info.json").exists()

    # The training job starts first and must block until day 2 is converted.
    trainer = subprocess.Popen([str(SCHEDULE / "train_when_ready.sh"), day2], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    assert trainer.poll() is None, "training started before its data existed"

    second = _run("convert_daily.sh", day2, env={**env, "ANALYSIS_FROM": str(outputs / f"dt={day1}")})
    assert second.returncode == 0, second.stderr
    out, err = trainer.communicate(timeout=120)
    assert trainer.returncode == 0, err
    assert "training on 120 records" in out

    # Day 2 maps values with day 1's vocabularies (--analysis-from).
    a1 = json.loads((outputs / f"dt={day1}" / "analysis.json").read_text())
    a2 = json.loads((outputs / f"dt={day2}" / "analysis.json").read_text())
    assert a1 == a2

    again = _run("convert_daily.sh", day2, env={**env, "ANALYSIS_FROM": str(outputs / f"dt={day1}")})
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout + again.stderr


def test_waiting_on_a_failed_conversion_stops_at_once(layout, tmp_path):
    env, outputs = layout
    out = outputs / "dt=2026-11-20"
    out.mkdir(parents=True)
    (out / "_FAILURE.json").write_text(json.dumps({"reason": "3 of 10 records were rejected", "counts": {}}))
    t0 = time.monotonic()
    r = _run("train_when_ready.sh", "2026-11-20", env=env)
    assert r.returncode != 0
    assert "rejected" in r.stdout + r.stderr
    assert time.monotonic() - t0 < 60  # not the 300 s timeout


def test_airflow_dag_compiles_and_loads_when_airflow_is_there(tmp_path):
    py_compile.compile(str(SCHEDULE / "airflow_dag.py"), cfile=str(tmp_path / "dag.pyc"), doraise=True)
    pytest.importorskip("airflow", reason="Airflow is not a recordprep dependency; the DAG is only compiled")
    ns: dict = {}
    exec(compile((SCHEDULE / "airflow_dag.py").read_text(), "airflow_dag.py", "exec"), ns)  # noqa: S102
    assert ns["dag"].task_ids == ["convert", "wait_for_dataset", "train"]
