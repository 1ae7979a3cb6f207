"""Reading AVRO, Parquet and JSON input into batches of records: the entry
points, each a thin call through the format registry (``convert.formats``).

Functions here take an already-open *binary* file object (the pipeline opens
files through Beam's filesystems, so local, ``gs://`` and ``hdfs://`` work the
same) and a byte range, and yield ``RecordBatch``es. Working on batches is what
lets the rest of the job use numpy instead of per-record Python.

Byte ranges follow Beam's ``avroio``/``textio`` convention: a range
``[start, end)`` owns every unit (Avro block, Parquet row group, JSON line)
that *starts* in it, so ranges of one file can be read by different workers
with no record read twice or lost.

The formats live in ``convert.formats`` (one module each: ``avro``, ``json``,
``parquet``, with their readers beside them); what every reader shares in
``convert.source_types`` (caps, ``InputFileError``, ``RecordBatch``) and
``convert.column_records`` (``ColumnRecords``, the fast paths' batches).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import IO, Any

from convert.column_records import ColumnRecords
from convert.formats import BatchOptions, format_of
from convert.formats.avro import AVRO_DECODERS, iter_avro, read_avro_schema
from convert.formats.avro_framing import AVRO_MAGIC, VALUE_FIELD, is_record_schema
from convert.formats.jsonl import iter_json
from convert.source_types import (
    DEFAULT_MAX_BLOCK_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    GZIP_MAGIC,
    MAX_AVRO_BLOCK_BYTES,
    MAX_AVRO_EMPTY_RECORDS,
    MAX_ERROR_TEXT_BYTES,
    InputFileError,
    RecordBatch,
)

__all__ = [
    "AVRO_DECODERS", "AVRO_MAGIC", "DEFAULT_MAX_BLOCK_BYTES", "DEFAULT_MAX_RECORD_BYTES", "GZIP_MAGIC",
    "MAX_AVRO_BLOCK_BYTES", "MAX_AVRO_EMPTY_RECORDS", "MAX_ERROR_TEXT_BYTES", "VALUE_FIELD", "ColumnRecords",
    "InputFileError", "RecordBatch", "detect_format", "is_record_schema", "is_splittable", "iter_avro",
    "iter_json", "iter_records", "read_avro_schema", "read_record_schema",
]


def _head(f: IO[bytes]) -> bytes:
    """The file's first four bytes (what detection reads), ``f`` left at 0."""
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    return head


def detect_format(path: str, head: bytes) -> str:
    """The name of the file's format (``convert.formats.format_of``): ``"avro"``,
    ``"parquet"`` or ``"json"`` from the magic bytes, falling back to the name."""
    return format_of(path, head).name


def is_splittable(path: str, head: bytes, json_records_path: str | None = None) -> bool:
    """Whether a file may be read in byte ranges by several workers. A
    compressed file never may (no reader can start inside it)."""
    if head.startswith(GZIP_MAGIC):
        return False
    return format_of(path, head).splittable(path, head, BatchOptions(json_records_path=json_records_path))


def read_record_schema(f: IO[bytes], path: str) -> dict[str, Any] | None:
    """The Avro(-equivalent) record schema of an Avro or Parquet file
    (``SourceFormat.read_schema``); ``None`` for JSON, which has none."""
    return format_of(path, _head(f)).read_schema(f, path)


def iter_records(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
                 batch_size: int = 4096, json_records_path: str | None = None,
                 avro_decoder: str = "auto", record_json: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                 columns: Collection[str] | None = None) -> Iterator[RecordBatch]:
    """The records of ``[start, end)`` in the file's format (``SourceFormat.iter_batches``;
    the options: ``convert.formats.BatchOptions``)."""
    options = BatchOptions(batch_size, json_records_path, avro_decoder, record_json, max_record_bytes,
                           max_block_bytes, columns)
    return format_of(path, _head(f)).iter_batches(f, path, start, end, options)
