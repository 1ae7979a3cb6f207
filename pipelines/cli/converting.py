"""The commands that make a dataset: ``convert`` (and ``--dry-run``), ``infer``, ``estimate``.

``convert`` reads as its stages: the options (``ConvertOptions``, validated
where it is built), the plan or the run, the summary, the drift check.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from pipelines.cli.base import DRIFT_THRESHOLD_HELP, echo, fail, gate, setup_logging, thresholds

if TYPE_CHECKING:
    from pipelines.job import ConvertResult
    from pipelines.options import ConvertOptions
    from pipelines.plan import InputFile

# The input caps' defaults and help, shared by convert and infer (convert.sources says why these values).
_DEFAULT_RECORD_MB = 64.0
_DEFAULT_BLOCK_MB = 256.0
_MAX_RECORD_HELP = ("Cap on one JSON line (a longer line goes to the error output) and on one whole JSON "
                    "document (a longer one fails the file), in MB. Bounds memory on hostile input.")
_MAX_BLOCK_HELP = ("Cap on the decompressed size of one Avro block or Parquet column chunk, in MB (a larger one fails the file; "
                   "writers flush blocks of 64 KB..16 MB), and on what one batch of Parquet rows decodes to (read in smaller "
                   "pieces instead; one record over it fails the file). Bounds memory on compression bombs.")


def _order(order: str | None, no_shuffle: bool) -> str:
    """``--order``, with ``--no-shuffle`` as ``--order input``; the two disagreeing is an OptionsError."""
    from pipelines.options import OptionsError

    if no_shuffle and order is not None and order.lower() != "input":
        raise OptionsError(f"--no-shuffle writes input order and --order {order} asks otherwise: drop one of them")
    return "input" if no_shuffle else (order or "shuffled").lower()



def convert(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Input files, globs or directories (local, gs://, s3://, azfs://account/container/path, hdfs://; s3:// credentials and endpoint as boto3 finds them: AWS_* environment, profile, role; azfs:// from AZURE_STORAGE_CONNECTION_STRING or DefaultAzureCredential): several after one -i, or repeat -i.")],
    config: Annotated[Path, typer.Option("--config", "-c", help="Feature config (YAML or JSON); `recordprep infer` drafts one.")],
    output: Annotated[str, typer.Option("--output", "-o", help="Output directory (local ones must be creatable and writable: checked before any work). dataset_info.json appears there last, when the run is complete.")],
    splits: Annotated[str, typer.Option(help="Named splits with weights; the first one is analyzed (vocabularies, statistics).")] = "train=0.9,eval=0.1",
    split_key: Annotated[str | None, typer.Option(help="Field whose value decides the split (entity-stable, e.g. user_id), a path as a feature's source is: user.id is the field id inside user; quote a name holding a dot: '[\"user.id\"]' (a top-level field named user.id). Default: the whole record.")] = None,
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
    max_vocabulary_terms: Annotated[int, typer.Option(help="Largest vocabulary without top_k a run accepts (terms counted min_frequency times or more in the training split): every process applying a vocabulary holds it whole, so a larger one stops the run after the analysis, before any shard is written (exit 2); give such a feature a top_k, or hash an identifier.")] = 5_000_000,
    check_against: Annotated[str | None, typer.Option(help="After the run, check drift against this earlier output and skew between the splits (as `recordprep report --fail-on-drift`): exit 1 naming the features over threshold (the output stays committed). Its path is checked with the run's before the run starts.", show_default=False)] = None,
    drift_threshold: Annotated[list[str] | None, typer.Option(help="With --check-against: " + DRIFT_THRESHOLD_HELP, show_default=False)] = None,
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
    setup_logging(verbose)
    limits = _drift_limits(check_against, drift_threshold)
    from convert.splits import Splits
    from pipelines.options import ConvertOptions

    with _exit_codes(verbose):
        opts = ConvertOptions(
            inputs=tuple(input), config=str(config), output=output, splits=Splits.parse(splits, split_key),
            num_shards=num_shards, target_shard_mb=target_shard_mb, compression=compression.lower(),
            gzip_level=gzip_level, layout=layout.lower(), batch_size=batch_size, order=_order(order, no_shuffle),
            seed=seed, avro_decoder=avro_decoder.lower(), max_errors=max_errors,
            max_error_fraction=max_error_fraction, json_records_path=json_records_path,
            max_record_mb=max_record_mb, max_block_mb=max_block_mb, analysis_from=analysis_from,
            max_vocabulary_terms=max_vocabulary_terms, overwrite=overwrite, force=force,
            beam_args=tuple(beam_args or ()), progress=progress, workers=workers,
            pre_fork=True,  # the CLI's own process: its workers may fork from it (pipelines.local.warm)
        )
        from pipelines import remote

        remote.check_paths(opts, check_against)  # --check-against too: refused before the run, not after its commit
        if dry_run:
            _print_plan(opts)
            return
        result = _run(opts)
    for line in result.summary_lines():
        echo(line)
    if check_against is not None:
        _check_drift(output, check_against, limits)
    _warn_empty_splits(result)


def _drift_limits(check_against: str | None, drift_threshold: list[str] | None) -> dict[str, float]:
    """``--drift-threshold``'s limits; without ``--check-against`` a usage error (exit 2)."""
    if drift_threshold and check_against is None:
        fail("--drift-threshold applies to --check-against; give the output to check against", 2)
    return thresholds(drift_threshold)


