"""The scheduling examples (examples/schedule/) run for real.

The cron scripts, with a simulated clock (``TODAY``): two consecutive days
converted and trained, a training job that waits for its conversion, a re-run
that does nothing, a killed conversion that the training job reports and the
next conversion takes over.

The Airflow DAGs, in Apache Airflow installed in a virtualenv of its own
(``tests/_airflow.py``, built from the package registry on first use) and run
with ``airflow dags test``: two consecutive days converted, waited for and
trained with examples/train.py; a retried and a backfilled finished day
that redo nothing; a conversion frozen then killed mid-run, which the wait
task reports dead and the convert task's retry takes over.
"""

from __future__ import annotations

import json
import os
import py_compile
import signal
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
DAYS = ("2026-11-21", "2026-11-22", "2026-11-23")
# The DAGs' runs of a day (``ds``) are stamped with their schedule's time of day.
CONVERT_AT, TRAIN_AT = "T01:30:00+00:00", "T02:00:00+00:00"

# Stands in for examples/train.py in the cron tests (the Airflow tests train for
# real): what matters here is that it starts only once the dataset is complete.
_FAKE_TRAIN = """
import json, sys, pathlib
info = json.loads((pathlib.Path(sys.argv[1]) / "dataset_info.json").read_text())
print("training on", info["counts"]["read"], "records with", sys.argv[2:])
"""


def _make_inputs(root: Path) -> tuple[Path, Path]:
    """One partition of AVRO files per day in ``root/events/dt=DAY``; the config beside them."""
    inputs = root / "events"
    for seed, day in enumerate(DAYS, 1):
        paths = write_dataset(inputs / f"dt={day}", make_records(120, seed=seed))
    cfg = root / "features.yaml"
    cfg.write_text(Path(paths["config"]).read_text())
    for day in DAYS:  # partitions hold only data files
        (inputs / f"dt={day}" / "features.yaml").unlink()
        for j in (inputs / f"dt={day}").glob("*.jsonl"):
            j.unlink()
    return inputs, cfg


def _files(out: Path) -> dict[str, tuple[int, int]]:
    """Every file of an output with its (mtime_ns, size): a run that redoes nothing leaves it equal."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*") if p.is_file()}


def _running_conversion(out: Path, proc: subprocess.Popen, timeout: float = 180) -> int:
    """The pid of the conversion writing ``out`` (from its lock) once it holds the lock."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        assert proc.poll() is None, f"the scheduler ended (rc {proc.returncode}) before the conversion took its lock"
        try:
            return int(json.loads((out / "_LOCK.json").read_text())["owner"]["pid"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.02)
    raise AssertionError(f"no conversion took the lock of {out} within {timeout} s")


def _signal_run(pid: int, sig: int, scheduler: subprocess.Popen) -> None:
    """Signal the conversion's process group (its Beam workers too, as a lost machine), never the scheduler's."""
    group = os.getpgid(pid)
    if group == os.getpgid(scheduler.pid) or group == os.getpgrp():
        os.kill(pid, sig)
    else:
        os.killpg(group, sig)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (a scheduler started in its own session, or a conversion)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if text in path.read_text(errors="replace"):
            return
        assert proc.poll() is None, f"ended (rc {proc.returncode}) without printing {text!r}:\n{path.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{text!r} not printed within {timeout} s:\n{path.read_text()[-3000:]}")


# ----------------------------------------------------------------------- cron


@pytest.fixture
def layout(tmp_path):
    inputs, cfg = _make_inputs(tmp_path)
    outputs = tmp_path / "tfrecords"
    train = tmp_path / "train.py"
    train.write_text(_FAKE_TRAIN)
    env = {**os.environ, "INPUT_ROOT": str(inputs), "OUTPUT_ROOT": str(outputs), "CONFIG": str(cfg),
           "RECORDPREP": str(BIN / "recordprep"), "PYTHON": sys.executable, "TRAIN": str(train),
           "WAIT_POLL": "0.2", "WAIT_TIMEOUT": "300"}
    for k in ("ANALYSIS_FROM", "TODAY", "WAIT_STALE_AFTER"):
        env.pop(k, None)
    return env, outputs


