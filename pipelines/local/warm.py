"""Pre-forked workers for local multi-process conversions (PySpark's daemon pattern).

Beam's multi-process ``FnApiRunner`` starts each worker as a new
interpreter (``python -m pipelines.local.worker``) that imports Beam, numpy,
polars and this package before it reads a record: a sizeable share of a
local job's CPU (docs/benchmarks.md#design-converter). The launcher has imported
nearly all of it already, so :class:`WarmPool` forks the workers from it
before the pipeline starts: each child imports what the launcher lacks
(polars, the encoders) while the launcher builds the pipeline, then waits
for Beam to ask for a worker. Beam's worker start (``Popen`` of the worker
command, in ``local_job_service.SubprocessSdkWorker.run``) is redirected to a
waiting child, which gets the environment Beam would have given the new
process and runs the same ``sdk_worker_main`` entry point; Beam waits for it
and kills it as it would the process it started.

Forking is the CLI's behaviour; a program calling ``run_convert`` opts in
with ``ConvertOptions.pre_fork`` (forking a caller's process, with its open
connections and handlers, is the caller's decision). Even then it is only
done where it is safe and can pay: Linux (``os.fork``), no other Python
thread in the launcher (numpy's OpenBLAS threads handle ``fork``
themselves), polars not yet imported (its thread pool must not be forked).
Otherwise, and for any worker the pool cannot serve, Beam starts the worker
process as usual. ``RECORDPREP_WARM_WORKERS=0`` turns the pool off for the
CLI too. ``ConvertResult.pre_forked`` says how many workers the pool served.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator

from pipelines.local.patches import (
    ARGSPEC_CACHE,
    LOOPBACK_BINDS,
    QUIET_BUNDLE_TRACEBACKS,
    SHORT_SAMPLER_SLEEPS,
    WORKER_STARTS,
    apply_for_process,
)

log = logging.getLogger(__name__)

#: Environment variable that turns the pool off when set to ``0``.
ENV_SWITCH = "RECORDPREP_WARM_WORKERS"

#: What a conversion worker imports beyond the launcher, done in each child
#: before it is handed a job.
_PRELOAD = ("polars", "zlib_ng.gzip_ng", "isal.igzip", "lz4.frame", "apache_beam.runners.worker.sdk_worker_main",
            "pipelines.convert_pass", "pipelines.commit", "convert.example", "convert.sources", "convert.vectorize")


def can_fork() -> bool:
    """Whether forking workers from this process is safe here (see the module docstring)."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    if not hasattr(os, "fork") or not sys.platform.startswith("linux"):
        return False
    if threading.active_count() != 1 or "polars" in sys.modules:
        return False
    return True


class _WarmProcess:
    """The ``Popen`` face of a forked child that Beam waits on and kills."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def _reaped(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self._reaped(status)
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._reaped(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class WarmPool:
    """Up to ``n`` forked children waiting for a worker job; see the module docstring."""

    def __init__(self, command: str) -> None:
        self.command = command
        self._idle: list[tuple[int, int]] = []  # (pid, write end of its job pipe)
        self._handed: list[_WarmProcess] = []
        self._lock = threading.Lock()

    @classmethod
    def start(cls, n: int, command: str) -> WarmPool | None:
        """Fork ``n`` children, or ``None`` (Beam then starts its processes itself)."""
        if n < 1 or not can_fork():
            return None
        pool = cls(command)
        for _ in range(n):
            r, w = os.pipe()
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child never returns from here
                os.close(w)
                for _, other in pool._idle:
                    os.close(other)  # else that sibling would never see its pipe close
                _child(r)
            os.close(r)
            pool._idle.append((pid, w))
        return pool

    def popen(self, command: str, env: dict[str, str]) -> _WarmProcess | None:
        """Hand Beam's worker start to an idle child; ``None`` if none is left
        or the command is not this pool's."""
        if command != self.command:
            return None
        with self._lock:
            if not self._idle:
                return None
            pid, w = self._idle.pop(0)
        job = json.dumps({"env": dict(env)}).encode("utf-8")
        try:
            with os.fdopen(w, "wb") as pipe:
                pipe.write(job)
        except OSError as e:  # the child died before its job: let Beam start a process
            log.debug("warm worker %d is gone (%s)", pid, e)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            return None
        proc = _WarmProcess(pid)
        with self._lock:
            self._handed.append(proc)
        return proc

    @property
    def handed(self) -> int:
        """Workers this pool served."""
        return len(self._handed)

    def close(self) -> None:
        """Dismiss the children never used (they exit when their pipe closes)
        and reap every child; a handed one still running is killed."""
        with self._lock:
            idle, self._idle = self._idle, []
            handed = list(self._handed)
        for _, w in idle:
            os.close(w)
        for pid, _ in idle:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        for proc in handed:
            if proc.poll() is None:
                proc.kill()
                with contextlib.suppress(ChildProcessError):
                    proc.wait()

    @contextlib.contextmanager
    def serving_beam(self) -> Iterator[None]:
        """While open, Beam's local worker starts go to this pool's children
        (:class:`pipelines.local.patches.WorkerStarts`)."""
        with WORKER_STARTS.serving(self.popen):
            yield


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While open, the objects that existed when it opened are left out of the cyclic GC
    (``gc.freeze``); closing gives them back to it (``gc.unfreeze``).

    A conversion's launcher holds Beam, numpy and this package, a great many
    objects, and a full collection walks them all: one in the launcher's
    pipeline set-up and one in each forked child, before the first record is
    read (docs/benchmarks.md#design-converter). Frozen, a collection walks only
    what the run made, and the children leave the inherited pages unwritten
    (no copy-on-write). If the caller already froze objects of its own, their
    freeze is left as it is (nothing done), so the caller's process ends the
    run as it began it.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _child(job_fd: int) -> None:
    """A forked worker: preload, wait for the job, run Beam's worker entry point, exit."""
    code = 1
    try:
        from pipelines.local.worker import _tune_malloc

        _tune_malloc()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's handler (pipelines.interrupt) is its own
        import importlib

        for name in _PRELOAD:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        gc.freeze()  # what it imported lives as long as the process: out of every collection
        with os.fdopen(job_fd, "rb") as pipe:
            raw = pipe.read()
        if not raw:  # dismissed: the run did not need this worker
            code = 0
            return
        job = json.loads(raw)
        os.environ.clear()
        os.environ.update(job["env"])
        # Logging as in a new interpreter: the launcher's handlers would print
        # what the worker sends to the runner a second time.
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)
        from apache_beam.runners.worker import sdk_worker_main

        # The launcher's run applied all but the traceback one before forking;
        # this process keeps them, as a started worker does (pipelines.local.worker).
        apply_for_process(LOOPBACK_BINDS, SHORT_SAMPLER_SLEEPS, ARGSPEC_CACHE, QUIET_BUNDLE_TRACEBACKS)
        sys.argv = ["apache_beam.runners.worker.sdk_worker_main"]
        sdk_worker_main.main(sys.argv)  # what `python -m` of it runs
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - report, then leave without the launcher's teardown
        import traceback

        traceback.print_exc()
    finally:
        logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
