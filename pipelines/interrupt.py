"""SIGTERM and Ctrl-C end a run as an exception the run's failure path handles.

A scheduler (Airflow, Kubernetes, systemd, ``timeout``) stops a process with
SIGTERM, whose default action ends it on the spot: no temp files removed,
no ``_FAILURE.json``, a lock left for waiters to judge by its heartbeat.
:func:`raise_on_signals` makes SIGTERM and SIGINT (Ctrl-C) raise
:class:`Interrupted` in the main thread instead, so ``run_convert`` records
the failure ("interrupted by SIGTERM"), removes its temp files and releases
its lock. (Python's own KeyboardInterrupt would do the same for Ctrl-C, but
typer turns it into a silent exit 130 before the CLI can say anything.)

The cleanup a signal starts has :data:`GRACE_SECONDS`: a run whose storage
stopped answering could otherwise hang in it for minutes, so after that the
process ends at once (exit 130/143, its lock left to go stale).

:func:`stop_main` lets another thread end the run the same way: the lock's
heartbeat thread calls it once the lock is lost, and the main thread raises
:class:`Stopped` wherever it is (a blocked system call included), rather than
only at the run's next fence.

Only the command line installs it (``pipelines.cli.main``): library code
never changes a caller's signal handling (there :func:`stop_main` does nothing).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

#: Seconds a run has to clean up after SIGTERM or Ctrl-C before the process ends anyway.
GRACE_SECONDS = 15.0
#: The signal stop_main sends to the main thread (handled only once the CLI installed raise_on_signals).
_STOP_SIGNAL = signal.SIGUSR2
_stop_reason: list[BaseException] = []
_received: list[Interrupted] = []


class Interrupted(BaseException):
    """A signal asked the run to stop.

    A BaseException, like KeyboardInterrupt, so that no ``except Exception``
    on the way swallows it.
    """

    def __init__(self, signum: int):
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.signame}{' (Ctrl-C)' if signum == signal.SIGINT else ''}")

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by this signal: 143 for SIGTERM, 130 for Ctrl-C."""
        return 128 + self.signum


class Stopped(BaseException):
    """Another thread of the run stopped it (:func:`stop_main`); ``reason`` is why.

    A BaseException, like :class:`Interrupted`, so that no ``except Exception``
    on the way (a retry loop) swallows it.
    """

    def __init__(self, reason: BaseException | str):
        self.reason = reason  # a str when Beam re-made the exception from its text
        super().__init__(str(reason))


def _hard_exit(signum: int) -> None:
    sys.stderr.write(f"recordprep: still cleaning up {GRACE_SECONDS:g} s after {signal.Signals(signum).name}; "
                     f"exiting now (temp files and the lock are left: the next run takes over once the lock is stale)\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def received() -> Interrupted | None:
    """The signal that ended this run, if one did (Beam may have re-made its exception on the way)."""
    return _received[-1] if _received else None


def _raise(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    _received.append(Interrupted(signum))
    timer = threading.Timer(GRACE_SECONDS, _hard_exit, (signum,))
    timer.daemon = True
    timer.start()
    raise _received[-1]


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    if _stop_reason:
        raise Stopped(_stop_reason.pop())


def stop_main(reason: BaseException) -> None:
    """From another thread: make the main thread raise :class:`Stopped` (``reason``) now.

    A no-op unless the command line installed :func:`raise_on_signals`.
    """
    if signal.getsignal(_STOP_SIGNAL) is not _raise_stopped:
        return
    _stop_reason.append(reason)
    signal.pthread_kill(threading.main_thread().ident, _STOP_SIGNAL)


def raise_on_signals() -> None:
    """From now on, SIGTERM and SIGINT raise :class:`Interrupted` in the main thread (once each).

    A signal the process was started ignoring (``cmd &`` in a script ignores
    SIGINT) stays ignored, as Python itself does for SIGINT.
    """
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise)
    signal.signal(_STOP_SIGNAL, _raise_stopped)


__all__ = ["GRACE_SECONDS", "Interrupted", "Stopped", "raise_on_signals", "received", "stop_main"]
