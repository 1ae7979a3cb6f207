"""The local runner: what a conversion on this machine sets up, beside the job it runs.

The job (:mod:`pipelines.job`) calls one entry, :func:`runner_for`: a context
manager choosing the run's runner (Beam's ``FnApiRunner`` in this process or
in worker processes, or the runner the Beam flags name) and, while it is open,
the changes to gRPC and Beam the run needs (:mod:`.patches`), the launcher's
heap frozen out of the cyclic GC and workers forked from it (:mod:`.warm`),
and live progress lines (:mod:`.progress`); all undone when it closes.

Inside: ``runner`` (the choice and its set-up), ``worker`` (``python -m
pipelines.local.worker``, the worker processes' entry point, and the lean
launcher of ``recordprep convert``), ``warm`` (pre-forked workers),
``patches`` (every change to gRPC and Beam, each undone), ``progress``
(per-unit progress files and the launcher's reporter), ``loopback``
(``python -m pipelines.local.loopback``: Beam's own services on loopback).

Importing this package imports neither Beam nor the job's modules (the
standard library only): ``python -m pipelines.local.worker`` imports it
before it sets its process up, and the launcher of ``recordprep convert``
before it marks Beam's unused connectors absent (:func:`prepare_launcher`).
"""

from pipelines.local.runner import MULTIPROCESS_MIN_BYTES, Runner, Work, local_workers, runner_for
from pipelines.local.worker import prepare_launcher

__all__ = ["MULTIPROCESS_MIN_BYTES", "Runner", "Work", "local_workers", "prepare_launcher", "runner_for"]
