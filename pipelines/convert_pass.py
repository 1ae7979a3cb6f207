"""The convert pass: each unit's prepared batches vectorized with the analysis,
encoded as ``tf.train.Example`` records and written to temp shards or scattered.

::

    units ──ConvertUnit(side input: AnalysisValue)──> unit result per unit
                                                  └──(stats)──MergeStats──> StatsMerger

Each unit's batches come from the prepared-batches file the analysis pass
left (``pipelines.tempfile_format``), or, with a reused analysis
(``--analysis-from``), from the input read here (``pipelines.unit_input``).
With ``--order input`` a unit's records go to that unit's temp shard of each
split (output shard ``i`` is unit ``i``'s input range); shuffled (the
default), they are scattered to the output shards' buckets
(``pipelines.shuffle``). Rejected records go to the unit's error file. A unit
result holds its temp shards or scatter index, its error file, its counts per
input file and its statistics; nothing is visible to readers until the commit
(``pipelines.commit``).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from convert.analysis import Analysis
from convert.config import Config
from convert.example import encode_examples, pack_columns
from convert.prepare import Preparer
from convert.spec import packed_slices
from convert.stats import StatsAccumulator, StatsMerger
from convert.tfrecord import frame_records
from convert.vectorize import Vectorizer
from pipelines._fs import delete as fs_delete
from pipelines.analyze import (
    PREPARED_KEY,
    AnalysisValue,
    merge_stats_terms,
    spill_stats_terms,
    with_term_summaries,
)
from pipelines.local.progress import UnitProgress
from pipelines.options import ConvertOptions
from pipelines.plan import WorkUnit
from pipelines.run_files import TMP_DIR
from pipelines.shuffle import Scatter
from pipelines.tempfile_format import Prepared, ShardWriter, read_prepared
from pipelines.unit_input import prepare_unit, relaxed_gc, unit_bytes, unit_progress


class _UnitOutput:
    """Where one attempt of a unit goes: a temp shard per split (``--order
    input``) or its scatter file (shuffled), its error file (created on the
    first rejection), its counts per input file and its statistics."""

    def __init__(self, config: Config, opts: ConvertOptions, unit: WorkUnit, num_shards: int):
        names = self.names = opts.splits.names
        tmp = FileSystems.join(opts.output, TMP_DIR)
        attempt = uuid.uuid4().hex[:8]
        suffix = ".tfrecord.gz" if opts.compression_type == "GZIP" else ".tfrecord"
        seed = opts.shuffle_seed
        self.writers = ([ShardWriter(FileSystems.join(tmp, f"{s}-{unit.index:05d}-{attempt}{suffix}"), opts.compression_type, opts.gzip_level)
                         for s in names] if seed is None else [])
        self.scatter = (Scatter(FileSystems.join(tmp, f"scatter-{unit.index:05d}-{attempt}.bin"), unit.index, num_shards, seed)
                        if seed is not None and unit.ranges else None)
        self.ordinal = 0  # records of the unit before this batch: the shuffle's record identity
        self.err_path = FileSystems.join(tmp, f"errors-{unit.index:05d}-{attempt}.jsonl")
        self.err_f: Any = None
        self.n_err = 0
        self.per_file: dict[str, dict[str, int]] = {}
        for rng in unit.ranges:
            self.per_file.setdefault(rng.path, {"read": 0, "errors": 0, **{s: 0 for s in names}})
        self.stats = StatsAccumulator(config, names)  # stats.json: every split (MergeStats)

    def add_errors(self, counts: dict[str, int], errors: list[bytes]) -> None:
        """One batch's error lines: to the error file, its input file's count and the statistics."""
        if self.err_f is None:
            self.err_f = FileSystems.create(self.err_path, mime_type="application/x-ndjson", compression_type="uncompressed")
        self.err_f.write(b"".join(errors))
        self.n_err += len(errors)
        counts["errors"] += len(errors)
        self.stats.add_errors(errors)

    def write(self, counts: dict[str, int], buf: np.ndarray, starts: np.ndarray, lens: np.ndarray,
              kept_split: np.ndarray, keep: np.ndarray, first: int) -> None:
        """One batch's encoded records (``keep`` of the batch whose first record is the unit's
        ``first``): scattered by bucket, or framed into the temp shard of their split."""
        names = self.names
        if self.scatter is not None:
            self.scatter.add(buf, starts, lens, kept_split, first + np.flatnonzero(keep))
            for s, c in enumerate(np.bincount(kept_split, minlength=len(names)).tolist()):
                counts[names[s]] += c
        for s, w in enumerate(self.writers):
            sel = np.nonzero(kept_split == s)[0]
            if sel.size:
                w.write(frame_records(buf, starts[sel], lens[sel]), int(sel.size))
                counts[names[s]] += int(sel.size)

    def abort(self) -> None:
        """Stop the writer threads and the scatter's (a failed attempt)."""
        for w in self.writers:
            w.abort()
        if self.scatter is not None:
            self.scatter.abort()


