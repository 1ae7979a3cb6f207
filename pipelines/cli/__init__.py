"""``recordprep``: the command line, and what its commands show of a dataset.

The commands, by what they do with a dataset:

- ``converting``: ``convert`` (``--dry-run``: the plan), ``infer``, ``estimate``;
- ``outputs``: ``inspect``, ``verify``, ``report``, ``wait``, on top of
  :mod:`.inspect`, :mod:`.verify` and :mod:`.report` (its HTML page from
  ``report_template.html``);
- ``serving``: ``export`` and ``data-service dispatcher|worker``.

``base`` holds what they share: the typer app, printing through
:mod:`.terminal` (data shown as text, never acted on by the terminal), and
the one place errors become messages and exit codes (1 for a failed run or
bad input, 2 for usage errors). Library code raises; only these commands
map its errors. They use ``readers`` through its public API only. Heavy
modules (Beam, TensorFlow) are imported by the command that needs them:
:func:`main` sets up the launcher of a local ``convert`` before Beam loads.

Entry points: the ``recordprep`` console script and ``python -m pipelines.cli``
both run :func:`main`.
"""

from __future__ import annotations

import sys

import typer

from pipelines.cli import converting, outputs, serving
from pipelines.cli.base import InputsCommand, app, data_service

__all__ = ["app", "main"]

# Registered here, in the order `recordprep --help` lists them.
app.command(cls=InputsCommand, context_settings={"allow_extra_args": False})(converting.convert)
app.command(cls=InputsCommand)(converting.infer)
app.command()(outputs.inspect)
app.command()(outputs.verify)
app.command()(outputs.report)
app.command()(serving.export)
app.command()(converting.estimate)
app.command()(outputs.wait)
data_service.command("dispatcher")(serving.data_service_dispatcher)
data_service.command("worker")(serving.data_service_worker)
app.add_typer(data_service, name="data-service")


def main() -> None:
    """``recordprep``: set up this process (a local convert's launcher; Ctrl-C and SIGTERM end a run cleanly), then run the command."""
    from pipelines.interrupt import Interrupted, Stopped, raise_on_signals
    from pipelines.local import prepare_launcher

    prepare_launcher(sys.argv[1:])  # a local convert loads no more of Beam than its workers
    raise_on_signals()  # a run stopped by Ctrl-C or a scheduler's SIGTERM cleans up and says so
    try:
        app()
    except Interrupted as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except Stopped as e:  # the run's lock was lost (pipelines.lock), outside the run's own error handling
        typer.echo(f"error: {e.reason}", err=True)
        sys.exit(1)
