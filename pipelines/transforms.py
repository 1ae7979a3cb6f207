"""The conversion job's PTransforms: analyze, convert, commit.

::

    units ──AnalyzeUnits──> Analysis (singleton, training split only)
      └────ConvertUnits(side input: Analysis)──> UnitResult per unit
    shard indexes ──GatherShards(side input: UnitResults)──> ShardResult per shard
                                   └──CommitOutput──> shards renamed, vocab,
                                                      errors, dataset_info.json

Each element is a ``WorkUnit`` (byte ranges of input files), so every step
works on batches of thousands of records and Beam's per-element cost is paid
per unit. The input is decoded once: the analysis pass prepares each batch
(split, field access, checks, tokens, hashes; ``convert.prepare.Preparer``)
and streams it to ``<output>/.recordprep-tmp/prepared-<unit>-*.bin`` (LZ4,
about as large as deflate Avro input; removed at commit); the convert pass
streams that file back and only applies the analysis. Nothing is held in
memory between stages, so memory stays flat however large the input; the
temp files need disk next to the output. With ``--analysis-from`` there is
no analysis pass and the convert pass reads and prepares the input itself.

The convert pass encodes and frames each unit's records; with ``--order
input`` it writes them into that unit's shard of each split (shard ``i`` is
unit ``i``'s input range), and ``GatherShards`` does not run. Shuffled (the
default), it scatters them by a seeded hash to per-unit temp files, and
``GatherShards`` writes each output shard from its share of every unit (see
the shuffle section below).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import datetime as _dt
import decimal
import gc
import gzip
import json
import logging
import os
import pickle
import queue
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import lz4.frame
import numpy as np
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.runners.worker.statecache import CacheAware
from apache_beam.transforms.window import GlobalWindows
from isal.igzip import IGzipFile
from zlib_ng.gzip_ng import GzipNGFile

from convert.analysis import Analysis, Analyzer
from convert.check import all_missing_message, common_rejection
from convert.config import Config
from convert.example import encode_examples, pack_columns
from convert.prepare import PreparedBatch, Preparer
from convert.sources import iter_records
from convert.spec import (
    FAILURE_FILENAME,
    FORMAT_VERSION,
    METADATA_FILENAME,
    DatasetInfo,
    FeatureSpec,
    ShardInfo,
    SplitInfo,
    packed_slices,
    shard_name,
)
from convert.stats import STATS_FILENAME, StatsAccumulator, StatsMerger
from convert.tfrecord import frame_records, take_records
from convert.vectorize import Vectorizer, unseen_label_rows
from pipelines._fs import delete as fs_delete
from pipelines._fs import match_in, size_of
from pipelines._progress import GATHER, PROGRESS_DIR, UnitProgress
from pipelines.analyze import (
    merge_stats_terms,
    merge_vocabularies,
    spill_stats_terms,
    spill_unit_counts,
    spilled_features,
    with_term_summaries,
)
from pipelines.options import ConvertOptions
from pipelines.plan import InputFile, WorkUnit

log = logging.getLogger("recordprep")

TMP_DIR = ".recordprep-tmp"
ANALYSIS_FILENAME = "analysis.json"
#: Key of the analysis side input mapping unit index -> its prepared-batches temp file.
PREPARED_KEY = "prepared_units"
#: Key of the analysis side input mapping feature -> values seen in the training
#: split (``Analyzer.present``); absent with a reused analysis (``--analysis-from``).
PRESENT_KEY = "present_values"
ERRORS_DIR = "errors"
VOCAB_DIR = "vocab"


class ConversionFailed(RuntimeError):
    """The run finished but must not be committed (too many errors, accounting)."""

    MARKER = "recordprep:"

    def __init__(self, message: str):
        super().__init__(f"{self.MARKER} {message}")
        self.message = message


def _unit_bytes(unit: WorkUnit) -> int:
    total = 0
    for r in unit.ranges:
        end = r.end
        if end is None:  # to the end of the file
            try:
                end = size_of(r.path)
            except Exception:  # progress only: never fail a unit over it
                end = r.start
        total += max(0, end - r.start)
    return total


def _unit_progress(options: ConvertOptions, pass_name: str, unit: WorkUnit) -> UnitProgress:
    """Progress files for the launcher (local runs with ``options.progress`` only)."""
    root = FileSystems.join(options.output, TMP_DIR, PROGRESS_DIR) if options.progress else None
    return UnitProgress(root, pass_name, unit.index)


# --------------------------------------------------------------- analysis


class _AnalyzeUnit(beam.DoFn):
    """A unit -> ``(index, Analyzer, prepared file, term counts file)``.

    With ``partitions`` > 1 the unit's vocabulary term counts go to a temp
    file cut by term (``pipelines.analyze``), not into the yielded analyzer.
    """

    def __init__(self, config: Config, options: ConvertOptions, partitions: int = 1):
        self.config, self.options, self.partitions = config, options, partitions

    def process(self, unit: WorkUnit):
        acc = Analyzer(self.config)
        path = None
        if unit.ranges:
            # The unit's prepared batches go to a temp file the convert pass
            # reads instead of decoding and preparing the input again.
            path = FileSystems.join(self.options.output, TMP_DIR, f"prepared-{unit.index:05d}-{uuid.uuid4().hex[:8]}.bin")
            prog = _unit_progress(self.options, "analyze", unit)
            with _PreparedWriter(path) as out, _relaxed_gc():
                for item in _prepare_unit(unit, self.options, Preparer(self.config, unit_terms=True), acc):
                    out.write(item)
                    prog.add(item.read)
            prog.add(0, _unit_bytes(unit))
            prog.close()
        acc.flush()
        spill = None
        if self.partitions > 1:
            spill = spill_unit_counts(acc, FileSystems.join(self.options.output, TMP_DIR), unit.index, self.partitions)
        yield unit.index, acc, path, spill


@dataclasses.dataclass
class _MergedAnalysis:
    """The global combine's output when term counts were spilled: all but the vocabularies."""

    analyzer: Analyzer
    prepared: dict[int, str | None]
    spills: dict[int, str | None]

    def value(self, config: Config, vocabularies: dict[str, list[str]] | None = None) -> AnalysisValue:
        # Where each unit's prepared batches are, and which features had values
        # (for the commit's check; neither is part of the saved analysis).
        present = {f.name: self.analyzer.present[f.name] for f in config.features}
        analysis = self.analyzer.result(vocabularies)
        self.analyzer.check_vocabularies(analysis)  # before any shard is written
        return AnalysisValue({**analysis.to_json(), PREPARED_KEY: self.prepared, PRESENT_KEY: present})


