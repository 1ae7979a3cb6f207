"""Building and running the conversion pipeline.

``run_convert`` is the library entry point behind ``recordprep convert``: it
plans in the launcher (inputs, shards, fingerprint), builds the Beam pipeline
from the PTransforms of ``pipelines.analyze``, ``convert_pass``, ``shuffle`` and
``commit``, runs it, and returns a summary. The runner and what a local one sets up in this process come from
one entry, :func:`pipelines.local.runner_for`; the plan from
:func:`pipelines.plan.plan`. Beam's file systems have the run's options
(``--hdfs_*`` and the like) from its start to its end, and the ones they had
before after it (:func:`pipelines.remote.filesystem_options`).

The output is guarded in stages, each before the next may write: an output
overlapping an input is refused (``_guard_output``); the output's lock is
taken (:mod:`pipelines.lock`); the output's files are checked
(``_check_output``) and a previous dataset is cleared only of what a
recordprep run wrote (``_clear_output``); and a run that fails after that
check leaves ``_FAILURE.json`` and no temp files (``_record_failure``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import logging
import os
import posixpath
import re
import time
import uuid
from importlib import metadata
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from convert.analysis import Analysis, AnalysisMismatchError
from convert.config import Config
from convert.sources import InputFileError
from convert.spec import FAILURE_FILENAME, FORMAT_VERSION, METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines import local, remote
from pipelines._fs import delete as fs_delete
from pipelines._fs import match_in, read_metadata
from pipelines.analyze import AnalysisValue, AnalyzeUnits
from pipelines.commit import CommitContext, CommitOutput, cleanup_tmp, write_atomic
from pipelines.convert_pass import ConvertUnits
from pipelines.interrupt import Interrupted
from pipelines.lock import LOCK_FILENAME, OutputLock
from pipelines.options import ConvertOptions
from pipelines.plan import InputFile, Plan, plan
from pipelines.run_files import ANALYSIS_FILENAME, ERRORS_DIR, TMP_DIR, VOCAB_DIR, ConversionFailed
from pipelines.shuffle import GatherShards
from pipelines.staging import staging_args

log = logging.getLogger("recordprep")


class OutputExistsError(RuntimeError):
    """The output holds another conversion (``--overwrite`` replaces it), or files no recordprep run wrote (nothing is deleted)."""


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


def read_existing(output: str) -> dict[str, Any] | None:
    """The metadata ``output`` holds (as JSON), None when it has none."""
    info = read_metadata(output)
    return None if info is None else info.to_json()


class OutputPathError(ValueError):
    """The output overlaps an input: a usage error, refused before anything is written."""


def _norm(path: str) -> str:
    """A path to compare locations by: local paths resolved (symlinks too), remote ones normalized."""
    if "://" not in path:
        return os.path.realpath(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    return f"{scheme.lower()}://{posixpath.normpath('/' + rest).lstrip('/')}"


def _inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or under it (both from :func:`_norm`)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _input_dirs(patterns: tuple[str, ...], files: list[InputFile]) -> list[str]:
    """The inputs given as directories (no glob, not a file)."""
    file_paths = {_norm(f.path) for f in files}
    dirs = []
    for pat in patterns:
        if "://" not in pat:
            if os.path.isdir(pat):
                dirs.append(pat)
        elif not any(c in pat for c in "*?[") and _norm(pat) not in file_paths:
            dirs.append(pat)
    return dirs


def _guard_local_output(output: str) -> None:
    """Refuse a local output the run could not create or write: a file, one under a
    file, or on a read-only file system (or without write permission), before any work."""
    if os.path.lexists(output) and not os.path.isdir(output):
        raise OutputPathError(f"--output {output} is a file, not a directory; name a directory to write the dataset into")
    here = os.path.abspath(output)
    while not os.path.lexists(here):  # the deepest part of the path that exists: the run creates the rest
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise OutputPathError(f"--output {output} lies under {here}, a file, not a directory; "
                              f"name a directory to write the dataset into")
    if not os.access(here, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only(here) else "is not writable by this user"
        raise OutputPathError(f"--output {output}: {here} {why}; write the dataset to a writable directory")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _guard_output(opts: ConvertOptions, files: list[InputFile]) -> None:
    """Refuse an output that is, contains or lies inside an input, before anything is written.

    A conversion never writes where it reads: ``--overwrite`` there would
    delete the inputs, and a later run would read the shards as input. An
    output next to the inputs (``-i data/x.avro -o data/out``) is fine.
    """
    if "://" not in opts.output:
        _guard_local_output(opts.output)
    out = _norm(opts.output)
    hint = "write to another directory (a conversion never writes where it reads its inputs)"
    for f in files:
        if _inside(_norm(f.path), out):
            raise OutputPathError(f"--output {opts.output} holds the input file {f.path}; {hint}")
    for d in _input_dirs(opts.inputs, files):
        if _inside(out, _norm(d)):
            raise OutputPathError(f"--output {opts.output} lies inside the input directory {d}; {hint}")


#: Names the converter writes, besides those a dataset's metadata lists.
_SHARD_RE = re.compile(r"[^/]+-\d{5}-of-\d{5}(-[0-9a-f]{12})?\.tfrecord(\.gz)?")
_VOCAB_RE = re.compile(VOCAB_DIR + r"/[^/]+\.txt")
_ERRORS_RE = re.compile(ERRORS_DIR + r"/errors-\d{5}(-of-\d{5})?\.jsonl")
_ATOMIC_TMP_RE = re.compile(r"(.+)\.tmp-[0-9a-f]{8}")  # a write_atomic interrupted before its rename
#: How many unknown files a refused --overwrite names.
_UNKNOWN_SHOWN = 5


def _first_few(names: list[str]) -> str:
    more = len(names) - _UNKNOWN_SHOWN
    return ", ".join(names[:_UNKNOWN_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _listed_files(info: dict[str, Any]) -> set[str]:
    """Every file a dataset's metadata names, relative to its output."""
    names = {METADATA_FILENAME, FAILURE_FILENAME, ANALYSIS_FILENAME, STATS_FILENAME,
             str(info.get("analysis_file") or ""), str(info.get("stats_file") or "")}
    for sp in (info.get("splits") or {}).values():
        names.update(str(sh.get("file")) for sh in sp.get("shards", []))
    names.update(str(v.get("file")) for v in (info.get("vocabularies") or {}).values())
    names.update(str(e.get("file")) for e in (info.get("errors") or {}).get("files", []))
    return names - {""}


