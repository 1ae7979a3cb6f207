"""The commands that read a dataset: ``inspect``, ``verify``, ``report``, ``wait``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.base import DRIFT_THRESHOLD_HELP, echo, fail, gate, thresholds, usage_errors


def inspect(
    output: Annotated[str, typer.Argument(help="A recordprep output directory, whatever characters its name has (or a shard pattern inside it: OUT/train-*).")],
    examples: Annotated[int, typer.Option("--examples", "-n", help="How many decoded examples to print.")] = 3,
    split: Annotated[str | None, typer.Option(help="Split to show examples from (default: the first).")] = None,
) -> None:
    """Print an output's metadata summary and its first decoded examples."""
    from pipelines.cli.inspect import InspectError, inspect_output

    try:
        with usage_errors():
            for line in inspect_output(output, examples, split):
                echo(line)
    except InspectError as e:
        fail(str(e))


def verify(
    output: Annotated[str, typer.Argument(help="A recordprep output directory.")],
) -> None:
    """Re-read every shard (CRCs, record counts, features vs spec) and compare with the metadata; check analysis.json (its content, against the metadata's spec) and the digests of it and every vocabulary; exit 1 on any difference."""
    from pipelines.cli.inspect import InspectError
    from pipelines.cli.verify import verify_output

    try:
        with usage_errors():
            report = verify_output(output)
    except InspectError as e:
        fail(str(e))
    if report.ok:
        echo(f"{output}: OK ({report.shards} shards, {report.records} records match the metadata)")
        return
    for p in report.problems:
        echo(p, err=True)
    fail(f"{output}: {len(report.problems)} problem(s) found in {report.shards} shards")


def report(
    output: Annotated[str, typer.Argument(help="A recordprep output directory.")],
    against: Annotated[str | None, typer.Option(help="An earlier output (e.g. yesterday's partition) to check this one's drift against, split by split.", show_default=False)] = None,
    html: Annotated[Path | None, typer.Option(help="Write a self-contained HTML page here (inline CSS/JS/SVG: opens without network).", show_default=False)] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the report (statistics, checks) as JSON here.", show_default=False)] = None,
    fail_on_drift: Annotated[bool, typer.Option(help="Exit 1 naming the features with a drift/skew measure over its threshold.")] = False,
    drift_threshold: Annotated[list[str] | None, typer.Option(help=DRIFT_THRESHOLD_HELP, show_default=False)] = None,
    oov_threshold: Annotated[float, typer.Option(help="Flag a vocabulary whose out-of-vocabulary share on a split other than the training one is above this fraction (0..1).")] = 0.05,
) -> None:
    """Show an output's statistics (every split) and drift/skew checks: a terminal summary, or --html/--json files; reads no shard.

    Terms, names, file names and records from the data are shown as text,
    never acted on: control characters as escapes (\\x1b), rich markup
    and HTML literally (docs/data-report.md).
    """
    import json

    from pipelines.cli.report import ReportError, build_report, render_html, render_terminal

    limits = thresholds(drift_threshold)
    if not 0.0 <= oov_threshold <= 1.0:
        fail(f"--oov-threshold must be a fraction in 0..1, found {oov_threshold!r}", code=2)
    try:
        with usage_errors():
            rep = build_report(output, against, limits, oov_threshold)
    except ReportError as e:
        fail(str(e))
    for path, render in ((html, lambda: render_html(rep)),
                         (json_file, lambda: json.dumps(rep, indent=1, allow_nan=False, default=str))):
        if path is None:
            continue
        try:
            path.write_text(render(), encoding="utf-8")
        except OSError as e:
            fail(f"cannot write {path}: {e.strerror or e}")
        echo(f"wrote {path}")
    if html is None and json_file is None:
        from rich.console import Console

        render_terminal(rep, Console(width=max(120, Console().width)))
    gate(rep, fail_on_drift)



def wait(
    output: Annotated[str, typer.Argument(help="Output directory a scheduled conversion writes.")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait before giving up (exit 1); finite, >= 0.")] = 3600.0,
    poll: Annotated[float, typer.Option(help="Seconds between checks; finite, >= 0.01.")] = 10.0,
    stale_after: Annotated[float | None, typer.Option(help="A conversion whose lock has had no heartbeat for this many seconds is dead (exit 1 at once); more than its heartbeat period (10 s). Default: the limit the run recorded (60 s).", show_default=False)] = None,
) -> None:
    """Block until OUTPUT is complete (a valid dataset_info.json); exit 1 on timeout or failure.

    A failed conversion (its _FAILURE.json) or a dead one (killed, or its
    machine lost: its lock's heartbeat stopped) ends the wait at once with
    exit 1, as does storage that cannot be read (an unreachable NameNode, no
    permission). No lock and no metadata means not started yet: the wait goes on.
    """
    from convert.spec import METADATA_FILENAME, SpecError
    from readers import (
        DatasetDeadError,
        DatasetFailedError,
        check_wait_arguments,
        locate,
        wait_for_metadata,
    )

    names = ("--timeout", "--poll", "--stale-after")
    from pipelines import remote

    try:
        check_wait_arguments(timeout, poll, stale_after, names=names)
        location = locate(output)
        remote.use_paths(output)  # hdfs:// needs Beam's --hdfs_* flags (derived; ValueError without a NameNode)
    except (ValueError, TypeError) as e:
        fail(str(e), 2)
    from pipelines._fs import read_file  # Beam's file systems: no TensorFlow

    try:
        wait_for_metadata(location, timeout, poll, read_file, stale_after=stale_after, names=names)
    except DatasetDeadError as e:
        fail(f"{e.reason}; it left no {METADATA_FILENAME} and no failure report. Re-run the conversion: "
              f"it takes over the dead run's lock ({location.lock_path}) without --overwrite.")
    except DatasetFailedError as e:
        fail(f"the conversion into {output} failed: {e.reason} (from {location.failure_path})")
    except TimeoutError as e:
        fail(f"{output} is still incomplete after {timeout:g} s (no valid {METADATA_FILENAME})"
              f"{getattr(e, 'problem', '')}; is the conversion running?")
    except OSError as e:  # the storage is unreachable or refuses: waiting on it would not help
        from pipelines.job import failure_reason
        from stores import store_for

        reach = store_for(output).reach_hint
        hint = f" ({reach})" if reach else ""
        fail(f"cannot read {location.metadata_path}: {failure_reason(e)}; check the path and that its file system is reachable{hint}")
    except SpecError as e:
        fail(f"{output} is not a complete recordprep output: {e}")
    except ValueError as e:  # --stale-after within the run's heartbeat period
        fail(str(e), 2)
    echo(f"{output} is complete")
