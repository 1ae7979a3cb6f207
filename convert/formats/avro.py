"""Avro object container files as a source format: detected by the magic
``Obj``, the writer schema as the record schema, blocks as the units of byte
ranges.

Avro logical types are read from their raw integers/bytes (records are
decoded with the writer schema minus ``logicalType``): real files hold
timestamps in year 0 or 10000 and ``time-millis`` of 24:00, which crash
``datetime`` conversion.

Two decoders give the same records: polars (``iter_avro_columnar``, faster,
columns out: ``ColumnRecords``) for the schemas and codecs of
``columnar_schema``'s whitelist, fastavro (dicts) for everything else and
from any block polars cannot read. ``iter_avro`` reads in stages: the header
(``_open_avro``), the first block of the range (``_seek_first_block``), the
polars blocks (``_columnar_blocks``), then fastavro's, each block checked
(``_block_problem``) before it is decoded (``_decode_block``). The framing is
``convert.formats.avro_framing``, the polars path
``convert.formats.avro_columnar``, the fastavro path's helpers
``convert.formats.avro_records``.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, Any, NamedTuple

import fastavro

from convert.formats.avro_columnar import (
    COLUMNAR_CODECS,
    columnar_schema,
    iter_avro_columnar,
)
from convert.formats.avro_framing import (
    AVRO_MAGIC,
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
from convert.formats.avro_records import (
    FASTAVRO_API_ERRORS,
    fastavro_changed,
    header_without_logical,
    raw_block,
    too_deep,
)
from convert.formats.base import BatchOptions, SourceFormat
from convert.source_types import (
    DEFAULT_MAX_BLOCK_BYTES,
    MAX_AVRO_BLOCK_BYTES,
    MAX_AVRO_EMPTY_RECORDS,
    InputFileError,
    RecordBatch,
    quoted,
)

__all__ = ["AVRO", "AVRO_DECODERS", "AvroFormat", "iter_avro", "read_avro_schema"]

#: Avro decoders: ``auto`` decodes with polars where it is known to give
#: fastavro's values (``columnar_schema``), else with fastavro; ``fastavro``
#: always uses fastavro.
AVRO_DECODERS = ("auto", "fastavro")

#: The bytes first read for a schema: the whole header of nearly every file, in
#: one request on remote storage; a larger header is read on from the file.
_HEAD_BYTES = 64 * 1024


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


class _Opened(NamedTuple):
    """An Avro file's header as read: ``f`` the file to read on (a patched copy
    when the header's metadata is not UTF-8), ``blocks`` fastavro's block
    reader, ``sync`` the file's sync marker and ``raw_header`` the header to
    decode blocks with when the schema has logical types (else ``None``)."""

    f: IO[bytes]
    blocks: Any
    header_end: int
    sync: bytes
    raw_header: bytes | None


def _open_avro(f: IO[bytes], path: str) -> _Opened:
    """Reads an Avro file's header; a file that is not Avro raises ``InputFileError`` naming it."""
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
    return _Opened(f, blocks, header_end, sync, raw_header)


def _seek_first_block(f: IO[bytes], sync: bytes, start: int, header_end: int) -> bool:
    """Moves ``f`` to the first block starting at or after ``start``; ``False`` when there is none."""
    if start <= header_end:
        f.seek(header_end)
        return True
    # The block starting exactly at ``start`` follows a sync marker that
    # begins at ``start - 16`` (never the header's, which ends before start).
    f.seek(start - SYNC_SIZE)
    return bool(advance_past_sync(f, sync))


def _columnar_blocks(o: _Opened, path: str, next_block: int, end: int | None, batch_size: int,
                     record_json: bool, max_block_bytes: int) -> Iterator[RecordBatch]:
    """The polars stage: batches of the blocks from ``next_block`` on; returns
    the offset of the first block it left to fastavro (``f`` moved there), or
    ``None`` when it read the whole range."""
    f = o.f
    f.seek(0)
    header = f.read(o.header_end)
    f.seek(next_block)
    resume = yield from iter_avro_columnar(f, path, header, o.sync, next_block, end, batch_size, record_json,
                                            o.blocks.codec, max_block_bytes, o.header_end)
    if resume is not None:
        f.seek(resume)
    return resume


def _block_problem(o: _Opened, path: str, off: int, max_block_bytes: int) -> InputFileError | None:
    """What is wrong with the block at ``off`` (``f`` there) by its header and
    decompressed size, checked before either is allocated; ``None`` when
    nothing is (or no block is left)."""
    f, codec = o.f, o.blocks.codec
    head = peek_block_header(f)
    if head is None:
        return None
    if not 0 <= head[1] <= MAX_AVRO_BLOCK_BYTES:
        return InputFileError(path, f"Avro block claims {head[1]} bytes (limit {MAX_AVRO_BLOCK_BYTES}); the file is corrupt", off)
    if check_block_at(f, codec, max_block_bytes) is not None:
        return block_too_big(f, path, o.header_end, off, max_block_bytes)
    if head[0] > MAX_AVRO_EMPTY_RECORDS and check_block_at(f, codec, head[0] - 1) is None:
        return InputFileError(path, f"Avro block claims {head[0]} records in fewer decompressed bytes; the file is corrupt", off)
    return None


