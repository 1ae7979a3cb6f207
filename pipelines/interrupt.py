"""SIGTERM and Ctrl-C end a run as an exception the run's failure path handles.

A scheduler (Airflow, Kubernetes, systemd, ``timeout``) stops a process with
SIGTERM, whose default action ends it on the spot: no temp files removed,
no ``_FAILURE.json``, a lock left for waiters to judge by its heartbeat.
:func:`raise_on_signals` makes SIGTERM and SIGINT (Ctrl-C) raise
:class:`Interrupted` in the main thread instead, so ``run_convert`` records
the failure ("interrupted by SIGTERM"), removes its temp files and releases
its lock. (Python's own KeyboardInterrupt would do the same for Ctrl-C, but
typer turns it into a silent exit 130 before the CLI can say anything.)

Only the command line installs it (``pipelines.cli.main``): library code
never changes a caller's signal handling.
"""

from __future__ import annotations

import signal
from types import FrameType


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


def _raise(signum: int, frame: FrameType | None) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise Interrupted(signum)


def raise_on_signals() -> None:
    """From now on, SIGTERM and SIGINT raise :class:`Interrupted` in the main thread (once each).

    A signal the process was started ignoring (``cmd &`` in a script ignores
    SIGINT) stays ignored, as Python itself does for SIGINT.
    """
    for signum in (signal.SIGTERM, signal.SIGINT):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _raise)


__all__ = ["Interrupted", "raise_on_signals"]
