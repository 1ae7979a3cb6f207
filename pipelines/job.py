"""Building and running the conversion pipeline.

``run_convert`` is the library entry point behind ``recordprep convert``: it
plans in the launcher (inputs, shards, fingerprint), builds the Beam pipeline
from the PTransforms in ``pipelines.transforms``, runs it, and returns a
summary. The default runner is Beam's in-process ``FnApiRunner``, chosen
explicitly: ``DirectRunner`` first tries to download the Prism runner binary,
which hangs or fails on an offline or firewalled machine. Any other runner
comes from the Beam flags passed through (``-- --runner DataflowRunner ...``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import re
import time
from importlib import metadata
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from convert.config import load_config
from convert.sources import InputFileError
from convert.spec import FAILURE_FILENAME, METADATA_FILENAME, DatasetInfo
from pipelines import remote
from pipelines._loopback import bind_loopback_only
from pipelines._progress import PASSES, PROGRESS_DIR, ProgressReporter
from pipelines._warm import WarmPool
from pipelines._worker import command as worker_command
from pipelines._worker import schemes_of, shorten_bundle_end_waits
from pipelines.options import ConvertOptions
from pipelines.plan import default_num_shards, discover, input_fingerprint, plan_units
from pipelines.staging import LOCAL_RUNNERS, staging_args
from pipelines.transforms import (
    ANALYSIS_FILENAME,
    TMP_DIR,
    AnalysisValue,
    AnalyzeUnits,
    CommitContext,
    CommitOutput,
    ConversionFailed,
    ConvertUnits,
)

log = logging.getLogger("recordprep")


class OutputExistsError(RuntimeError):
    pass


def tool_version() -> str:
    try:
        return metadata.version("recordprep")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclasses.dataclass
class ConvertResult:
    """What a run did. ``skipped`` is True when the output was already complete."""

    output: str
    skipped: bool
    info: dict[str, Any]
    seconds: float

    def summary_lines(self) -> list[str]:
        info = self.info
        counts = info.get("counts", {})
        lines = [f"output: {self.output}" + ("  (already complete for these inputs and config: nothing to do)" if self.skipped else "")]
        lines.append(f"records read: {counts.get('read', 0)}   rejected (error output): {counts.get('errors', 0)}")
        for name, sp in info.get("splits", {}).items():
            lines.append(f"  {name:<8} {sp['num_records']:>10} records  {len(sp['shards']):>4} shards  {sp['num_bytes'] / 1e6:9.2f} MB")
        for ef in info.get("errors", {}).get("files", []):
            lines.append(f"  errors   {ef['count']:>10} records in {ef['file']}")
        if not self.skipped:
            n = counts.get("read", 0)
            rate = n / self.seconds if self.seconds > 0 else 0.0
            lines.append(f"time: {self.seconds:.1f} s ({rate:,.0f} records/s)")
        return lines


def read_existing(output: str) -> dict[str, Any] | None:
    path = FileSystems.join(output, METADATA_FILENAME)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return DatasetInfo.loads(f.read(), source=path).to_json()


def _clear_output(output: str) -> None:
    """Remove a previous dataset, metadata first so no reader sees a mix."""
    meta = FileSystems.join(output, METADATA_FILENAME)
    if FileSystems.exists(meta):
        FileSystems.delete([meta])
    matched = FileSystems.match([FileSystems.join(output, "*")])[0].metadata_list
    if matched:
        FileSystems.delete([m.path for m in matched])
    for sub in ("vocab", "errors"):
        # Object stores have no directories: delete what is under the prefix,
        # then the directory where there is one (local, HDFS).
        try:
            inner = FileSystems.match([FileSystems.join(output, sub, "*")])[0].metadata_list
        except BeamIOError:  # HDFS: listing a missing directory fails
            inner = []
        if inner:
            FileSystems.delete([m.path for m in inner])
        d = FileSystems.join(output, sub)
        if FileSystems.exists(d):
            FileSystems.delete([d])


def _load_analysis(old_output: str) -> dict[str, Any]:
    path = FileSystems.join(old_output, ANALYSIS_FILENAME)
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"--analysis-from {old_output}: no {ANALYSIS_FILENAME} there; point it at a completed recordprep output")
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return json.loads(f.read())


#: Below this much input, starting worker processes (each loads Beam, ~3 s
#: and ~180 MB) costs more than a second core gains; measured with bench/.
MULTIPROCESS_MIN_BYTES = 32 * 1024 * 1024


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _beam_sets_workers(beam_args: tuple[str, ...]) -> bool:
    return any(a.startswith(("--direct_num_workers", "--direct_running_mode")) for a in beam_args)


def local_workers(opts: ConvertOptions, total_bytes: int, num_units: int, beam_args: tuple[str, ...] = ()) -> int:
    """Worker processes for a local run: ``opts.workers`` if given; else one
    per core (at most one per work unit) when the input repays their start-up.
    Beam flags ``--direct_num_workers``/``--direct_running_mode`` win."""
    if _beam_sets_workers(beam_args):
        return 1  # the user's Beam flags decide; leave them untouched
    if opts.workers is not None:
        return opts.workers
    if total_bytes < MULTIPROCESS_MIN_BYTES:
        return 1
    return max(1, min(_cores(), num_units))


class _DropModeWarning(logging.Filter):
    """Beam warns that ``direct_num_workers`` > 1 wants a multi-process running
    mode; ours is multi-process through its own worker environment."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


