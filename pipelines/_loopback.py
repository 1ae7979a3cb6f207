"""Keep Beam's local gRPC servers on the loopback interface.

Beam's local servers (the multi-process FnApiRunner's control/data/state/
logging servers, ``local_job_service_main``'s artifact server,
``worker_pool_main``) bind ``[::]:port``, i.e. every interface, and offer no
option to change it, while their clients always dial ``localhost:port``.
A conversion on a laptop or a shared host should not open ports to the
network, so for local runs we rewrite wildcard binds to ``localhost`` (which
gRPC binds on 127.0.0.1 and ::1) at the one place every server goes through,
``grpc.Server.add_insecure_port``. Explicit addresses are left alone.

Used in-process by ``pipelines.job`` for local multi-process runs, and as a
launcher for Beam's own local services (the portable-runner tests)::

    python -m pipelines._loopback apache_beam.runners.worker.worker_pool_main --service_port 50000
"""

from __future__ import annotations

import functools
import runpy
import sys

_WILDCARDS = ("[::]:", "0.0.0.0:", ":")


def _loopback_address(address: str) -> str:
    for w in _WILDCARDS:
        if address.startswith(w):
            return "localhost:" + address[len(w):]
    return address


def bind_loopback_only() -> bool:
    """Patch gRPC's server class so wildcard binds become loopback binds.

    Idempotent. Returns False (and changes nothing) if this grpc version has
    no such class, in which case Beam's servers keep binding every interface.
    """
    try:
        from grpc import _server
    except ImportError:  # pragma: no cover - grpc always ships it today
        return False
    cls = getattr(_server, "_Server", None)
    original = getattr(cls, "add_insecure_port", None)
    if original is None:
        return False
    if getattr(original, "_recordprep_loopback", False):
        return True

    @functools.wraps(original)
    def add_insecure_port(self, address: str) -> int:
        return original(self, _loopback_address(address))

    add_insecure_port._recordprep_loopback = True  # type: ignore[attr-defined]
    cls.add_insecure_port = add_insecure_port
    return True


def _main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m pipelines._loopback MODULE [ARGS...]")
    bind_loopback_only()
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
