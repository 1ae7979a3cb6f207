"""Live progress of a local conversion: records and input bytes per pass, and a rate.

Beam's local runner only hands back metrics when the pipeline has finished,
so workers report through small files instead: each work unit overwrites
``<output>/.recordprep-tmp/progress/<pass>-<unit>.json`` (``{"records": n,
"bytes": b}``) at most once a second and when it ends, and the launcher sums
them every few seconds. With shuffled output a third pass, ``gather``, reports
each output shard as it is written (``gather-<shard>.json``: records written
and their share of the input bytes, so its percentage reads like the
others'). It works across the multi-process runner's workers
(same machine, same files). Remote runners have their own monitoring (the
Dataflow console), so the launcher only enables this for local outputs, and
a worker that cannot write a progress file just carries on.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

PROGRESS_DIR = "progress"
PASSES = ("analyze", "convert")
#: The shuffle's last pass (shuffled output only): scattered records gathered into the output shards.
GATHER = "gather"


def run_passes(reused_analysis: bool, shuffled: bool) -> tuple[str, ...]:
    """The passes a local conversion goes through, in order (what its progress line shows)."""
    return (("convert",) if reused_analysis else PASSES) + ((GATHER,) if shuffled else ())


class UnitProgress:
    """Worker side: the running totals of one unit in one pass."""

    def __init__(self, root: str | None, pass_name: str, unit: int, every: float = 1.0):
        self.path = None if root is None else os.path.join(root, f"{pass_name}-{unit:05d}.json")
        self.records = 0
        self.bytes = 0
        self._every = every
        self._last = time.monotonic()

    def add(self, records: int, nbytes: int = 0) -> None:
        self.records += records
        self.bytes += nbytes
        if self.path is not None and time.monotonic() - self._last >= self._every:
            self._write()

    def close(self) -> None:
        if self.path is not None:
            self._write()

    def _write(self) -> None:
        self._last = time.monotonic()
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"records": self.records, "bytes": self.bytes}, f)
            os.replace(tmp, self.path)
        except OSError:  # progress is a courtesy; never fail a unit over it
            self.path = None


def read_totals(root: str, passes: tuple[str, ...] = PASSES) -> dict[str, tuple[int, int]]:
    """``{pass: (records, bytes)}`` summed over the units (or shards) that reported so far."""
    totals = {p: [0, 0] for p in passes}
    try:
        names = os.listdir(root)
    except OSError:
        names = []
    for name in names:
        if not name.endswith(".json"):
            continue
        pass_name = name.split("-", 1)[0]
        if pass_name not in totals:
            continue
        try:
            d = json.loads(Path(root, name).read_text())
        except (OSError, ValueError):
            continue  # replaced while we read it: next poll
        totals[pass_name][0] += int(d.get("records", 0))
        totals[pass_name][1] += int(d.get("bytes", 0))
    return {k: (v[0], v[1]) for k, v in totals.items()}


def format_line(totals: dict[str, tuple[int, int]], total_bytes: int, elapsed: float, passes: tuple[str, ...]) -> str:
    parts = []
    for p in passes:
        records, nbytes = totals.get(p, (0, 0))
        pct = f" {min(100.0, 100.0 * nbytes / total_bytes):5.1f}%" if total_bytes > 0 else ""
        parts.append(f"{p}: {records:,} records, {nbytes / 1e6:,.1f}/{total_bytes / 1e6:,.1f} MB{pct}")
    # Each record goes through every pass: this rate ends equal to the summary's
    # (the gather counts written records: a little below it when some are rejected).
    records = sum(totals.get(p, (0, 0))[0] for p in passes) / max(1, len(passes))
    rate = records / elapsed if elapsed > 0 else 0.0
    return f"[{elapsed:6.0f} s] " + "  |  ".join(parts) + f"  ({rate:,.0f} records/s)"


class ProgressReporter:
    """Launcher side: a daemon thread printing a progress line every ``interval`` s."""

    def __init__(self, root: str, total_bytes: int, passes: tuple[str, ...] = PASSES,
                 interval: float = 5.0, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.root, self.total_bytes, self.passes = root, total_bytes, passes
        self.interval, self.stream, self.clock = interval, stream or sys.stderr, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="recordprep-progress", daemon=True)
        self._t0 = clock()

    def __enter__(self) -> ProgressReporter:
        os.makedirs(self.root, exist_ok=True)
        self._t0 = self.clock()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            totals = read_totals(self.root, self.passes)
            if not any(r for r, _ in totals.values()):
                continue  # nothing reported yet (or the commit already removed the files)
            line = format_line(totals, self.total_bytes, self.clock() - self._t0, self.passes)
            print(line, file=self.stream, flush=True)
