"""Building and running the conversion pipeline.

``run_convert`` is the library entry point behind ``recordprep convert``: it
plans in the launcher (inputs, shards, fingerprint), builds the Beam pipeline
from the PTransforms of ``pipelines.analyze``, ``convert_pass``, ``shuffle`` and
``commit``, runs it, and returns a summary. The runner and what a local one sets up in this process come from
one entry, :func:`pipelines.local.runner_for`; the plan from
:func:`pipelines.plan.plan`. Beam's file systems have the run's options
(``--hdfs_*`` and the like) from its start to its end, and the ones they had
before after it (:func:`pipelines.remote.filesystem_options`).

The output is guarded in stages, each before the next may write
(:mod:`pipelines.output_guard`): an output overlapping an input is refused;
the output's lock is taken (:mod:`pipelines.lock`); the output's files are
checked (``_check_output``) and a previous dataset is cleared only of what a
recordprep run wrote; and a run that fails after that check leaves
``_FAILURE.json`` and no temp files (``_record_failure``). Every delete,
rename or write in the output is fenced: the run first proves it still holds
the lock (``OutputLock.check``, ``pipelines.lock.fence`` in the commit); a run
that lost it raises ``LockLostError`` and touches nothing more, not even to
record its failure (the files there may be the new holder's).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import posixpath
import re
import time
import uuid
from importlib import metadata
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from convert.analysis import Analysis, AnalysisMismatchError
from convert.apply import check_reused_analysis
from convert.config import Config, ConfigError
from convert.sources import InputFileError
from convert.spec import FAILURE_FILENAME, FORMAT_VERSION, METADATA_FILENAME
from pipelines import local, remote
from pipelines._fs import delete as fs_delete
from pipelines._fs import read_file
from pipelines.analyze import AnalysisValue, AnalyzeUnits
from pipelines.commit import CommitContext, CommitOutput, cleanup_tmp, write_atomic
from pipelines.convert_pass import ConvertUnits
from pipelines.interrupt import Interrupted, Stopped, received, stop_main
from pipelines.lock import LockLostError, OutputLock, lock_timing
from pipelines.options import ConvertOptions
from pipelines.output_guard import (
    OutputExistsError,
    clear_output,
    guard_output,
    read_existing,
    refuse_clashing_files,
    refuse_unknown_files,
)
from pipelines.plan import Plan, plan
from pipelines.run_files import ANALYSIS_FILENAME, ERRORS_DIR, TMP_DIR, ConversionFailed
from pipelines.shuffle import GatherShards
from pipelines.staging import staging_args

log = logging.getLogger("recordprep")


def new_run_id() -> str:
    """12 hex digits naming one run's shards, unique per run (not derived from the inputs: a
    re-conversion of the same data must not reuse the names a reader of the old one holds)."""
    return uuid.uuid4().hex[:12]


def tool_version() -> str:
    try:
        return metadata.version("recordprep")
    except metadata.PackageNotFoundError:
        return "0+unknown"


#: How many error files a run's summary names (the line gives their total and directory).
_ERROR_FILES_SHOWN = 3


@dataclasses.dataclass
class ConvertResult:
    """What a run did. ``skipped`` is True when the output was already complete.

    ``workers``: the worker processes of a local run (1: in-process, or a
    remote runner); ``pre_forked``: how many of them were forked from this
    process (``ConvertOptions.pre_fork``) rather than started by Beam.
    """

    output: str
    skipped: bool
    info: dict[str, Any]
    seconds: float
    workers: int = 1
    pre_forked: int = 0

    def summary_lines(self) -> list[str]:
        info = self.info
        counts = info.get("counts", {})
        skipped = "  (already complete for these inputs and config: nothing to do; --force re-runs it)"
        lines = [f"output: {self.output}" + (skipped if self.skipped else "")]
        lines.append(f"records read: {counts.get('read', 0)}   rejected (error output): {counts.get('errors', 0)}")
        for name, sp in info.get("splits", {}).items():
            lines.append(f"  {name:<8} {sp['num_records']:>10} records  {len(sp['shards']):>4} shards  {sp['num_bytes'] / 1e6:9.2f} MB")
        error_files = info.get("errors", {}).get("files", [])
        if error_files:  # one line however many work units rejected records
            total = sum(ef["count"] for ef in error_files)
            names = [posixpath.basename(ef["file"]) for ef in error_files]
            more = len(names) - _ERROR_FILES_SHOWN
            shown = ", ".join(names[:_ERROR_FILES_SHOWN]) + (f" and {more} more" if more > 0 else "")
            lines.append(f"  errors   {total:>10} records in {self.output.rstrip('/')}/{ERRORS_DIR}/ "
                         f"({len(names)} file{'s' if len(names) > 1 else ''}: {shown})")
        if not self.skipped:
            n = counts.get("read", 0)
            rate = n / self.seconds if self.seconds > 0 else 0.0
            how = f"; {self.workers} worker processes, {self.pre_forked} pre-forked" if self.workers > 1 else ""
            lines.append(f"time: {self.seconds:.1f} s ({rate:,.0f} records/s{how})")
        return lines


def load_analysis(old_output: str, config: Config) -> dict[str, Any]:
    """The analysis of an earlier output (``--analysis-from``), checked against ``config``.

    Raises:
      FileNotFoundError: ``old_output`` has no analysis.
      AnalysisMismatchError: a feature of ``config`` has no vocabulary or
        statistics there, or ones computed with another transform or options
        (``Analysis.check_config``); also when the file is not an analysis.
    """
    path = FileSystems.join(old_output, ANALYSIS_FILENAME)
    if not FileSystems.exists(path):
        raise FileNotFoundError(f"--analysis-from {old_output}: no {ANALYSIS_FILENAME} there; point it at a completed recordprep output")
    with FileSystems.open(path, compression_type="uncompressed") as f:
        raw = f.read()
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise AnalysisMismatchError(f"--analysis-from {old_output}: {path} is not a recordprep analysis "
                                    f"({type(e).__name__}: {str(e)[:200]}); point it at a completed recordprep output") from None
    analysis = Analysis.load(data, where=f"--analysis-from {old_output}: {path}")
    check_reused_analysis(read_file, old_output, FileSystems.join, raw)  # the metadata's digest and spec
    unverified = analysis.check_config(config, where=f"--analysis-from {old_output}: its {ANALYSIS_FILENAME}")
    if unverified:
        log.warning("--analysis-from %s: %s predates recording transforms and options; it has vocabularies/statistics "
                    "for %s but whether they were computed with this config's transforms and options cannot be verified",
                    old_output, ANALYSIS_FILENAME, ", ".join(unverified))
    return data


class _ViewCachingOptions(PipelineOptions):
    """``PipelineOptions`` that make each view once.

    Beam asks the pipeline's options for a view per transform it applies
    (``view_as(TypeOptions)`` and others, many times per job), and every view
    builds an argparse parser of its options and parses the flags again: a
    measurable part of the job's set-up (the count and the cost:
    docs/benchmarks.md#design-converter). Views of one options
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
    runs (unless ``force``). A different dataset there is refused unless
    ``overwrite`` (or ``force``), which removes only what a recordprep run
    wrote. The output is locked (:mod:`pipelines.lock`) from before anything
    is checked, cleared or written until the run ends (the lock is released
    whatever ends the run); any failure once the output is found to be this
    run's to write, a signal included, leaves ``_FAILURE.json`` (the reason)
    and no temp files.

    Raises:
      OutputPathError: the output is, contains or lies inside an input.
      OutputExistsError: the output holds another dataset (or, with
        ``overwrite``, files no recordprep run wrote).
      LockHeldError: another live conversion is writing the output.
      ConversionFailed: the run failed (rejected records beyond the
        tolerance, unreadable input); ``_FAILURE.json`` says why.
    """
    t0 = time.perf_counter()
    with remote.filesystem_options(opts) as beam_options:  # the launcher's own I/O; restored when the run ends
        return _convert(opts, beam_options, t0)


def _convert(opts: ConvertOptions, beam_options: PipelineOptions, t0: float) -> ConvertResult:
    """:func:`run_convert` in stages: plan, guard the output, lock it, check it, clear it, run, read the result."""
    p = plan(opts)
    guard_output(opts, list(p.files))
    existing = _check_existing(opts, p.fingerprint)
    if existing is not None:
        return ConvertResult(opts.output, True, existing, time.perf_counter() - t0)
    analysis = load_analysis(opts.analysis_from, p.config) if opts.analysis_from else None  # before any clearing

    lock = _lock(opts, p.fingerprint, beam_options)
    try:  # released even when a signal ends acquire() after the lock file was made
        lock.acquire()
        existing, previous = _check_output(opts, p.fingerprint, lock)
        if existing is not None:  # the run that held the lock made this very dataset
            return ConvertResult(opts.output, True, existing, time.perf_counter() - t0)
        # From here on the output is this run's: any failure, a signal included, leaves the
        # marker, unless the lock is no longer provably ours (then nothing may be touched).
        try:
            lock.check("clear (clearing the previous dataset)")
            _clear_previous(opts, previous)
            workers, pre_forked = _run(p, analysis, lock)
        except BaseException as e:
            if not lock.still_ours():
                raise _lost(lock, e) from e
            _record_failure(opts.output, p.fingerprint, e)
            raise
    finally:
        lock.release()
    info = read_existing(opts.output)
    if info is None:
        raise ConversionFailed(f"the pipeline finished but {opts.output}/{METADATA_FILENAME} was not written; see the runner's logs")
    return ConvertResult(opts.output, False, info, time.perf_counter() - t0, workers, pre_forked)


def _lock(opts: ConvertOptions, fingerprint: str, beam_options: PipelineOptions) -> OutputLock:
    """The output's lock; on gs:// through a client made from the job's Beam options (project, credentials).

    Once lost (see :class:`OutputLock`), the run is stopped where it is
    (:func:`pipelines.interrupt.stop_main`, when the CLI allows it), not
    only at its next fence: a run whose store died fails within bounded time.
    """
    client = None
    if opts.output.startswith("gs://"):
        from apache_beam.io.gcp.gcsio import create_storage_client

        client = create_storage_client(beam_options)
    heartbeat, stale_after = lock_timing()
    lock = OutputLock(opts.output, fingerprint=fingerprint, version=tool_version(), gcs_client=client,
                      heartbeat_seconds=heartbeat, stale_after_seconds=stale_after)
    lock.on_lost = stop_main
    return lock


def _lost(lock: OutputLock, e: BaseException) -> BaseException:
    """What a failed run whose lock is not provably its own raises: the signal that ended it, or LockLostError."""
    signalled = e if isinstance(e, Interrupted | KeyboardInterrupt) else received()  # Beam may re-make it
    if signalled is not None:
        log.error("%s: not recording the failure, since the lock of %s %s", failure_reason(signalled), lock.output,
                  lock.lost or "could not be refreshed")
        return signalled
    seen: BaseException | None = e
    for _ in range(20):  # the fence's own error, if it is in the chain (in-process runs)
        if seen is None:
            break
        if isinstance(seen, Stopped):  # the heartbeat thread stopped the run (stop_main)
            if not isinstance(seen.reason, LockLostError):  # re-made from its text by Beam on the way
                break
            seen = seen.reason
        if isinstance(seen, LockLostError):
            return LockLostError(lock.output, seen.why, seen.step)
        seen = seen.__cause__ or seen.__context__
    return LockLostError(lock.output, lock.lost or f"could not be refreshed after the run failed ({failure_reason(e)})")


def _check_existing(opts: ConvertOptions, fingerprint: str) -> dict[str, Any] | None:
    """The output's metadata when it is this very dataset (nothing to do); None when the run may go on.

    ``force`` re-runs even then. Raises OutputExistsError when it holds
    another dataset and neither ``overwrite`` nor ``force`` is on.
    """
    return _done_or_refused(opts, fingerprint, read_existing(opts.output))


def _done_or_refused(opts: ConvertOptions, fingerprint: str, existing: dict[str, Any] | None) -> dict[str, Any] | None:
    """``_check_existing`` of the metadata ``existing`` the caller read."""
    if existing is None:
        return None
    if existing.get("fingerprint") == fingerprint and not opts.force:
        log.info("%s is already complete for these inputs and config; nothing to do", opts.output)
        return existing
    if not (opts.overwrite or opts.force):
        old = existing.get("format_version")
        changed = _changed_options(opts, existing)
        if type(old) is int and old < FORMAT_VERSION:
            made = (f"written by an older recordprep (format_version {old}; this one writes {FORMAT_VERSION}, "
                    f"with other hash and text ids)")
        elif changed:
            made = f"made with other options ({'; '.join(changed)}; pass the same to keep it)"
        else:
            made = "made from other inputs or another config"
        raise OutputExistsError(
            f"{opts.output} already holds a dataset {made} "
            f"(fingerprint {str(existing.get('fingerprint'))[:12]}, this run {fingerprint[:12]}); "
            f"pass --overwrite to replace it, or write to a new directory such as {opts.output.rstrip('/')}/dt=YYYY-MM-DD/"
        )
    return None


def _changed_options(opts: ConvertOptions, existing: dict[str, Any]) -> list[str]:
    """Each fingerprinted option whose value differs between the output's ``dataset_info.json``
    and this run, as ``--flag: THERE there, HERE here``. A changed default counts too, so a
    re-run after an upgrade names the flag that keeps the output instead of blaming the inputs."""
    theirs = existing.get("options")
    if not isinstance(theirs, dict):
        return []
    ours = json.loads(json.dumps(opts.fingerprint_fields(), default=str))
    return [f"--{k.replace('_', '-')}: {json.dumps(theirs.get(k))} there, {json.dumps(ours.get(k))} here"
            for k in sorted(set(theirs) | set(ours)) if theirs.get(k) != ours.get(k)]


def _check_output(opts: ConvertOptions, fingerprint: str,
                  lock: OutputLock) -> tuple[dict[str, Any] | None, list[str] | None]:
    """Under the lock, before anything is written: whether the output may be written.

    Returns ``(done, previous)``: the metadata when the output already is
    this dataset (a run that held the lock before made it), else None; and
    the files of a previous dataset to remove (``overwrite``), else None.
    Raises OutputExistsError for another dataset without ``overwrite``, or
    for files no recordprep run left: no failure marker may be written
    there, since a marker makes the next run take such files for a failed
    run's leftovers.
    """
    existing = read_existing(opts.output)  # once: on gs:// every read is a round trip under the lock
    done = _done_or_refused(opts, fingerprint, existing)
    if done is not None:
        return done, None
    if existing is None:
        refuse_clashing_files(opts.output, took_over=lock.took_over is not None)
        return None, None
    return None, refuse_unknown_files(opts.output, existing)


def _clear_previous(opts: ConvertOptions, previous: list[str] | None) -> None:
    """Under the lock: remove the previous dataset's ``previous`` files (``overwrite``) and an old failure marker."""
    if previous is not None:
        clear_output(opts.output, previous)
    # A failure marker from an earlier run would make `recordprep wait` and
    # readers.wait_for_dataset give up on this run before it finishes.
    stale = FileSystems.join(opts.output, FAILURE_FILENAME)
    if FileSystems.exists(stale):
        fs_delete([stale])


