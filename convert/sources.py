"""Reading AVRO, Parquet and JSON input into batches of records.

Functions here take an already-open *binary* file object (the pipeline opens
files through Beam's filesystems, so local, ``gs://`` and ``hdfs://`` work the
same) and a byte range, and yield ``RecordBatch``es. Working on batches is what
lets the rest of the job use numpy instead of per-record Python.

Byte ranges follow Beam's ``avroio``/``textio`` convention: a range
``[start, end)`` owns every Avro block (JSON line) that *starts* in it, so
ranges of one file can be read by different workers with no record read twice
or lost.

Avro logical types are read from their raw integers/bytes (records are decoded
with the writer schema minus ``logicalType``): real files hold timestamps in
year 0 or 10000 and ``time-millis`` of 24:00, which crash ``datetime``
conversion.

Two Avro decoders give the same records: polars (``iter_avro_columnar``,
faster, columns out: ``ColumnRecords``) for the schemas and codecs
of ``columnar_schema``'s whitelist, fastavro (dicts) for everything else and
from any block polars cannot read.

This module holds the entry points; the concepts live beside it:
``convert.source_types`` (caps, ``InputFileError``, ``RecordBatch``),
``convert.column_records`` (``ColumnRecords``, the fast path's batches),
``convert.avro_framing`` (header, sync marker, block headers, size checks),
``convert.avro_columnar`` (the polars path), ``convert.avro_records`` (the
fastavro path's helpers), ``convert.jsonl`` (JSON input) and ``convert.parquet``
(Parquet input, row groups as the units of byte ranges).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import IO, Any

import fastavro

from convert.avro_columnar import (
    COLUMNAR_CODECS,
    columnar_schema,
    iter_avro_columnar,
)
from convert.avro_framing import (
    SYNC_SIZE,
    VALUE_FIELD,
    advance_past_sync,
    as_record_schema,
    binary_meta_readable,
    block_too_big,
    check_block_at,
    duplicate_field,
    has_logical,
    header_sync,
    is_record_schema,
    peek_block_header,
)
from convert.avro_records import (
    FASTAVRO_API_ERRORS,
    fastavro_changed,
    header_without_logical,
    raw_block,
    too_deep,
)
from convert.column_records import ColumnRecords
from convert.jsonl import iter_json
from convert.source_types import (
    AVRO_MAGIC,
    DEFAULT_MAX_BLOCK_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    GZIP_MAGIC,
    MAX_AVRO_BLOCK_BYTES,
    MAX_AVRO_EMPTY_RECORDS,
    MAX_ERROR_TEXT_BYTES,
    InputFileError,
    RecordBatch,
    is_parquet,
    quoted,
)

__all__ = [
    "AVRO_DECODERS", "AVRO_MAGIC", "DEFAULT_MAX_BLOCK_BYTES", "DEFAULT_MAX_RECORD_BYTES", "GZIP_MAGIC",
    "MAX_AVRO_BLOCK_BYTES", "MAX_AVRO_EMPTY_RECORDS", "MAX_ERROR_TEXT_BYTES", "VALUE_FIELD", "ColumnRecords",
    "InputFileError", "RecordBatch", "detect_format", "is_record_schema", "is_splittable", "iter_avro",
    "iter_json", "iter_records", "read_avro_schema", "read_record_schema",
]


#: Avro decoders: ``auto`` decodes with polars where it is known to give
#: fastavro's values (``columnar_schema``), else with fastavro; ``fastavro``
#: always uses fastavro.
AVRO_DECODERS = ("auto", "fastavro")


def detect_format(path: str, head: bytes) -> str:
    """``"avro"``, ``"parquet"`` or ``"json"`` from the magic bytes, falling back to the name."""
    if head.startswith(AVRO_MAGIC[:3]):
        return "avro"  # "Obj" + version: no JSON text starts with "O"
    if is_parquet(path, head):
        return "parquet"  # "PAR1": no JSON text starts with "P"
    lower = path.lower()
    if lower.endswith(".avro"):
        return "avro"  # let the Avro reader report the bad magic
    return "json"


def is_splittable(path: str, head: bytes, json_records_path: str | None = None) -> bool:
    """Whether a file may be read in byte ranges by several workers."""
    if head.startswith(GZIP_MAGIC):
        return False
    if detect_format(path, head) in ("avro", "parquet"):
        return True  # at Avro blocks, Parquet row groups
    if json_records_path:
        return False
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return not stripped.startswith(b"[")


def read_avro_schema(f: IO[bytes], path: str) -> dict[str, Any]:
    """The schema of the records read from an Avro container file (for ``infer``
    and checks): its writer schema, wrapped as one field ``VALUE_FIELD`` when
    that is not a record. A field declared twice in a record is an
    ``InputFileError`` naming it (``duplicate_field``)."""
    schema = as_record_schema(_writer_schema(f, path))
    problem = duplicate_field(schema)
    if problem:
        raise InputFileError(path, problem, 0)
    return schema


def read_record_schema(f: IO[bytes], path: str) -> dict[str, Any] | None:
    """The Avro(-equivalent) record schema of an Avro or Parquet file
    (``read_avro_schema``, ``convert.parquet.read_parquet_schema``); ``None``
    for JSON, which has none."""
    f.seek(0)
    fmt = detect_format(path, f.read(4))
    f.seek(0)
    if fmt == "parquet":
        from convert.parquet import read_parquet_schema  # pyarrow, only where Parquet is read

        return read_parquet_schema(f, path)
    return read_avro_schema(f, path) if fmt == "avro" else None


def _writer_schema(f: IO[bytes], path: str) -> Any:
    """The file's writer schema as written; a header fastavro cannot read is an ``InputFileError``."""
    f.seek(0)
    try:
        try:
            return fastavro.reader(f).writer_schema
        except UnicodeDecodeError:
            patched = binary_meta_readable(f)
            if patched is None:
                raise
            return fastavro.reader(patched).writer_schema
    except RecursionError:
        raise InputFileError(path, too_deep(f), 0) from None
    except FASTAVRO_API_ERRORS as e:
        raise fastavro_changed(e) from e
    except Exception as e:  # fastavro raises many types for bad headers
        raise InputFileError(path, f"not a readable Avro file ({quoted(e)}); check the file is an Avro object container", 0) from e