_DROP_MODE_WARNING = _DropModeWarning()


def _multiprocess_runner(fn_api_runner: Any, command: str) -> Any:
    """An FnApiRunner whose workers are ``python -m pipelines._worker`` processes.

    The same as ``--direct_running_mode multi_processing`` (which hard-codes
    Beam's own worker command) with our worker entry point: less memory per
    worker, loopback-only gRPC (see :mod:`pipelines._worker`); ``command``
    (``worker_command``) names the file systems of every path the workers
    open, so they load only those. A :class:`~pipelines._warm.WarmPool` may
    serve these starts with forked children instead.
    """
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").addFilter(_DROP_MODE_WARNING)
    return fn_api_runner(default_environment=SubprocessSDKEnvironment.from_command_string(command))


def plan(opts: ConvertOptions) -> dict[str, Any]:
    """Everything the run will do, without running it (``--dry-run``)."""
    remote.pipeline_options(opts)  # hdfs:// flags, set on FileSystems before listing inputs
    config = load_config(opts.config)
    files = discover(opts.inputs)
    total = sum(f.size for f in files)
    n = opts.num_shards or default_num_shards(total, opts.target_shard_mb)
    units = plan_units(files, n, opts.json_records_path)
    return {
        "inputs": [{"path": f.path, "size": f.size} for f in files],
        "total_bytes": total,
        "num_shards": n,
        "units": [[(r.path, r.start, r.end) for r in u.ranges] for u in units],
        "splits": dict(zip(opts.splits.names, opts.splits.weights, strict=True)),
        "split_key": opts.splits.key,
        "features": config.to_json(),
        "fingerprint": input_fingerprint(files, config.hash, opts.fingerprint_fields()),
        "config": config,
        "files": files,
        "unit_objs": units,
    }


class _ViewCachingOptions(PipelineOptions):
    """``PipelineOptions`` that make each view once.

    Beam asks the pipeline's options for a view per transform it applies
    (``view_as(TypeOptions)`` and others, 145 calls building this job), and
    every view builds an argparse parser of its options and parses the flags
    again: 0.21-0.23 s of the job's set-up, measured. Views of one options
    object share its values (``_all_options``) and its flags never change, so
    a view made once answers every later call alike. Adds no options.
    """

    def view_as(self, cls):  # type: ignore[override]
        views = self.__dict__.setdefault("_recordprep_views", {})
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_recordprep_views", None)  # rebuilt on demand
        return state