@contextlib.contextmanager
def _exit_codes(verbose: bool) -> Iterator[None]:
    """A conversion's errors as one line and an exit code: 2 for bad options, config or inputs, 1 for a
    failed run; anything else by its reason (the traceback with ``--verbose``)."""
    from convert.config import ConfigError
    from convert.splits import SplitError
    from pipelines.job import failure_reason
    from pipelines.lock import LockHeldError, LockLostError
    from pipelines.options import OptionsError
    from pipelines.output_guard import OutputExistsError, OutputPathError
    from pipelines.plan import InputError
    from pipelines.remote import RemotePathError
    from pipelines.run_files import ConversionFailed

    try:
        yield
    except (ConfigError, OptionsError, SplitError, InputError, OutputPathError, RemotePathError) as e:
        fail(str(e), 2)
    except (ConversionFailed, OutputExistsError, LockHeldError, LockLostError, FileNotFoundError) as e:
        fail(getattr(e, "message", None) or str(e))
    except Exception as e:  # noqa: BLE001 - last resort: one line, details with -v
        if verbose:
            raise
        fail(f"{failure_reason(e)} (re-run with --verbose for details)")


def _run(opts: ConvertOptions) -> ConvertResult:
    from pipelines.job import run_convert

    echo(f"converting {', '.join(opts.inputs)} -> {opts.output}")  # the summary's stream (stdout)
    return run_convert(opts)


def _warn_empty_splits(result: ConvertResult) -> None:
    """A warning for each split no record hashed into (readers refuse an empty split)."""
    written = sum(sp.get("num_records", 0) for sp in result.info.get("splits", {}).values())
    for name, sp in result.info.get("splits", {}).items():
        if written and not sp.get("num_records"):
            echo(f"warning: split {name!r} is empty: all {written} records hashed into the other split(s); "
                 f"readers refuse an empty split. Convert more records or change --splits/--split-key.",
                 err=True, color=typer.colors.YELLOW)


def _check_drift(output: str, against: str, limits: dict[str, float]) -> None:
    """``--check-against``: drift against an earlier output and skew between the splits; exit 1 over threshold."""
    from pipelines.cli.report import ReportError, build_report

    try:
        gate(build_report(output, against, limits), True)
    except ReportError as e:
        fail(f"--check-against: {e}")


def _print_plan(opts: ConvertOptions) -> None:
    """``convert --dry-run``: checks the config against the data (and a reused
    analysis against the config) and prints what a run would do."""
    from pipelines import remote
    from pipelines.job import load_analysis
    from pipelines.plan import plan

    with remote.filesystem_options(opts):
        p = plan(opts)
        if opts.analysis_from:  # refused here when it does not fit the config
            load_analysis(opts.analysis_from, p.config)
            echo(f"analysis: reused from {opts.analysis_from} (fits the config)")
    for line in p.describe():
        echo(line)