def _open_avro(f: IO[bytes], path: str) -> tuple[IO[bytes], Any, int, bytes, bytes | None]:
    """Reads an Avro file's header: ``(f, blocks, header_end, sync, raw_header)``.

    ``f`` is the file to read on (a patched copy when the header's metadata is
    not UTF-8), ``blocks`` fastavro's block reader, ``sync`` the file's sync
    marker and ``raw_header`` the header to decode blocks with when the schema
    has logical types (else ``None``). A file that is not Avro raises
    ``InputFileError`` naming it.
    """
    f.seek(0)
    magic = f.read(len(AVRO_MAGIC))
    if magic != AVRO_MAGIC:
        what = "the file is empty" if not magic else f"it starts with {magic!r}, not {AVRO_MAGIC!r}"
        raise InputFileError(path, f"not an Avro object container file version 1 ({what})", 0)
    f.seek(0)
    try:
        try:
            blocks = fastavro.block_reader(f)
        except UnicodeDecodeError:
            patched = binary_meta_readable(f)
            if patched is None:
                raise
            f = patched
            blocks = fastavro.block_reader(f)
        header_end = f.tell()
        sync = header_sync(f, header_end)
        # With logical types, records are decoded with the writer schema minus
        # ``logicalType``: fastavro converts logical types according to the
        # *writer* schema, so a reader schema cannot turn the conversion off.
        raw_header = header_without_logical(blocks.writer_schema, blocks.codec, sync) if has_logical(blocks.writer_schema) else None
    except RecursionError:
        raise InputFileError(path, too_deep(f), 0) from None
    except FASTAVRO_API_ERRORS as e:
        raise fastavro_changed(e) from e
    except Exception as e:
        raise InputFileError(
            path, f"cannot read the Avro header ({quoted(e)}); is it an Avro object container file?", 0
        ) from e
    problem = duplicate_field(blocks.writer_schema)  # before polars, which panics on them
    if problem:
        raise InputFileError(path, problem, 0)
    return f, blocks, header_end, sync, raw_header


def _seek_first_block(f: IO[bytes], sync: bytes, start: int, header_end: int) -> bool:
    """Moves ``f`` to the first block starting at or after ``start``; ``False`` when there is none."""
    if start <= header_end:
        f.seek(header_end)
        return True
    # The block starting exactly at ``start`` follows a sync marker that
    # begins at ``start - 16`` (never the header's, which ends before start).
    f.seek(start - SYNC_SIZE)
    return bool(advance_past_sync(f, sync))


