"""``recordprep``: the command line.

Library code raises; only this module turns errors into messages and exit
codes (1 for a failed run or bad input, 2 for usage errors), so users never
see a traceback for their own mistakes. ``--verbose`` shows Beam's logs.
Every message and log line goes through ``pipelines._terminal.visible``:
paths, names and reasons from the data show their control characters as
escapes instead of acting on the terminal.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from pipelines._terminal import visible
from pipelines.options import looks_like_path, regroup_args

if TYPE_CHECKING:
    from pipelines.options import ConvertOptions
    from pipelines.plan import InputFile

#: Characters of a command's first help sentence in ``recordprep --help`` (wrapped, not cut).
_SHORT_HELP_CHARS = 300


class _Group(TyperGroup):
    """Lists each command with its whole first sentence, wrapped: click cuts
    it at the terminal's width with "..."."""

    def format_commands(self, ctx, formatter) -> None:  # noqa: ANN001 - click's Context and HelpFormatter
        rows = [(name, cmd.get_short_help_str(_SHORT_HELP_CHARS)) for name in self.list_commands(ctx)
                if (cmd := self.get_command(ctx, name)) is not None and not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    cls=_Group,
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


class _InputsCommand(TyperCommand):
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


def _echo(msg: str, err: bool = False, color: str | None = None) -> None:
    """Print one message: its data (paths, terms, field names, reasons) with control
    characters shown, never acted on by the terminal (``pipelines._terminal``)."""
    text = visible(msg, lines=True)
    if color is None:
        typer.echo(text, err=err)
    else:
        typer.secho(text, fg=color, err=err)


def _fail(msg: str, code: int = 1) -> None:
    _echo(f"error: {msg}", err=True, color=typer.colors.RED)
    raise typer.Exit(code)


def _order(order: str | None, no_shuffle: bool) -> str:
    """``--order``, with ``--no-shuffle`` as ``--order input``; the two disagreeing is an OptionsError."""
    from pipelines.options import OptionsError

    if no_shuffle and order is not None and order.lower() != "input":
        raise OptionsError(f"--no-shuffle writes input order and --order {order} asks otherwise: drop one of them")
    return "input" if no_shuffle else (order or "shuffled").lower()


class _VisibleFormatter(logging.Formatter):
    """Log lines name paths and fields from the data: their control characters shown (``pipelines._terminal``)."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record), lines=True)


#: TensorFlow's start-up logging (oneDNN, cpu_feature_guard): off unless the user's environment says otherwise.
#: TF_CPP_MIN_LOG_LEVEL alone does not hide the oneDNN line, which TensorFlow prints before reading it.
_QUIET_TENSORFLOW = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}


def _quiet_tensorflow() -> None:
    """Before TensorFlow is imported: hide its start-up log lines, keeping any value the user set.

    Once TensorFlow is imported (the CLI called from a Python process that uses it) the settings
    no longer matter to it, and the environment is left alone: child processes would otherwise
    run TensorFlow with other kernels (oneDNN off) than their parent's."""
    if "tensorflow" in sys.modules:
        return
    for name, value in _QUIET_TENSORFLOW.items():
        os.environ.setdefault(name, value)


def _setup_logging(verbose: bool) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_VisibleFormatter("%(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])
    if not verbose:
        # Beam logs worker exceptions with full tracebacks before re-raising;
        # the CLI prints one clear line instead.
        logging.getLogger("apache_beam").setLevel(logging.CRITICAL)
    logging.getLogger("recordprep").setLevel(logging.INFO)


# The input caps' defaults and help, shared by convert and infer (convert.sources says why these values).
_DEFAULT_RECORD_MB = 64.0
_DEFAULT_BLOCK_MB = 256.0
_MAX_RECORD_HELP = ("Cap on one JSON line (a longer line goes to the error output) and on one whole JSON "
                    "document (a longer one fails the file), in MB. Bounds memory on hostile input.")
_MAX_BLOCK_HELP = ("Cap on the decompressed size of one Avro block or Parquet column chunk, in MB (a larger one fails the file; "
                   "writers flush blocks of 64 KB..16 MB). Bounds memory on compression bombs.")


def _thresholds(pairs: list[str] | None) -> dict[str, float]:
    """``--drift-threshold MEASURE=VALUE`` flags; a bad one is a usage error (exit 2)."""
    from convert.drift import check_overrides

    out: dict[str, float] = {}
    for p in pairs or ():
        k, sep, v = p.partition("=")
        try:
            out[k.strip()] = float(v) if sep else float("nan")
        except ValueError:
            _fail(f"--drift-threshold {p!r}: expected MEASURE=NUMBER, e.g. js=0.05", 2)
    try:
        return check_overrides(out)
    except ValueError as e:
        _fail(f"--drift-threshold: {e}", 2)
    raise AssertionError("unreachable")


_DRIFT_THRESHOLD_HELP = ("MEASURE=VALUE (repeat): a drift/skew threshold for every feature, over the config's "
                         "(`drift:` top-level and per feature); measures: linf, js, new_terms, missing, mean_shift.")


def _gate(report: dict, fail: bool) -> None:
    """Print the drift/skew verdict; with ``fail``, exit 1 naming the features over threshold."""
    over = report["features_over"]
    if not over:
        _echo("drift/skew: no measure over its threshold")
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
    if fail:
        _fail(msg)
    _echo(f"warning: {msg}", err=True, color=typer.colors.YELLOW)


@app.command(cls=_InputsCommand, context_settings={"allow_extra_args": False})
def convert(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Input files, globs or directories (local, gs://, s3://, hdfs://; s3:// credentials and endpoint as boto3 finds them: AWS_* environment, profile, role): several after one -i, or repeat -i.")],
    config: Annotated[Path, typer.Option("--config", "-c", help="Feature config (YAML or JSON); `recordprep infer` drafts one.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory (local ones must be creatable and writable: checked before any work). dataset_info.json appears there last, when the run is complete.")],
    splits: Annotated[str, typer.Option(help="Named splits with weights; the first one is analyzed (vocabularies, statistics).")] = "train=0.9,eval=0.1",
    split_key: Annotated[str | None, typer.Option(help="Field whose value decides the split (entity-stable, e.g. user_id). Default: the whole record.")] = None,
    num_shards: Annotated[int | None, typer.Option(help="Shards per split. Default: from input size (see --target-shard-mb).")] = None,
    target_shard_mb: Annotated[float, typer.Option(help="Input MB per shard when --num-shards is not given (> 0; an error if it makes more than 100,000 shards).")] = 128.0,
    compression: Annotated[str, typer.Option(help="Shard compression: gzip or none.")] = "gzip",
    gzip_level: Annotated[int, typer.Option(help="gzip level 0 (stored) .. 9 (smallest): 1-2 are ISA-L's fast igzip (the default 2: about zlib's level-1 size), 3-9 zlib-ng's (5 and up: smaller than zlib's usual 6).")] = 2,
    layout: Annotated[str, typer.Option(help="Example layout: 'features' (one Feature per column) or 'packed' (all float32 columns in one Feature, all int64 in another; readers.train_dataset unpacks them; parsing is several times cheaper, records smaller).")] = "features",
    batch_size: Annotated[int, typer.Option(help="Records per vectorized batch inside a worker.")] = 4096,
    order: Annotated[str | None, typer.Option(help="Record order: 'shuffled' (each shard a uniform random sample of its split, records in random order: readers' batches are fair samples even of sorted input) or 'input' (each shard a contiguous range of the input, in input order; for sequence data or debugging). Default: shuffled.", show_default=False)] = None,
    no_shuffle: Annotated[bool, typer.Option("--no-shuffle", help="Same as --order input.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed of the shuffle (0 .. 2**63-1; default 0): the same seed writes the same bytes, whatever the runner or worker count.", show_default=False)] = None,
    avro_decoder: Annotated[str, typer.Option(help="Avro decoding: 'auto' (polars for the schemas and codecs where it gives fastavro's values, faster; fastavro for the rest and from any block polars cannot read) or 'fastavro' (always). Same output either way. Parquet: 'fastavro' selects its per-record reference path.")] = "auto",
    max_errors: Annotated[int | None, typer.Option(help="Rejected records tolerated before the run fails. Default 0.")] = None,
    max_error_fraction: Annotated[float | None, typer.Option(help="Fraction of rejected records tolerated (0..1).")] = None,
    json_records_path: Annotated[str | None, typer.Option(help="Dotted key holding the record array in JSON documents, e.g. 'statuses'.")] = None,
    max_record_mb: Annotated[float, typer.Option(help=_MAX_RECORD_HELP)] = _DEFAULT_RECORD_MB,
    max_block_mb: Annotated[float, typer.Option(help=_MAX_BLOCK_HELP)] = _DEFAULT_BLOCK_MB,
    analysis_from: Annotated[str | None, typer.Option(help="Reuse vocabularies/statistics of an earlier output (daily runs, eval-only runs); refused when a feature's transform or options differ from those it was computed with.")] = None,
    check_against: Annotated[str | None, typer.Option(help="After the run, check drift against this earlier output and skew between the splits (as `recordprep report --fail-on-drift`): exit 1 naming the features over threshold (the output stays committed).", show_default=False)] = None,
    drift_threshold: Annotated[list[str] | None, typer.Option(help="With --check-against: " + _DRIFT_THRESHOLD_HELP, show_default=False)] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output made from other inputs or config. Deletes only what a recordprep run wrote; refused (nothing deleted) when the output holds other files. A reader still reading the old output gets its records or an error saying it was replaced, never the new run's (shard names are unique per run).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Re-run even when the output is already complete for these inputs and config (then nothing runs by default). Implies --overwrite.")] = False,
    progress: Annotated[bool, typer.Option(help="Local runs: print records, input MB and rate per pass every 5 s (stderr).")] = True,
    workers: Annotated[int | None, typer.Option(help="Local runs: worker processes. Default: one per core when the input is over 32 MB (faster), else 1. 1 = in-process, least memory. On Linux they are forked from this process when safe (RECORDPREP_WARM_WORKERS=0: start new interpreters).", show_default=False)] = None,
    dry_run: Annotated[bool, typer.Option(help="Check the config against the data (Avro schemas, a JSON sample), print the plan (inputs, shards, splits, features) and exit.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show Beam's logs.")] = False,
    beam_args: Annotated[list[str] | None, typer.Argument(metavar="-- BEAM_FLAGS", help="Beam flags after a literal `--`, e.g. -- --runner DataflowRunner --project P --region R --temp_location gs://b/tmp", show_default=False)] = None,
) -> None:
    """Convert Avro, Parquet or JSON files into sharded TFRecords of pre-vectorized tf.train.Examples.

    Runs on Beam's in-process runner unless Beam flags after `--` pick another.
    Records that cannot be converted go to OUTPUT/errors/ (JSON Lines with file,
    offset, field, reason and the record); by default any rejected record fails
    the run after writing them: tolerate with --max-errors/--max-error-fraction.
    Re-running with the same inputs and config into the same output does
    nothing unless --force.
    """
    _setup_logging(verbose)
    if drift_threshold and check_against is None:
        _fail("--drift-threshold applies to --check-against; give the output to check against", 2)
    limits = _thresholds(drift_threshold)
    from convert.config import ConfigError
    from convert.splits import SplitError, Splits
    from pipelines.job import OutputExistsError, OutputPathError, failure_reason, run_convert
    from pipelines.lock import LockHeldError
    from pipelines.options import ConvertOptions, OptionsError
    from pipelines.plan import InputError
    from pipelines.transforms import ConversionFailed

    try:
        opts = ConvertOptions(
            inputs=tuple(input), config=str(config), output=output, splits=Splits.parse(splits, split_key),
            num_shards=num_shards, target_shard_mb=target_shard_mb, compression=compression.lower(),
            gzip_level=gzip_level, layout=layout.lower(), batch_size=batch_size, order=_order(order, no_shuffle), seed=seed, avro_decoder=avro_decoder.lower(), max_errors=max_errors,
            max_error_fraction=max_error_fraction, json_records_path=json_records_path,
            max_record_mb=max_record_mb, max_block_mb=max_block_mb,
            analysis_from=analysis_from, overwrite=overwrite, force=force, beam_args=tuple(beam_args or ()), progress=progress, workers=workers,
            pre_fork=True,  # the CLI's own process: its workers may fork from it (pipelines._warm)
        )
        if dry_run:
            _print_plan(opts)
            return
        _echo(f"converting {', '.join(opts.inputs)} -> {opts.output}")  # the summary's stream (stdout)
        result = run_convert(opts)
    except (ConfigError, OptionsError, SplitError, InputError, OutputPathError) as e:
        _fail(str(e), 2)
    except (ConversionFailed, OutputExistsError, LockHeldError, FileNotFoundError) as e:
        _fail(getattr(e, "message", None) or str(e))
    except Exception as e:  # noqa: BLE001 - last resort: one line, details with -v
        if verbose:
            raise
        _fail(f"{failure_reason(e)} (re-run with --verbose for details)")
    for line in result.summary_lines():
        _echo(line)
    if check_against is not None:
        from pipelines.report import ReportError, build_report

        try:
            _gate(build_report(output, check_against, limits), True)
        except ReportError as e:
            _fail(f"--check-against: {e}")
    written = sum(sp.get("num_records", 0) for sp in result.info.get("splits", {}).values())
    for name, sp in result.info.get("splits", {}).items():
        if written and not sp.get("num_records"):
            _echo(f"warning: split {name!r} is empty: all {written} records hashed into the other split(s); "
                  f"readers refuse an empty split. Convert more records or change --splits/--split-key.",
                  err=True, color=typer.colors.YELLOW)


def _print_plan(opts: ConvertOptions) -> None:
    """``convert --dry-run``: checks the config against the data (and a reused
    analysis against the config) and prints what a run would do."""
    from pipelines.job import load_analysis, plan

    p = plan(opts)
    if opts.analysis_from:  # refused here when it does not fit the config
        load_analysis(opts.analysis_from, p["config"])
        _echo(f"analysis: reused from {opts.analysis_from} (fits the config)")
    _echo(f"inputs: {len(p['inputs'])} files, {p['total_bytes'] / 1e6:.2f} MB")
    for f in p["inputs"][:20]:
        _echo(f"  {f['path']}  {f['size']:,} bytes")
    if len(p["inputs"]) > 20:
        _echo(f"  ... and {len(p['inputs']) - 20} more")
    _echo(f"splits: {p['splits']} (key: {p['split_key'] or 'whole record'})")
    _echo(f"shards per split: {p['num_shards']}  compression: {opts.compression}")
    _echo(f"order: {opts.order}" + (f" (seed {opts.shuffle_seed})" if opts.shuffle_seed is not None else ""))
    _echo("features:")
    for feat in p["features"]["features"]:
        extra = {k: v for k, v in feat.items() if k in ("max_len", "top_k", "buckets", "fill") and v is not None}
        _echo(f"  {feat['name']:<20} <- {feat['source']:<24} {feat['transform']} {extra or ''}")
    if p["features"]["label"]:
        _echo(f"label: {p['features']['label']['name']} <- {p['features']['label']['source']}")
    _echo(f"config checked against: {p['data_check']}")


@app.command(cls=_InputsCommand)
def infer(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Input files, globs or directories: several after one -i, or repeat -i.")],
    sample: Annotated[int, typer.Option(help="Records to sample (from the first files).")] = 2000,
    label: Annotated[str | None, typer.Option(help="Field to use as the label (default: a numeric field named label/target/y/...); its kind comes from the data: strings -> class names (transform: vocabulary), few integer values -> int64, other numbers -> float32; warns when it is null in part of the sample.")] = None,
    json_records_path: Annotated[str | None, typer.Option(help="Dotted key holding the record array in JSON documents.")] = None,
    max_record_mb: Annotated[float, typer.Option(help=_MAX_RECORD_HELP)] = _DEFAULT_RECORD_MB,
    max_block_mb: Annotated[float, typer.Option(help=_MAX_BLOCK_HELP)] = _DEFAULT_BLOCK_MB,
) -> None:
    """Draft a feature config from a sample of the data: `recordprep infer -i 'data/*.avro' > features.yaml`.

    One entry per leaf field with a transform chosen from the sample (numeric ->
    zscore, low-cardinality -> vocabulary, high-cardinality and identifiers (id,
    *_id, card numbers) -> hash, ISO 8601 strings -> timestamp, free text ->
    text, lists -> padded to their 95th-percentile length; lists of records,
    lists of lists and maps -> their count plus paths through them: items[].price,
    m[][], attrs[keys]) and a comment saying why. The draft converts the sampled
    data as it is: fields absent, null or empty in part of the sample (or under a
    list) get allow_all_missing; fields it cannot type are left out, saying why.
    """
    _setup_logging(False)
    import difflib

    from convert.infer import infer_config, render_yaml
    from pipelines.options import OptionsError, input_cap_bytes
    from pipelines.plan import InputError, discover

    if sample < 1:
        _fail("--sample must be >= 1", 2)
    try:
        max_record_bytes = input_cap_bytes("--max-record-mb", max_record_mb)
        max_block_bytes = input_cap_bytes("--max-block-mb", max_block_mb)
    except OptionsError as e:
        _fail(str(e), 2)
    try:
        files = discover(input)
    except InputError as e:
        _fail(str(e), 2)

    records, schemas, bad, first_bad, read_from = _sample_records(
        files, input, sample, json_records_path, max_record_bytes, max_block_bytes)
    where = _describe_files(read_from)
    if not records:
        _fail(f"no records found in {where}; nothing to infer from{_no_records_hint(bad, first_bad, read_from)}")
    config, drafts = infer_config(records, schemas or None, label)
    if not config["features"]:
        _fail(f"unsupported input: no field of the {len(records)} sampled records of {where} can be vectorized "
              f"({'; '.join(d.comment for d in drafts) or 'the records have no fields'}); check that the input is "
              f"the data you meant (its records declare no field, or only fields that are null in the sample: "
              f"--sample more records if values come later)")
    paths = [d.path for d in drafts]
    if label and label not in paths:
        close = difflib.get_close_matches(label, paths, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        _fail(f"--label {label!r}: no such field in the sample{hint}; fields: {', '.join(paths)}", 2)
    for d in drafts:  # the label's: null in part of the sample, or not a kind of label convert takes
        for w in d.warnings:
            _echo(f"warning: {w}", err=True, color=typer.colors.YELLOW)
    typer.echo(render_yaml(config, drafts, header=f"inferred from {len(records)} records of {len(files)} file(s)"), nl=False)


@app.command()
def inspect(
    output: Annotated[str, typer.Argument(help="A recordprep output directory (or a shard pattern inside it).")],
    examples: Annotated[int, typer.Option("--examples", "-n", help="How many decoded examples to print.")] = 3,
    split: Annotated[str | None, typer.Option(help="Split to show examples from (default: the first).")] = None,
) -> None:
    """Print an output's metadata summary and its first decoded examples."""
    from pipelines.inspect import InspectError, inspect_output

    try:
        for line in inspect_output(output, examples, split):
            _echo(line)
    except InspectError as e:
        _fail(str(e))


@app.command()
def verify(
    output: Annotated[str, typer.Argument(help="A recordprep output directory.")],
) -> None:
    """Re-read every shard (CRCs, record counts, features vs spec) and compare with the metadata, check analysis.json; exit 1 on any difference."""
    from pipelines.inspect import InspectError
    from pipelines.verify import verify_output

    try:
        report = verify_output(output)
    except InspectError as e:
        _fail(str(e))
    if report.ok:
        _echo(f"{output}: OK ({report.shards} shards, {report.records} records match the metadata)")
        return
    for p in report.problems:
        _echo(p, err=True)
    _fail(f"{output}: {len(report.problems)} problem(s) found in {report.shards} shards")


@app.command()
def report(
    output: Annotated[str, typer.Argument(help="A recordprep output directory.")],
    against: Annotated[str | None, typer.Option(help="An earlier output (e.g. yesterday's partition) to check this one's drift against, split by split.", show_default=False)] = None,
    html: Annotated[Path | None, typer.Option(help="Write a self-contained HTML page here (inline CSS/JS/SVG: opens without network).", show_default=False)] = None,
    json_file: Annotated[Path | None, typer.Option("--json", help="Write the report (statistics, checks) as JSON here.", show_default=False)] = None,
    fail_on_drift: Annotated[bool, typer.Option(help="Exit 1 naming the features with a drift/skew measure over its threshold.")] = False,
    drift_threshold: Annotated[list[str] | None, typer.Option(help=_DRIFT_THRESHOLD_HELP, show_default=False)] = None,
) -> None:
    """Show an output's statistics (every split) and drift/skew checks: a terminal summary, or --html/--json files; reads no shard.

    Terms, names, file names and records from the data are shown as text,
    never acted on: control characters as escapes (\\x1b), rich markup
    and HTML literally (docs/data-report.md).
    """
    import json

    from pipelines.report import ReportError, build_report, render_html, render_terminal

    limits = _thresholds(drift_threshold)
    try:
        rep = build_report(output, against, limits)
    except ReportError as e:
        _fail(str(e))
    for path, render in ((html, lambda: render_html(rep)),
                         (json_file, lambda: json.dumps(rep, indent=1, allow_nan=False, default=str))):
        if path is None:
            continue
        try:
            path.write_text(render(), encoding="utf-8")
        except OSError as e:
            _fail(f"cannot write {path}: {e.strerror or e}")
        _echo(f"wrote {path}")
    if html is None and json_file is None:
        from rich.console import Console

        render_terminal(rep, Console(width=max(120, Console().width)))
    _gate(rep, fail_on_drift)


@app.command()
def export(
    output: Annotated[str, typer.Argument(help="The recordprep output the model was trained on (its analysis is embedded).")],
    model: Annotated[Path, typer.Argument(help="The trained Keras model file (.keras or .h5), taking the output's features by name.")],
    export_dir: Annotated[str, typer.Argument(help="Where to write the serving SavedModel (must not exist).")],
    trust_model_code: Annotated[bool, typer.Option(help="Load Python code inside the model file (Lambda layers): only for a model you wrote.")] = False,
) -> None:
    """Write a SavedModel for TF Serving that applies the converter's transforms exactly to raw records (docs/serving.md).

    Two signatures, same outputs: serving_default takes the packed fields (kinds, numbers, terms, ...);
    serve_examples takes 'examples', serialized tf.train.Example protos of the raw records (keyed by
    source path), for clients in any language.
    """
    if not model.exists():
        _fail(f"model {model}: no such file", code=2)
    _quiet_tensorflow()
    from readers._io import exists

    if exists(export_dir):
        _fail(f"{export_dir} exists; export into a new directory (TF Serving reads one version per directory)", code=2)
    import tensorflow as tf  # only this command needs TensorFlow

    from readers._serving_examples import example_keys
    from readers.errors import SpecError
    from readers.serving import export_serving, transform_layer

    try:
        layer = transform_layer(output)
    except (SpecError, OSError) as e:
        _fail(str(e))
    try:
        keras_model = tf.keras.models.load_model(model, safe_mode=not trust_model_code)
    except Exception as e:  # Keras raises many types for a file it cannot load
        hint = " (add --trust-model-code to load Lambda layers of a model you wrote)" if "safe_mode" in str(e) else ""
        _fail(f"cannot load the model {model}: {str(e).splitlines()[0] if str(e) else type(e).__name__}{hint}")
    try:
        export_serving(keras_model, layer, export_dir)
    except (ValueError, TypeError, tf.errors.OpError) as e:
        _fail(f"cannot export {model} with the transforms of {output}: {e}")
    inputs = ", ".join(layer.wire.input_names())
    keys = ", ".join(example_keys(layer.config, layer.wire).values())
    _echo(f"exported {model} with the transforms of {output} to {export_dir}\nserving_default inputs: {inputs}\n"
          f"serve_examples input: examples (tf.train.Example features: {keys})")


@app.command()
def estimate(
    records: Annotated[float, typer.Option(help="Records in the input (e.g. 1e9).")],
    input_gb: Annotated[float, typer.Option(help="Input size in GB (10^9 bytes).")],
    distinct_ids: Annotated[float, typer.Option(help="Distinct values of the largest vocabulary feature (reported; its analysis memory is not modelled).")] = 0,
    machine_type: Annotated[str, typer.Option(help="Dataflow worker machine type (n1-standard-4, n2-standard-8, ...).")] = "n1-standard-4",
    splits: Annotated[int, typer.Option(help="Number of splits.")] = 2,
    target_shard_mb: Annotated[float, typer.Option(help="As convert's --target-shard-mb.")] = 128.0,
    cpu_us_per_record: Annotated[float | None, typer.Option(help="CPU µs per record measured on your data (a local run's CPU-s / records); default: the bench's.", show_default=False)] = None,
    utilization: Annotated[float, typer.Option(help="Share of the workers' vCPU-hours spent converting.")] = 0.7,
    vcpu_hour_usd: Annotated[float | None, typer.Option(help="Price of a vCPU-hour (default: pipelines/estimate.py PRICES).", show_default=False)] = None,
    gb_hour_usd: Annotated[float | None, typer.Option(help="Price of a GB-hour of worker memory.", show_default=False)] = None,
) -> None:
    """Size a conversion before running it: units, shards, requests, memory per worker,
    worker-hours and cost on Dataflow, beside TF Transform on the same job (docs: Sizing a job)."""
    from pipelines.estimate import MEASURED, JobSize, render
    from pipelines.estimate import estimate as run_estimate

    prices = {k: v for k, v in (("vcpu_hour", vcpu_hour_usd), ("gb_hour", gb_hour_usd)) if v is not None}
    try:
        job = JobSize(records=int(records), input_bytes=int(input_gb * 1e9), distinct_ids=int(distinct_ids),
                      machine_type=machine_type, splits=splits, target_shard_mb=target_shard_mb,
                      cpu_us_per_record=cpu_us_per_record or MEASURED["cpu_us_per_record"], utilization=utilization)
        lines = render(job, run_estimate(job, prices))
    except ValueError as e:  # EstimateError, or the plan's InputError (too many shards)
        _fail(str(e), 2)
    for line in lines:
        typer.echo(line)


@app.command()
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
    from readers.errors import DatasetDeadError, DatasetFailedError
    from readers.info import check_wait_arguments, locate, wait_for_metadata

    names = ("--timeout", "--poll", "--stale-after")
    from pipelines import remote

    try:
        check_wait_arguments(timeout, poll, stale_after, names=names)
        location = locate(output)
        remote.use_paths(output)  # hdfs:// needs Beam's --hdfs_* flags (derived; ValueError without a NameNode)
    except (ValueError, TypeError) as e:
        _fail(str(e), 2)
    from pipelines._fs import read_file  # Beam's file systems: no TensorFlow

    try:
        wait_for_metadata(location, timeout, poll, read_file, stale_after=stale_after, names=names)
    except DatasetDeadError as e:
        _fail(f"{e.reason}; it left no {METADATA_FILENAME} and no failure report. Re-run the conversion: "
              f"it takes over the dead run's lock ({location.lock_path}) without --overwrite.")
    except DatasetFailedError as e:
        _fail(f"the conversion into {output} failed: {e.reason} (from {location.failure_path})")
    except TimeoutError as e:
        _fail(f"{output} is still incomplete after {timeout:g} s (no valid {METADATA_FILENAME})"
              f"{getattr(e, 'problem', '')}; is the conversion running?")
    except OSError as e:  # the storage is unreachable or refuses: waiting on it would not help
        from pipelines.job import failure_reason

        hint = (f" (for hdfs://, the NameNode's WebHDFS address: {remote.WEBHDFS_URL_ENV})" if output.startswith("hdfs://")
                else " (for s3://, the credentials, region and AWS_ENDPOINT_URL boto3 finds)" if output.startswith("s3://")
                else "")
        _fail(f"cannot read {location.metadata_path}: {failure_reason(e)}; check the path and that its file system is reachable{hint}")
    except SpecError as e:
        _fail(f"{output} is not a complete recordprep output: {e}")
    except ValueError as e:  # --stale-after within the run's heartbeat period
        _fail(str(e), 2)
    _echo(f"{output} is complete")


def _sample_records(files: list[InputFile], input: list[str], sample: int, json_records_path: str | None,
                    max_record_bytes: int, max_block_bytes: int) -> tuple[list, list, int, str, list[str]]:
    """``infer``'s sample: up to ``sample`` records from the first files, in order.

    Returns ``(records, schemas, bad, first_bad, read_from)``: the writer
    schemas of the Avro files read (maps, logical types), how many lines were
    not records and the first of them, and the files read. A file that cannot
    be read ends the command naming it.
    """
    from apache_beam.io.filesystems import FileSystems

    from convert.sources import InputFileError, detect_format, iter_records, read_record_schema

    schemas: list = []
    records: list = []
    bad = 0
    first_bad = ""
    read_from: list[str] = []
    try:
        for f in files:
            read_from.append(f.path)
            with FileSystems.open(f.path, compression_type="uncompressed") as fh:
                has_schema = detect_format(f.path, fh.read(4)) in ("avro", "parquet")
                # Records first: the reader checks the magic and names what is wrong.
                for batch in iter_records(fh, f.path, 0, None, 1024, json_records_path,
                                          max_record_bytes=max_record_bytes, max_block_bytes=max_block_bytes):
                    if batch.bad and not bad:
                        _, line_no, reason, _ = batch.bad[0]
                        first_bad = f"{f.path}{f' line {line_no}' if line_no else ''}: {reason}"
                    bad += len(batch.bad)
                    records.extend(batch.records[: sample - len(records)])
                    if len(records) >= sample:
                        break
                if has_schema:
                    schemas.append(read_record_schema(fh, f.path))
            if len(records) >= sample:
                break
    except InputFileError as e:
        _fail(f"cannot read input {e}")
    except (OSError, ValueError) as e:  # a file vanished, or a reader bug: still one line
        _fail(f"cannot read input {read_from[-1] if read_from else input}: {type(e).__name__}: {e}")
    return records, schemas, bad, first_bad, read_from


def _no_records_hint(bad: int, first_bad: str, read_from: list[str]) -> str:
    """What to do when ``infer`` found no records: the lines that were not records, or where records are."""
    hint = ""
    if bad:
        hint = f"; {bad} line(s) are not JSON objects (first: {first_bad})"
        key = _records_key_hint(read_from)
        if key:
            hint += f"; the file is one JSON document: name the key holding the records with --json-records-path {key}"
    if not hint:
        hint = ("; point -i at files that hold records, or write the config by hand (docs/feature-config.md): "
                "convert turns files without records into an empty output")
    return hint


def _describe_files(paths: list[str]) -> str:
    if len(paths) == 1:
        return paths[0]
    shown = ", ".join(paths[:3])
    return f"{len(paths)} files ({shown}{', ...' if len(paths) > 3 else ''})"


def _records_key_hint(paths: list[str]) -> str:
    """The key of a record list when a file is one JSON object holding one (``users``), else ``""``."""
    import orjson
    from apache_beam.io.filesystems import FileSystems

    for p in paths[:3]:
        try:
            with FileSystems.open(p, compression_type="uncompressed") as fh:
                data = fh.read(64 * 1024 * 1024 + 1)
            if len(data) > 64 * 1024 * 1024:
                continue
            doc = orjson.loads(data.removeprefix(b"\xef\xbb\xbf"))
        except Exception:  # noqa: BLE001 - only a hint
            continue
        if isinstance(doc, dict):
            keys = [k for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
            if keys:
                return keys[0]
    return ""


data_service = typer.Typer(
    cls=_Group, no_args_is_help=True, rich_markup_mode=None,
    help="Run tf.data service servers: a dispatcher and CPU workers that read, shuffle and parse for "
         "trainers (readers.train_dataset(..., service='grpc://host:port')). Each runs until SIGTERM/Ctrl-C. "
         "They have no authentication: anyone who reaches the port can run a tf.data graph on them, so they "
         "listen on loopback unless --bind says otherwise. Exit codes: 0 stopped by SIGTERM/Ctrl-C once up, "
         "1 failed to start (e.g. the dispatcher did not answer), 2 usage error or port in use, "
         "130/143 Ctrl-C/SIGTERM before it was up.",
)
app.add_typer(data_service, name="data-service")

_BIND_HELP = ("Address to be reachable at: 127.0.0.1 (loopback only), an address of this host (it and loopback), "
              "or 0.0.0.0 for every interface. The servers have no authentication: bind beyond loopback only on a "
              "private network (docs/data-service.md#ports).")


def _serve(run, *args, **kwargs) -> None:  # noqa: ANN001 - readers.service.serve_*
    from readers import service

    try:
        run(*args, echo=typer.echo, **kwargs)
    except (ValueError, service.PortInUse) as e:
        _fail(str(e), 2)
    except service.ServerInterrupted as e:
        _fail(str(e), e.exit_code)
    except service.DispatcherUnreachable as e:
        _fail(str(e), 1)
    except Exception as e:  # noqa: BLE001 - TensorFlow's own message
        _fail(f"{type(e).__name__}: {e}")


@data_service.command("dispatcher")
def data_service_dispatcher(
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one. A port another process listens on is refused.")] = 5050,
    bind: Annotated[str, typer.Option(help=_BIND_HELP)] = "127.0.0.1",
    work_dir: Annotated[str | None, typer.Option(help="Directory (local or gs://) for the dispatcher's journal: fault-tolerant mode, a restarted dispatcher resumes its jobs.")] = None,
    worker_address: Annotated[list[str] | None, typer.Option("--worker-address", help="host:port of each worker, as it advertises itself (repeat): the fixed worker list that ReadOptions(service_sharding='static') needs.")] = None,
    worker_timeout_s: Annotated[float | None, typer.Option(help="Seconds without a heartbeat after which a worker counts as lost (TensorFlow's default if not given); a lost worker keeps its tasks: epochs wait for a worker back at its address (docs/data-service.md).", show_default=False)] = None,
) -> None:
    """Run a tf.data service dispatcher: it hands shards to the workers and tells trainers where to fetch batches."""
    _quiet_tensorflow()
    from readers import service  # TensorFlow, only for this command

    _serve(service.serve_dispatcher, port, bind=bind, work_dir=work_dir,
           worker_addresses=tuple(worker_address or ()), worker_timeout_s=worker_timeout_s)


@data_service.command("worker")
def data_service_worker(
    dispatcher: Annotated[str, typer.Option(help="host:port of the dispatcher.")],
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one. A port another process listens on is refused.")] = 5051,
    bind: Annotated[str, typer.Option(help=_BIND_HELP)] = "127.0.0.1",
    advertise: Annotated[str | None, typer.Option(help="Host name or address trainers reach this worker at (default: the --bind address, or this host's name with --bind 0.0.0.0).", show_default=False)] = None,
    heartbeat_s: Annotated[float | None, typer.Option(help="Seconds between heartbeats to the dispatcher (TensorFlow's default if not given).", show_default=False)] = None,
    start_timeout: Annotated[float, typer.Option(help="Seconds to wait for the dispatcher to answer at start; then exit 1 naming it (a supervisor restarts the worker).")] = 60.0,
) -> None:
    """Run a tf.data service worker: it runs the input pipelines the dispatcher assigns and streams parsed batches to trainers."""
    _quiet_tensorflow()
    from readers import service  # TensorFlow, only for this command

    _serve(service.serve_worker, dispatcher, port, bind=bind, advertise=advertise, heartbeat_s=heartbeat_s,
           start_timeout_s=start_timeout)


def main() -> None:
    from pipelines._worker import prepare_launcher
    from pipelines.interrupt import Interrupted, raise_on_signals

    prepare_launcher(sys.argv[1:])  # a local convert loads no more of Beam than its workers
    raise_on_signals()  # a run stopped by Ctrl-C or a scheduler's SIGTERM cleans up and says so
    try:
        app()
    except Interrupted as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    main()