def infer(
    input: Annotated[list[str], typer.Option("--input", "-i", help="Input files, globs or directories: several after one -i, or repeat -i.")],
    sample: Annotated[int, typer.Option(help="Records to sample (from the first files).")] = 2000,
    label: Annotated[str | None, typer.Option(help="The label's source path, as in the config: a field (clicked), a list's item (y[0]), a nested field (n.a), a map's value (m[\"k\"]). Without it the draft has no label: a numeric field named label/target/clicked/y/... is named as the candidate (in the draft and on stderr) and left out of the features. The label's kind comes from the data: strings -> class names (transform: vocabulary), few integer values -> int64, other numbers -> float32; warns when it is null in part of the sample.")] = None,
    json_records_path: Annotated[str | None, typer.Option(help="Dotted key holding the record array in JSON documents.")] = None,
    max_record_mb: Annotated[float, typer.Option(help=_MAX_RECORD_HELP)] = _DEFAULT_RECORD_MB,
    max_block_mb: Annotated[float, typer.Option(help=_MAX_BLOCK_HELP)] = _DEFAULT_BLOCK_MB,
) -> None:
    """Draft a feature config from a sample of the data: `recordprep infer -i 'data/*.avro' > features.yaml`.

    One entry per leaf field with a transform chosen from the sample (numeric ->
    zscore, low-cardinality -> vocabulary, high-cardinality and identifiers (id,
    *_id, card numbers) -> hash, ISO 8601 strings -> timestamp, free text ->
    text, lists -> padded to their 95th-percentile length; lists of lists and
    maps -> their count plus paths through them: m[][], attrs[keys]; lists of
    records -> their items' fields, items[].price, with one length feature: the
    first numeric item field's <name>_len, which the others share (length_of),
    fields of ids writing none (length: false)) and a comment saying why. The draft converts the sampled
    data as it is: fields absent, null or empty in part of the sample (or under a
    list) get allow_all_missing; fields it cannot type are left out, saying why,
    and so are identifiers of the record itself (nearly one distinct value per
    record: request_id, event_id). Vocabularies get top_k from the sample's
    distinct count, with the estimated coverage in a comment. No label is chosen
    without --label. A file that is one JSON document holding one list of records
    is read from that list, saying which (convert then needs --json-records-path).
    """
    setup_logging(False)
    from convert.infer import infer_config, render_yaml
    from convert.infer_labels import label_path_problem
    from pipelines.options import OptionsError, input_cap_bytes
    from pipelines.plan import InputError, discover

    if sample < 1:
        fail("--sample must be >= 1", 2)
    try:
        max_record_bytes = input_cap_bytes("--max-record-mb", max_record_mb)
        max_block_bytes = input_cap_bytes("--max-block-mb", max_block_mb)
    except OptionsError as e:
        fail(str(e), 2)
    try:
        files = discover(input)
    except InputError as e:
        fail(str(e), 2)

    records, schemas, bad, first_bad, read_from = _sample_records(
        files, input, sample, json_records_path, max_record_bytes, max_block_bytes)
    header = f"inferred from {len(records)} records of {len(files)} file(s)"
    keys = _records_keys(read_from) if not records and bad and json_records_path is None else []
    if len(keys) == 1:  # one JSON document holding one list of records: read it, and say so
        records, schemas, bad, first_bad, read_from = _sample_records(
            files, input, sample, keys[0], max_record_bytes, max_block_bytes)
        note = (f"the records are the list at {keys[0]!r} of one JSON document: pass --json-records-path {keys[0]} "
                f"to convert (and to infer)")
        echo(f"note: {note}", err=True, color=typer.colors.YELLOW)
        header = f"inferred from {len(records)} records of {len(files)} file(s); {note}"
    where = _describe_files(read_from)
    if not records:
        fail(f"no records found in {where}; nothing to infer from{_no_records_hint(bad, first_bad, read_from)}")
    problem = label_path_problem(label, records, schemas) if label else None
    if problem:  # what convert's config check would say of this label
        fail(f"--label {label!r}: {problem}", 2)
    config, drafts = infer_config(records, schemas or None, label)
    if not config["features"]:
        fail(f"unsupported input: no field of the {len(records)} sampled records of {where} can be vectorized "
              f"({'; '.join(d.comment for d in drafts) or 'the records have no fields'}); check that the input is "
              f"the data you meant (its records declare no field, or only fields that are null in the sample: "
              f"--sample more records if values come later)")
    for d in drafts:  # the label's: null in part of the sample, or not a kind of label convert takes
        for w in d.warnings:
            echo(f"warning: {w}", err=True, color=typer.colors.YELLOW)
    typer.echo(render_yaml(config, drafts, header=header), nl=False)


def _sample_records(files: list[InputFile], input: list[str], sample: int, json_records_path: str | None,
                    max_record_bytes: int, max_block_bytes: int) -> tuple[list, list, int, str, list[str]]:
    """``infer``'s sample: up to ``sample`` records from the first files, in order.

    Returns ``(records, schemas, bad, first_bad, read_from)``: the writer
    schemas of the Avro files read (maps, logical types), how many lines were
    not records and the first of them, and the files read. A file that cannot
    be read ends the command naming it.
    """
    from apache_beam.io.filesystems import FileSystems

    from convert.sources import InputFileError, iter_records, read_record_schema

    schemas: list = []
    records: list = []
    bad = 0
    first_bad = ""
    read_from: list[str] = []
    try:
        for f in files:
            read_from.append(f.path)
            with FileSystems.open(f.path, compression_type="uncompressed") as fh:
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
                schema = read_record_schema(fh, f.path)  # None: a format without one (JSON)
                if schema is not None:
                    schemas.append(schema)
            if len(records) >= sample:
                break
    except InputFileError as e:
        fail(f"cannot read input {e}")
    except (OSError, ValueError) as e:  # a file vanished, or a reader bug: still one line
        fail(f"cannot read input {read_from[-1] if read_from else input}: {type(e).__name__}: {e}")
    return records, schemas, bad, first_bad, read_from


