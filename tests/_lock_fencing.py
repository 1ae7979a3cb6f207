"""The lock's split brain with real processes (issue 44), the same on every store.

Run A holds an output's lock and is paused (SIGSTOP, at a named step through
``$RECORDPREP_TEST_PAUSE_AT``) until its lock is stale; run B takes the lock
over with ``--overwrite`` and commits; A is resumed (SIGCONT). A must exit
non-zero and leave every file of B's output as B wrote it. ``files()``
returns the output's files by name; ``out`` is the output's URL or path.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from convert.lockfile import LOCK_FILENAME
from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from pipelines.lock import PAUSE_ENV, STALE_AFTER_ENV

RECORDPREP = Path(sys.executable).with_name("recordprep")
#: The staleness bound of both runs: short, so B may take A's lock over soon after A stops.
STALE_AFTER = "4"


def convert_cmd(data: dict, out: str, shards: int) -> list[str]:
    return [str(RECORDPREP), "convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", out,
            "--num-shards", str(shards), "--batch-size", "200", "--workers", "1", "--overwrite"]


def env(store: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """This process's environment (plus ``store``'s), the short bound, and ``extra``."""
    base = {k: v for k, v in os.environ.items() if k != PAUSE_ENV}
    return {**base, **(store or {}), STALE_AFTER_ENV: STALE_AFTER, **extra}


def wait_paused(proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until ``proc`` has stopped itself (state T), or fail with its output if it ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"run A ended (rc {proc.returncode}) before pausing:\n{out}\n{err}")
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.05)
    raise AssertionError("run A never paused")


def take_over(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Run B until it gets the lock (A's heartbeat goes stale while A is paused) and commits."""
    deadline = time.monotonic() + timeout
    time.sleep(float(STALE_AFTER))  # A's heartbeat is stale by then (saves refused runs of B)
    while True:
        b = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env())
        if b.returncode == 0 or "being written by another conversion" not in b.stderr or time.monotonic() > deadline:
            return b
        time.sleep(0.5)


def split_brain_is_refused(data: dict, out: str, files: Callable[[], dict[str, bytes]], stage: str,
                           *, preconditions: bool = True) -> str:
    """The scenario; returns A's stderr (for store-specific checks). ``preconditions``: the
    store refuses to create over a live lock (the GCS emulator does not: B wins at once there)."""
    t0 = time.monotonic()
    a = subprocess.Popen(convert_cmd(data, out, 4), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env(**{PAUSE_ENV: stage}))
    try:
        wait_paused(a)
        print(f"A paused after {time.monotonic() - t0:.0f} s", file=sys.stderr)
        assert LOCK_FILENAME in files()  # paused while holding its lock
        b = take_over(convert_cmd(data, out, 2))
        print(f"B done after {time.monotonic() - t0:.0f} s", file=sys.stderr)
        assert b.returncode == 0, b.stdout + b.stderr
        assert "taking over the lock" in b.stderr or not preconditions, b.stderr
        committed = files()
        assert METADATA_FILENAME in committed and LOCK_FILENAME not in committed
    finally:
        os.kill(a.pid, signal.SIGCONT)
    a_out, a_err = a.communicate(timeout=300)
    print(f"A done after {time.monotonic() - t0:.0f} s", file=sys.stderr)
    after = files()
    assert sorted(after) == sorted(committed), a_err  # nothing deleted, renamed or written: no failure marker either
    assert after == committed, a_err
    assert FAILURE_FILENAME not in after
    assert a.returncode == 1, a_out + a_err
    # stopped at its next fence ("stopped before ..."), or at once by its heartbeat thread
    assert "this run stopped" in a_err and f"the lock of {out}" in a_err, a_err
    assert "Traceback" not in a_err, a_err
    for cmd in (["verify", out], ["wait", out, "--timeout", "30", "--poll", "0.2"]):
        r = subprocess.run([str(RECORDPREP), *cmd], capture_output=True, text=True, timeout=300, env=env())
        assert r.returncode == 0, r.stdout + r.stderr
    return a_err
