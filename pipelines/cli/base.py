"""What every ``recordprep`` command shares: the typer app, printing, failing, logging.

Library code raises; only the commands turn errors into messages and exit
codes (1 for a failed run or bad input, 2 for usage errors), through
:func:`fail`, so users never see a traceback for their own mistakes.
``--verbose`` shows Beam's logs. Every message and log line goes through
``pipelines.cli.terminal.visible``: paths, names and reasons from the data
show their control characters as escapes instead of acting on the terminal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

import typer
from typer.core import TyperCommand, TyperGroup

from pipelines.cli.terminal import visible
from pipelines.options import looks_like_path, regroup_args

#: Characters of a command's first help sentence in ``recordprep --help`` (wrapped, not cut).
_SHORT_HELP_CHARS = 300


class Group(TyperGroup):
    """Lists each command with its whole first sentence, wrapped: click cuts
    it at the terminal's width with "..."."""

    def format_commands(self, ctx, formatter) -> None:  # noqa: ANN001 - click's Context and HelpFormatter
        rows = [(name, cmd.get_short_help_str(_SHORT_HELP_CHARS)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    # Plain help: rich's option table cuts option names and defaults at 80 columns.
    rich_markup_mode=None,
    help="Convert Avro, Parquet or JSON into sharded, pre-vectorized TFRecords for TensorFlow training.",
    # What this command sets up in its own process and a library caller's run never does (docs/converting.md).
    epilog="This command sets up its own process: logging (Beam's quiet unless --verbose), SIGTERM and "
           "Ctrl-C handlers that end a run cleanly, Beam's unused connectors marked absent for a local "
           "convert, and convert's workers forked from it (RECORDPREP_WARM_WORKERS=0: started instead). "
           "Commands that load TensorFlow (export, data-service) set TF_CPP_MIN_LOG_LEVEL=2 and "
           "TF_ENABLE_ONEDNN_OPTS=0, hiding its start-up log lines, unless the environment sets them.",
)


class InputsCommand(TyperCommand):
    """A command whose ``--input`` takes every value up to the next option
    (``-i a.avro b.avro``, or a glob the shell expanded) and that refuses any
    other argument before ``--``, where nothing typed may be dropped or
    handed to Beam (Beam flags go after a literal ``--``)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:  # noqa: ANN001 - click's Context
        takes_value: dict[str, bool] = {}
        multi: set[str] = set()
        for param in self.get_params(ctx):
            if param.param_type_name != "option":
                continue
            for opt in param.opts:
                takes_value[opt] = not (param.is_flag or param.count)
            takes_value.update(dict.fromkeys(param.secondary_opts, False))
            if param.name == "input":
                multi.update(param.opts)
        regrouped = regroup_args(args, takes_value, multi)
        help_asked = any(a in ("--help", "-h") for a in regrouped.args)
        if regrouped.stray and not ctx.resilient_parsing and not help_asked:
            what = " ".join(regrouped.stray)
            hint = ("; to convert several files, list them all after --input (-i a.avro b.avro) or repeat --input"
                    if any(looks_like_path(a) for a in regrouped.stray) else "")
            ctx.fail(f"unexpected argument(s) {what}{hint}; Beam flags go after a literal `--`")
        return super().parse_args(ctx, regrouped.args)


def echo(msg: str, err: bool = False, color: str | None = None) -> None:
    """Print one message: its data (paths, terms, field names, reasons) with control
    characters shown, never acted on by the terminal (``pipelines.cli.terminal``)."""
    text = visible(msg, lines=True)
    if color is None:
        typer.echo(text, err=err)
    else:
        typer.secho(text, fg=color, err=err)


def fail(msg: str, code: int = 1) -> None:
    echo(f"error: {msg}", err=True, color=typer.colors.RED)
    raise typer.Exit(code)


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """Errors in the paths a user wrote that no retry fixes (:class:`pipelines.remote.RemotePathError`:
    another Azure account than the connection string's, two accounts in one job, no NameNode to
    tell): one line and exit 2, no traceback."""
    from pipelines.remote import RemotePathError

    try:
        yield
    except RemotePathError as e:
        fail(str(e), 2)


class _VisibleFormatter(logging.Formatter):
    """Log lines name paths and fields from the data: their control characters shown (``pipelines.cli.terminal``)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), lines=True)