def failure_reason(e: BaseException) -> str:
    """One line saying why a run failed, as the CLI prints it."""
    if isinstance(e, ConversionFailed):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted (KeyboardInterrupt)"
    if isinstance(e, Interrupted):
        return str(e)  # "interrupted by SIGTERM"
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _record_failure(output: str, fingerprint: str, e: BaseException) -> None:
    """After a failed run: remove the temp files, then write ``_FAILURE.json``, best effort.

    Temp files go first: after a full disk they are what keeps it full, and
    the marker needs room. A marker the run already wrote (rejected records,
    with their counts) is kept.
    """
    cleanup_tmp(output)
    marker = FileSystems.join(output, FAILURE_FILENAME)
    try:
        if FileSystems.exists(marker):
            return
        write_atomic(marker, json.dumps({
            "reason": failure_reason(e), "fingerprint": fingerprint,
            "failed": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        }, indent=2).encode())
    except Exception as err:  # noqa: BLE001 - the run's own error is the one to report
        log.warning("could not write %s: %s", marker, err)


def _build_pipeline(p: Plan, analysis: dict[str, Any] | None, runner: local.Runner,
                    lock: OutputLock) -> beam.Pipeline:
    """The job's pipeline: analyze (or reuse an analysis), convert, gather the shuffled shards, commit."""
    opts, config, units = p.options, p.config, list(p.units)
    ctx = CommitContext(
        inputs=list(p.files), num_shards=len(units), fingerprint=p.fingerprint, config_json=config.to_json(),
        config_hash=config.hash, runner=runner.label, tool_version=tool_version(),
        started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), run_id=new_run_id(),
        lock_token=lock.token, lock_max_age=lock.lost_after,
    )
    pipeline = beam.Pipeline(runner=runner.beam_runner, options=_ViewCachingOptions(runner.args))
    # The reshuffle spreads the units over workers; in one process there is
    # nothing to spread, and it costs a GroupByKey stage.
    in_process = runner.in_process
    unit_pc = pipeline | "Units" >> beam.Create(units, reshuffle=not in_process)
    if analysis is not None:
        analysis_pc = pipeline | "ReusedAnalysis" >> beam.Create([AnalysisValue(analysis)])
    else:
        analysis_pc = unit_pc | "Analyze" >> AnalyzeUnits(config, opts, len(units))
    results, stats = unit_pc | "Convert" >> ConvertUnits(config, opts, analysis_pc, len(units), len(units))
    gathered = None
    if opts.shuffle_seed is not None:  # one element per output shard, after every unit scattered
        gathered = (pipeline | "ShardIndexes" >> beam.Create(range(len(units)), reshuffle=not in_process)
                    | "Gather" >> GatherShards(opts, len(units), results, parallel=2 if in_process else 1))
    _ = stats | "Commit" >> CommitOutput(config, opts, ctx, analysis_pc, results, gathered)
    return pipeline