def iter_avro(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
              batch_size: int = 4096, decoder: str = "auto", record_json: bool = False,
              max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> Iterator[RecordBatch]:
    """Yield batches of records from Avro blocks starting in ``[start, end)``.

    On a corrupt block, or one that decompresses to more than
    ``max_block_bytes`` (checked before it is decompressed whole, on either
    decoder), the records of the intact blocks before it are yielded first,
    then ``InputFileError`` (naming the file and the block's offset) is
    raised. ``decoder``: see ``AVRO_DECODERS``; both give the same records.
    """
    if decoder not in AVRO_DECODERS:
        raise ValueError(f"Avro decoder must be one of {', '.join(AVRO_DECODERS)}, found {decoder!r}")
    f, blocks, header_end, sync, raw_header = _open_avro(f, path)
    if not _seek_first_block(f, sync, start, header_end):
        return
    next_block = f.tell()
    wrap = not is_record_schema(blocks.writer_schema)  # (never on the fast path: its whitelist has records only)
    if decoder == "auto" and blocks.codec in COLUMNAR_CODECS and columnar_schema(blocks.writer_schema):
        f.seek(0)
        header = f.read(header_end)
        f.seek(next_block)
        resume = yield from iter_avro_columnar(f, path, header, sync, next_block, end, batch_size, record_json,
                                                blocks.codec, max_block_bytes, header_end)
        if resume is None:
            return
        next_block = resume
        f.seek(resume)
    batch = RecordBatch(path, "avro", [], [], [])
    error: InputFileError | None = None
    cause: BaseException | None = None
    while end is None or next_block < end:
        head = peek_block_header(f)
        if head is not None and not 0 <= head[1] <= MAX_AVRO_BLOCK_BYTES:
            error = InputFileError(path, f"Avro block claims {head[1]} bytes (limit {MAX_AVRO_BLOCK_BYTES}); the file is corrupt", next_block)
            break
        expands = None if head is None else check_block_at(f, blocks.codec, max_block_bytes)
        if expands is not None:
            error = block_too_big(f, path, header_end, next_block, max_block_bytes)
            break
        if head is not None and head[0] > MAX_AVRO_EMPTY_RECORDS and check_block_at(f, blocks.codec, head[0] - 1) is None:
            error = InputFileError(path, f"Avro block claims {head[0]} records in fewer decompressed bytes; the file is corrupt", next_block)
            break
        off = next_block
        try:
            block = next(blocks) if raw_header is None else raw_block(f, raw_header)
        except StopIteration:
            break
        except RecursionError as e:
            error, cause = InputFileError(path, too_deep(None), off), e
            break
        except FASTAVRO_API_ERRORS as e:
            raise fastavro_changed(e) from e
        except Exception as e:
            what = "truncated Avro block (the file ends inside it)" if isinstance(e, EOFError) else "corrupt Avro block"
            error, cause = InputFileError(path, f"{what} ({quoted(e)})", off), e
            break
        recs = []
        try:
            recs.extend(block)
        except RecursionError as e:
            error, cause = InputFileError(path, too_deep(None), off), e
            break
        except Exception as e:
            error, cause = InputFileError(path, f"corrupt record {len(recs)} in Avro block ({quoted(e)})", off), e
            break
        if wrap:
            recs = [{VALUE_FIELD: r} for r in recs]
        batch.records.extend(recs)
        batch.offsets.extend([off] * len(recs))
        batch.indexes.extend(range(len(recs)))
        next_block = off + block.size
        if len(batch.records) >= batch_size:
            yield batch
            batch = RecordBatch(path, "avro", [], [], [])
    if batch.records:
        yield batch
    if error is not None:
        raise error from cause


def iter_records(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
                 batch_size: int = 4096, json_records_path: str | None = None,
                 avro_decoder: str = "auto", record_json: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                 columns: Collection[str] | None = None) -> Iterator[RecordBatch]:
    """Dispatch on the file's format; see ``iter_avro`` and ``iter_json``.

    ``record_json``: the Avro fast path also gives each record's canonical
    JSON (``ColumnRecords.record_json``), for the whole-record split.
    ``max_record_bytes`` caps a JSON line or document, ``max_block_bytes`` an
    Avro block's decompressed bytes (``ConvertOptions.max_record_mb`` and
    ``max_block_mb``). ``columns``: the top-level fields to decode where the
    format can leave the others undecoded (Parquet); ``None`` for all.
    """
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    fmt = detect_format(path, head)
    if fmt == "avro":
        return iter_avro(f, path, start, end, batch_size, avro_decoder, record_json, max_block_bytes)
    if fmt == "parquet":
        from convert.parquet import iter_parquet  # pyarrow, only where Parquet is read

        return iter_parquet(f, path, start, end, batch_size, avro_decoder, record_json, max_block_bytes, columns)
    return iter_json(f, path, start, end, batch_size, json_records_path, max_record_bytes)