#: TensorFlow's start-up logging (oneDNN, cpu_feature_guard): off unless the user's environment says otherwise.
#: TF_CPP_MIN_LOG_LEVEL alone does not hide the oneDNN line, which TensorFlow prints before reading it.
_QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def quiet_tensorflow() -> None:
    """Before TensorFlow is imported: hide its start-up log lines, keeping any value the user set.

    Once TensorFlow is imported (the CLI called from a Python process that uses it) the settings
    no longer matter to it, and the environment is left alone: child processes would otherwise
    run TensorFlow with other kernels (oneDNN off) than their parent's."""
    if "tensorflow" in sys.modules:
        return
    for name, value in _QUIET_TENSORFLOW.items():
        os.environ.setdefault(name, value)


def setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    if not verbose:
        # Beam logs worker exceptions with full tracebacks before re-raising;
        # the CLI prints one clear line instead.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    logging.getLogger("recordprep").setLevel(logging.INFO)
    # The Azure SDK logs every HTTP request and response at INFO (secrets redacted): thousands of lines a run.
    logging.getLogger("azure.core.pipeline.policies.http_logging_policy").setLevel(logging.WARNING)


def thresholds(pairs: list[str] | None) -> dict[str, float]:
    """``--drift-threshold MEASURE=VALUE`` flags; a bad one is a usage error (exit 2)."""
    from convert.drift import check_overrides

    out: dict[str, float] = {}
    for p in pairs or ():
        k, sep, v = p.partition("=")
        try:
            out[k.strip()] = float(v) if sep else float("nan")
        except ValueError:
            fail(f"--drift-threshold {p!r}: expected MEASURE=NUMBER, e.g. js=0.05", 2)
    try:
        return check_overrides(out)
    except ValueError as e:
        fail(f"--drift-threshold: {e}", 2)
    raise AssertionError("unreachable")


DRIFT_THRESHOLD_HELP = ("MEASURE=VALUE (repeat): a drift/skew threshold for every feature, over the config's "
                         "(`drift:` top-level and per feature); measures: linf, js, new_terms, missing, mean_shift.")


def gate(report: dict, fail_over: bool) -> None:
    """Print the drift/skew verdict; with ``fail_over``, exit 1 naming the features over threshold."""
    over = report["features_over"]
    if not over:
        echo("drift/skew: no measure over its threshold")
        return
    worst: dict[str, dict[str, float]] = {}
    for c in report["skew"] + report["drift"]:
        for f in c["findings"]:
            if f["over"]:
                m = worst.setdefault(f["feature"], {})
                m[f["measure"]] = max(m.get(f["measure"], 0.0), f["value"] if f["value"] is not None else float("inf"))
    detail = "; ".join(f"{name}: " + ", ".join(f"{k} {v:.3g}" for k, v in m.items()) for name, m in list(worst.items())[:10])
    msg = (f"drift/skew over threshold in {len(over)} feature(s): {', '.join(over)} ({detail}); "
           f"`recordprep report` shows the thresholds and every split compared")
    if fail_over:
        fail(msg)
    echo(f"warning: {msg}", err=True, color=typer.colors.YELLOW)


data_service = typer.Typer(
    cls=Group, no_args_is_help=True, rich_markup_mode=None,
    help="Run tf.data service servers: a dispatcher and CPU workers that read, shuffle and parse for "
         "trainers (readers.train_dataset(..., service='grpc://host:port')). Each runs until SIGTERM/Ctrl-C. "
         "They have no authentication: anyone who reaches the port can run a tf.data graph on them, so they "
         "listen on loopback unless --bind says otherwise. Exit codes: 0 stopped by SIGTERM/Ctrl-C once up, "
         "1 failed to start (e.g. the dispatcher did not answer), 2 usage error or port in use, "
         "130/143 Ctrl-C/SIGTERM before it was up.",
)
