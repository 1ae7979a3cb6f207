"""Entry point of the worker processes of a local multi-process conversion.

Beam's multi-process ``FnApiRunner`` starts each worker as
``python -m apache_beam.runners.worker.sdk_worker_main``. A local run of
``recordprep convert`` starts ``python -m pipelines._worker`` instead: it sets
the process up, then runs that same Beam module unchanged. Three things,
each measured on the bench's default workload (2 workers, 400k records):

- **Beam's unused connectors are not loaded.** ``import apache_beam`` eagerly
  imports BigQuery (and with it the Google Cloud client stack), MongoDB
  (pymongo, bson) and Parquet (pyarrow): about 47 MB of the 180 MB a worker
  holds before it reads a record. A conversion worker uses none of them
  (Cloud Storage comes through ``gcsfilesystem``, which still loads on
  demand), and Beam already treats each as optional, importing it inside
  ``try ... except ImportError``: marking them absent here is what Beam does on
  a machine where they are not installed.
- **glibc malloc keeps less.** At most two arenas (the gRPC, gzip and LZ4
  threads would otherwise each get one) and a fixed mmap threshold, so the
  large batch buffers are returned to the system when freed instead of
  staying in the heap: about 10 MB per worker.
- **gRPC binds loopback only**, as in the launcher (:mod:`pipelines._loopback`).

Remote runners (Dataflow, Flink, Spark) start their own workers; nothing here
applies to them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import runpy
import shlex
import sys

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


def command() -> str:
    """The shell command Beam runs to start one worker (it uses ``shell=True``)."""
    return f"{shlex.quote(sys.executable)} -m pipelines._worker"


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


def prepare() -> None:
    """Set this process up as a worker; call before anything imports Beam."""
    _tune_malloc()
    for name in UNUSED_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "import name" raises ImportError
    bind_loopback_only()


def _main() -> None:
    prepare()
    sys.argv = ["apache_beam.runners.worker.sdk_worker_main", *sys.argv[1:]]
    runpy.run_module("apache_beam.runners.worker.sdk_worker_main", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main()
