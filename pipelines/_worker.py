"""Entry point of the worker processes of a local multi-process conversion.

Beam's multi-process ``FnApiRunner`` starts each worker as
``python -m apache_beam.runners.worker.sdk_worker_main``. A local run of
``recordprep convert`` starts ``python -m pipelines._worker`` instead: it sets
the process up, then runs that same Beam module's ``main`` unchanged, or hands
the work over to a warm process started earlier (:mod:`pipelines._warm`). What
the setup does, each measured on the bench's default workload (2 workers, 400k
records):

- **Beam's unused connectors are not loaded.** ``import apache_beam`` eagerly
  imports BigQuery (and with it the Google Cloud client stack), MongoDB
  (pymongo, bson) and Parquet (pyarrow): about 47 MB of the 180 MB a worker
  holds before it reads a record. A conversion worker uses none of them
  (Cloud Storage comes through ``gcsfilesystem``, which still loads on
  demand), and Beam already treats each as optional, importing it inside
  ``try ... except ImportError``: marking them absent here is what Beam does on
  a machine where they are not installed. So are Dataflow's API client and
  the ``gs://``/``hdfs://`` file systems when no path of the job uses them.
- **glibc malloc keeps less.** At most two arenas (the gRPC, gzip and LZ4
  threads would otherwise each get one) and a fixed mmap threshold, so the
  large batch buffers are returned to the system when freed instead of
  staying in the heap: about 10 MB per worker.
- **gRPC binds loopback only**, as in the launcher (:mod:`pipelines._loopback`).
- **It exits at once** when the harness returns (``os._exit`` after flushing
  logs): the runner stops its workers one after the other, each waiting for
  the interpreter's teardown, which added 0.6-0.7 s to the end of every job.

Remote runners (Dataflow, Flink, Spark) start their own workers; nothing here
applies to them.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import shlex
import sys
import traceback
from collections.abc import Iterable, Sequence

from pipelines._loopback import bind_loopback_only

#: Modules a conversion worker never imports; ``import apache_beam`` tries them
#: all inside ``try/except ImportError``.
UNUSED_MODULES = (
    "apache_beam.io.gcp.bigquery",  # google-cloud-bigquery and friends
    "pymongo",
    "bson",
    "pyarrow",  # apache_beam.io.parquetio, typehints' Arrow support
    "pyarrow_hotfix",
)

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8


#: Dataflow's API client: no local process submits a Dataflow job (Beam imports
#: it inside ``try/except ImportError`` too).
LOCAL_UNUSED_MODULES = ("google.cloud.dataflow",)
#: Beam's file system plugins by URL scheme: loaded only when a path uses it.
FILESYSTEM_MODULES = {"gs": "apache_beam.io.gcp.gcsfilesystem", "hdfs": "apache_beam.io.hadoopfilesystem"}
_SCHEMES_FLAG = "--recordprep-schemes="


def schemes_of(paths: Iterable[str]) -> set[str]:
    """URL schemes (``gs``, ``hdfs``, ...) that appear anywhere in ``paths``."""
    return {s for s in FILESYSTEM_MODULES if any(f"{s}://" in p for p in paths)}


def command(schemes: Iterable[str] = tuple(FILESYSTEM_MODULES), pool: str | None = None) -> str:
    """The shell command Beam runs to start one worker (it uses ``shell=True``);
    ``schemes``: the remote file systems the job's paths use (the others are not
    loaded); ``pool``: a ``pipelines._warm.WarmPool``'s ``command_args()``."""
    cmd = f"{shlex.quote(sys.executable)} -m pipelines._worker {_SCHEMES_FLAG}{','.join(sorted(schemes))}"
    return f"{cmd} {pool}" if pool else cmd


def _tune_malloc() -> bool:
    """Cap glibc's arenas and fix its mmap threshold; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    if not sys.platform.startswith("linux") or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    ok = mallopt(_M_ARENA_MAX, 2)
    ok &= mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
    ok &= mallopt(_M_TRIM_THRESHOLD, 1024 * 1024)
    return bool(ok)


def block_unused_modules(schemes: Iterable[str] | None = None) -> None:
    """Mark ``UNUSED_MODULES`` absent in this process; call before anything imports Beam.

    With ``schemes`` (a local run, whose paths use those remote file systems)
    also ``LOCAL_UNUSED_MODULES`` and the file system plugins of other schemes.
    Measured importing the worker: 1.40 -> 1.10 s CPU, 124 -> 106 MB with
    neither ``gs`` nor ``hdfs``. ``prepare_launcher`` does the same for the
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
    connectors no more than its workers (171 -> 122 MB after importing the job).
    Call before anything imports Beam; returns whether it applied."""
    from pipelines.staging import LOCAL_RUNNERS

    argv = list(argv)
    if argv[:1] != ["convert"]:
        return False
    beam = argv[argv.index("--") + 1:] if "--" in argv else []
    runner = None
    for i, a in enumerate(beam):
        if a == "--runner" and i + 1 < len(beam):
            runner = beam[i + 1]
        elif a.startswith("--runner="):
            runner = a.split("=", 1)[1]
    if runner is not None and runner.split(".")[-1] not in LOCAL_RUNNERS:
        return False
    block_unused_modules(schemes_of(argv))
    return True


def prepare(schemes: Iterable[str] = tuple(FILESYSTEM_MODULES)) -> None:
    """Set this process up as a worker; call before anything imports Beam."""
    _tune_malloc()
    block_unused_modules(schemes)
    bind_loopback_only()


def _flag(args: list[str], flag: str) -> str | None:
    return next((a[len(flag):] for a in args if a.startswith(flag)), None)


def _main() -> None:
    from pipelines import _warm

    args = sys.argv[1:]
    rest = [a for a in args if not a.startswith("--recordprep-")]
    pool = _flag(args, _warm.POOL_FLAG)
    if pool is not None:  # a worker started by the runner: hand over to a warm process if one is left
        status = _warm.hand_over(pool, rest)
        if status is not None:
            os._exit(status)
    given = _flag(args, _SCHEMES_FLAG)
    prepare(FILESYSTEM_MODULES if given is None else [s for s in given.split(",") if s])
    conn = None
    warm = _flag(args, _warm.WARM_FLAG)
    if warm is not None:
        got = _warm.serve(warm, [m for m in (_flag(args, _warm.PRELOAD_FLAG) or "").split(",") if m])
        if got is None:
            os._exit(0)
        _, rest, conn = got
    sys.argv = ["apache_beam.runners.worker.sdk_worker_main", *rest]
    status = 0
    try:
        # What `python -m apache_beam.runners.worker.sdk_worker_main` runs (a warm
        # process imported the module already: calling main() runs it once).
        from apache_beam.runners.worker import sdk_worker_main

        sdk_worker_main.main(sys.argv)
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        status = 1
    # The harness returned: the runner closed the control stream, every bundle
    # is done and its files closed. Skip the interpreter's teardown (module
    # and thread finalization, 0.3-0.4 s per worker), which the runner waits
    # for one worker after the other before the job returns.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if conn is not None:
        with contextlib.suppress(OSError):
            conn.sendall(str(status).encode())
            conn.close()
    os._exit(status)


if __name__ == "__main__":
    _main()