def _decode_block(o: _Opened, path: str, off: int) -> tuple[int, list[Any]] | None:
    """The block at ``off`` decoded by fastavro: ``(its size in bytes, its
    records)``, or ``None`` at the end of the file. A block or record that
    cannot be decoded raises ``InputFileError`` at the block's offset."""
    try:
        block = next(o.blocks) if o.raw_header is None else raw_block(o.f, o.raw_header)
    except StopIteration:
        return None
    except RecursionError as e:
        raise InputFileError(path, too_deep(None), off) from e
    except FASTAVRO_API_ERRORS as e:
        raise fastavro_changed(e) from e
    except Exception as e:
        what = "truncated Avro block (the file ends inside it)" if isinstance(e, EOFError) else "corrupt Avro block"
        raise InputFileError(path, f"{what} ({quoted(e)})", off) from e
    recs: list[Any] = []
    try:
        recs.extend(block)
    except RecursionError as e:
        raise InputFileError(path, too_deep(None), off) from e
    except Exception as e:
        raise InputFileError(path, f"corrupt record {len(recs)} in Avro block ({quoted(e)})", off) from e
    return block.size, recs


def _fastavro_blocks(o: _Opened, path: str, next_block: int, end: int | None, batch_size: int,
                     max_block_bytes: int) -> Iterator[RecordBatch]:
    """The fastavro stage: batches of the blocks from ``next_block`` (``f``
    there) to the first starting at or after ``end``; a damaged block's
    error is raised after the batches of the blocks before it."""
    wrap = not is_record_schema(o.blocks.writer_schema)  # (never on the fast path: its whitelist has records only)
    batch = RecordBatch(path, "avro", [], [], [])
    error: InputFileError | None = None
    while end is None or next_block < end:
        off = next_block
        error = _block_problem(o, path, off, max_block_bytes)
        if error is not None:
            break
        try:
            decoded = _decode_block(o, path, off)
        except InputFileError as e:
            error = e
            break
        if decoded is None:
            break
        size, recs = decoded
        if wrap:
            recs = [{VALUE_FIELD: r} for r in recs]
        batch.records.extend(recs)
        batch.offsets.extend([off] * len(recs))
        batch.indexes.extend(range(len(recs)))
        next_block = off + size
        if len(batch.records) >= batch_size:
            yield batch
            batch = RecordBatch(path, "avro", [], [], [])
    if batch.records:
        yield batch
    if error is not None:
        raise error


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
    o = _open_avro(f, path)
    if not _seek_first_block(o.f, o.sync, start, o.header_end):
        return
    next_block: int | None = o.f.tell()
    if decoder == "auto" and o.blocks.codec in COLUMNAR_CODECS and columnar_schema(o.blocks.writer_schema):
        next_block = yield from _columnar_blocks(o, path, next_block, end, batch_size, record_json, max_block_bytes)
        if next_block is None:
            return
    yield from _fastavro_blocks(o, path, next_block, end, batch_size, max_block_bytes)


class AvroFormat(SourceFormat):
    """Avro object container files (version 1), any codec fastavro reads."""

    name = "avro"
    suffixes = (".avro",)

    def detect(self, path: str, head: bytes) -> bool:
        return head.startswith(AVRO_MAGIC[:3])  # "Obj" + version: no JSON text starts with "O"

    def read_schema(self, f: IO[bytes], path: str) -> dict[str, Any]:
        """``read_avro_schema``, from the file's first bytes where the header
        fits in them (one read on remote storage)."""
        f.seek(0)
        head = f.read(_HEAD_BYTES)
        try:
            return read_avro_schema(io.BytesIO(head), path)
        except InputFileError:
            if len(head) < _HEAD_BYTES:
                raise
        return read_avro_schema(f, path)

    def splittable(self, path: str, head: bytes, options: BatchOptions) -> bool:
        return True  # at blocks: a range's reader finds its first block by the sync marker

    def iter_batches(self, f: IO[bytes], path: str, start: int, end: int | None,
                     options: BatchOptions) -> Iterator[RecordBatch]:
        return iter_avro(f, path, start, end, options.batch_size, options.avro_decoder, options.record_json,
                         options.max_block_bytes)

    def error_position(self, index: int) -> dict[str, int]:
        return {"record_in_block": index}


AVRO = AvroFormat()
