"""A work unit's input, read once: decoded and prepared batch by batch, its rejected
records as error-output lines, its size and progress.

Both passes start here: the analysis pass prepares each unit (``prepare_unit``
with an ``Analyzer``) and writes the batches to a temp file
(``pipelines.tempfile_format``); the convert pass reads them back, or, with a
reused analysis (``--analysis-from``), prepares the unit itself. A rejected
record becomes one JSON line of the error output (``OUTPUT/errors/``: file,
byte offset, record in block or line, field, reason, the record).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import decimal
import gc
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
from apache_beam.io.filesystems import FileSystems

from convert import formats
from convert.analysis import Analyzer
from convert.config import Config
from convert.paths import parse_path
from convert.prepare import PreparedBatch, Preparer
from convert.sources import iter_records
from convert.splits import Splits
from convert.vectorize import unseen_label_rows
from pipelines._fs import size_of
from pipelines.local.progress import PROGRESS_DIR, UnitProgress
from pipelines.options import ConvertOptions
from pipelines.plan import WorkUnit
from pipelines.run_files import TMP_DIR
from pipelines.tempfile_format import Prepared


def unit_bytes(unit: WorkUnit) -> int:
    """The bytes of input ``unit`` covers (for progress: a file it cannot size counts 0)."""
    total = 0
    for r in unit.ranges:
        end = r.end
        if end is None:  # to the end of the file
            try:
                end = size_of(r.location)
            except Exception:  # progress only: never fail a unit over it
                end = r.start
        total += max(0, end - r.start)
    return total


def unit_progress(options: ConvertOptions, pass_name: str, unit: WorkUnit) -> UnitProgress:
    """Progress files for the launcher (local runs with ``options.progress`` only)."""
    root = FileSystems.join(options.output, TMP_DIR, PROGRESS_DIR) if options.progress else None
    return UnitProgress(root, pass_name, unit.index)


_gc_lock = threading.Lock()
_gc_users = 0
_gc_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def relaxed_gc() -> Iterator[None]:
    """Fewer cyclic-GC passes while a unit runs (then the thresholds come back).

    A batch holds thousands of decoded records (dicts, lists) alive, and with
    the default threshold (700 allocations) the collector traverses them again
    and again (a threshold of 50 000 saves that time: docs/benchmarks.md#design-converter).
    Records hold no reference cycles; reference counting frees them either way.
    Process-wide, so counted across threads.
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
    row.update(formats.get(kind).error_position(index))  # kind: the batch's format
    row.update(field=field, reason=reason, record=_jsonable(raw))
    return json.dumps(row, ensure_ascii=False).encode() + b"\n"


def _late_label_errors(config: Config, pb: PreparedBatch, known: Any, path: str, batch: Any) -> dict[int, bytes] | None:
    """Error lines, made while the records are at hand, of the rows whose label
    class is not in ``known`` (the training classes seen so far, or a reused
    analysis' classes): ``Vectorizer.finish`` rejects those the whole training
    split lacks. None without a vocabulary label."""
    lab = config.label
    if lab is None or not lab.needs_vocabulary:
        return None
    return {i: _error_line(path, batch.kind, batch.offsets[i], batch.indexes[i], r.field, r.reason, batch.records[i])
            for i, r in unseen_label_rows(pb, lab, known).items()}


def read_columns(config: Config, splits: Splits) -> frozenset[str] | None:
    """The top-level fields a run reads from each record: the first key of
    every source path of the config and of the split key (Parquet decodes
    only these columns). ``None`` (every field) when the split hashes whole
    records."""
    if splits.hashes_whole_records:
        return None
    sources = [s for f in config.features for s in (f.source, *(f.sources or ()))]
    sources += [config.label.source] if config.label is not None else []
    sources += [splits.key] if splits.key else []
    out = set()
    for source in sources:
        first = parse_path(source)[0] if "[" in source or "]" in source else source.split(".")[0]
        if isinstance(first, str):
            out.add(first)
    return frozenset(out)


def prepare_unit(unit: WorkUnit, options: ConvertOptions, preparer: Preparer,
                  analyzer: Analyzer | None = None, label_classes: Any = None) -> Iterator[Prepared]:
    """Read and prepare a unit's batches; with ``analyzer``, also analyze the training split.
    ``label_classes``: a reused analysis' label classes (see ``_late_label_errors``)."""
    columns = read_columns(preparer.config, options.splits)
    for rng in unit.ranges:
        with FileSystems.open(rng.location, compression_type="uncompressed") as f:
            for batch in iter_records(f, rng.path, rng.start, rng.end, options.batch_size, options.json_records_path,
                                      options.avro_decoder, record_json=options.splits.hashes_whole_records,
                                      max_record_bytes=options.max_record_bytes, max_block_bytes=options.max_block_bytes,
                                      columns=columns):
                errors = [_error_line(rng.path, batch.kind, off, idx, "<record>", reason, raw)
                          for off, idx, reason, raw in batch.bad]
                if not batch.records:
                    yield Prepared(rng.path, len(batch.bad), errors, None, None)
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
                yield Prepared(rng.path, len(batch.records) + len(batch.bad), errors, split, pb, late)
