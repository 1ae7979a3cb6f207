"""Runs that die say so (issue 25): a conversion killed with -9 (or frozen, or on a lost machine)
is reported dead by ``recordprep wait`` and ``readers.wait_for_dataset`` instead of being waited on,
the next run takes over its output, and SIGTERM ends a run like Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

import readers
from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from pipelines.cli import app
from pipelines.lock import LOCK_FILENAME

ROOT = Path(__file__).resolve().parents[1]
RECORDPREP = Path(sys.executable).with_name("recordprep")
TMP = ".recordprep-tmp"
runner = CliRunner()


def _convert_cmd(data, out) -> list[str]:
    return [str(RECORDPREP), "convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out),
            "--num-shards", "4", "--batch-size", "200", "--workers", "1"]


def _wait_for_lock(out: Path, proc: subprocess.Popen) -> dict:
    """The run's lock once it is written whole (so it names its owner)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            lock = json.loads((out / LOCK_FILENAME).read_text())
            if lock.get("owner", {}).get("pid") == proc.pid:
                return lock
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    raise AssertionError(f"the run never held {out / LOCK_FILENAME} (rc {proc.poll()})")


def _cli_wait(out: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(RECORDPREP), "wait", out, *extra], capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------------ a run killed with -9


@pytest.mark.slow
def test_a_run_killed_with_sigkill_is_reported_dead_and_the_next_run_takes_over(tmp_path):
    data = write_dataset(tmp_path / "d", make_records(6000))
    out = tmp_path / "out"
    run = subprocess.Popen(_convert_cmd(data, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = _wait_for_lock(out, run)
    os.kill(run.pid, signal.SIGSTOP)  # mid-run, whatever the machine's load
    assert not (out / METADATA_FILENAME).exists()
    os.kill(run.pid, signal.SIGKILL)
    run.communicate(timeout=60)
    assert (out / LOCK_FILENAME).exists() and not (out / FAILURE_FILENAME).exists()  # -9 writes nothing
    host, pid = socket.gethostname(), run.pid

    r = _cli_wait(str(out), "--timeout", "60", "--stale-after", "2", "--poll", "0.2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"started at {lock['owner']['started']} on {host} (pid {pid}) is dead" in r.stderr, r.stderr  # not the timeout
    assert "without --overwrite" in r.stderr and "Traceback" not in r.stderr

    with pytest.raises(readers.DatasetDeadError, match=rf"on {host} \(pid {pid}\) is dead: its process {pid} is gone") as e:
        readers.wait_for_dataset(str(out), timeout=60, poll=0.1, stale_after=2)  # (the timeout: a TimeoutError)
    assert isinstance(e.value, readers.DatasetFailedError) and e.value.lock["owner"]["pid"] == pid

    again = subprocess.run(_convert_cmd(data, out), capture_output=True, text=True, timeout=600)  # no --overwrite
    assert again.returncode == 0, again.stderr
    assert "taking over the lock" in again.stderr and f"pid {pid} of" in again.stderr
    assert (out / METADATA_FILENAME).exists() and not (out / LOCK_FILENAME).exists() and not (out / TMP).exists()
    v = subprocess.run([str(RECORDPREP), "verify", str(out)], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr


# ------------------------------------------------------------------ a frozen run: its heartbeat stops

_HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from pipelines.lock import OutputLock
client = None
if len(sys.argv) > 2:  # gs://: the emulator's endpoint
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    client = storage.Client(project="recordprep-test", credentials=AnonymousCredentials(),
                            client_options={{"api_endpoint": sys.argv[2]}})
with OutputLock(sys.argv[1], heartbeat_seconds=0.2, stale_after_seconds=1.5, gcs_client=client):
    print("locked", flush=True)
    time.sleep(600)
"""


class _Holder:
    """A process holding an output's lock with a fast heartbeat (0.2 s, dead after 1.5 s), as a run's launcher does."""

    def __init__(self, output: str, *extra: str):
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER.format(root=str(ROOT)), output, *extra],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "locked"

    def freeze(self) -> None:
        os.kill(self.proc.pid, signal.SIGSTOP)

    def stop(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _frozen_run_is_reported(output: str) -> None:
    holder = _Holder(output, *([os.environ["STORAGE_EMULATOR_HOST"]] if output.startswith("gs://") else []))
    try:
        # live: its heartbeat keeps the wait waiting (the run's own limit, 1.5 s, passes twice)
        with pytest.raises(TimeoutError, match="did not appear within 3 s"):
            readers.wait_for_dataset(output, timeout=3, poll=0.1)
        r = _cli_wait(output, "--timeout", "3", "--poll", "0.2")
        assert r.returncode == 1 and "still incomplete after 3 s" in r.stderr, r.stderr
        # a limit within its heartbeat period would call a live run dead: a usage error
        r = _cli_wait(output, "--timeout", "30", "--stale-after", "0.1")
        assert r.returncode == 2 and "--stale-after 0.1 s is not longer than the heartbeat period" in r.stderr, r.stderr

        holder.freeze()  # alive, but its heartbeat stops: a hung or lost launcher
        pid, host = holder.proc.pid, socket.gethostname()
        with pytest.raises(readers.DatasetDeadError, match=rf"on {host} \(pid {pid}\) appears dead: no heartbeat for"):
            readers.wait_for_dataset(output, timeout=60, poll=0.1)  # (the timeout: a TimeoutError)
        r = _cli_wait(output, "--timeout", "60", "--poll", "0.2")
        assert r.returncode == 1 and f"on {host} (pid {pid}) appears dead: no heartbeat for" in r.stderr, r.stderr
    finally:
        holder.stop()


@pytest.mark.slow
def test_a_frozen_run_keeps_wait_waiting_until_its_heartbeat_is_stale(tmp_path):
    _frozen_run_is_reported(str(tmp_path / "out"))


@pytest.mark.slow
def test_a_frozen_run_on_gcs_is_reported_dead(remote_stack):
    _frozen_run_is_reported(f"gs://{remote_stack.bucket}/dead-runs/out")


# ------------------------------------------------------------------ a lost machine, a damaged lock


def _lock(out: Path, *, host: str, age_s: float, stale_after: float = 60.0) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / LOCK_FILENAME).write_text(json.dumps({
        "owner": {"host": host, "pid": 4242, "user": "someone", "started": "2026-11-24T01:02:03+00:00"},
        "heartbeat": "2026-11-24T01:02:03+00:00", "heartbeat_unix": time.time() - age_s,
        "heartbeat_seconds": 10.0, "stale_after_seconds": stale_after}))


def test_a_run_on_a_lost_machine_is_reported_dead_by_its_heartbeat(tmp_path):
    out = tmp_path / "out"
    _lock(out, host="lost-host", age_s=300)  # older than the limit the run recorded (60 s)
    r = runner.invoke(app, ["wait", str(out), "--timeout", "30", "--poll", "0.05"])
    assert r.exit_code == 1, r.output
    assert re.search(r"started at 2026-11-24T01:02:03\+00:00 on lost-host \(pid 4242\) appears dead: "
                     r"no heartbeat for 3\d\d s \(the limit is 60 s\)", r.output), r.output
    # --stale-after overrides the run's own limit, both ways
    _lock(out, host="lost-host", age_s=30)
    with pytest.raises(TimeoutError):
        readers.wait_for_dataset(str(out), timeout=0.3, poll=0.05)
    with pytest.raises(readers.DatasetDeadError, match=r"no heartbeat for 3\d s \(the limit is 20 s\)"):
        readers.wait_for_dataset(str(out), timeout=30, poll=0.05, stale_after=20)
    _lock(out, host="lost-host", age_s=300)
    with pytest.raises(TimeoutError):
        readers.wait_for_dataset(str(out), timeout=0.3, poll=0.05, stale_after=600)


def test_a_failure_report_is_reported_before_the_lock(tmp_path):
    out = tmp_path / "out"
    _lock(out, host="lost-host", age_s=300)
    (out / FAILURE_FILENAME).write_text(json.dumps({"reason": "interrupted by SIGTERM"}))
    with pytest.raises(readers.DatasetFailedError, match="interrupted by SIGTERM") as e:
        readers.wait_for_dataset(str(out), timeout=30, poll=0.05)
    assert not isinstance(e.value, readers.DatasetDeadError)


def test_no_lock_and_no_metadata_is_a_run_not_started_yet(tmp_path):
    with pytest.raises(TimeoutError):
        readers.wait_for_dataset(str(tmp_path), timeout=0.3, poll=0.05, stale_after=0.01)
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "0.3", "--poll", "0.05"])
    assert r.exit_code == 1 and "still incomplete" in r.output, r.output


@pytest.mark.parametrize("content", [b"", b"{not json", b"[]", b'{"owner": "x", "heartbeat_unix": "soon"}',
                                     b'{"owner": {"host": "%s", "pid": 1e400, "started": []}, "heartbeat_unix": NaN}'
                                     % socket.gethostname().encode(),
                                     b'{"owner": {"host": "%s", "pid": %d}}' % (socket.gethostname().encode(), 2**70)])
def test_a_damaged_lock_is_judged_by_how_long_it_stays_unchanged(tmp_path, content):
    (tmp_path / LOCK_FILENAME).write_bytes(content)
    with pytest.raises(TimeoutError):
        readers.wait_for_dataset(str(tmp_path), timeout=0.3, poll=0.05)  # being created, maybe
    with pytest.raises(readers.DatasetDeadError, match=r"no readable heartbeat \(the lock is damaged\) for"):
        readers.wait_for_dataset(str(tmp_path), timeout=30, poll=0.05, stale_after=0.5)


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_stale_after_must_be_a_positive_finite_number(tmp_path, value):
    r = runner.invoke(app, ["wait", str(tmp_path), "--stale-after", value])
    assert r.exit_code == 2 and "--stale-after must be a finite number of seconds > 0" in r.output, r.output
    with pytest.raises(ValueError, match="stale_after must be"):
        readers.wait_for_dataset(str(tmp_path), timeout=1, stale_after=float(value))


# ------------------------------------------------------------------ SIGTERM


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "code", "reason"), [(signal.SIGTERM, 143, "interrupted by SIGTERM"),
                                                        (signal.SIGINT, 130, "interrupted by SIGINT (Ctrl-C)")])
def test_sigterm_ends_a_run_like_ctrl_c(tmp_path, signum, code, reason):
    data = write_dataset(tmp_path / "d", make_records(6000))
    out = tmp_path / "out"
    run = subprocess.Popen(_convert_cmd(data, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_lock(out, run)
    run.send_signal(signum)  # what a scheduler sends to stop a task; Ctrl-C
    _, err = run.communicate(timeout=120)
    assert run.returncode == code, err
    assert err.strip().splitlines()[-1] == f"error: {reason}" and "Traceback" not in err, err
    marker = json.loads((out / FAILURE_FILENAME).read_text())
    assert marker["reason"] == reason, marker
    assert not (out / TMP).exists() and not (out / LOCK_FILENAME).exists() and not (out / METADATA_FILENAME).exists()
    r = runner.invoke(app, ["wait", str(out), "--timeout", "30", "--poll", "0.1"])
    assert r.exit_code == 1 and f"failed: {reason}" in r.output, r.output  # the failure, not the timeout


def _until_it_handles_sigterm(proc: subprocess.Popen) -> None:
    """Once the command has set its SIGTERM handler (Linux: ``SigCgt`` in ``/proc/PID/status``);
    before that the signal's default action would end it with no message."""
    deadline = time.monotonic() + 120
    while proc.poll() is None:
        with open(f"/proc/{proc.pid}/status") as f:
            caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
        if caught & (1 << (signal.SIGTERM - 1)):
            return
        assert time.monotonic() < deadline, "the command never set its SIGTERM handler"
        time.sleep(0.05)
    raise AssertionError(f"the command ended (rc {proc.returncode}) before it handled SIGTERM")


@pytest.mark.slow
def test_sigterm_ends_a_wait(tmp_path):
    p = subprocess.Popen([str(RECORDPREP), "wait", str(tmp_path), "--timeout", "120", "--poll", "0.05"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _until_it_handles_sigterm(p)  # not a fixed sleep: a loaded machine starts the command slower
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 143 and err.strip() == "error: interrupted by SIGTERM", err