def _run(script: str, *args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCHEDULE / script), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_cron_two_days_on_a_simulated_clock_train_after_their_conversion_and_reruns_are_noops(layout):
    env, outputs = layout
    day1, day2 = DAYS[:2]
    first = _run("convert_daily.sh", env={**env, "TODAY": "2026-11-22"})  # converts the day before
    assert first.returncode == 0, first.stderr
    assert (outputs / f"dt={day1}" / "dataset_info.json").exists()

    # The next day's training job starts first and must block until day 2 is converted.
    day2_env = {**env, "TODAY": "2026-11-23", "ANALYSIS_FROM": str(outputs / f"dt={day1}")}
    trainer = subprocess.Popen([str(SCHEDULE / "train_when_ready.sh"), "--steps", "3"], env=day2_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        assert trainer.poll() is None, "training started before its data existed"
        second = _run("convert_daily.sh", env=day2_env)
        assert second.returncode == 0, second.stderr
        out, err = trainer.communicate(timeout=120)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err
    assert "training on 120 records with ['--steps', '3']" in out

    # Day 2 maps values with day 1's vocabularies (--analysis-from).
    a1 = json.loads((outputs / f"dt={day1}" / "analysis.json").read_text())
    a2 = json.loads((outputs / f"dt={day2}" / "analysis.json").read_text())
    assert a1 == a2

    before = _files(outputs / f"dt={day2}")
    again = _run("convert_daily.sh", env=day2_env)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout + again.stderr
    assert _files(outputs / f"dt={day2}") == before


def test_waiting_on_a_failed_conversion_stops_at_once(layout):
    env, outputs = layout
    out = outputs / "dt=2026-11-20"
    out.mkdir(parents=True)
    (out / "_FAILURE.json").write_text(json.dumps({"reason": "3 of 10 records were rejected", "counts": {}}))
    r = _run("train_when_ready.sh", "2026-11-20", env=env)
    assert r.returncode != 0
    assert "rejected" in r.stdout + r.stderr
    assert "still incomplete" not in r.stdout + r.stderr  # the failure, not the 300 s timeout


def test_cron_killed_conversion_is_reported_by_the_training_job_and_taken_over_by_the_next_run(layout):
    env = {**layout[0], "TODAY": "2026-11-22"}
    out = layout[1] / f"dt={DAYS[0]}"
    conv = subprocess.Popen([str(SCHEDULE / "convert_daily.sh")], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = _running_conversion(out, conv)
        _signal_run(pid, signal.SIGKILL, conv)  # kill -9: it writes nothing more
        conv.wait(timeout=60)
    finally:
        conv.kill()
    assert not (out / "dataset_info.json").exists() and not (out / "_FAILURE.json").exists()

    r = _run("train_when_ready.sh", env=env, timeout=120)  # its wait's timeout is 300 s: ending here is at once
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"(pid {pid}) is dead" in r.stderr, r.stderr
    assert "training on" not in r.stdout and "still incomplete" not in r.stderr

    retry = _run("convert_daily.sh", env=env)
    assert retry.returncode == 0, retry.stderr
    assert "taking over the lock" in retry.stderr, retry.stderr
    trained = _run("train_when_ready.sh", env=env, timeout=120)
    assert trained.returncode == 0, trained.stderr
    assert "training on 120 records" in trained.stdout


def test_cron_drift_gate_stops_training_on_a_day_over_its_thresholds(layout):
    env, outputs = layout
    for today in ("2026-11-22", "2026-11-23"):  # converts DAYS[0], then DAYS[1]
        r = _run("convert_daily.sh", env={**env, "TODAY": today})
        assert r.returncode == 0, r.stderr
    loose = "js=1 linf=1 mean_shift=1000 missing=1 new_terms=1"
    gate = {**env, "TODAY": "2026-11-23", "DRIFT_AGAINST": "previous"}
    r = _run("train_when_ready.sh", env={**gate, "DRIFT_THRESHOLDS": loose})
    assert r.returncode == 0, r.stderr
    assert "training on 120 records" in r.stdout and f"dt={DAYS[0]}:train" in r.stdout  # compared with the day before
    r = _run("train_when_ready.sh", env={**gate, "DRIFT_THRESHOLDS": "js=0 linf=0"})
    assert r.returncode == 1
    assert "training on" not in r.stdout
    assert "drift/skew over threshold" in r.stderr and "color: linf" in r.stderr and "x: js" in r.stderr
    # the first day has no day before: its splits only, with a note
    r = _run("train_when_ready.sh", env={**gate, "TODAY": "2026-11-22", "DRIFT_THRESHOLDS": loose})
    assert r.returncode == 0, r.stderr
    assert "is not a complete output; checking" in r.stderr and "training on 120 records" in r.stdout


# -------------------------------------------------------------------- Airflow


def test_airflow_dags_compile(tmp_path):
    py_compile.compile(str(SCHEDULE / "airflow_dag.py"), cfile=str(tmp_path / "dag.pyc"), doraise=True)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory):
    """Two Airflow deployments (one per DAG, as a training team's Airflow may be apart from the
    conversion's) sharing the test's data; each call runs the ``airflow`` CLI in one of them."""
    import _airflow

    try:
        stamp = _airflow.ensure_venv()
        root = tmp_path_factory.mktemp("airflow")
        db = _airflow.migrated_db(root)
    except _airflow.AirflowUnavailable as e:
        pytest.skip(str(e))
    print(f"Airflow {stamp['airflow']} (virtualenv built in {stamp['install_seconds']} s)")
    inputs, cfg = _make_inputs(root)
    outputs = root / "tf records"  # a space: the DAGs quote what they pass to the shell
    variables = {
        "INPUT_ROOT": inputs, "OUTPUT_ROOT": outputs, "CONFIG": cfg, "BIN": BIN / "recordprep",
        "PYTHON": sys.executable, "TRAIN_SCRIPT": ROOT / "examples" / "train.py",
        "TRAIN_ARGS": "--steps 3 --batch-size 16", "WAIT_TIMEOUT": 300, "WAIT_POLL": 0.5, "STALE_AFTER": 12,
    }
    deployments = {}
    for name, retry_delay in (("convert", 1), ("train", 20)):
        env = _airflow.deployment(root / f"home-{name}", db, SCHEDULE / "airflow_dag.py")
        env.update({f"AIRFLOW_VAR_RECORDPREP_{k}": str(v) for k, v in variables.items()})
        env.update({"AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY": str(retry_delay), "TF_CPP_MIN_LOG_LEVEL": "2",
                    "TF_ENABLE_ONEDNN_OPTS": "0"})
        deployments[name] = env

    class Airflow:
        outputs = root / "tf records"
        homes = {name: Path(env["AIRFLOW_HOME"]) for name, env in deployments.items()}

        @staticmethod
        def popen(where: str, *args: str, log: Path, **variables: str) -> subprocess.Popen:
            env = {**deployments[where], **{f"AIRFLOW_VAR_RECORDPREP_{k}": v for k, v in variables.items()}}
            with open(log, "w") as f:
                return subprocess.Popen([str(_airflow.airflow_bin()), *args], env=env, stdout=f,
                                        stderr=subprocess.STDOUT, start_new_session=True)

        @classmethod
        def run(cls, where: str, *args: str, timeout: float = 300, **variables: str) -> str:
            log = root / f"{where}-{time.monotonic_ns()}.log"
            proc = cls.popen(where, *args, log=log, **variables)
            try:
                rc = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                raise
            text = log.read_text(errors="replace")
            assert rc == 0, f"airflow {' '.join(args)} exited {rc}:\n{text[-6000:]}"
            return text

    return Airflow


@pytest.fixture(scope="module")
def two_days(airflow):
    """Both DAGs for two consecutive days (day 2 reuses day 1's analysis); their logs."""
    logs = {}
    for day in DAYS[:2]:
        extra = {"ANALYSIS_FROM": str(airflow.outputs / f"dt={DAYS[0]}")} if day == DAYS[1] else {}
        logs["convert", day] = airflow.run("convert", "dags", "test", "recordprep_convert", day + CONVERT_AT, **extra)
        logs["train", day] = airflow.run("train", "dags", "test", "recordprep_train", day + TRAIN_AT)
    return logs


def test_airflow_converts_waits_and_trains_two_consecutive_days(airflow, two_days):
    for day in DAYS[:2]:
        out = airflow.outputs / f"dt={day}"
        info = json.loads((out / "dataset_info.json").read_text())
        assert info["counts"]["read"] == 120
        assert f"{out} is complete" in two_days["train", day]
        assert "trained 3 steps" in two_days["train", day] and "eval: loss" in two_days["train", day]
        assert "Marking task as SUCCESS. dag_id=recordprep_train, task_id=train" in two_days["train", day]
    a1, a2 = (json.loads((airflow.outputs / f"dt={d}" / "analysis.json").read_text()) for d in DAYS[:2])
    assert a1 == a2  # day 2 ran with --analysis-from day 1


def test_airflow_drift_gate_fails_its_task_and_training_does_not_start(airflow, two_days, tmp_path):
    assert "drift gate off" in two_days["train", DAYS[1]]  # Variable unset: the gate passes
    log = tmp_path / "train.log"
    proc = airflow.popen("train", "dags", "test", "recordprep_train", DAYS[1] + TRAIN_AT, log=log,
                         DRIFT_AGAINST="previous", DRIFT_THRESHOLDS="js=0 linf=0")
    try:
        proc.wait(timeout=300)
    finally:
        _kill_group(proc.pid)
    text = log.read_text(errors="replace")
    assert "drift/skew over threshold" in text and f"dt={DAYS[0]}:train" in text, text[-4000:]
    assert any("FAILED" in line and "task_id=check_drift" in line for line in text.splitlines()), text[-4000:]
    assert "trained 3 steps" not in text


def test_airflow_retry_and_backfill_of_a_finished_day_redo_nothing(airflow, two_days):
    out = airflow.outputs / f"dt={DAYS[0]}"
    before = _files(out)
    retried = airflow.run("convert", "dags", "test", "recordprep_convert", DAYS[0] + CONVERT_AT)
    assert "already complete for these inputs and config" in retried
    assert _files(out) == before

    started = time.time()
    airflow.run("convert", "dags", "backfill", "recordprep_convert", "-s", DAYS[0] + CONVERT_AT, "-e", DAYS[0] + CONVERT_AT,
                "--reset-dagruns", "-y")
    logs = [p for p in (airflow.homes["convert"] / "logs").rglob("*.log")
            if "task_id=convert" in str(p) and p.stat().st_mtime >= started]
    assert logs, "the backfill ran no convert task"
    assert all("already complete for these inputs and config" in p.read_text() for p in logs)
    assert _files(out) == before


def test_airflow_wait_reports_a_frozen_conversion_dead_and_the_convert_retry_takes_over(airflow, tmp_path):
    """The conversion is frozen (SIGSTOP, as a hung or partitioned worker) while holding the lock:
    its heartbeat stops, and the wait task fails once it is older than ``recordprep_stale_after``.
    Then it is killed (-9): the convert task fails, and its retry takes over the dead run's output.
    The wait task's retry (a longer retry delay) then follows that run, and training goes on."""
    day = DAYS[2]
    out = airflow.outputs / f"dt={day}"
    convert_log, train_log = tmp_path / "convert.log", tmp_path / "train.log"
    conv = airflow.popen("convert", "dags", "test", "recordprep_convert", day + CONVERT_AT, log=convert_log)
    trainer = pid = None
    try:
        pid = _running_conversion(out, conv)
        _signal_run(pid, signal.SIGSTOP, conv)
        assert not (out / "dataset_info.json").exists()
        trainer = airflow.popen("train", "dags", "test", "recordprep_train", day + TRAIN_AT, log=train_log)
        _wait_for_text(train_log, "appears dead: no heartbeat for", trainer, timeout=120)
        _signal_run(pid, signal.SIGKILL, conv)
        assert conv.wait(timeout=300) == 0, convert_log.read_text()[-6000:]
        assert trainer.wait(timeout=300) == 0, train_log.read_text()[-6000:]
    finally:  # on failure, nothing stays behind (a stopped conversion would never end)
        if pid is not None:
            _kill_group(pid)
        for proc in (conv, trainer):
            if proc is not None and proc.poll() is None:
                _kill_group(proc.pid)
    converted, trained = convert_log.read_text(), train_log.read_text()
    assert f"(pid {pid}) appears dead" in trained
    assert "Marking task as UP_FOR_RETRY. dag_id=recordprep_train, task_id=wait_for_dataset" in trained
    assert "Marking task as UP_FOR_RETRY. dag_id=recordprep_convert, task_id=convert" in converted
    assert "taking over the lock" in converted
    assert "Marking task as SUCCESS. dag_id=recordprep_convert, task_id=convert" in converted
    assert f"{out} is complete" in trained and "trained 3 steps" in trained
    assert json.loads((out / "dataset_info.json").read_text())["counts"]["read"] == 120