class _MergeAnalyzers(beam.CombineFn):
    """Merges per-unit analyzers into one ``Analysis``, reproducibly.

    Vocabulary counts merge exactly in any order. Floating-point statistics
    do not, and the runner picks the merge order, so the per-unit numeric
    partials are kept apart and merged in unit order at the end: the same
    input always gives bit-identical statistics, hence identical shards.
    With ``spilled`` the term counts are in files (``pipelines.analyze``) and
    the output is a ``_MergedAnalysis`` still without those vocabularies.
    """

    def __init__(self, config: Config, spilled: bool = False):
        self.config, self.spilled = config, spilled

    def create_accumulator(self):
        return (Analyzer(self.config), {}, {}, {})

    def add_input(self, acc, element):
        unit, analyzer, prepared, *spill = element
        analyzer.flush()
        for k, c in analyzer.counts.items():
            acc[0].counts[k].update(c)
        acc[0].present.update(analyzer.present)
        acc[1][unit] = analyzer.numeric
        acc[2][unit] = prepared
        acc[3][unit] = spill[0] if spill else None
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        first = next(accs)
        for counts_acc, partials, prepared, spills in accs:
            for k, c in counts_acc.counts.items():
                first[0].counts[k].update(c)
            first[0].present.update(counts_acc.present)
            first[1].update(partials)
            first[2].update(prepared)
            first[3].update(spills)
        return first

    def extract_output(self, acc):
        analyzer, partials, prepared, spills = acc
        for unit in sorted(partials):
            for k, st in partials[unit].items():
                analyzer.numeric[k].merge(st)
        merged = _MergedAnalysis(analyzer, prepared, spills)
        return merged if self.spilled else merged.value(self.config)


class AnalysisValue(CacheAware):
    """The analysis side input: ``Analysis.to_json()`` (plus ``PREPARED_KEY``) in ``.json``.

    Why a wrapper: Beam's state cache weighs every side input value it loads
    by walking its whole object graph (objsize), again at each bundle that
    loads it, which is slow for an analysis of tens of thousands of terms
    (docs/benchmarks.md#design-converter). ``CacheAware`` is Beam's hook for this: the
    weight is estimated once, where the analysis is made, and the cache reads
    it from ``__sizeof__`` instead of walking the graph. The estimate is 8x
    the pickled size, a little above what the walk finds on real analyses:
    the cache (100 MB by default) only needs the right order of magnitude.
    """

    def __init__(self, analysis_json: dict[str, Any]):
        super().__init__()
        self.json = analysis_json
        self.weight = 8 * len(pickle.dumps(analysis_json, protocol=pickle.HIGHEST_PROTOCOL))

    def get_referents_for_cache(self) -> list[Any]:
        return []

    def __sizeof__(self) -> int:
        return self.weight


class AnalyzeUnits(beam.PTransform):
    """``PCollection[WorkUnit]`` -> singleton ``PCollection[AnalysisValue]``.

    Vocabulary counts and numeric statistics over the first split (training)
    only, so eval data never leaks into the mapping. Each unit's prepared
    batches are written to ``<output>/.recordprep-tmp/prepared-*.bin``; the
    output's ``PREPARED_KEY`` maps unit index to that file.

    With ``partitions`` > 1 (the job passes its unit count) vocabulary term
    counts are merged per partition of the terms (``pipelines.analyze``), so
    no process holds every distinct term; with one unit they go through the
    global combine. Both give the same analysis.
    """

    def __init__(self, config: Config, options: ConvertOptions, partitions: int = 1):
        super().__init__()
        self.config, self.options = config, options
        self.partitions = partitions if spilled_features(config) else 1

    def expand(self, units):
        spilled = self.partitions > 1
        merged = (
            units
            | "AnalyzeUnit" >> beam.ParDo(_AnalyzeUnit(self.config, self.options, self.partitions))
            | "MergeAnalysis" >> beam.CombineGlobally(_MergeAnalyzers(self.config, spilled))
        )
        if not spilled:
            return merged
        vocabularies = merge_vocabularies(merged, self.config, self.partitions)
        config = self.config
        return merged | "FinishAnalysis" >> beam.Map(
            lambda m, v: m.value(config, v), beam.pvalue.AsSingleton(vocabularies))


# ---------------------------------------------------------------- convert


#: The error output keeps this many nesting levels of a rejected record (deeper
#: values would exhaust the stack inside a Beam worker).
_MAX_ERROR_RECORD_DEPTH = 100