def _encode_batch(item: Prepared, vec: Vectorizer, slices: Any, out: _UnitOutput, prog: UnitProgress) -> None:
    """Count, vectorize and encode one prepared batch into the unit's outputs."""
    counts = out.per_file[item.path]
    counts["read"] += item.read
    prog.add(item.read)
    if item.errors:
        out.add_errors(counts, item.errors)
    if item.batch is None:
        return
    vb = vec.finish(item.batch)
    if item.late_errors:  # label classes the training split lacks
        late = [item.late_errors[r.index] for r in vb.rejections if r.index in item.late_errors]
        if late:
            out.add_errors(counts, late)
    assert item.split is not None
    out.stats.add(item.batch, vb, item.split)
    kept_split = item.split[vb.keep]
    first, out.ordinal = out.ordinal, out.ordinal + len(item.split)
    rows = int(vb.keep.sum())
    if rows == 0:
        return
    columns = vb.columns if slices is None else pack_columns(vb.columns, rows, slices)
    buf, lens = encode_examples(columns, rows)
    starts = np.cumsum(lens) - lens
    out.write(counts, buf, starts, lens, kept_split, vb.keep, first)


class _ConvertUnit(beam.DoFn):
    """Read, vectorize, encode and write one unit into one temp shard per split
    (``--order input``), or scatter its records to the output shards (``Scatter``).

    A unit's shards are closed, and its result emitted, when the next unit of
    the bundle has been encoded (or at the end of the bundle): the gzip
    threads of one unit finish while the next one is encoded, instead of the
    DoFn waiting for them (the convert pass is deflate-bound).
    """

    def __init__(self, config: Config, options: ConvertOptions, num_shards: int, partitions: int = 1):
        self.config, self.options, self.num_shards, self.partitions = config, options, num_shards, partitions
        self.records_read = Metrics.counter("recordprep", "records_read")
        self.records_written = Metrics.counter("recordprep", "records_written")
        self.records_rejected = Metrics.counter("recordprep", "records_rejected")
        self._pending: Callable[[], dict] | None = None

    def start_bundle(self) -> None:
        self._pending = None

    def _finish_pending(self) -> dict | None:
        finish, self._pending = self._pending, None
        return finish() if finish is not None else None

    def process(self, unit: WorkUnit, analysis: AnalysisValue):
        try:
            finish = self._encode(unit, analysis.json)
        except BaseException:
            self.teardown()
            raise
        # This unit is pending before the previous one closes: if closing that
        # fails, teardown still stops this unit's writer threads.
        previous, self._pending = self._pending, finish
        try:
            done = previous() if previous is not None else None
        except BaseException:
            self.teardown()
            raise
        if done is not None:
            yield from _unit_outputs(done, _same)

    def finish_bundle(self):
        done = self._finish_pending()
        if done is not None:
            yield from _unit_outputs(done, GlobalWindows.windowed_value)

    def teardown(self) -> None:
        """A failed bundle: stop the writer threads of the unit left pending."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.abort()  # type: ignore[attr-defined]

    def _encode(self, unit: WorkUnit, analysis_json: dict) -> Callable[[], dict]:
        """Encode the unit into its writers; returns what closes them and gives the result."""
        opts = self.options
        vec = Vectorizer(self.config, Analysis.from_json(analysis_json))
        slices = packed_slices(vec.feature_specs()) if opts.layout == "packed" else None
        out = _UnitOutput(self.config, opts, unit, self.num_shards)
        cached, items = self._prepared_batches(unit, analysis_json, vec)
        prog = unit_progress(opts, "convert", unit)
        with relaxed_gc():
            try:
                for item in items:
                    _encode_batch(item, vec, slices, out, prog)
            except BaseException:
                out.abort()  # no writer thread outlives a failed attempt
                raise
        if out.err_f is not None:
            out.err_f.close()
        if cached:  # read to the end: its disk space is the scatter's or the shards' now
            fs_delete([cached])
        return self._finisher(unit, out, prog)

    def _prepared_batches(self, unit: WorkUnit, analysis_json: dict,
                          vec: Vectorizer) -> tuple[str | None, Iterator[Prepared]]:
        """The unit's prepared batches, and the prepared file they are read from (None: prepared here).

        The analysis pass left the unit prepared; with a reused analysis
        (--analysis-from) there is no analysis pass: prepare here, as a
        retried unit does (its first attempt removed the file it read).
        """
        cached = (analysis_json.get(PREPARED_KEY) or {}).get(unit.index)
        if cached and not FileSystems.exists(cached):
            cached = None
        items = (read_prepared(cached) if cached
                 else prepare_unit(unit, self.options, Preparer(self.config, unit_terms=True), label_classes=vec.label_ids))
        return cached, items

    def _finisher(self, unit: WorkUnit, out: _UnitOutput, prog: UnitProgress) -> Callable[[], dict]:
        """What closes the unit's outputs and returns its result; its ``abort`` stops them instead."""
        names, seed = self.options.splits.names, self.options.shuffle_seed
        writers, scatter, per_file = out.writers, out.scatter, out.per_file

        def finish() -> dict:
            try:
                shards = {}
                for s, w in zip(names, writers, strict=False):  # no writers when scattering
                    size = w.close()
                    shards[s] = {"tmp": w.path, "records": w.records, "bytes": size}
                nbytes = unit_bytes(unit)
                scattered = scatter.close(nbytes) if scatter is not None else None
            except BaseException:
                out.abort()
                raise
            stats_terms = None
            if self.partitions > 1:  # the statistics' term counts go to a file, merged per partition
                stats_terms = spill_stats_terms(out.stats, FileSystems.join(self.options.output, TMP_DIR),
                                                unit.index, self.partitions)
            prog.add(0, nbytes)
            prog.close()
            read = sum(c["read"] for c in per_file.values())
            self.records_read.inc(read)
            self.records_written.inc(sum(c[s] for c in per_file.values() for s in names))
            self.records_rejected.inc(out.n_err)
            return {"unit": unit.index, "shards": shards if seed is None else None, "scatter": scattered,
                    "errors": {"tmp": out.err_path if out.n_err else None, "count": out.n_err}, "per_file": per_file,
                    "stats": out.stats, "stats_terms": stats_terms}

        finish.abort = out.abort  # type: ignore[attr-defined]
        return finish