def _written_by_us(rel: str, listed: set[str]) -> bool:
    if rel in listed or rel.split("/", 1)[0] == TMP_DIR or rel.startswith(LOCK_FILENAME + "."):
        return True  # (the last: a lock refresh or take-over interrupted before its rename)
    m = _ATOMIC_TMP_RE.fullmatch(rel)
    base = m.group(1) if m else rel
    return (base in listed or ("/" not in base and _SHARD_RE.fullmatch(base) is not None)
            or _VOCAB_RE.fullmatch(base) is not None or _ERRORS_RE.fullmatch(base) is not None)


def _list_output(output: str) -> list[str]:
    """Every file under ``output``, relative to it (on HDFS: the top level, errors/ and vocab/)."""
    root = output.rstrip("/")
    if "://" not in output:
        rel = []
        for dirpath, dirnames, filenames in os.walk(root):
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # never followed
            for name in filenames + links:
                rel.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
        return rel
    patterns = ["**"] if output.startswith("gs://") else ["*", f"{ERRORS_DIR}/*", f"{VOCAB_DIR}/*"]
    rel = set()
    for pattern in patterns:
        try:
            matched = match_in(root, pattern)
        except BeamIOError:  # HDFS: listing a missing directory fails
            continue
        rel.update(m[len(root) + 1:] for m in matched if m.startswith(root + "/"))
    return sorted(r for r in rel if r not in (ERRORS_DIR, VOCAB_DIR))


def _refuse_unknown_files(output: str, existing: dict[str, Any]) -> list[str]:
    """The output's files (but the lock) when all are the previous dataset's (``existing``, its
    metadata) or a run's temp files; else raises OutputExistsError."""
    listed = _listed_files(existing)
    files = [r for r in _list_output(output) if r != LOCK_FILENAME]
    unknown = sorted(r for r in files if not _written_by_us(r, listed))
    if unknown:
        shown = _first_few(unknown)
        raise OutputExistsError(
            f"--overwrite: {output} holds {len(unknown)} file(s) no recordprep run wrote ({shown}); "
            f"nothing was deleted. Move them elsewhere, or write to another directory"
        )
    return files