def _jsonable(v: Any, depth: int = 0) -> Any:
    if isinstance(v, dict | list | tuple) and depth >= _MAX_ERROR_RECORD_DEPTH:
        return f"<nested deeper than {_MAX_ERROR_RECORD_DEPTH} levels: cut>"
    if isinstance(v, dict):
        return {str(k): _jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x, depth + 1) for x in v]
    if isinstance(v, bytes | bytearray):
        return {"$base64": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    if isinstance(v, decimal.Decimal | _dt.date | _dt.datetime | _dt.time | uuid.UUID):
        return str(v)
    return v


def _error_line(path: str, kind: str, offset: int, index: int, field: str, reason: str, raw: Any) -> bytes:
    """One line of the error output (JSON Lines)."""
    row: dict[str, Any] = {"file": path, "byte_offset": offset}
    if kind == "avro":
        row["record_in_block"] = index
    elif kind == "parquet":  # byte_offset: the row group's
        row["row_in_row_group"] = index
    elif index:
        row["line"] = index
    row.update(field=field, reason=reason, record=_jsonable(raw))
    return json.dumps(row, ensure_ascii=False).encode() + b"\n"


@dataclasses.dataclass
class _Prepared:
    """One input batch, prepared: all the convert pass needs from the input."""

    path: str
    read: int  # records + unparseable lines
    errors: list[bytes]  # its error-output lines, in output order
    split: np.ndarray | None  # split index per record; None: no records
    batch: PreparedBatch | None
    #: A vocabulary label: error lines of the rows finishing may reject (``_late_label_errors``).
    late_errors: dict[int, bytes] | None = None


def _late_label_errors(config: Config, pb: PreparedBatch, known: Any, path: str, batch: Any) -> dict[int, bytes] | None:
    """Error lines, made while the records are at hand, of the rows whose label
    class is not in ``known`` (the training classes seen so far, or a reused
    analysis' classes): ``Vectorizer.finish`` rejects those the whole training
    split lacks. None without a vocabulary label."""
    lab = config.label
    if lab is None or lab.transform != "vocabulary":
        return None
    return {i: _error_line(path, batch.kind, batch.offsets[i], batch.indexes[i], r.field, r.reason, batch.records[i])
            for i, r in unseen_label_rows(pb, lab, known).items()}


def _prepare_unit(unit: WorkUnit, options: ConvertOptions, preparer: Preparer,
                  analyzer: Analyzer | None = None, label_classes: Any = None) -> Iterator[_Prepared]:
    """Read and prepare a unit's batches; with ``analyzer``, also analyze the training split.
    ``label_classes``: a reused analysis' label classes (see ``_late_label_errors``)."""
    for rng in unit.ranges:
        with FileSystems.open(rng.path, compression_type="uncompressed") as f:
            for batch in iter_records(f, rng.path, rng.start, rng.end, options.batch_size, options.json_records_path,
                                      options.avro_decoder, record_json=options.splits.hashes_whole_records,
                                      max_record_bytes=options.max_record_bytes, max_block_bytes=options.max_block_bytes):
                errors = [_error_line(rng.path, batch.kind, off, idx, "<record>", reason, raw)
                          for off, idx, reason, raw in batch.bad]
                if not batch.records:
                    yield _Prepared(rng.path, len(batch.bad), errors, None, None)
                    continue
                split = options.splits.assign(batch.records)
                pb = preparer.prepare(batch.records, analyze=analyzer is not None)
                if analyzer is not None:
                    train = split == 0
                    if pb.bad:  # rejected records (error output) teach the analysis nothing
                        train[list(pb.bad)] = False
                    analyzer.add_prepared(pb, train)
                    pb.analysis = None
                for r in sorted(pb.bad.values(), key=lambda r: r.index):
                    errors.append(_error_line(rng.path, batch.kind, batch.offsets[r.index], batch.indexes[r.index],
                                              r.field, r.reason, batch.records[r.index]))
                late = _late_label_errors(preparer.config, pb, analyzer.label_counts if analyzer else label_classes,
                                          rng.path, batch)
                yield _Prepared(rng.path, len(batch.records) + len(batch.bad), errors, split, pb, late)


_FRAME = struct.Struct("<Q")


class _Serial:
    """Runs ``fn(item)`` for each submitted item, in order, on a thread of its own.

    For work that releases the GIL (zlib, LZ4, file writes): it runs on
    another core while the DoFn goes on. The queue is bounded (``queued``
    items in flight), so memory stays flat; a failure surfaces on the next
    ``submit`` or at ``close``.
    """

    def __init__(self, fn: Callable[[Any], Any], name: str, queued: int = 4):
        self._fn = fn
        self._error: BaseException | None = None
        self._queue: queue.Queue[Any] = queue.Queue(queued)
        self._thread: threading.Thread | None = threading.Thread(target=self._drain, name=name, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._error is None:  # after a failure, keep draining so submit() never blocks
                try:
                    self._fn(item)
                except BaseException as e:
                    self._error = e

    def submit(self, item: Any) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def abort(self) -> None:
        """Stop the thread (after a failure elsewhere)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        self.abort()
        if self._error is not None:
            raise self._error


def _lz4_temp(path: str) -> bool:
    """Whether the temp file ``path`` (prepared batches, scatter, key ranges) holds LZ4 frames.

    On a remote file system its bytes cross the network, and LZ4 (level 0)
    cuts them to a half (prepared batches) or a third (framed records) for
    a little CPU. On a local disk they are written as they are: LZ4's CPU
    costs more than the page cache's copies, for temp files about the size
    of the uncompressed output that live for one pass.
    """
    return "://" in path


def _prepared_parts(item: _Prepared) -> list[Any]:
    """``item`` pickled with its numpy arrays out of band (protocol 5): a head (buffer
    count, then the pickle's and each buffer's length), the pickle, the arrays' memory.
    Arrays are not copied into the pickle, nor out of it when read (``_unpickle_prepared``)."""
    bufs: list[pickle.PickleBuffer] = []
    main = pickle.dumps(item, protocol=5, buffer_callback=bufs.append)
    views = [b.raw() for b in bufs]
    return [struct.pack(f"<I{len(views) + 1}Q", len(views), len(main), *(v.nbytes for v in views)), main, *views]


def _unpickle_prepared(data: bytearray, path: str) -> _Prepared:
    """The item ``_prepared_parts`` wrote; its arrays are views of ``data`` (writable, as unpickled copies are)."""
    try:
        (k,) = struct.unpack_from("<I", data)
        lens = struct.unpack_from(f"<{k + 1}Q", data, 4)
        mv = memoryview(data)
        at, views = 4 + 8 * (k + 1), []
        for n in lens:
            views.append(mv[at:at + n])
            at += n
        if at != len(data):
            raise ValueError("frame size")
        return pickle.loads(views[0], buffers=views[1:])
    except (struct.error, ValueError, pickle.UnpicklingError, EOFError) as e:
        raise ConversionFailed(f"temp file {path} is damaged ({e}); re-run the conversion") from e


class _PreparedWriter:
    """A unit's prepared batches in a temp file: length-prefixed frames of ``_prepared_parts``,
    LZ4-compressed where ``_lz4_temp``.

    Pickling and a raw frame's writes happen in ``write`` (the arrays are
    written from the batch's own memory, before the caller goes on); LZ4 and
    its writes run on a ``_Serial`` thread (they release the GIL). The convert
    pass removes the file once it has read it (the commit removes the temp
    directory in any case).
    """

    def __init__(self, path: str):
        self.f = FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed")
        self._lz4 = _lz4_temp(path)
        self._bg = _Serial(self._compress_and_write, f"recordprep-prepared-{posix_basename(path)}") if self._lz4 else None

    def _compress_and_write(self, data: bytes) -> None:
        data = lz4.frame.compress(data, compression_level=0)
        self.f.write(_FRAME.pack(len(data)))
        self.f.write(data)

    def write(self, item: _Prepared) -> None:
        parts = _prepared_parts(item)
        if self._bg is not None:
            self._bg.submit(b"".join(parts))  # a copy: the batch's arrays are the caller's again once this returns
            return
        self.f.write(_FRAME.pack(sum(memoryview(p).nbytes for p in parts)))
        for p in parts:
            self.f.write(p)

    def __enter__(self) -> _PreparedWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if self._bg is not None and exc_type is None:
                self._bg.close()  # LZ4 frames: the thread writes what is queued
            elif self._bg is not None:
                self._bg.abort()
        finally:
            self.f.close()


def _read_prepared(path: str) -> Iterator[_Prepared]:
    compressed = _lz4_temp(path)
    with FileSystems.open(path, compression_type="uncompressed") as f:
        while True:
            head = f.read(_FRAME.size)
            if not head:
                return
            n = _FRAME.unpack(head)[0] if len(head) == _FRAME.size else -1
            data = bytearray(max(n, 0))
            if n < 0 or f.readinto(data) != n:
                raise ConversionFailed(f"temp file {path} is truncated; re-run the conversion")
            if compressed:
                try:
                    data = lz4.frame.decompress(data, return_bytearray=True)
                except RuntimeError as e:
                    raise ConversionFailed(f"temp file {path} is damaged ({e}); re-run the conversion") from e
            yield _unpickle_prepared(data, path)


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def _relaxed_gc() -> Iterator[None]:
    """Fewer cyclic-GC passes while a unit runs (then the thresholds come back).

    A batch holds thousands of decoded records (dicts, lists) alive, and with
    the default threshold (700 allocations) the collector traverses them again
    and again (a threshold of 50 000 is measurably faster, docs/benchmarks.md#design-converter).
    Records hold no reference cycles; reference
    counting frees them either way. Process-wide, so counted across threads.
    """
    global _gc_users, _gc_saved
    with _gc_lock:
        if _gc_users == 0:
            _gc_saved = gc.get_threshold()
            gc.set_threshold(max(_gc_saved[0], 50_000), max(_gc_saved[1], 20), max(_gc_saved[2], 20))
        _gc_users += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_users -= 1
            if _gc_users == 0 and _gc_saved is not None:
                gc.set_threshold(*_gc_saved)


#: ``--gzip-level`` values written by ISA-L's igzip (python-isal, its levels 1 and 2); 0 and 3..9
#: are zlib-ng's. igzip's levels are far cheaper than zlib-ng's lowest for about the bytes of
#: zlib's level 1 (docs/benchmarks.md#design-converter), so the scale stays monotonic: each
#: step up is slower and smaller.
ISAL_LEVELS = (1, 2)


def gzip_file(fileobj: Any, level: int) -> gzip.GzipFile:
    """A gzip writer over ``fileobj`` at ``level`` (``ConvertOptions.gzip_level``): no name and no
    mtime in its header, so the same records give the same bytes."""
    if level in ISAL_LEVELS:
        return IGzipFile(filename="", fileobj=fileobj, mode="wb", compresslevel=level, mtime=0)
    return GzipNGFile(filename="", fileobj=fileobj, mode="wb", compresslevel=level, mtime=0)


class _Writer:
    """A temp shard being written: raw file, optional gzip layer, counts.

    Gzip is ISA-L's igzip or zlib-ng's by level (:func:`gzip_file`); any gzip
    reader reads it. With gzip, compressing and writing happen on a thread of
    their own: both libraries and file writes release the GIL, so deflate runs
    on another core while the DoFn prepares the next batch. The bytes, and the
    order of the writes, are the same as writing inline.
    """

    _QUEUED = 4  # batches in flight per shard (a few MB): bounded memory

    def __init__(self, path: str, compression: str, level: int):
        self.path = path
        self.raw = FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed")
        self.f = gzip_file(self.raw, level) if compression == "GZIP" else self.raw
        self.records = 0
        self._bg = (_Serial(lambda data: self.f.write(data), f"recordprep-writer-{posix_basename(path)}", self._QUEUED)
                    if self.f is not self.raw else None)

    def write(self, data: bytes, n: int) -> None:
        if self._bg is not None:
            self._bg.submit(data)
        else:
            self.f.write(data)
        self.records += n

    def abort(self) -> None:
        """Stop the writer thread after a failure elsewhere (the temp file is left to the cleanup)."""
        if self._bg is not None:
            self._bg.abort()

    def close(self) -> int:
        if self._bg is not None:
            self._bg.close()
        if self.f is not self.raw:
            self.f.close()
        self.raw.close()
        return size_of(self.path)


# ---------------------------------------------------------------- shuffle
#
# ``--order shuffled`` (the default): each unit's convert step frames its
# records as it would for a shard, then *scatters* them: a record's output
# shard (its bucket) and its place in that shard come from a seeded hash of
# its identity (unit, ordinal in the unit), so they depend on neither the
# worker count nor the runner. The scattered records go to one temp file per
# unit (``scatter-<unit>-*.bin``), in spills of at most ``_SPILL_BYTES``, each
# spill holding one frame per (split, bucket) it has records for (LZ4 where
# ``_lz4_temp``). Then
# ``GatherShards`` runs one element per output shard: it reads its bucket's
# frames from every unit (the index rides along in the unit results, a side
# input: no GroupByKey of records) and writes them sorted by their order key.
# Sorting by an iid uniform key gives a uniform random order, and the bucket
# choice is iid uniform too: each shard is a uniform random sample of its
# split. A bucket larger than ``_GATHER_BYTES`` is first split by key range
# into a temp file of its own (one pass), then each range is sorted in
# memory: a gathering shard holds one range whatever the input's size, and
# the output is the same however many ranges there are.
#
# On a remote file system (gs://, where every read is a request with a round
# trip of tens of milliseconds) the layout and reads are sized for requests
# (docs/architecture.md#the-shuffle-on-object-stores):
# - a unit spills to a local file and, at close, writes its scatter file as
#   one *block* per (split, bucket), in bucket order: ``uint32`` frame count
#   ``k``, ``k`` x (``uint64`` frame size, ``uint32`` records, ``uint64``
#   raw bytes), then the ``k`` LZ4 frames in spill order. Its index holds one
#   ``(offset, size, records, raw bytes, k)`` per bucket.
# - consecutive units are merged into groups (``fan_in_groups``) until a
#   group's blocks average ``_FAN_IN_READ_BYTES``: each unit file is read
#   whole, the group's file written with one block per bucket (the units'
#   frames in unit order, so ties sort as before: the same output bytes).
# - a gathering shard reads each group's block in one ranged GET of exactly
#   its bytes (``_ranged_reader``; Beam's reader fetches 16 MB from wherever
#   a read starts), at most ``_READ_BYTES`` at a time.
# Requests of the gather then grow with bytes / ``_FAN_IN_READ_BYTES``, not
# with units x shards; local runs keep the plain layout (reads are cheap).

_U64 = np.uint64
#: Encoded records a unit buffers before spilling them to its scatter file
#: (up to two more spills wait for the writer thread).
_SPILL_BYTES = 4 << 20
#: Framed records a gathering shard holds at once; a larger bucket is split
#: into key ranges of at most about this size.
_GATHER_BYTES = 16 << 20
#: Most bytes of a scatter file read at once (adjacent frames of one bucket together).
_READ_BYTES = 8 << 20
#: Scatter bytes per bucket a group of units' merged file holds at least (remote temp
#: files): a gathering shard's reads then average at least this.
_FAN_IN_READ_BYTES = 1 << 20
#: Records per write of a gathered shard.
_GATHER_CHUNK = 2048
_FRAME_HEAD = struct.Struct("<I")


try:  # glibc only; elsewhere the allocator is left as it is
    _malloc_trim = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError, TypeError):
    _malloc_trim = None


def _release_freed_memory() -> None:
    """Give the C allocator's free pages back to the system (glibc ``malloc_trim``).

    A gathering shard allocates and frees a key range's buffer and its frames
    (megabytes each) on pool threads; glibc keeps what each thread's arena
    freed, so without this the process's peak grows with the number of ranges
    gathered, not with the largest range.
    """
    if _malloc_trim is not None:
        _malloc_trim(0)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
        return x ^ (x >> _U64(31))


def shuffle_keys(seed: int, unit: int, ordinals: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(bucket, order key)`` of the records ``ordinals`` (0-based, among the records the unit read).

    The identity ``unit << 40 | ordinal`` is hashed with the seed: buckets are
    uniform over ``num_shards`` and keys uniform over 64 bits, independently.
    """
    seeded = _mix64(np.array([seed], dtype=_U64))[0]
    ident = (_U64(unit) << _U64(40)) | ordinals.astype(_U64)
    h = _mix64(ident ^ seeded)
    bucket = ((h >> _U64(32)) * _U64(num_shards)) >> _U64(32)
    return bucket.astype(np.int64), _mix64(h)


class _Scatter:
    """A unit's framed records, scattered by bucket to its temp file.

    Frame payload: record count (uint32), order keys (uint64 each), framed
    lengths (uint32 each), the framed records. ``index`` maps
    ``split * num_shards + bucket`` to ``(offset, size, records, raw bytes)``
    of each of its frames, in file order; it is complete after ``close``.
    """

    def __init__(self, path: str, unit: int, num_shards: int, seed: int):
        self.path, self.unit, self.num_shards, self.seed = path, unit, num_shards, seed
        self._lz4 = _lz4_temp(path)
        # Remote: spills go to a local file first, copied out bucket by bucket at ``close``.
        self.f = (tempfile.TemporaryFile(prefix="recordprep-scatter-") if self._lz4 else
                  FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed"))
        self.index: dict[int, list[tuple[int, int, int, int]]] = {}
        self._pos = 0
        self._pending: dict[int, list[tuple[memoryview, np.ndarray, np.ndarray]]] = {}
        self._pending_bytes = 0
        self._bg = _Serial(self._write_spill, f"recordprep-scatter-{unit}", queued=2)

    def add(self, buf: np.ndarray, starts: np.ndarray, lens: np.ndarray, split: np.ndarray, ordinals: np.ndarray) -> None:
        bucket, key = shuffle_keys(self.seed, self.unit, ordinals, self.num_shards)
        group = split.astype(np.int64) * self.num_shards + bucket
        order = np.argsort(group, kind="stable")
        framed = memoryview(frame_records(buf, starts[order], lens[order]))  # slices below: no copies
        flens = lens[order].astype(np.int64) + 16
        ends = np.cumsum(flens)
        group, key = group[order], key[order]
        cuts = np.flatnonzero(group[1:] != group[:-1]) + 1
        lo = 0
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(group)], strict=True):
            hi = int(ends[b - 1])
            self._pending.setdefault(int(group[a]), []).append((framed[lo:hi], flens[a:b], key[a:b]))
            lo = hi
        self._pending_bytes += len(framed)
        if self._pending_bytes >= _SPILL_BYTES:
            self._spill()

    def _spill(self) -> None:
        if self._pending:
            self._bg.submit(sorted(self._pending.items()))
        self._pending, self._pending_bytes = {}, 0

    def _write_spill(self, groups: list[tuple[int, list[tuple[memoryview, np.ndarray, np.ndarray]]]]) -> None:
        for g, parts in groups:
            keys = np.concatenate([p[2] for p in parts])
            size, raw = _write_frame(self.f, keys, np.concatenate([p[1] for p in parts]), [p[0] for p in parts], self._lz4)
            self.index.setdefault(g, []).append((self._pos, size, len(keys), raw))
            self._pos += size

    def close(self, input_bytes: int) -> dict:
        """The file and its index; ``input_bytes``, the unit's, scales the gather's progress."""
        try:
            self._spill()
            self._bg.close()
            if self._lz4:
                self.index = _copy_by_bucket(self.f, self.index, self.path)
        finally:
            self.f.close()
        return {"path": self.path, "index": self.index, "input_bytes": input_bytes}

    def abort(self) -> None:
        self._bg.abort()


def _write_frame(f: Any, keys: np.ndarray, flens: np.ndarray, records: list[Any], compress: bool) -> tuple[int, int]:
    """Write one frame of a scatter (or key-range) file: count, order keys, framed lengths,
    the framed records (``records``: pieces, in order); an LZ4 frame of all that if
    ``compress``. Returns ``(bytes written, bytes of the framed records)``."""
    parts = [_FRAME_HEAD.pack(len(keys)), keys.astype("<u8").tobytes(), flens.astype("<u4").tobytes(), *records]
    raw = sum(len(p) for p in records)
    if compress:
        comp = lz4.frame.compress(b"".join(parts), compression_level=0)
        f.write(comp)
        return len(comp), raw
    for p in parts:
        f.write(p)
    return _FRAME_HEAD.size + 12 * len(keys) + raw, raw


_Index = dict[int, list[tuple[int, ...]]]  # split * num_shards + bucket -> its frames or its block
_BLOCK_HEAD = struct.Struct("<I")
_BLOCK_FRAME = struct.Struct("<QIQ")


def _copy_by_bucket(local: Any, index: _Index, path: str) -> _Index:
    """Write the frames of ``index`` (offsets in ``local``) to ``path`` as one block per bucket
    (see the shuffle's notes above); returns the index of ``path``: one entry per bucket."""
    out: _Index = {}
    pos = 0
    f = FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed")
    try:
        for g in sorted(index):
            frames = index[g]
            head = _BLOCK_HEAD.pack(len(frames)) + b"".join(_BLOCK_FRAME.pack(fs, n, raw) for _, fs, n, raw in frames)
            f.write(head)
            for offset, size, _, _ in frames:
                local.seek(offset)
                data = local.read(size)
                if len(data) != size:
                    raise ConversionFailed(f"the local copy of {path} is truncated (disk full?); re-run the conversion")
                f.write(data)
            size = len(head) + sum(fr[1] for fr in frames)
            out[g] = [(pos, size, sum(fr[2] for fr in frames), sum(fr[3] for fr in frames), len(frames))]
            pos += size
    finally:
        f.close()
    return out


def _block_frames(head: Any, block: tuple[int, ...], path: str) -> list[tuple[int, int, int, int]]:
    """The frames of ``block`` (an index entry ``(offset, size, records, raw bytes, frames)``)
    from its first bytes ``head``: ``(offset, size, records, raw bytes)`` each."""
    k = block[4]
    need = _BLOCK_HEAD.size + _BLOCK_FRAME.size * k
    if len(head) < need or _BLOCK_HEAD.unpack_from(head)[0] != k:
        raise ConversionFailed(f"temp file {path} is truncated or damaged; re-run the conversion")
    frames, at = [], block[0] + need
    for size, n, raw in _BLOCK_FRAME.iter_unpack(bytes(head[_BLOCK_HEAD.size:need])):
        frames.append((at, size, n, raw))
        at += size
    if at != block[0] + block[1]:
        raise ConversionFailed(f"temp file {path} is truncated or damaged; re-run the conversion")
    return frames


def _runs(frames: list[tuple[int, ...]]) -> Iterator[tuple[int, int, list[tuple[int, ...]]]]:
    """``(offset, size, entries)`` of each read of index entries (frames or blocks): adjacent
    ones together, up to ``_READ_BYTES`` a read (a larger one is a read of its own)."""
    run: list[tuple[int, ...]] = []
    start = end = 0
    for fr in frames:
        if run and (fr[0] != end or end - start + fr[1] > _READ_BYTES):
            yield start, end - start, run
            run = []
        if not run:
            start = end = fr[0]
        run.append(fr)
        end += fr[1]
    if run:
        yield start, end - start, run


_GCS_CLIENTS: dict[str | None, Any] = {}
_GCS_LOCK = threading.Lock()


def _gcs_client(path: str) -> Any:
    """Beam's storage client for ``path``, one per process and endpoint (making one takes
    a credential lookup; ``STORAGE_EMULATOR_HOST`` is the endpoint of the test emulator)."""
    key = os.environ.get("STORAGE_EMULATOR_HOST")
    with _GCS_LOCK:
        if key not in _GCS_CLIENTS:
            gcsio = getattr(FileSystems.get_filesystem(path), "_gcsIO", None)
            _GCS_CLIENTS[key] = gcsio().client if gcsio is not None else None
        return _GCS_CLIENTS[key]


@contextlib.contextmanager
def _ranged_reader(path: str) -> Iterator[Callable[[int, int], bytes]]:
    """``read(offset, size)``: one request per call on gs:// (Beam's reader would fetch 16 MB
    from ``offset`` on, whatever was asked), a seek and a read of an open file elsewhere."""
    client = _gcs_client(path) if path.startswith("gs://") else None
    if client is not None:
        bucket, name = path[len("gs://"):].split("/", 1)
        blob = client.bucket(bucket).blob(name)
        yield lambda offset, size: blob.download_as_bytes(start=offset, end=offset + size - 1,
                                                          raw_download=True, checksum=None)
        return
    with FileSystems.open(path, compression_type="uncompressed") as f:
        def read_fs(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)
        yield read_fs


def _read_frames(path: str, frames: list[tuple[int, int, int, int]],
                 into: memoryview | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, memoryview]]:
    """``(order keys, framed lengths, framed records)`` of the frames of one scatter file
    (views of the frame's payload: no copy). With ``into``, the frames' records go
    to it back to back, a raw frame's read straight into it, and the views are of it."""
    compressed = _lz4_temp(path)
    if compressed:
        yield from _read_lz4_frames(path, frames, into)
        return
    direct = into is not None
    at = 0
    with FileSystems.open(path, compression_type="uncompressed") as f:
        for offset, size, n, raw in frames:
            f.seek(offset)
            head = _FRAME_HEAD.size + 12 * n
            if direct:
                payload = f.read(head) if size == head + raw else b""
                ok = len(payload) == head and f.readinto(into[at:at + raw]) == raw
            else:
                payload = f.read(size)
                if compressed:
                    try:
                        payload = lz4.frame.decompress(payload) if len(payload) == size else b""
                    except RuntimeError:
                        payload = b""
                ok = len(payload) == head + raw
            if not ok or _FRAME_HEAD.unpack_from(payload)[0] != n:
                raise ConversionFailed(f"temp file {path} is truncated or damaged; re-run the conversion")
            keys = np.frombuffer(payload, dtype="<u8", count=n, offset=_FRAME_HEAD.size)
            flens = np.frombuffer(payload, dtype="<u4", count=n, offset=_FRAME_HEAD.size + 8 * n)
            records = memoryview(payload)[head:]
            if into is not None:
                if not direct:
                    into[at:at + raw] = records
                records = into[at:at + raw]
                at += raw
            yield keys, flens.astype(np.int64), records


def _read_lz4_frames(path: str, entries: list[tuple[int, ...]],
                     into: memoryview | None) -> Iterator[tuple[np.ndarray, np.ndarray, memoryview]]:
    """:func:`_read_frames` of a remote temp file: adjacent entries in one ranged read
    (:func:`_runs`); a block larger than ``_READ_BYTES`` is read as its frames, after its header."""
    with _ranged_reader(path) as read:
        yield from _read_lz4_entries(path, entries, into, read)


def _read_lz4_entries(path: str, entries: list[tuple[int, ...]], into: memoryview | None,
                      read: Callable[[int, int], bytes]) -> Iterator[tuple[np.ndarray, np.ndarray, memoryview]]:
    items: list[tuple[int, ...]] = []
    for e in entries:
        if len(e) == 5 and e[1] > _READ_BYTES:
            items.extend(_block_frames(read(e[0], _BLOCK_HEAD.size + _BLOCK_FRAME.size * e[4]), e, path))
        else:
            items.append(e)
    at = 0
    for offset, size, run in _runs(items):
        data = memoryview(read(offset, size))
        if len(data) != size:
            raise ConversionFailed(f"temp file {path} is truncated or damaged; re-run the conversion")
        for e in run:
            for fo, fsize, n, raw in (_block_frames(data[e[0] - offset:], e, path) if len(e) == 5 else [e]):
                try:
                    payload = lz4.frame.decompress(data[fo - offset:fo - offset + fsize])
                except RuntimeError:
                    payload = b""
                head = _FRAME_HEAD.size + 12 * n
                if len(payload) != head + raw or _FRAME_HEAD.unpack_from(payload)[0] != n:
                    raise ConversionFailed(f"temp file {path} is truncated or damaged; re-run the conversion")
                keys = np.frombuffer(payload, dtype="<u8", count=n, offset=_FRAME_HEAD.size)
                flens = np.frombuffer(payload, dtype="<u4", count=n, offset=_FRAME_HEAD.size + 8 * n)
                records = memoryview(payload)[head:]
                if into is not None:
                    into[at:at + raw] = records
                    records = into[at:at + raw]
                    at += raw
                yield keys, flens.astype(np.int64), records
        del data


class _GatherShard(beam.DoFn):
    """One output shard per split: its bucket from every unit's scatter file, sorted by order key.

    Up to ``parallel`` shards of a bundle are written at once, each on a
    thread of its own: a shard's gzip (on its writer's thread) is the step's
    bottleneck, and it releases the GIL, so in one process the next shard's
    deflate runs on another core (as the input-order convert pass overlaps
    deflate with encoding); worker processes already use the cores. Results
    come out in shard order; memory is that many shards' key ranges.
    """

    def __init__(self, options: ConvertOptions, num_shards: int, parallel: int = 1):
        self.options, self.num_shards, self.parallel = options, num_shards, parallel
        self._running: list[concurrent.futures.Future] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop = threading.Event()

    def setup(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="recordprep-gather")

    def start_bundle(self) -> None:
        self._running = []
        self._stop.clear()

    def process(self, shard: int, results: list[dict]):
        assert self._pool is not None
        try:
            done = self._running.pop(0).result() if len(self._running) >= self.parallel else None
            self._running.append(self._pool.submit(self._write_shard, shard, results))
        except BaseException:
            self._abort()
            raise
        if done is not None:
            yield done

    def finish_bundle(self):
        try:
            done = [fut.result() for fut in self._running]
        except BaseException:
            self._abort()
            raise
        self._running = []
        for d in done:
            yield GlobalWindows.windowed_value(d)

    def _abort(self) -> None:
        """A failure (or Ctrl-C): the other shards' threads stop before the error goes on, so
        none writes into the temp directory the run's cleanup removes."""
        self._stop.set()
        running, self._running = self._running, []
        concurrent.futures.wait(running)

    def teardown(self) -> None:
        self._abort()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _write_shard(self, shard: int, results: list[dict]) -> dict:
        opts = self.options
        tmp = FileSystems.join(opts.output, TMP_DIR)
        attempt = uuid.uuid4().hex[:8]
        suffix = ".tfrecord.gz" if opts.compression_type == "GZIP" else ".tfrecord"
        scattered = sorted((r for r in results if r["scatter"] is not None), key=lambda r: r["unit"])
        # Progress in input bytes: each written byte stands for this many (the whole bucket's share of the input).
        raw = sum(fr[3] for r in scattered for frames in r["scatter"]["index"].values() for fr in frames)
        scale = sum(r["scatter"].get("input_bytes", 0) for r in scattered) / raw if raw else 0.0
        prog = UnitProgress(FileSystems.join(opts.output, TMP_DIR, PROGRESS_DIR) if opts.progress else None, GATHER, shard)
        out = {}
        with _relaxed_gc():
            for s, name in enumerate(opts.splits.names):
                g = s * self.num_shards + shard
                sources = [(r["scatter"]["path"], r["scatter"]["index"][g]) for r in scattered if g in r["scatter"]["index"]]
                w = _Writer(FileSystems.join(tmp, f"{name}-{shard:05d}-{attempt}{suffix}"), opts.compression_type, opts.gzip_level)
                try:
                    for piece in _gathered(sources, FileSystems.join(tmp, f"gather-{name}-{shard:05d}-{attempt}.bin")):
                        if self._stop.is_set():
                            raise ConversionFailed("stopped: another shard failed")
                        w.write(piece[0], piece[1])
                        prog.add(piece[1], round(len(piece[0]) * scale))
                except BaseException:
                    w.abort()
                    raise
                out[name] = {"tmp": w.path, "records": w.records, "bytes": w.close()}
        prog.close()
        return {"shard": shard, "shards": out}


_Sources = list[tuple[str, list[tuple[int, int, int, int]]]]  # (scatter file, its frames of one bucket)


def _gathered(sources: _Sources, spill: str) -> Iterator[tuple[bytes, int]]:
    """The framed records of ``sources`` sorted by order key (ties: in source order), in writes of ``_GATHER_CHUNK`` records.

    A bucket of more than ``_GATHER_BYTES`` is split by key range into the
    temp file ``spill`` first (removed at the end), so one range is in memory
    at a time and every record is read at most twice. Writes are counted over
    the whole shard (deflate's bytes depend on how the input is cut into
    writes): the same bytes however many ranges there are.
    """
    raw = sum(fr[3] for _, frames in sources for fr in frames)
    ranges = max(1, -(-raw // _GATHER_BYTES))
    try:
        parts = [sources] if ranges == 1 else _split_by_key(sources, ranges, spill)
        pending: list[Any] = []  # pieces of the next write
        count = 0  # records in ``pending``
        for part in parts:
            keys, lens, data = _load(part)
            order = np.argsort(keys, kind="stable")
            starts, lens = (np.cumsum(lens) - lens)[order], lens[order]
            del keys, order
            at = 0
            while at < len(starts):
                end = min(len(starts), at + _GATHER_CHUNK - count)
                pending.append(take_records(data, starts[at:end], lens[at:end]))  # copies: nothing holds ``data``
                count += end - at
                at = end
                if count == _GATHER_CHUNK:
                    yield b"".join(pending), count
                    pending, count = [], 0
            del data
        if count:
            yield b"".join(pending), count
    finally:
        if ranges > 1 and FileSystems.exists(spill):
            fs_delete([spill])


def _load(sources: _Sources) -> tuple[np.ndarray, np.ndarray, bytearray]:
    """``(order keys, framed lengths, framed records)`` of every frame of ``sources``,
    in source order; the records in one buffer (each frame's payload is let go once copied)."""
    _release_freed_memory()  # the previous range's (or shard's) buffers
    data = bytearray(sum(fr[3] for _, frames in sources for fr in frames))
    keys, lens, pos = [], [], 0
    mv = memoryview(data)
    for path, frames in sources:
        for k, fl, _ in _read_frames(path, frames, into=mv[pos:]):
            keys.append(k.copy())  # not a view that would hold the payload
            lens.append(fl)
        pos += sum(fr[3] for fr in frames)
    if not keys:
        return np.zeros(0, _U64), np.zeros(0, np.int64), data
    return np.concatenate(keys), np.concatenate(lens), data


def _split_by_key(sources: _Sources, ranges: int, spill: str) -> list[_Sources]:
    """Copy the records of ``sources`` into ``spill``, one frame per source frame and key range
    (keys ``[2**64 * j / ranges, 2**64 * (j + 1) / ranges)``); returns each range's frames, in source order."""
    cuts = np.array([(2**64 * j) // ranges for j in range(1, ranges)], dtype=_U64)
    index: list[list[tuple[int, int, int, int]]] = [[] for _ in range(ranges)]
    pos = 0
    compress = _lz4_temp(spill)
    f = FileSystems.create(spill, mime_type="application/octet-stream", compression_type="uncompressed")
    try:
        for path, frames in sources:
            for k, fl, d in _read_frames(path, frames):
                rng = np.searchsorted(cuts, k, side="right")
                order = np.argsort(rng, kind="stable")
                starts, lens = (np.cumsum(fl) - fl)[order].tolist(), fl[order].tolist()
                rng, k, fl = rng[order], k[order], fl[order]
                cut = (np.flatnonzero(rng[1:] != rng[:-1]) + 1).tolist()
                for a, b in zip([0, *cut], [*cut, len(rng)], strict=True):
                    records = [b"".join([d[x:x + n] for x, n in zip(starts[a:b], lens[a:b], strict=True)])]
                    size, raw = _write_frame(f, k[a:b], fl[a:b], records, compress)
                    index[int(rng[a])].append((pos, size, b - a, raw))
                    pos += size
    finally:
        f.close()
    return [[(spill, frames)] for frames in index]


class GatherShards(beam.PTransform):
    """Shard indexes -> one result per output shard (``{"shard", "shards": {split: tmp, records, bytes}}``).

    ``results`` (the convert step's unit results, with their scatter index)
    is a side input, so every unit has scattered before any shard gathers.
    """

    def __init__(self, options: ConvertOptions, num_shards: int, results, parallel: int = 1):
        super().__init__()
        self.options, self.num_shards, self.results, self.parallel = options, num_shards, results, parallel

    def expand(self, shards):
        # Only the scatter indexes ride to the gather: the unit results' other
        # parts (per-file counts, statistics) are the commit's.
        indexes = self.results | "ScatterIndexes" >> beam.Map(_scatter_index)
        if _lz4_temp(self.options.output):  # remote temp files: merge units until reads are large
            buckets = self.num_shards * len(self.options.splits.names)
            # Only (unit, bytes) pairs meet in one element; each group's indexes meet in its own.
            groups = (indexes | "ScatterSizes" >> beam.Map(lambda r: (None, (r["unit"], _scatter_bytes(r))))
                      | "CollectSizes" >> beam.GroupByKey()
                      | "FanInGroups" >> beam.MapTuple(lambda _, sizes: fan_in_groups(list(sizes), buckets)))
            indexes = (indexes | "ByGroup" >> beam.Map(lambda r, g: (g[r["unit"]], r), beam.pvalue.AsSingleton(groups))
                       | "Group" >> beam.GroupByKey()
                       | "MergeScatter" >> beam.MapTuple(lambda _, rs: _merge_scatter(rs, self.options)))
        return shards | "GatherShard" >> beam.ParDo(_GatherShard(self.options, self.num_shards, self.parallel),
                                                    beam.pvalue.AsList(indexes))


def _scatter_index(result: dict) -> dict:
    return {"unit": result["unit"], "scatter": result["scatter"]}


def _without_scatter_index(result: dict) -> dict:
    return {**result, "scatter": None}


def _scatter_bytes(result: dict) -> int:
    sc = result["scatter"]
    return sum(fr[1] for frames in sc["index"].values() for fr in frames) if sc else 0


def fan_in_groups(sizes: list[tuple[int, int]], buckets: int) -> dict[int, int]:
    """``unit -> group`` (the group's first unit) from ``(unit, scatter bytes)``: consecutive
    units grouped until a group's scatter bytes reach ``_FAN_IN_READ_BYTES`` per bucket, so
    a gathering shard's read of one group's bucket averages at least that (the last group
    may be smaller). A unit without scatter bytes is a group of its own."""
    target = _FAN_IN_READ_BYTES * buckets
    groups: dict[int, int] = {}
    first, size = None, 0
    for unit, nbytes in sorted(sizes):
        if not nbytes:
            groups[unit] = unit
            continue
        first = unit if first is None else first
        groups[unit] = first
        size += nbytes
        if size >= target:
            first, size = None, 0
    return groups


def _merge_scatter(units: Iterable[dict], options: ConvertOptions) -> dict:
    """One scatter file of a group of units: each unit's file read whole (reads of
    ``_READ_BYTES``) to local disk, then written bucket by bucket, the units' frames of a
    bucket in unit order (the order the gather's ties keep). A group of one is itself."""
    group = sorted(units, key=lambda r: r["unit"])
    if len(group) == 1:
        return group[0]
    first = group[0]["unit"]
    path = FileSystems.join(options.output, TMP_DIR, f"scatter-group-{first:05d}-{uuid.uuid4().hex[:8]}.bin")
    with tempfile.TemporaryFile(prefix="recordprep-merge-") as local:
        index: dict[int, list[tuple[int, int, int, int]]] = {}
        for r in group:
            sc = r["scatter"]
            total, base = _scatter_bytes(r), local.seek(0, os.SEEK_END)
            with _ranged_reader(sc["path"]) as read:
                for at in range(0, total, _READ_BYTES):
                    data = read(at, min(_READ_BYTES, total - at))
                    if len(data) != min(_READ_BYTES, total - at):
                        raise ConversionFailed(f"temp file {sc['path']} is truncated or damaged; re-run the conversion")
                    local.write(data)
            for g, blocks in sc["index"].items():
                for blk in blocks:  # a unit's file: one block per bucket
                    local.seek(base + blk[0])
                    head = local.read(_BLOCK_HEAD.size + _BLOCK_FRAME.size * blk[4])
                    frames = _block_frames(head, (base + blk[0], *blk[1:]), sc["path"])
                    index.setdefault(g, []).extend(frames)
        local.flush()
        merged = _copy_by_bucket(local, index, path)
    return {"unit": first, "scatter": {"path": path, "index": merged,
                                       "input_bytes": sum(r["scatter"].get("input_bytes", 0) for r in group)}}


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
        self.writers = ([_Writer(FileSystems.join(tmp, f"{s}-{unit.index:05d}-{attempt}{suffix}"), opts.compression_type, opts.gzip_level)
                         for s in names] if seed is None else [])
        self.scatter = (_Scatter(FileSystems.join(tmp, f"scatter-{unit.index:05d}-{attempt}.bin"), unit.index, num_shards, seed)
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


def _encode_batch(item: _Prepared, vec: Vectorizer, slices: Any, out: _UnitOutput, prog: UnitProgress) -> None:
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
    (``--order input``), or scatter its records to the output shards (``_Scatter``).

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
        prog = _unit_progress(opts, "convert", unit)
        with _relaxed_gc():
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
                          vec: Vectorizer) -> tuple[str | None, Iterator[_Prepared]]:
        """The unit's prepared batches, and the prepared file they are read from (None: prepared here).

        The analysis pass left the unit prepared; with a reused analysis
        (--analysis-from) there is no analysis pass: prepare here, as a
        retried unit does (its first attempt removed the file it read).
        """
        cached = (analysis_json.get(PREPARED_KEY) or {}).get(unit.index)
        if cached and not FileSystems.exists(cached):
            cached = None
        items = (_read_prepared(cached) if cached
                 else _prepare_unit(unit, self.options, Preparer(self.config, unit_terms=True), label_classes=vec.label_ids))
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
                nbytes = _unit_bytes(unit)
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


# ----------------------------------------------------------------- commit


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


class _Commit(beam.DoFn):
    def __init__(self, config: Config, options: ConvertOptions, ctx: CommitContext):
        self.config, self.options, self.ctx = config, options, ctx

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
        error_files = _move_error_files(out, results)
        self._refuse_failed_run(counts, error_files, analysis_json)

        # Everything that can fail on the configuration (the analysis, feature
        # specs, the metadata) is built before the first shard is renamed into
        # place, so such a failure leaves no shards without metadata.
        analysis = Analysis.from_json(analysis_json)
        info, renames = self._dataset_info(shard_results, analysis, counts, error_files)
        splits, vocab_files = info.splits, info.extra["vocabularies"]
        metadata = info.dumps().encode()
        analysis_data = json.dumps(analysis.to_json()).encode()
        stats_data = _stats_document(keyed_stats[1].result(), splits, per_file, analysis.stats)

        # Shards: temp names -> {split}-{i}-of-{n}; then what an earlier run left.
        _rename_replacing([src for src, _ in renames], [dst for _, dst in renames])
        _remove_stale(out, [f"{s}-*-of-*.tfrecord*" for s in names], {sh.file for sp in splits.values() for sh in sp.shards})
        _remove_stale(out, [f"{ERRORS_DIR}/errors-*.jsonl"], {e["file"] for e in error_files})
        for name, terms in analysis.vocabularies.items():
            data = "".join(_escape_term(t) + "\n" for t in terms).encode("utf-8", "surrogatepass")
            write_atomic(FileSystems.join(out, vocab_files[name]["file"]), data)
        write_atomic(FileSystems.join(out, ANALYSIS_FILENAME), analysis_data)
        write_atomic(FileSystems.join(out, STATS_FILENAME), stats_data)

        cleanup_tmp(out)
        try:
            fs_delete([FileSystems.join(out, FAILURE_FILENAME)])
        except Exception:
            pass
        write_atomic(FileSystems.join(out, METADATA_FILENAME), metadata)
        yield info.to_json()

    def _refuse_failed_run(self, counts: dict, error_files: list[dict], analysis_json: dict) -> None:
        """Raise ``ConversionFailed`` (and, for too many rejections, write the failure file)
        when the run must not commit: more rejections than tolerated, or a feature absent."""
        opts, ctx, out = self.options, self.ctx, self.options.output
        read, n_err, written = counts["read"], counts["errors"], counts["written"]
        if not opts.errors_tolerated(n_err, read):
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

    def _dataset_info(self, shard_results: list[dict], analysis: Analysis, counts: dict,
                      error_files: list[dict]) -> tuple[DatasetInfo, list[tuple[str, str]]]:
        """The committed dataset's metadata, and the (temp, final) renames of its shards."""
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
        vocab_files = {name: {"file": f"{VOCAB_DIR}/{name}.txt", "terms": len(terms)}
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


def posix_basename(p: str) -> str:
    return p.rstrip("/").rsplit("/", 1)[-1]


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
        results = self.results | "CommitResults" >> beam.Map(_without_scatter_index)
        return stats | "Commit" >> beam.ParDo(_Commit(self.config, self.options, self.ctx), beam.pvalue.AsList(results),
                                              beam.pvalue.AsSingleton(self.analysis), *shards)