#: ``_ConvertUnit``'s output of ``(None, (unit index, StatsAccumulator))``, for ``MergeStats``.
STATS_TAG = "stats"


def _unit_outputs(done: dict, wrap: Callable[[Any], Any]) -> Iterator[Any]:
    """A unit's result without its statistics (main output), and its statistics, keyed for ``MergeStats``."""
    stats = done.pop("stats")
    yield wrap(done)
    yield beam.pvalue.TaggedOutput(STATS_TAG, wrap((None, (done["unit"], stats))))


def _same(value: Any) -> Any:
    return value


class _MergeStats(beam.CombineFn):
    """The units' statistics merged into one ``StatsAccumulator`` (``convert.stats.StatsMerger``:
    the same result in any order of arrival). The runner lifts the combine
    into the convert step, so each worker merges its own units' term counts
    there, in parallel, and the commit step merges one accumulator per
    worker instead of every unit's."""

    def __init__(self, config: Config, names: Sequence[str]):
        self.config, self.names = config, list(names)

    def create_accumulator(self) -> StatsMerger:
        return StatsMerger(self.config, self.names)

    def add_input(self, acc: StatsMerger, element: tuple[int, StatsAccumulator]) -> StatsMerger:
        acc.add(*element)
        return acc

    def merge_accumulators(self, accs: Iterable[StatsMerger]) -> StatsMerger:
        accs = iter(accs)
        first = next(accs)
        for other in accs:
            first.merge(other)
        return first

    def extract_output(self, acc: StatsMerger) -> StatsMerger:
        return acc  # merged by the commit step (``StatsMerger.result``), after its checks


class ConvertUnits(beam.PTransform):
    """``PCollection[WorkUnit]`` + Analysis side input -> ``(results, stats)``: the
    ``PCollection[dict]`` of unit results, and a singleton keyed ``(None,
    StatsMerger)`` of their statistics.

    Writes temp shards under ``<output>/.recordprep-tmp/`` (attempt-unique
    names, so retried work never clobbers a committed attempt); nothing is
    visible to readers until ``CommitOutput``. With ``partitions`` > 1 (the job
    passes its unit count) the statistics' term counts are merged per partition
    of the terms (``pipelines.analyze.merge_stats_terms``), not in ``MergeStats``.
    """

    def __init__(self, config: Config, options: ConvertOptions, analysis, num_shards: int, partitions: int = 1):
        super().__init__()
        self.config, self.options, self.analysis, self.num_shards = config, options, analysis, num_shards
        self.partitions = partitions

    def expand(self, units):
        outputs = units | "ConvertUnit" >> beam.ParDo(
            _ConvertUnit(self.config, self.options, self.num_shards, self.partitions),
            beam.pvalue.AsSingleton(self.analysis)).with_outputs(STATS_TAG, main="results")
        stats = outputs[STATS_TAG] | "MergeStats" >> beam.CombinePerKey(_MergeStats(self.config, self.options.splits.names))
        # One step of its own between the results and their readers (side inputs): Beam's
        # BundleBasedDirectRunner reads a side input made from one output of a multi-output
        # ParDo as none, or all, of that ParDo's outputs. Fused away on the other runners.
        results = outputs.results | "Results" >> beam.Map(_same)
        if self.partitions > 1:
            summaries = merge_stats_terms(results, self.partitions)
            stats = stats | "TermSummaries" >> beam.Map(with_term_summaries, beam.pvalue.AsSingleton(summaries))
        return results, stats