def _clear_output(output: str, files: list[str]) -> None:
    """Remove the previous dataset: ``files``, the output's files as ``_refuse_unknown_files``
    found them all a recordprep run's. The metadata goes first so no reader sees a mix."""
    root = output.rstrip("/")
    meta = FileSystems.join(output, METADATA_FILENAME)
    if FileSystems.exists(meta):
        fs_delete([meta])
    mine = [f"{root}/{r}" for r in files if r != METADATA_FILENAME and r.split("/", 1)[0] != TMP_DIR]
    if "://" not in output:
        for path in mine:  # unlink: a symlink is removed, never what it points to
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    elif mine:
        fs_delete(mine)
    cleanup_tmp(output)
    for sub in (VOCAB_DIR, ERRORS_DIR):  # now empty (local, HDFS; object stores have no directories)
        d = FileSystems.join(output, sub)
        if "://" not in output:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        elif not output.startswith("gs://") and FileSystems.exists(d):
            fs_delete([d])


def _refuse_clashing_files(output: str, *, took_over: bool) -> None:
    """In an output without a dataset, refuse files under the names a run replaces or removes.

    The commit replaces its shard, vocabulary, error and analysis files and
    removes other shards of its splits. In a directory that an earlier
    recordprep run left unfinished those are its leftovers (its failure
    marker, its temp directory, or the dead run's lock just taken over say
    so); anywhere else they are someone's files, and nothing is deleted.
    """
    files = [r for r in _list_output(output) if r != LOCK_FILENAME]
    if took_over or any(r == FAILURE_FILENAME or r.split("/", 1)[0] == TMP_DIR for r in files):
        return
    clashing = sorted(r for r in files if _written_by_us(r, {ANALYSIS_FILENAME, STATS_FILENAME}))
    if clashing:
        shown = _first_few(clashing)
        raise OutputExistsError(
            f"{output} holds no recordprep dataset but {len(clashing)} file(s) under names a conversion writes "
            f"or removes ({shown}); nothing was deleted. Move them elsewhere, or write to another directory"
        )


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
    _guard_output(opts, list(p.files))
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
        # From here on the output is this run's: any failure, a signal included, leaves the marker.
        try:
            _clear_previous(opts, previous)
            workers, pre_forked = _run(p, analysis, lock)
        except BaseException as e:
            _record_failure(opts.output, p.fingerprint, e)
            raise
    finally:
        lock.release()
    info = read_existing(opts.output)
    if info is None:
        raise ConversionFailed(f"the pipeline finished but {opts.output}/{METADATA_FILENAME} was not written; see the runner's logs")
    return ConvertResult(opts.output, False, info, time.perf_counter() - t0, workers, pre_forked)


def _lock(opts: ConvertOptions, fingerprint: str, beam_options: PipelineOptions) -> OutputLock:
    """The output's lock; on gs:// through a client made from the job's Beam options (project, credentials)."""
    client = None
    if opts.output.startswith("gs://"):
        from apache_beam.io.gcp.gcsio import create_storage_client

        client = create_storage_client(beam_options)
    return OutputLock(opts.output, fingerprint=fingerprint, version=tool_version(), gcs_client=client)


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
        _refuse_clashing_files(opts.output, took_over=lock.took_over is not None)
        return None, None
    return None, _refuse_unknown_files(opts.output, existing)


def _clear_previous(opts: ConvertOptions, previous: list[str] | None) -> None:
    """Under the lock: remove the previous dataset's ``previous`` files (``overwrite``) and an old failure marker."""
    if previous is not None:
        _clear_output(opts.output, previous)
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


def _build_pipeline(p: Plan, analysis: dict[str, Any] | None, runner: local.Runner) -> beam.Pipeline:
    """The job's pipeline: analyze (or reuse an analysis), convert, gather the shuffled shards, commit."""
    opts, config, units = p.options, p.config, list(p.units)
    ctx = CommitContext(
        inputs=list(p.files), num_shards=len(units), fingerprint=p.fingerprint, config_json=config.to_json(),
        config_hash=config.hash, runner=runner.label, tool_version=tool_version(),
        started=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), run_id=new_run_id(),
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
        pipeline = _build_pipeline(p, analysis, runner)
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
    return e
