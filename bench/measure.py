"""Run one measurement in a fresh subprocess and sample its process tree.

Every row of every table is one child process (``python -m bench.<module>
--case ... --result FILE``), so nothing bleeds between measurements: not
TensorFlow's thread pools and caches, not Beam's state, not the page cache of
Python objects, not a warmed-up allocator. The parent samples the child's
process tree every ``interval`` seconds with psutil and records:

- ``peak_rss_mb``: the largest sum of RSS over all processes of the tree at
  one sample (Beam or tf.data may start helpers; they count), or the child's
  own ``ru_maxrss`` if that is larger (it also catches a spike between two
  samples).
- ``cpu_s``: CPU seconds (user + system) of the whole tree over its whole life,
  from ``wait4``'s rusage (exact for the child and every descendant it reaped),
  or the psutil sum over the last sample of every process seen, if larger.
- ``wall_s``: process lifetime (interpreter start and imports included).
- ``others_cores``: CPU used by everything *outside* the tree meanwhile, in
  cores (system-wide busy time minus the tree's CPU, over the wall time): how
  much a shared machine's other tenants competed with this row.

The child measures its *work phase* itself (:class:`WorkTimer`: wall time and
the process's own CPU, excluding interpreter start-up and imports) and writes
it, with its own numbers, as JSON to the result file. Tables use the work
phase for rates and CPU per record, and the tree's peak RSS for memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class Measurement:
    """What the parent observed of one child, plus the child's own result."""

    ok: bool
    result: dict[str, Any]
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    samples: int
    others_cores: float = 0.0
    error: str | None = None
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return [proc]


def run_child(module: str, args: Sequence[str], *, timeout: float = 1800.0, interval: float = 0.1,
              log_dir: Path | None = None, env: dict[str, str] | None = None,
              python: str | None = None) -> Measurement:
    """Run ``python -m module *args --result FILE`` from the repo root and measure it
    (``python``: another interpreter than this one, e.g. a peer's virtualenv)."""
    log_dir = Path(log_dir or tempfile.gettempdir())
    log_dir.mkdir(parents=True, exist_ok=True)
    fd, result_path = tempfile.mkstemp(prefix="bench-result-", suffix=".json")
    os.close(fd)
    log_path = log_dir / f"{module.rsplit('.', 1)[-1]}-{os.getpid()}-{time.monotonic_ns()}.log"
    cmd = [python or sys.executable, "-m", module, *args, "--result", result_path]
    child_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                 "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", **(env or {})}
    busy0 = _system_busy_s()
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        popen = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                 start_new_session=True)
        proc = psutil.Process(popen.pid)
        peak = 0
        last_cpu: dict[int, float] = {}
        samples = 0
        rusage = None
        status = None
        timed_out = False
        while True:
            rss = 0
            for p in _tree(proc):
                try:
                    with p.oneshot():
                        rss += p.memory_info().rss
                        ct = p.cpu_times()
                        last_cpu[p.pid] = ct.user + ct.system
                except psutil.Error:
                    pass
            peak = max(peak, rss)
            samples += 1
            pid, status, rusage = os.wait4(popen.pid, os.WNOHANG)
            if pid:
                popen.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - t0 > timeout:
                timed_out = True
                os.killpg(popen.pid, signal.SIGKILL)  # the child's own session: only what it started
                _, status, rusage = os.wait4(popen.pid, 0)
                popen.returncode = -9
                break
            time.sleep(interval)
    wall = time.perf_counter() - t0
    busy = _system_busy_s() - busy0
    cpu = rusage.ru_utime + rusage.ru_stime if rusage else 0.0
    cpu = max(cpu, sum(last_cpu.values()))
    others = max(0.0, (busy - cpu) / wall) if wall > 0 else 0.0
    peak = max(peak, (rusage.ru_maxrss * 1024) if rusage else 0)
    try:
        result = json.loads(Path(result_path).read_text() or "{}")
    except (OSError, ValueError):
        result = {}
    finally:
        Path(result_path).unlink(missing_ok=True)
    error = None
    if timed_out:
        error = f"timed out after {timeout:.0f} s"
    elif popen.returncode != 0:
        error = result.get("error") or f"exit code {popen.returncode}: {_tail(log_path)}"
    elif result.get("error"):
        error = result["error"]
    return Measurement(ok=error is None, result=result, wall_s=round(wall, 3), cpu_s=round(cpu, 3),
                       peak_rss_mb=round(peak / 2**20, 1), samples=samples, others_cores=round(others, 2),
                       error=error, log=str(log_path))


def _system_busy_s() -> float:
    """CPU seconds all cores spent running something since boot (not idle, I/O wait or stolen)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - sum(getattr(t, k, 0.0) for k in ("iowait", "steal", "guest", "guest_nice"))


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:])


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system + t.children_user + t.children_system


class WorkTimer:
    """Wall and CPU seconds of a block, measured inside the child."""

    def __enter__(self) -> WorkTimer:
        self.cpu0, self.t0 = _cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall_s = time.perf_counter() - self.t0
        self.cpu_s = _cpu_s() - self.cpu0

    def to_json(self) -> dict[str, float]:
        return {"work_wall_s": round(self.wall_s, 4), "work_cpu_s": round(self.cpu_s, 4)}


def child_main(description: str, add_args: Callable[[argparse.ArgumentParser], None],
               work: Callable[[argparse.Namespace], dict[str, Any]]) -> None:
    """Entry point of a measured child: parse args, run ``work``, write its JSON result.

    An exception becomes ``{"error": "..."}`` in the result (and exit code 1),
    so the parent reports that row as failed with the reason and goes on.
    """
    ap = argparse.ArgumentParser(description=description)
    add_args(ap)
    ap.add_argument("--result", required=True)
    args = ap.parse_args()
    try:
        out = work(args)
        code = 0
    except Exception as e:  # reported to the parent; the traceback is in the log
        import traceback

        traceback.print_exc()
        out = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}
        code = 1
    Path(args.result).write_text(json.dumps(out, default=str))
    sys.exit(code)