def _no_records_hint(bad: int, first_bad: str, read_from: list[str]) -> str:
    """What to do when ``infer`` found no records: the lines that were not records, or where records are."""
    hint = ""
    if bad:
        hint = f"; {bad} line(s) are not JSON objects (first: {first_bad})"
        keys = _records_keys(read_from)
        if keys:
            hint += (f"; the file is one JSON document: name the key holding the records with --json-records-path "
                     f"{keys[0]} (lists of records in it: {', '.join(keys[:5])})")
    if not hint:
        hint = ("; point -i at files that hold records, or write the config by hand (docs/feature-config.md): "
                "convert turns files without records into an empty output")
    return hint


def _describe_files(paths: list[str]) -> str:
    if len(paths) == 1:
        return paths[0]
    shown = ", ".join(paths[:3])
    return f"{len(paths)} files ({shown}{', ...' if len(paths) > 3 else ''})"


def _records_keys(paths: list[str]) -> list[str]:
    """The ``--json-records-path`` of each list of records in the first file that is one
    JSON object holding some (``statuses``), else ``[]``."""
    import orjson
    from apache_beam.io.filesystems import FileSystems

    from convert.formats.jsonl import record_lists

    for p in paths[:3]:
        try:
            with FileSystems.open(p, compression_type="uncompressed") as fh:
                data = fh.read(64 * 1024 * 1024 + 1)
            if len(data) > 64 * 1024 * 1024:
                continue
            doc = orjson.loads(data.removeprefix(b"\xef\xbb\xbf"))
        except Exception:  # noqa: BLE001 - only a hint
            continue
        if keys := record_lists(doc):
            return keys
    return []


def estimate(
    records: Annotated[float, typer.Option(help="Records in the input (e.g. 1e9; a whole number > 0).")],
    input_gb: Annotated[float, typer.Option(help="Input size in GB (10^9 bytes; > 0).")],
    distinct_ids: Annotated[float, typer.Option(help="Distinct values of the largest vocabulary feature (>= 0): sizes the term counts a worker process holds.")] = 0,
    machine_type: Annotated[str, typer.Option(help="Dataflow worker machine type (n1-standard-4, n2-standard-8, ...).")] = "n1-standard-4",
    splits: Annotated[int, typer.Option(help="Number of splits (1..256).")] = 2,
    target_shard_mb: Annotated[float, typer.Option(help="As convert's --target-shard-mb (> 0).")] = 128.0,
    cpu_us_per_record: Annotated[float | None, typer.Option(help="CPU µs per record measured on your data (a local run's CPU-s / records; > 0); default: the bench's.", show_default=False)] = None,
    utilization: Annotated[float, typer.Option(help="Share of the workers' vCPU-hours spent converting (0 < u <= 1).")] = 0.7,
    vcpu_hour_usd: Annotated[float | None, typer.Option(help="Price of a vCPU-hour (> 0; default: pipelines/estimate.py PRICES).", show_default=False)] = None,
    gb_hour_usd: Annotated[float | None, typer.Option(help="Price of a GB-hour of worker memory (> 0).", show_default=False)] = None,
) -> None:
    """Size a conversion before running it: units, shards, requests, memory per worker,
    worker-hours and cost on Dataflow, beside TF Transform on the same job (docs: Sizing a job).

    Every number is checked (finite, in its range) before anything is computed: exit 2 naming the option.
    """
    from pipelines.estimate import MEASURED, PRICES, EstimateError, JobSize, render
    from pipelines.estimate import estimate as run_estimate

    given = {"cpu_us_per_record": (cpu_us_per_record, MEASURED["cpu_us_per_record"]),
             "vcpu_hour_usd": (vcpu_hour_usd, PRICES["vcpu_hour"]), "gb_hour_usd": (gb_hour_usd, PRICES["gb_hour"])}
    try:
        job = JobSize(records=records, input_bytes=input_gb * 1e9, distinct_ids=distinct_ids,  # type: ignore[arg-type]
                      machine_type=machine_type, splits=splits, target_shard_mb=target_shard_mb,
                      utilization=utilization, **{k: default if v is None else v for k, (v, default) in given.items()})
        lines = render(job, run_estimate(job))
    except EstimateError as e:
        fail(str(e), 2)
    for line in lines:
        typer.echo(line)