def run_convert(opts: ConvertOptions) -> ConvertResult:
    """Convert ``opts.inputs`` into a committed dataset at ``opts.output``.

    Idempotent: if the output already holds a dataset with the same
    fingerprint (inputs' paths, sizes and mtimes; config; options), nothing
    runs. A different dataset there is refused unless ``overwrite``.

    Raises:
      ConversionFailed: records were rejected beyond the tolerance (the error
        output and ``_FAILURE.json`` are written, no dataset is committed).
      OutputExistsError: the output holds another dataset.
    """
    t0 = time.perf_counter()
    p = plan(opts)
    config, files, units = p["config"], p["files"], p["unit_objs"]
    fingerprint = p["fingerprint"]

    existing = read_existing(opts.output)
    if existing is not None:
        if existing.get("fingerprint") == fingerprint:
            log.info("%s is already complete for these inputs and config; nothing to do", opts.output)
            return ConvertResult(opts.output, True, existing, time.perf_counter() - t0)
        if not opts.overwrite:
            raise OutputExistsError(
                f"{opts.output} already holds a dataset made from other inputs or another config "
                f"(fingerprint {str(existing.get('fingerprint'))[:12]}, this run {fingerprint[:12]}); "
                f"pass --overwrite to replace it, or write to a new directory such as {opts.output.rstrip('/')}/dt=YYYY-MM-DD/"
            )
        _clear_output(opts.output)

    # A failure marker from an earlier run would make `recordprep wait` and
    # readers.wait_for_dataset give up on this run before it finishes.
    stale = FileSystems.join(opts.output, FAILURE_FILENAME)
    if FileSystems.exists(stale):
        FileSystems.delete([stale])

    remote.pipeline_options(opts)  # also hands the hdfs:// flags to FileSystems
    args = remote.beam_args_for(opts)
    runner_name = PipelineOptions(args).view_as(StandardOptions).runner
    local = runner_name is None or runner_name.split(".")[-1] in LOCAL_RUNNERS
    # Remote workers get this package as a wheel (no setup.py, no TensorFlow).
    args += staging_args(runner_name, opts.beam_args)
    if local:
        # Beam's local gRPC servers would otherwise listen on every interface.
        bind_loopback_only()
        shorten_bundle_end_waits()  # in-process bundles (workers do it themselves)
    in_process = False
    warm: WarmPool | None = None
    if runner_name is None:
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        workers = local_workers(opts, p["total_bytes"], len(units), beam_args=opts.beam_args)
        runner: Any = FnApiRunner()
        if workers > 1:
            paths = [f.path for f in files] + [opts.output] + ([opts.analysis_from] if opts.analysis_from else [])
            command = worker_command(schemes_of(paths))
            runner = _multiprocess_runner(FnApiRunner, command)
            args += ["--direct_num_workers", str(workers)]
            # Before any thread starts: the workers fork from this process (pipelines/_warm.py).
            warm = WarmPool.start(workers, command)
        in_process = workers == 1 and not _beam_sets_workers(opts.beam_args)
        runner_name = ("FnApiRunner (local, in-process)" if in_process
                       else f"FnApiRunner (local, {workers} worker processes{', pre-forked' if warm else ''})")
    else:
        runner = None
    try:  # the forked workers, if any, are dismissed whatever happens from here
        beam_opts = _ViewCachingOptions(args)

        ctx = CommitContext(
            inputs=files, num_shards=len(units), fingerprint=fingerprint, config_json=config.to_json(),
            config_hash=config.hash, runner=str(runner_name), tool_version=tool_version(),
            started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        )
        pipeline = beam.Pipeline(runner=runner, options=beam_opts)
        # The reshuffle spreads the units over workers; in one process there is
        # nothing to spread, and it costs a GroupByKey stage (~0.1 s measured).
        unit_pc = pipeline | "Units" >> beam.Create(units, reshuffle=not in_process)
        if opts.analysis_from:
            analysis = pipeline | "ReusedAnalysis" >> beam.Create([AnalysisValue(_load_analysis(opts.analysis_from))])
        else:
            analysis = unit_pc | "Analyze" >> AnalyzeUnits(config, opts)
        results = unit_pc | "Convert" >> ConvertUnits(config, opts, analysis)
        _ = results | "Commit" >> CommitOutput(config, opts, ctx, analysis)
        progress = opts.progress and local and "://" not in opts.output
        reporter = (ProgressReporter(FileSystems.join(opts.output, TMP_DIR, PROGRESS_DIR), p["total_bytes"],
                                     ("convert",) if opts.analysis_from else PASSES)
                    if progress else contextlib.nullcontext())
        try:
            with reporter, (warm.serving_beam() if warm else contextlib.nullcontext()):
                pipeline.run().wait_until_finish()
        except Exception as e:
            raise _unwrap(e) from e
    finally:
        if warm is not None:
            warm.close()
    info = read_existing(opts.output)
    if info is None:
        raise ConversionFailed(f"the pipeline finished but {opts.output}/{METADATA_FILENAME} was not written; see the runner's logs")
    return ConvertResult(opts.output, False, info, time.perf_counter() - t0)


def _clean(msg: str) -> str:
    msg = msg.strip()
    while msg.startswith(ConversionFailed.MARKER):
        msg = msg[len(ConversionFailed.MARKER):].strip()
    msg = msg.splitlines()[0] if msg else msg
    return re.sub(r"\s*\[while running '[^']*'\].*$", "", msg).strip(" '\"")


def _unwrap(e: BaseException) -> BaseException:
    """Beam wraps worker exceptions (often as text): recover ours and input errors."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ConversionFailed):
            return ConversionFailed(_clean(seen.message))
        if isinstance(seen, InputFileError):
            return ConversionFailed(f"cannot read input {_clean(str(seen))}")
        seen = seen.__cause__ or seen.__context__
    text = str(e)
    if ConversionFailed.MARKER in text:
        return ConversionFailed(_clean(text.split(ConversionFailed.MARKER, 1)[1]))
    for line in text.splitlines():
        if "InputFileError:" in line:
            return ConversionFailed("cannot read input " + _clean(line.split("InputFileError:", 1)[1]))
    return e
