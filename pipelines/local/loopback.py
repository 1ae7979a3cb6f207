"""Launcher of Beam's own local services with their gRPC servers on loopback only.

``python -m pipelines.local.loopback MODULE [ARGS...]`` runs ``MODULE`` (e.g.
``apache_beam.runners.worker.worker_pool_main --service_port 50000``) as
``python -m`` would, with :class:`pipelines.local.patches.LoopbackBinds` applied
for the life of that process (the portable-runner tests start Beam's job
service and worker pool this way). A conversion applies the same patch only
while a run needs it (``pipelines.job``).
"""

from __future__ import annotations

import runpy
import sys

from pipelines.local.patches import LOOPBACK_BINDS, apply_for_process


def bind_loopback_only() -> bool:
    """Make wildcard gRPC binds loopback binds for the rest of this process (a
    process of our own: a launcher or a worker); returns whether it applied."""
    return apply_for_process(LOOPBACK_BINDS)[0]


def _main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m pipelines.local.loopback MODULE [ARGS...]")
    bind_loopback_only()
    sys.argv = [argv[0], *argv[1:]]
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