def _beam_args(opts: ConvertOptions) -> tuple[list[str], str | None]:
    """The run's Beam flags (given, derived for remote paths, staging for remote workers) and the runner they name."""
    args = remote.beam_args_for(opts)
    runner_name = PipelineOptions(args).view_as(StandardOptions).runner
    # Remote workers get this package as a wheel (no setup.py, no TensorFlow).
    return args + staging_args(runner_name, opts.beam_args), runner_name


def _run(p: Plan, analysis: dict[str, Any] | None, lock: OutputLock) -> tuple[int, int]:
    """Build and run the pipeline; Beam's wrapped errors come out as ours (``_unwrap``).

    Returns ``(worker processes, how many of them were pre-forked)``. Every
    change to gRPC and Beam the run makes is undone when it returns or raises
    (:func:`pipelines.local.runner_for`).
    """
    opts = p.options
    args, runner_name = _beam_args(opts)
    paths = (*(f.path for f in p.files), opts.output, *((opts.analysis_from,) if opts.analysis_from else ()))
    tmp_dir = FileSystems.join(opts.output, TMP_DIR) if opts.progress and "://" not in opts.output else None
    work = local.Work(total_bytes=p.total_bytes, num_units=p.num_shards, paths=paths, tmp_dir=tmp_dir)
    with local.runner_for(opts, args, runner_name, work) as runner:
        lock.start_heartbeat()  # a thread: only once the workers are forked
        pipeline = _build_pipeline(p, analysis, runner, lock)
        try:
            runner.run(pipeline)
        except Exception as e:
            raise _unwrap(e) from e
        return runner.workers, runner.pre_forked


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
        if "ConfigError:" in line:  # the analysis' checks, raised in a worker process
            return ConfigError(_clean(line.split("ConfigError:", 1)[1]))
    return e
