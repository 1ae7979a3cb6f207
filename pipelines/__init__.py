"""The Beam conversion job, its local runner and the ``recordprep`` command line.

Three parts, each with one entry:

- the job: :func:`run_convert` (``pipelines.job``) converts with
  :class:`ConvertOptions` (``pipelines.options``) after
  ``pipelines.plan.plan`` decided what the run does (a :class:`Plan`); the PTransforms it builds
  the pipeline from (``pipelines.analyze``, ``pipelines.convert_pass``, ``pipelines.shuffle``,
  ``pipelines.commit``), the output's lock
  (``pipelines.lock``), Beam flags for remote paths (``pipelines.remote``);
- the local runner, ``pipelines.local``: what a run on this machine sets up
  (worker processes, patches, progress), behind ``pipelines.local.runner_for``;
- the command line, ``pipelines.cli``: the ``recordprep`` commands, the only
  place errors become messages and exit codes.

Importing this package imports none of them (no Beam): a local worker
process (``python -m pipelines.local.worker``) imports it before it sets
itself up. The names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from pipelines.job import ConvertResult, run_convert
    from pipelines.lock import LockHeldError
    from pipelines.options import ConvertOptions, OptionsError
    from pipelines.output_guard import OutputExistsError, OutputPathError
    from pipelines.plan import InputError, Plan
    from pipelines.run_files import ConversionFailed

__all__ = [
    "ConversionFailed",
    "ConvertOptions",
    "ConvertResult",
    "InputError",
    "LockHeldError",
    "OptionsError",
    "OutputExistsError",
    "OutputPathError",
    "Plan",
    "run_convert",
]

_LAZY = {
    "ConversionFailed": "pipelines.run_files",
    "ConvertOptions": "pipelines.options",
    "ConvertResult": "pipelines.job",
    "InputError": "pipelines.plan",
    "LockHeldError": "pipelines.lock",
    "OptionsError": "pipelines.options",
    "OutputExistsError": "pipelines.output_guard",
    "OutputPathError": "pipelines.output_guard",
    "Plan": "pipelines.plan",
    "run_convert": "pipelines.job",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pipelines' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
