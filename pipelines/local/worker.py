"""Entry point of the worker processes of a local multi-process conversion.

Beam's multi-process ``FnApiRunner`` starts each worker as
``python -m apache_beam.runners.worker.sdk_worker_main``. A local run of
``recordprep convert`` starts ``python -m pipelines.local.worker`` instead: it sets
the process up, then runs that same Beam module unchanged. The set-up changes
what a worker costs (docs/benchmarks.md#design-converter), not what it writes;
each point's reasons: docs/converting.md#worker-processes.

- **Beam's unused connectors are not loaded** (BigQuery, MongoDB, pyarrow,
  Dataflow's client, file systems no path uses): Beam imports each inside
  ``try ... except ImportError``, so marking them absent is what Beam does on
  a machine where they are not installed.
- **glibc malloc keeps less**: two arenas, a 4 MB mmap threshold and an 8 MB
  trim threshold, so a batch's buffers are reused from the heap instead of
  mapped afresh, or trimmed, and faulted in again by the next batch.
- **gRPC binds loopback only**, **bundles end promptly**, **each function's
  signature is inspected once** and **a failed bundle's traceback is not
  printed** to the stderr it shares with the CLI: the patches of
  :mod:`pipelines.local.patches`, kept for the worker's lifetime.
- **It exits at once** when the harness returns (``os._exit`` after flushing
  logs): the runner waits for each worker's interpreter teardown in turn.

Where it is safe, a local run forks its workers from the launcher instead
(:mod:`pipelines.local.warm`), which has already done this set-up and most of the
imports. Remote runners (Dataflow, Flink, Spark) start their own workers;
nothing here applies to them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import runpy
import shlex
import sys
from collections.abc import Iterable, Sequence

from pipelines.local.patches import (
    ARGSPEC_CACHE,
    LOOPBACK_BINDS,
    QUIET_BUNDLE_TRACEBACKS,
    SHORT_SAMPLER_SLEEPS,
    apply_for_process,
)
from stores import beam_filesystem_modules

#: Modules a conversion worker never imports; ``import apache_beam`` tries them
#: all inside ``try/except ImportError``.
UNUSED_MODULES = (
    "apache_beam.io.gcp.bigquery",  # google-cloud-bigquery and friends
    "pymongo",
    "bson",
    "pyarrow",  # apache_beam.io.parquetio, typehints' Arrow support; convert.formats.parquet_reader lifts the mark for Parquet input
    "pyarrow_hotfix",
)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


#: Dataflow's API client: no local process submits a Dataflow job (Beam imports
#: it inside ``try/except ImportError`` too).
LOCAL_UNUSED_MODULES = ("google.cloud.dataflow",)
#: Beam's file system plugins by URL scheme: loaded only when a path uses it.
FILESYSTEM_MODULES = beam_filesystem_modules()  # each store module names its Beam plugin
_SCHEMES_FLAG = "--recordprep-schemes="


def schemes_of(paths: Iterable[str]) -> set[str]:
    """URL schemes (``gs``, ``hdfs``, ...) that appear anywhere in ``paths``."""
    return {s for s in FILESYSTEM_MODULES if any(f"{s}://" in p for p in paths)}


def command(schemes: Iterable[str] = tuple(FILESYSTEM_MODULES)) -> str:
    """The shell command Beam runs to start one worker (it uses ``shell=True``);
    ``schemes``: the remote file systems the job's paths use (the others are not loaded)."""
    return f"{shlex.quote(sys.executable)} -m pipelines.local.worker {_SCHEMES_FLAG}{','.join(sorted(schemes))}"


def _tune_malloc() -> bool:
    """Cap glibc's arenas and fix its mmap and trim thresholds; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    ok = mallopt(_M_ARENA_MAX, 2)
    ok &= mallopt(_M_MMAP_THRESHOLD, 4 << 20)
    ok &= mallopt(_M_TRIM_THRESHOLD, 8 << 20)
    return bool(ok)


def block_unused_modules(schemes: Iterable[str] | None = None) -> None:
    """Mark ``UNUSED_MODULES`` absent in this process; call before anything imports Beam.

    With ``schemes`` (a local run, whose paths use those remote file systems)
    also ``LOCAL_UNUSED_MODULES`` and the file system plugins of other schemes.
    It makes the worker's imports cheaper (docs/benchmarks.md#design-converter). ``prepare_launcher`` does the same for the
    launcher of a local ``recordprep convert``.
    """
    names = list(UNUSED_MODULES)
    if schemes is not None:
        names += LOCAL_UNUSED_MODULES
        names += [m for s, m in FILESYSTEM_MODULES.items() if s not in set(schemes)]
    for name in names:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "import name" raises ImportError


def prepare_launcher(argv: Sequence[str]) -> bool:
    """Set up the process of ``recordprep convert ARGV`` when it runs locally
    (no ``--runner`` after ``--``, or a local one): its launcher needs Beam's
    connectors no more than its workers.
    Call before anything imports Beam; returns whether it applied."""
    from pipelines.options import beam_flag, split_beam_args
    from pipelines.staging import LOCAL_RUNNERS

    argv = list(argv)
    if argv[:1] != ["convert"]:
        return False
    runner = beam_flag(split_beam_args(argv)[1], "--runner")
    if runner and runner.split(".")[-1] not in LOCAL_RUNNERS:
        return False
    block_unused_modules(schemes_of(argv))
    return True


def prepare(schemes: Iterable[str] = tuple(FILESYSTEM_MODULES)) -> None:
    """Set this process up as a worker; call before anything imports Beam."""
    _tune_malloc()
    block_unused_modules(schemes)
    apply_for_process(LOOPBACK_BINDS, SHORT_SAMPLER_SLEEPS, ARGSPEC_CACHE)


def _main() -> None:
    ours = [a for a in sys.argv[1:] if a.startswith(_SCHEMES_FLAG)]
    schemes = [s for a in ours for s in a[len(_SCHEMES_FLAG):].split(",") if s] if ours else FILESYSTEM_MODULES
    prepare(schemes)
    apply_for_process(QUIET_BUNDLE_TRACEBACKS)
    sys.argv = ["apache_beam.runners.worker.sdk_worker_main", *(a for a in sys.argv[1:] if a not in ours)]
    runpy.run_module("apache_beam.runners.worker.sdk_worker_main", run_name="__main__", alter_sys=True)
    # The harness returned: the runner closed the control stream, every bundle
    # is done and its files closed. Skip the interpreter's teardown (module
    # and thread finalization, a noticeable pause per worker), which the runner waits
    # for one worker after the other before the job returns.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main()
