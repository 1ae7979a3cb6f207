"""The commit: the run's temp files become the dataset, or the run fails and nothing
is committed.

``CommitOutput`` runs once, after every unit (and, shuffled, every gathered
shard). In order: the accounting is checked (every record read is in exactly
one split or the error output; every unit and shard reported), the units'
error files move to ``errors/``; a run with more rejections than tolerated, or
a feature without a value in the training split, raises ``ConversionFailed``
(writing ``_FAILURE.json`` for the rejections). Otherwise everything that can
fail on the configuration is built first, then the temp shards are renamed to
``{split}-{i}-of-{n}-{run id}.tfrecord[.gz]``, what an earlier run left is
removed, vocabularies, ``analysis.json`` and ``stats.json`` are written, the
temp directory is removed, and ``dataset_info.json`` is written last and
atomically (``write_atomic``): a reader that finds it finds a whole dataset.

Before each of those steps that deletes, renames or writes in the output
the run proves it still holds the output's lock (``pipelines.lock.fence``);
a run that lost it (it stalled and another run took over) raises
``LockLostError`` and leaves the output as the new holder made it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from convert.analysis import Analysis
from convert.apply import content_digest
from convert.check import all_missing_message, common_rejection
from convert.config import Config
from convert.spec import (
    FAILURE_FILENAME,
    FORMAT_VERSION,
    METADATA_FILENAME,
    DatasetInfo,
    FeatureSpec,
    ShardInfo,
    SplitInfo,
    shard_name,
)
from convert.stats import STATS_FILENAME, StatsAccumulator, StatsMerger
from convert.vectorize import Vectorizer
from pipelines._fs import delete as fs_delete
from pipelines._fs import match_in
from pipelines.analyze import PRESENT_KEY, AnalysisValue
from pipelines.lock import fence
from pipelines.options import ConvertOptions
from pipelines.plan import InputFile
from pipelines.run_files import (
    ANALYSIS_FILENAME,
    ERRORS_DIR,
    TMP_DIR,
    VOCAB_DIR,
    ConversionFailed,
    posix_basename,
)
from pipelines.shuffle import without_scatter_index

log = logging.getLogger("recordprep")


def write_atomic(path: str, data: bytes) -> None:
    """Write-then-rename: a reader sees the old state or the new, never half.

    On object stores (gs://) an object appears whole when its upload
    finishes and Beam's rename is copy + delete, so readers never see a
    partial file there either.
    """
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with FileSystems.create(tmp, compression_type="uncompressed") as f:
        f.write(data)
    _rename_replacing([tmp], [path])


def _rename_replacing(src: list[str], dst: list[str]) -> None:
    """``FileSystems.rename`` that replaces existing targets on every file system.

    Local and GCS renames replace a target; HDFS's RENAME refuses an existing
    one (a shard or vocabulary an interrupted run left), so the targets of
    the renames that failed are deleted and those renames retried.
    """
    try:
        FileSystems.rename(src, dst)
    except BeamIOError as e:
        failed = [k for k in (e.exception_details or {}) if isinstance(k, tuple) and len(k) == 2]
        stale = [d for _, d in failed if FileSystems.exists(d)]
        if not failed or not stale:
            raise
        log.info("replacing %d existing file(s) at the rename targets", len(stale))
        fs_delete(stale)
        FileSystems.rename([s for s, _ in failed], [d for _, d in failed])


def _escape_term(t: str) -> str:
    return t.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


@dataclasses.dataclass
class CommitContext:
    """What the launcher knows and the commit step records."""

    inputs: list[InputFile]
    num_shards: int
    fingerprint: str
    config_json: dict
    config_hash: str
    runner: str
    tool_version: str
    started: str
    run_id: str = ""  # in every shard name: a replacement never reuses a name (convert.spec.shard_name)
    lock_token: str = ""  # the run's lock (OutputLock.token), checked before every destructive step
    lock_max_age: float = 0.0  # the oldest heartbeat a worker's check accepts (OutputLock.lost_after)


class _Commit(beam.DoFn):
    def __init__(self, config: Config, options: ConvertOptions, ctx: CommitContext):
        self.config, self.options, self.ctx = config, options, ctx

    def _fence(self, step: str) -> None:
        """Raise LockLostError unless the run still holds the output's lock (``step``: "id (what)")."""
        fence(self.options.output, self.ctx.lock_token, self.ctx.lock_max_age, step)

    def process(self, keyed_stats: tuple[None, StatsMerger], results: list[dict], analysis_value: AnalysisValue,
                gathered: list[dict] | None = None):
        analysis_json = analysis_value.json
        opts, ctx = self.options, self.ctx
        out = opts.output
        results = sorted(results, key=lambda r: r["unit"])
        names = opts.splits.names
        # Output shard i: unit i's (input order), or what GatherShards wrote (shuffled).
        shard_results = sorted(gathered, key=lambda r: r["shard"]) if gathered is not None else \
            [{"shard": r["unit"], "shards": r["shards"]} for r in results]
        counts = _checked_counts(results, shard_results, names, ctx.num_shards)
        per_file = counts["per_file"]
        # Error output goes to its final place whatever happens next.
        self._fence("commit-errors (moving the error files into errors/)")
        error_files = _move_error_files(out, results)
        self._refuse_failed_run(counts, error_files, analysis_json)

        # Everything that can fail on the configuration (the analysis, feature
        # specs, the metadata) is built before the first shard is renamed into
        # place, so such a failure leaves no shards without metadata.
        analysis = Analysis.from_json(analysis_json)
        analysis_data = json.dumps(analysis.to_json()).encode()
        vocab_data = {name: "".join(_escape_term(t) + "\n" for t in terms).encode("utf-8", "surrogatepass")
                      for name, terms in analysis.vocabularies.items()}
        info, renames = self._dataset_info(shard_results, analysis, counts, error_files,
                                           analysis_data, vocab_data)
        splits, vocab_files = info.splits, info.extra["vocabularies"]
        metadata = info.dumps().encode()
        stats_data = _stats_document(keyed_stats[1].result(), splits, per_file, analysis.stats)

        # Shards: temp names -> {split}-{i}-of-{n}; then what an earlier run left.
        self._fence("commit-shards (renaming the shards into place)")
        _rename_replacing([src for src, _ in renames], [dst for _, dst in renames])
        self._fence("commit-stale (removing files an earlier run left)")
        _remove_stale(out, [f"{s}-*-of-*.tfrecord*" for s in names], {sh.file for sp in splits.values() for sh in sp.shards})
        _remove_stale(out, [f"{ERRORS_DIR}/errors-*.jsonl"], {e["file"] for e in error_files})
        self._fence("commit-files (writing the vocabularies, analysis and statistics)")
        for name, data in vocab_data.items():
            write_atomic(FileSystems.join(out, vocab_files[name]["file"]), data)
        write_atomic(FileSystems.join(out, ANALYSIS_FILENAME), analysis_data)
        write_atomic(FileSystems.join(out, STATS_FILENAME), stats_data)

        self._fence("commit-tmp (removing the temp files)")
        cleanup_tmp(out)
        try:
            fs_delete([FileSystems.join(out, FAILURE_FILENAME)])
        except Exception:
            pass
        self._fence("commit-metadata (writing dataset_info.json)")
        write_atomic(FileSystems.join(out, METADATA_FILENAME), metadata)
        yield info.to_json()

    def _refuse_failed_run(self, counts: dict, error_files: list[dict], analysis_json: dict) -> None:
        """Raise ``ConversionFailed`` (and, for too many rejections, write the failure file)
        when the run must not commit: more rejections than tolerated, or a feature absent."""
        opts, ctx, out = self.options, self.ctx, self.options.output
        read, n_err, written = counts["read"], counts["errors"], counts["written"]
        if not opts.errors_tolerated(n_err, read):
            self._fence("commit-failure (recording the rejected run)")
            cleanup_tmp(out)
            where = FileSystems.join(out, ERRORS_DIR)
            if n_err == read:  # tolerating them all would commit an empty dataset: say why instead
                seen = [0]
                common = common_rejection(_counted(_error_rows(out, error_files), seen))
                which = "every one" if seen[0] >= n_err else f"the first {seen[0]} all"
                msg = (f"all {read} records were rejected{f', {which} for {common}' if common else ''} "
                       f"(reasons in {where}/); no dataset was committed. Fix the config or the input")
            else:
                msg = (f"{n_err} of {read} records were rejected (first reasons in {where}/); "
                       f"no dataset was committed. Fix the input or config, or tolerate them with "
                       f"--max-errors {n_err} or --max-error-fraction {n_err / max(read, 1):.4g}")
            write_atomic(FileSystems.join(out, FAILURE_FILENAME),
                          json.dumps({"reason": msg, "counts": counts, "fingerprint": ctx.fingerprint}, indent=2).encode())
            raise ConversionFailed(msg)
        present = analysis_json.get(PRESENT_KEY)
        if present is not None:  # this run's analysis (a reused one did not see this data)
            missing = all_missing_message(self.config, present, written[opts.splits.names[0]])
            if missing:
                raise ConversionFailed(missing)

    def _dataset_info(self, shard_results: list[dict], analysis: Analysis, counts: dict, error_files: list[dict],
                      analysis_data: bytes, vocab_data: dict[str, bytes]) -> tuple[DatasetInfo, list[tuple[str, str]]]:
        """The committed dataset's metadata, and the (temp, final) renames of its shards.
        The digests of the analysis and vocabulary files bind them to this metadata: a reader
        that finds another run's file beside it (a replacement under way) knows."""
        opts, ctx = self.options, self.ctx
        out, names = opts.output, opts.splits.names
        splits = {}
        renames: list[tuple[str, str]] = []
        for s in names:
            infos = []
            for r in shard_results:
                sh = r["shards"][s]
                name = shard_name(s, r["shard"], ctx.num_shards, opts.compression_type, ctx.run_id)
                renames.append((sh["tmp"], FileSystems.join(out, name)))
                infos.append(ShardInfo(name, sh["records"], sh["bytes"]))
            splits[s] = SplitInfo(s, tuple(infos))
        features: list[FeatureSpec] = Vectorizer(self.config, analysis).feature_specs()
        vocab_files = {name: {"file": f"{VOCAB_DIR}/{name}.txt", "terms": len(terms),
                              "sha256": content_digest(vocab_data[name])}
                       for name, terms in analysis.vocabularies.items()}
        info = DatasetInfo(
            format_version=FORMAT_VERSION,
            layout=opts.layout,
            features=tuple(features),
            label_key=self.config.label.name if self.config.label else None,
            compression=opts.compression_type,
            splits=splits,
            extra={
                "tool": {"name": "recordprep", "version": ctx.tool_version},
                "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                "started": ctx.started,
                "run_id": ctx.run_id,
                "runner": ctx.runner,
                "fingerprint": ctx.fingerprint,
                "config": ctx.config_json,
                "config_hash": ctx.config_hash,
                "options": opts.fingerprint_fields(),
                "shuffle": {"order": opts.order, "seed": opts.shuffle_seed},
                "inputs": [{"path": f.path, "size": f.size, "mtime": f.mtime} for f in ctx.inputs],
                "counts": counts,
                "errors": {"count": counts["errors"], "files": error_files},
                "vocabularies": vocab_files,
                "statistics": analysis.stats,
                "analysis_file": ANALYSIS_FILENAME,
                "analysis_sha256": content_digest(analysis_data),
                "stats_file": STATS_FILENAME,
            },
        )
        return info, renames


def _checked_counts(results: list[dict], shard_results: list[dict], names: list[str], num_shards: int) -> dict:
    """The run's counts (read, written per split, errors, per input file), checked:
    every record read is in exactly one split or the error output, and every
    unit and output shard reported."""
    per_file: dict[str, dict[str, int]] = {}
    for r in results:
        for path, c in r["per_file"].items():
            agg = per_file.setdefault(path, {k: 0 for k in c})
            for k, v in c.items():
                agg[k] = agg.get(k, 0) + v
    for path, c in per_file.items():
        if c["read"] != sum(c[s] for s in names) + c["errors"]:
            raise ConversionFailed(f"accounting mismatch for {path}: read {c['read']}, "
                                   f"written {sum(c[s] for s in names)}, errors {c['errors']}; this is a bug, please report it")
    read = sum(c["read"] for c in per_file.values())
    n_err = sum(c["errors"] for c in per_file.values())
    written = {s: sum(r["shards"][s]["records"] for r in shard_results) for s in names}
    if len(results) != num_shards or len(shard_results) != num_shards:
        raise ConversionFailed(f"expected {num_shards} work unit and shard results, got {len(results)} and "
                               f"{len(shard_results)}; re-run the conversion")
    for s in names:  # the shuffle moved every record written exactly once
        if written[s] != sum(c[s] for c in per_file.values()):
            raise ConversionFailed(f"accounting mismatch for split {s}: {sum(c[s] for c in per_file.values())} "
                                   f"records converted, {written[s]} in its shards; this is a bug, please report it")
    return {"read": read, "written": written, "errors": n_err, "per_file": per_file}


def _move_error_files(out: str, results: list[dict]) -> list[dict]:
    """Rename the units' error files to ``errors/errors-i-of-n.jsonl``; their entries for the metadata."""
    error_files = []
    err_results = [r for r in results if r["errors"]["tmp"]]
    if err_results:
        _ensure_dir(FileSystems.join(out, ERRORS_DIR))
    for i, r in enumerate(err_results):
        dst = FileSystems.join(out, ERRORS_DIR, f"errors-{i:05d}-of-{len(err_results):05d}.jsonl")
        _rename_replacing([r["errors"]["tmp"]], [dst])
        error_files.append({"file": f"{ERRORS_DIR}/{posix_basename(dst)}", "count": r["errors"]["count"]})
    return error_files


def _stats_document(merged: StatsAccumulator, splits: dict[str, SplitInfo],
                    per_file: dict[str, dict[str, int]], analysis_stats: dict[str, Any]) -> bytes:
    """``stats.json``: the units' merged statistics, with records and bytes per
    split and the counts per input file (what ``report`` shows)."""
    names = merged.splits
    doc = merged.to_json(analysis_stats)
    doc["splits"] = {s: {"records": sp.num_records, "bytes": sp.num_bytes, "shards": len(sp.shards)}
                     for s, sp in splits.items()}
    doc["files"] = [{"path": p, "read": c["read"], "rejected": c["errors"], "written": {s: c[s] for s in names}}
                    for p, c in per_file.items()]
    return json.dumps(doc, allow_nan=False).encode()


#: Bytes of the error output a failed run reads to say what its rejections share.
_ERROR_SCAN_BYTES = 16 * 1024 * 1024


def _error_rows(out: str, error_files: list[dict]) -> Iterator[dict]:
    """The rows of the committed error files, up to ``_ERROR_SCAN_BYTES`` in all
    (a row cut by the limit is skipped; the rows read all share what is reported)."""
    budget = _ERROR_SCAN_BYTES
    for ef in error_files:
        if budget <= 0:
            return
        with FileSystems.open(FileSystems.join(out, ef["file"]), compression_type="uncompressed") as f:
            data = f.read(budget)
        budget -= len(data)
        for line in data.split(b"\n"):
            try:
                row = json.loads(line)
            except ValueError:
                continue  # the empty tail, or a line cut by the budget
            if isinstance(row, dict):
                yield row


def _counted(rows: Iterator[dict], seen: list[int]) -> Iterator[dict]:
    for row in rows:
        seen[0] += 1
        yield row


def _remove_stale(out: str, patterns: list[str], keep: set[str]) -> None:
    """Shards and error files an interrupted or failed earlier run left, not part of this dataset."""
    for pattern in patterns:
        try:
            matched = match_in(out, pattern)
        except BeamIOError:  # HDFS: listing a missing directory fails
            continue
        where = pattern.rpartition("/")[0]
        stale = [m for m in matched if f"{where}/{posix_basename(m)}".lstrip("/") not in keep]
        if stale:
            log.info("removing %d file(s) left by an earlier run", len(stale))
            fs_delete(stale)


def _ensure_dir(path: str) -> None:
    """Local renames need the target directory; object stores have none."""
    try:
        FileSystems.mkdirs(path)
    except OSError:
        pass  # exists already


def cleanup_tmp(out: str) -> None:
    """Remove the temp directory; on object stores (no directories) every object under it."""
    tmp = FileSystems.join(out, TMP_DIR)
    try:
        if FileSystems.exists(tmp):  # a directory (local, HDFS)
            fs_delete([tmp])
            return
        left = match_in(tmp, "**")  # gs://: objects under the prefix
        if left:
            fs_delete(left)
    except Exception as e:  # leftover temp files are harmless; say so
        log.warning("could not remove %s: %s", tmp, e)


class CommitOutput(beam.PTransform):
    """The units' merged statistics (``ConvertUnits``' second output) + their results -> the
    committed dataset (a singleton of its metadata dict).

    Runs once, after every unit (and, shuffled, every gathered shard): checks the accounting, moves the error
    output into ``errors/``, fails the run (writing ``_FAILURE.json``) when
    more records were rejected than tolerated, otherwise renames the temp
    shards, writes vocabularies and analysis, and writes ``dataset_info.json``
    last and atomically. Its one input element is the merged statistics
    (every run has at least one unit), so the statistics' final merge and the
    commit run as one step.
    """

    def __init__(self, config: Config, options: ConvertOptions, ctx: CommitContext, analysis, results, gathered=None):
        super().__init__()
        self.config, self.options, self.ctx, self.analysis = config, options, ctx, analysis
        self.results, self.gathered = results, gathered

    def expand(self, stats):
        shards = () if self.gathered is None else (beam.pvalue.AsList(self.gathered),)
        # The scatter indexes are the gather's (they grow with units x buckets), not the commit's.
        results = self.results | "CommitResults" >> beam.Map(without_scatter_index)
        return stats | "Commit" >> beam.ParDo(_Commit(self.config, self.options, self.ctx), beam.pvalue.AsList(results),
                                              beam.pvalue.AsSingleton(self.analysis), *shards)
