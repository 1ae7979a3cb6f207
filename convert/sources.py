"""Reading AVRO and JSON input into batches of records.

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

Two Avro decoders give the same records: polars (``_iter_avro_columnar``,
faster, columns out: ``ColumnRecords``) for the schemas and codecs
of ``_columnar_schema``'s whitelist, fastavro (dicts) for everything else and
from any block polars cannot read.
"""

from __future__ import annotations

import bz2
import dataclasses
import functools
import gzip
import io
import itertools
import json
import logging
import lzma
import re
import sys
import zlib
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import IO, Any

import fastavro
import numpy as np
import orjson

from convert.columns import ListArray, NumericArray, ScalarArray, TermCodes

_log = logging.getLogger("recordprep")

AVRO_MAGIC = b"Obj\x01"
GZIP_MAGIC = b"\x1f\x8b"
_SYNC_SIZE = 16
#: Avro blocks claiming more than this are rejected before allocation (guards
#: against corrupt headers asking for gigabytes).
MAX_AVRO_BLOCK_BYTES = 256 * 1024 * 1024
#: A block claiming more records than it has (decompressed) bytes holds records
#: that encode to zero bytes (no fields, only nulls); more of those than this
#: in one block is taken for a corrupt count (it would decode into an
#: unbounded list of empty records).
MAX_AVRO_EMPTY_RECORDS = 1 << 20
#: Default cap on one JSON line (JSON Lines) and on one whole JSON document
#: (an array file, a ``--json-records-path`` document), in bytes: far above a
#: real record, low enough that one hostile line (gigabytes of one repeated
#: byte gzip to a few MB) cannot exhaust a worker. ``--max-record-mb``.
DEFAULT_MAX_RECORD_BYTES = 64 << 20
#: Default cap on the decompressed bytes of one Avro block: Avro writers flush
#: blocks of 64 KB .. 16 MB, and a deflate bomb of a few MB expands to
#: gigabytes before any record is decoded. ``--max-block-mb``.
DEFAULT_MAX_BLOCK_BYTES = 256 << 20
#: At most this many bytes of a rejected line's text are copied into the error
#: output (and into messages): enough to recognize and repair a record, while
#: a line near the record cap is not copied whole.
MAX_ERROR_TEXT_BYTES = 16 * 1024
#: Exception texts quoted in messages are cut to this many characters.
_MAX_QUOTED_CHARS = 500
#: Decompressed bytes per call when measuring an Avro block's size: what the
#: check holds in memory at once.
_CHECK_CHUNK_BYTES = 1 << 20
#: deflate expands at most ~1032:1, so blocks up to cap / 1032 bytes need no check.
_DEFLATE_MAX_RATIO = 1032


class InputFileError(ValueError):
    """An input file cannot be read at all (bad magic, corrupt block, ...)."""

    def __init__(self, path: str, reason: str | None = None, offset: int | None = None):
        self.path, self.reason, self.offset = path, reason, offset
        if reason is None:  # re-created from a message (Beam re-raises with context)
            super().__init__(path)
            return
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{path}{where}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason, self.offset))


def _mb(nbytes: int) -> str:
    """A byte cap as the ``--max-*-mb`` options spell it (MB of 2**20 bytes)."""
    return f"{nbytes / 2**20:g} MB"


def _quoted(e: BaseException) -> str:
    """``Type: message`` of an exception, cut to a bounded length (messages of
    parsers and decoders may quote input)."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= _MAX_QUOTED_CHARS else text[:_MAX_QUOTED_CHARS] + "... [cut]"


def _excerpt(raw: bytes, total: int | None = None) -> str:
    """The text of a rejected line for the error output: whole up to
    ``MAX_ERROR_TEXT_BYTES``, else that prefix and a note of the line's size
    (``total`` when ``raw`` is already a prefix)."""
    total = len(raw) if total is None else total
    if total <= MAX_ERROR_TEXT_BYTES and len(raw) == total:
        return raw.decode("utf-8", "replace")
    head = raw[:MAX_ERROR_TEXT_BYTES].decode("utf-8", "replace")
    return f"{head}... [truncated: the line holds {total} bytes]"


@dataclasses.dataclass
class RecordBatch:
    """Records plus where each came from.

    ``offsets[i]`` is the byte offset of the Avro block (or JSON line) holding
    record ``i``; ``indexes[i]`` is its position in that Avro block, or for
    JSON its 1-based line number (0 when unknown: a range that starts
    mid-file), or its position in a JSON array.
    ``bad`` lists records that could not even be parsed (malformed JSON) as
    ``(offset, index, reason, raw_text)``; they never reach ``records``.
    ``records`` is a ``ColumnRecords`` when the Avro fast path decoded the
    batch: the same values, held as columns.
    """

    path: str
    kind: str  # "avro" | "json"
    records: list[Any] | ColumnRecords
    offsets: list[int]
    indexes: list[int]
    bad: list[tuple[int, int, str, str]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)


class ColumnRecords(Sequence[dict[str, Any]]):
    """A batch of records held as columns (top-level field -> list of values).

    What the Avro fast path yields: the values are exactly those the
    fastavro path puts in its dicts (same types, logical types as raw
    integers), and consumers that work column-wise (``Preparer``) read
    ``columns`` directly instead of transposing dicts. Iterating builds each
    record's dict as it goes (none is kept: a batch of dicts next to its
    columns raised the workers' peak memory), so it still behaves as the list
    of records it stands for.

    Columns given as ``deferred`` (name -> a function making the column's
    list; their entry in ``columns`` only holds the field's place) are made
    on first use: the fast path defers the numeric columns it
    also hands over as ``arrays``, and the string, enum and integer columns it
    can hand over as ``term_codes``, whose Python values the vectorizer does
    not need (building the float lists is measurable: docs/benchmarks.md#design-converter).
    """

    __slots__ = ("_columns", "_deferred", "arrays", "record_json", "_n", "_coders", "_codes", "_lists", "_leaves")

    def __init__(self, columns: dict[str, list[Any]], n: int, arrays: dict[str, NumericArray] | None = None,
                 record_json: list[bytes] | None = None, deferred: dict[str, Callable[[], list[Any]]] | None = None,
                 coders: dict[str, Callable[[], TermCodes | None]] | None = None, lists: dict[str, Any] | None = None):
        if any(len(c) != n for k, c in columns.items() if not deferred or k not in deferred):
            raise ValueError("every column needs one value per record")
        if record_json is not None and len(record_json) != n:
            raise ValueError("record_json needs one entry per record")
        self._columns, self._n = columns, n
        self._deferred = {k: make for k, make in (deferred or {}).items() if k in columns}
        #: Numeric columns also as numpy (``_numeric_arrays``), the same values.
        self.arrays: dict[str, NumericArray] = arrays or {}
        #: Each record's canonical JSON when the reader was asked for it
        #: (``_records_json``), the bytes the whole-record split hashes.
        self.record_json = record_json
        self._coders = coders or {}
        self._codes: dict[str, TermCodes | None] = {}
        #: Top-level columns holding lists (polars Series), for paths through them (``path_leaf``).
        self._lists: dict[str, Any] = lists or {}
        self._leaves: dict[tuple, tuple | None] = {}

    def path_leaf(self, steps: tuple) -> tuple[Any, np.ndarray, np.ndarray] | None:
        """``(items, counts, null rows)`` of a path through lists (``convert.config.parse_path``
        steps with at least one ``EACH``): every row's items, back to back, as one polars
        Series, how many each row has, and which rows are null (null before the first
        list); ``None`` when the columns cannot give them (then read the records).

        Made with list and struct column operations (explode, struct fields) and
        the counts in numpy, so the items' records never become Python dicts:
        the same values, in the same order, as ``convert.records.walk_path``.
        """
        if steps not in self._leaves:
            self._leaves[steps] = _path_leaf(self._lists.get(steps[0]), steps[1:], self._n)
        return self._leaves[steps]

    def path_values(self, steps: tuple) -> list[Any] | None:
        """Each row's items at a path through lists (``path_leaf``) as a Python list, None for a null row."""
        leaf = self.path_leaf(steps)
        if leaf is None:
            return None
        items, counts, null = leaf
        values = items.to_list()
        out: list[Any] = []
        pos = 0
        for c, is_null in zip(counts.tolist(), null.tolist(), strict=True):
            out.append(None if is_null else values[pos:pos + c])
            pos += c
        return out

    def path_term_codes(self, steps: tuple) -> TermCodes | None:
        """``term_codes`` of the string items at a path through lists (kind ``"list"``), when none is null."""
        leaf = self.path_leaf(steps)
        if leaf is None or not _is_text_dtype(leaf[0].dtype) or leaf[0].null_count():
            return None
        import polars as pl

        s = leaf[0].cast(pl.String)
        uniq = s.unique(maintain_order=True)
        codes = s.cast(pl.Enum(uniq)).to_physical().cast(pl.Int32).to_numpy()
        return TermCodes("list", uniq.to_list(), codes, leaf[1])

    def path_array(self, steps: tuple) -> ListArray | None:
        """The numeric items at a path through lists as ``arrays`` gives a list column
        (``ListArray``), when none is null."""
        leaf = self.path_leaf(steps)
        if leaf is None:
            return None
        items, counts, null = leaf
        if not (items.dtype.is_integer() or items.dtype.is_float()) or items.null_count():
            return None
        import polars as pl

        return ListArray(items.cast(pl.Float64).to_numpy(), counts, null)

    def term_codes(self, name: str) -> TermCodes | None:
        """The field's values as distinct values and codes (``TermCodes``), made
        on first use; ``None`` when the reader cannot give them for this field."""
        if name not in self._codes:
            make = self._coders.get(name)
            self._codes[name] = make() if make is not None else None
        return self._codes[name]

    @property
    def columns(self) -> dict[str, list[Any]]:
        """Field -> its values, in the records' field order (deferred ones made now)."""
        for k in list(self._deferred):
            self.column(k)
        return self._columns

    @property
    def fields(self) -> list[str]:
        """The field names, in order, without making deferred columns."""
        return list(self._columns)

    @property
    def deferred_fields(self) -> list[str]:
        """Fields whose values are not made yet."""
        return list(self._deferred)

    def column(self, name: str, default: Any = None) -> Any:
        """One field's values (``default`` when there is no such field), made if deferred."""
        if name not in self._columns:
            return default
        make = self._deferred.pop(name, None)
        if make is not None:
            values = make()
            if len(values) != self._n:
                raise ValueError(f"column {name!r}: {len(values)} values for {self._n} records")
            self._columns[name] = values
        return self._columns[name]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return {k: c[i] for k, c in self.columns.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # C-level map chain, no strict zips (lengths are checked in __init__)
        return map(dict, map(zip, itertools.repeat(list(self.columns)), zip(*self.columns.values(), strict=False)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ColumnRecords | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ColumnRecords({self._n} records, fields {self.fields})"


def detect_format(path: str, head: bytes) -> str:
    """``"avro"`` or ``"json"`` from the magic bytes, falling back to the name."""
    if head.startswith(AVRO_MAGIC[:3]):
        return "avro"  # "Obj" + version: no JSON text starts with "O"
    lower = path.lower()
    if lower.endswith(".avro"):
        return "avro"  # let the Avro reader report the bad magic
    return "json"


def is_splittable(path: str, head: bytes, json_records_path: str | None = None) -> bool:
    """Whether a file may be read in byte ranges by several workers."""
    if head.startswith(GZIP_MAGIC):
        return False
    if detect_format(path, head) == "avro":
        return True
    if json_records_path:
        return False
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return not stripped.startswith(b"[")


# --------------------------------------------------------------------- Avro


def _strip_logical(schema: Any) -> Any:
    """Writer schema with ``logicalType`` removed, keeping named types intact."""
    if isinstance(schema, dict):
        return {k: _strip_logical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical(s) for s in schema]
    return schema


def _has_logical(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "logicalType" in schema or any(_has_logical(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_logical(s) for s in schema)
    return False


def _advance_past_sync(f: IO[bytes], sync: bytes, chunk: int = 1 << 16) -> bool:
    """Leave ``f`` just after the next sync marker; False at end of file."""
    carry = b""
    while True:
        pos = f.tell()
        data = f.read(chunk)
        if not data:
            return False
        buf = carry + data
        i = buf.find(sync)
        if i >= 0:
            f.seek(pos - len(carry) + i + len(sync))
            return True
        carry = buf[-(len(sync) - 1):]


#: Header metadata keys whose values the specification requires as UTF-8 text.
_TEXT_META_KEYS = frozenset({b"avro.schema", b"avro.codec"})


def _header_meta_fix(head: bytes) -> bytes | None:
    """The Avro header at the start of ``head`` with each metadata value that is
    not UTF-8 (other than ``avro.schema`` and ``avro.codec``) replaced by as
    many ``?`` bytes, or ``None`` when ``head`` does not hold the whole header.

    Why: the specification declares the metadata a map of bytes, and some
    writers store binary values there, but fastavro decodes every value as
    UTF-8. The replacement keeps every length, so byte offsets stay the file's.
    """
    out, i = bytearray(head), len(AVRO_MAGIC)
    while True:
        got = _zigzag_at(head, i)  # a map block: its count (and byte size when negative)
        if got is None:
            return None
        count, i = got
        if count == 0:
            break
        if count < 0:
            got = _zigzag_at(head, i)
            if got is None:
                return None
            count, i = -count, got[1]
        for _ in range(count):
            spans = []
            for _part in ("key", "value"):
                got = _zigzag_at(head, i)
                if got is None or got[0] < 0 or got[1] + got[0] > len(head):
                    return None
                spans.append((got[1], got[1] + got[0]))
                i = got[1] + got[0]
            (ks, ke), (vs, ve) = spans
            if head[ks:ke] not in _TEXT_META_KEYS:
                try:
                    head[vs:ve].decode("utf-8")
                except UnicodeDecodeError:
                    out[vs:ve] = b"?" * (ve - vs)
    return bytes(out[:i + _SYNC_SIZE]) if i + _SYNC_SIZE <= len(head) else None


def _zigzag_at(data: bytes, i: int) -> tuple[int, int] | None:
    """The zigzag varint (an Avro long) at ``data[i:]`` and the offset after it."""
    n = shift = 0
    while i < len(data) and shift <= 63:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return (n >> 1) ^ -(n & 1), i
        shift += 7
    return None


class _PatchedHeader:
    """A binary file whose first bytes read as ``head`` (same length) instead of the file's."""

    def __init__(self, f: IO[bytes], head: bytes):
        self._f, self._head = f, head

    def read(self, n: int = -1) -> bytes:
        pos = self._f.tell()
        data = self._f.read(n)
        if pos < len(self._head) and data:
            k = min(len(data), len(self._head) - pos)
            data = self._head[pos:pos + k] + data[k:]
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


def _binary_meta_readable(f: IO[bytes]) -> IO[bytes] | None:
    """``f`` as fastavro can read it when its header holds metadata values
    that are not UTF-8 (``_header_meta_fix``), or ``None`` when it holds none."""
    size = 1 << 16
    while size <= MAX_AVRO_BLOCK_BYTES:
        f.seek(0)
        head = f.read(size)
        if not head.startswith(AVRO_MAGIC):
            return None
        fixed = _header_meta_fix(head)
        if fixed is not None:
            f.seek(0)
            return None if fixed == head[:len(fixed)] else _PatchedHeader(f, fixed)  # type: ignore[return-value]
        if len(head) < size:
            return None
        size *= 4
    return None


#: The one field of the records read from an Avro file whose schema is not a
#: record (``int``, an array, a map, a union): each datum is ``{"value": datum}``, as Spark reads them.
VALUE_FIELD = "value"


def is_record_schema(schema: Any) -> bool:
    """Whether an Avro writer schema is a record (else its data are read as ``VALUE_FIELD``)."""
    return isinstance(schema, dict) and schema.get("type") in ("record", "error")


def _as_record_schema(schema: Any) -> dict[str, Any]:
    """``schema``, or for data that are not records the schema of the records they are read as."""
    if is_record_schema(schema):
        return schema
    return {"type": "record", "name": "recordprep_value", "fields": [{"name": VALUE_FIELD, "type": schema}]}


def read_avro_schema(f: IO[bytes], path: str) -> dict[str, Any]:
    """The schema of the records read from an Avro container file (for ``infer``
    and checks): its writer schema, wrapped as one field ``VALUE_FIELD`` when
    that is not a record."""
    f.seek(0)
    try:
        try:
            return _as_record_schema(fastavro.reader(f).writer_schema)
        except UnicodeDecodeError:
            patched = _binary_meta_readable(f)
            if patched is None:
                raise
            return _as_record_schema(fastavro.reader(patched).writer_schema)
    except RecursionError:
        raise InputFileError(path, _too_deep(f), 0) from None
    except _FASTAVRO_API_ERRORS as e:
        raise _fastavro_changed(e) from e
    except Exception as e:  # fastavro raises many types for bad headers
        raise InputFileError(path, f"not a readable Avro file ({_quoted(e)}); check the file is an Avro object container", 0) from e


def _block_header(head: bytes) -> tuple[int, int, int] | None:
    """``(record count, byte size, header length)`` from the first bytes of an
    Avro block (two zigzag varints); ``None`` when they are incomplete."""
    out, i = [], 0
    for _ in range(2):
        n = shift = 0
        while True:
            if i >= len(head) or shift > 63:
                return None
            b = head[i]
            i += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                break
            shift += 7
        out.append((n >> 1) ^ -(n & 1))  # zigzag
    return out[0], out[1], i


def _peek_block_header(f: IO[bytes]) -> tuple[int, int] | None:
    """``(record count, byte size)`` of the block at ``f``'s position, ``f`` left
    where it was; ``None`` when no complete header is there (EOF)."""
    pos = f.tell()
    head = f.read(20)
    f.seek(pos)
    h = _block_header(head)
    return None if h is None else (h[0], h[1])


def _varint(data: bytes | memoryview) -> int | None:
    """An unsigned little-endian base-128 varint at the start of ``data``."""
    n = shift = 0
    for b in data[:10]:
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
    return None


def _inflated_size(data: bytes | memoryview, cap: int) -> int:
    """Bytes raw deflate ``data`` expands to, counted ``_CHECK_CHUNK_BYTES`` at
    a time; stops as soon as the count passes ``cap``."""
    d = zlib.decompressobj(-15)
    total = 0
    try:
        while True:
            out = d.decompress(data, _CHECK_CHUNK_BYTES)
            total += len(out)
            data = d.unconsumed_tail
            if total > cap or d.eof or not out:
                return total
    except zlib.error:
        return total  # corrupt: the decoder reports it


def _streamed_size(new: Callable[[], Any], data: bytes | memoryview, cap: int) -> int:
    """``_inflated_size`` for the bz2/lzma/zstd decompressor API (several
    concatenated streams, as ``bz2.decompress`` and friends accept)."""
    total = 0
    try:
        while data:
            d = new()
            out = d.decompress(data, _CHECK_CHUNK_BYTES)
            total += len(out)
            while total <= cap and not d.eof and not d.needs_input:
                out = d.decompress(b"", _CHECK_CHUNK_BYTES)
                total += len(out)
            if total > cap or not d.eof:
                return total
            data = d.unused_data
    except (OSError, EOFError, ValueError, lzma.LZMAError, _zstd().ZstdError):  # (evaluated on an error only)
        pass  # corrupt: the decoder reports it
    return total


def _zstd() -> Any:
    if sys.version_info >= (3, 14):
        from compression import zstd
    else:
        from backports import zstd
    return zstd


def _zstd_decompressor() -> Any:
    return _zstd().ZstdDecompressor()


def _block_expands_past(codec: str, data: bytes | memoryview | Callable[[int], bytes], size: int, cap: int) -> int | None:
    """``None`` when an Avro block of ``size`` compressed bytes decompresses to
    at most ``cap`` bytes, else how many bytes it decompresses to (at least).

    ``data`` is the block's compressed bytes, or ``read(n)`` giving its first
    ``n``: only codecs whose size is not known cheaply read all of it. The
    size comes from the codec's own framing where it has one (snappy's and
    lz4's length prefix, which their decoders allocate), from deflate's
    maximum ratio for small blocks, else from a decompression that counts in
    bounded chunks. Unknown codecs: ``None`` (fastavro refuses them).
    """
    def head(n: int) -> bytes:
        return data(n) if callable(data) else data[:n]

    if codec == "null":
        return size if size > cap else None
    if codec == "deflate" and size * _DEFLATE_MAX_RATIO <= cap:
        return None
    if codec == "snappy":
        n = _varint(head(10))  # raw snappy: the uncompressed length first (the CRC follows the data)
    elif codec == "lz4":
        prefix = head(4)  # lz4.block's stored size
        n = int.from_bytes(prefix, "little") if len(prefix) == 4 else None
    elif codec in ("deflate", "bzip2", "xz", "zstandard"):
        body = head(size)
        if codec == "deflate":
            n = _inflated_size(body, cap)
        elif codec == "xz":
            n = _streamed_size(lzma.LZMADecompressor, body, cap)
        elif codec == "bzip2":
            n = _streamed_size(bz2.BZ2Decompressor, body, cap)
        else:
            n = _streamed_size(_zstd_decompressor, body, cap)
    else:
        return None
    return n if n is not None and n > cap else None


#: Most block headers walked to number a block in an error message (each is a
#: seek and a read, a request on remote file systems).
_MAX_INDEX_WALK = 10_000


def _block_too_big(f: IO[bytes], path: str, first_block: int, offset: int, cap: int) -> InputFileError:
    """The error for the block at ``offset``, with its index in the file
    (counted from ``first_block`` by walking the block headers before it)."""
    index, pos = 0, first_block
    try:
        while pos < offset and index < _MAX_INDEX_WALK:
            f.seek(pos)
            h = _block_header(f.read(20))
            if h is None:
                break
            pos += h[2] + h[1] + _SYNC_SIZE
            index += 1
    except OSError:
        pass
    which = f"Avro block {index}" if pos == offset else "the Avro block"
    return InputFileError(path, f"{which} decompresses to more than {_mb(cap)}, the cap on an Avro block "
                                f"(--max-block-mb); raise --max-block-mb if the file is genuine", offset)


def _check_block_at(f: IO[bytes], codec: str, cap: int) -> int | None:
    """``_block_expands_past`` for the block at ``f``'s position; ``f`` left where it was."""
    pos = f.tell()
    h = _block_header(f.read(20))
    if h is None:
        f.seek(pos)
        return None
    _, size, i = h

    def read(n: int) -> bytes:
        f.seek(pos + i)
        return f.read(min(n, size))

    try:
        return _block_expands_past(codec, read, size, cap)
    finally:
        f.seek(pos)


#: Avro decoders: ``auto`` decodes with polars where it is known to give
#: fastavro's values (``_columnar_schema``), else with fastavro; ``fastavro``
#: always uses fastavro.
AVRO_DECODERS = ("auto", "fastavro")
_COLUMNAR_CODECS = frozenset({"null", "deflate", "snappy"})
_COLUMNAR_PRIMITIVES = frozenset({"boolean", "int", "long", "float", "double", "string", "bytes"})
#: Logical types polars decodes that cast back to fastavro's raw values exactly.
_COLUMNAR_LOGICAL = frozenset({("long", "timestamp-millis"), ("long", "timestamp-micros"),
                               ("int", "date"), ("string", "uuid")})


#: Most record fields (at any depth) a schema may have for the polars path:
#: polars' Avro reader costs more per value, in time and memory, the more
#: fields a record has; past about a thousand fastavro is faster and smaller.
_COLUMNAR_MAX_FIELDS = 1000


def _field_count(schema: Any) -> int:
    """How many record fields ``schema`` declares at any depth (no recursion)."""
    n, stack = 0, [schema]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            if isinstance(s.get("fields"), list):
                n += len(s["fields"])
            stack.extend(v for v in s.values() if isinstance(v, dict | list))
        elif isinstance(s, list):
            stack.extend(s)
    return n


def _columnar_schema(schema: Any) -> bool:
    """Whether polars decodes records of this writer schema to fastavro's values
    (and is the faster decoder: not past ``_COLUMNAR_MAX_FIELDS`` fields).

    A whitelist, each entry covered by ``tests/test_convert_sources_columnar.py``:
    a top-level record with fields of primitives, fixed, nested records,
    arrays, ``[null, T]`` unions, the logical types that cast back to their
    raw integers, and enums as top-level fields. Left out, from trying polars
    2.1: enums anywhere else (a Rust panic), maps, unions of several branches,
    named-type references and recursive schemas (not decoded), ``null``
    fields (not implemented), records with no fields (decoded as zero rows),
    ``time-millis`` of 24:00 (silently null), decimals and the other logical
    types (other values).
    """
    return (isinstance(schema, dict) and schema.get("type") == "record" and _field_count(schema) <= _COLUMNAR_MAX_FIELDS
            and _columnar_type(schema, 0, top=True))


def _columnar_type(schema: Any, depth: int, enum_ok: bool = False, top: bool = False) -> bool:
    """``top``: the file's record, whose fields may be enums."""
    if depth > 32:
        return False
    if isinstance(schema, str):
        return schema in _COLUMNAR_PRIMITIVES
    if isinstance(schema, list):
        if len(schema) != 2 or schema.count("null") != 1:
            return False
        other = schema[1] if schema[0] == "null" else schema[0]
        return not isinstance(other, list) and _columnar_type(other, depth + 1)
    if not isinstance(schema, dict):
        return False
    t, logical = schema.get("type"), schema.get("logicalType")
    if logical is not None:
        return (t, logical) in _COLUMNAR_LOGICAL
    if t in _COLUMNAR_PRIMITIVES:
        return True
    if t == "record":
        fields = schema.get("fields")
        return bool(fields) and all(isinstance(x, dict) and _columnar_type(x.get("type"), depth + 1, enum_ok=top)
                                    for x in fields)
    if t == "array":
        return _columnar_type(schema.get("items"), depth + 1)
    if t == "enum":
        return enum_ok
    return t == "fixed"


def _read_raw_block(f: IO[bytes], sync: bytes, max_size: int = MAX_AVRO_BLOCK_BYTES) -> tuple[int, bytes, int] | None:
    """``(record count, the block's bytes, sync marker included, the length of
    its header)`` at ``f``'s position, ``f`` left after it; ``None`` at the end of the file or when the
    block does not look intact (the fastavro path then reads it and says why)."""
    pos = f.tell()
    h = _block_header(f.read(20))
    if h is None:
        return None
    count, size, i = h
    if not 0 <= count <= MAX_AVRO_EMPTY_RECORDS or not 0 <= size <= min(max_size, MAX_AVRO_BLOCK_BYTES):
        return None
    f.seek(pos)
    data = f.read(i + size + _SYNC_SIZE)
    if len(data) != i + size + _SYNC_SIZE or data[-_SYNC_SIZE:] != sync:
        return None
    return count, data, i


def _raw_dtype(dtype: Any) -> Any:
    """The polars type holding fastavro's raw value of a logical type."""
    import polars as pl

    if isinstance(dtype, pl.Datetime):
        return pl.Int64
    if dtype == pl.Date:
        return pl.Int32
    if isinstance(dtype, pl.Struct):
        return pl.Struct({x.name: _raw_dtype(x.dtype) for x in dtype.fields})
    if isinstance(dtype, pl.List):
        return pl.List(_raw_dtype(dtype.inner))
    return dtype


def _leaves(df: Any) -> list[tuple[str, Any]]:
    """``(path, series)`` for every column of ``df``, and for every scalar (not
    list, not record) field of its record columns, at any depth, under its
    dotted path (``user.segment``), null where a record is.

    Why: a feature reading ``user.segment`` then takes the field as numpy or
    codes like a top-level column, and the records of ``user`` are never
    built as Python dicts (docs/benchmarks.md#design-converter).
    """
    import polars as pl

    out: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any, bool]] = [(s.name, s, False) for s in reversed(df.get_columns())]
    while stack:
        path, s, nested = stack.pop()
        if isinstance(s.dtype, pl.Struct):
            # polars' struct.field is null where the record is (the tests check it)
            stack.extend((f"{path}.{f.name}", s.struct.field(f.name), True) for f in reversed(s.dtype.fields))
            if nested:
                continue  # a record inside a record: only its fields
        elif nested and isinstance(s.dtype, pl.List):
            continue  # a list inside a record: read from the record's values
        out.append((path, s))
    return out


def _numeric_arrays(leaves: list[tuple[str, Any]]) -> dict[str, NumericArray]:
    """Integer and float columns among a batch's ``leaves`` (``_leaves``) as
    ``ScalarArray``, lists of them without null items as ``ListArray``: what the vectorizer's numeric fast paths build from Python lists,
    made in Rust (the same float64 values: both round integers to the nearest
    double)."""
    import polars as pl

    out: dict[str, NumericArray] = {}
    for path, s in leaves:
        dt = s.dtype
        if dt.is_integer() or dt.is_float():
            # is_null is a polars expression (a measurable cost per call): skipped when there is none
            null = s.is_null().to_numpy() if s.null_count() else np.zeros(len(s), dtype=bool)
            out[path] = ScalarArray(s.cast(pl.Float64).to_numpy(), null)
        elif isinstance(dt, pl.List) and (dt.inner.is_integer() or dt.inner.is_float()):
            flat = s.explode(empty_as_null=False, keep_nulls=False)
            if flat.null_count() == 0:
                out[path] = ListArray(flat.cast(pl.Float64).to_numpy(),
                                      s.list.len().fill_null(0).to_numpy().astype(np.int64), s.is_null().to_numpy())
    return out


def _path_leaf(s: Any, steps: tuple, n: int) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """``ColumnRecords.path_leaf`` of the column ``s`` (None: no such list column) and the steps after its name."""
    import polars as pl

    from convert.config import EACH

    if s is None:
        return None
    counts = null = None
    for step in steps:
        if step is EACH:
            if not isinstance(s.dtype, pl.List):
                return None
            lens = s.list.len().fill_null(0).to_numpy().astype(np.int64)
            if counts is None:  # the first list: a row per record
                counts, null = lens, s.is_null().to_numpy()
            else:  # items of the lists so far: add each item's count to its row
                rows = np.repeat(np.arange(n), counts)
                counts = np.bincount(rows, weights=lens, minlength=n).astype(np.int64)
            s = s.explode(empty_as_null=False, keep_nulls=False)
            if len(s) != int(counts.sum()):
                return None
        elif isinstance(step, str) and isinstance(s.dtype, pl.Struct) and step in {f.name for f in s.dtype.fields}:
            s = s.struct.field(step)  # null where the record is null
        elif isinstance(step, int) and not isinstance(step, bool) and isinstance(s.dtype, pl.List):
            s = s.list.get(step, null_on_oob=True)  # null where the list is null or too short
        else:
            return None
    if counts is None or null is None:
        return None
    return s, counts, null


def _has_list(dtype: Any) -> bool:
    """Whether a polars type holds a list at some depth."""
    import polars as pl

    if isinstance(dtype, pl.List):
        return True
    return isinstance(dtype, pl.Struct) and any(_has_list(f.dtype) for f in dtype.fields)


def _is_text_dtype(dtype: Any) -> bool:
    import polars as pl

    return dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum)


def _term_coders(leaves: list[tuple[str, Any]]) -> dict[str, Callable[[], TermCodes | None]]:
    """``TermCodes`` makers for the string, enum, integer and list-of-string
    columns among a batch's ``leaves`` (``_leaves``): made in Rust and numpy,
    only for the columns asked for.

    Why: a batch's strings become Python objects only once per distinct
    value, instead of a term-index lookup per record or flattening the
    lists of a tag column into Python strings (measured, docs/benchmarks.md#design-converter).
    """
    import polars as pl

    out: dict[str, Callable[[], TermCodes | None]] = {}
    for path, s in leaves:
        dt = s.dtype
        if _is_text_dtype(dt):
            out[path] = functools.partial(_text_codes, s, "scalar")
        elif isinstance(dt, pl.List) and _is_text_dtype(dt.inner):
            out[path] = functools.partial(_text_codes, s, "list")
        elif dt.is_integer() and dt != pl.UInt64:
            out[path] = functools.partial(_int_codes, s)
    return out


def _text_codes(s: Any, kind: str) -> TermCodes | None:
    import polars as pl

    counts = None
    if kind == "list":
        counts = s.list.len().fill_null(0).to_numpy().astype(np.int64)
        s = s.explode(empty_as_null=False, keep_nulls=False)
        if s.null_count():
            return None  # null items: the vectorizer's per-value path decides
    s = s.cast(pl.String)
    uniq = s.unique(maintain_order=True).drop_nulls()
    codes = s.cast(pl.Enum(uniq)).to_physical().cast(pl.Int32).fill_null(-1).to_numpy()
    return TermCodes(kind, uniq.to_list(), codes, counts)


def _int_codes(s: Any) -> TermCodes:
    import polars as pl

    null = s.is_null().to_numpy()
    vals = s.cast(pl.Int64).fill_null(0).to_numpy()
    present = ~null
    uniq, first, inverse = np.unique(vals[present], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # first-occurrence order
    rank = np.empty(order.size, dtype=np.int32)
    rank[order] = np.arange(order.size, dtype=np.int32)
    codes = np.full(vals.size, -1, dtype=np.int32)
    codes[present] = rank[inverse.reshape(-1)]
    return TermCodes("scalar", uniq[order].tolist(), codes)


def _json_ready(expr: Any, dtype: Any) -> Any:
    """``expr`` (of polars type ``dtype``) as the values ``convert.splits._canonical``
    serializes: struct fields in sorted order, float32 as the float64 Python
    holds, bytes as their hex (its ``default``), enums as their symbol."""
    import polars as pl

    if isinstance(dtype, pl.Struct):
        fields = pl.struct([_json_ready(expr.struct.field(f.name), f.dtype).alias(f.name)
                            for f in sorted(dtype.fields, key=lambda f: f.name)])
        return pl.when(expr.is_null()).then(None).otherwise(fields)  # a new struct is never null
    if isinstance(dtype, pl.List):
        return expr.list.eval(_json_ready(pl.element(), dtype.inner)) if _json_differs(dtype.inner) else expr
    if dtype == pl.Float32:
        return expr.cast(pl.Float64)
    if dtype == pl.Binary:
        return expr.bin.encode("hex")
    if isinstance(dtype, pl.Enum | pl.Categorical):
        return expr.cast(pl.String)
    return expr


def _json_differs(dtype: Any) -> bool:
    """Whether ``_json_ready`` changes values of ``dtype``."""
    import polars as pl

    if isinstance(dtype, pl.List):
        return _json_differs(dtype.inner)
    return isinstance(dtype, pl.Struct | pl.Enum | pl.Categorical) or dtype in (pl.Float32, pl.Binary)


def _records_json(df: Any) -> list[bytes]:
    """Each row's canonical JSON, as ``convert.splits._canonical`` makes it from
    the row's dict (keys sorted at every level), made by polars in Rust.

    Why: the whole-record split hashes these bytes, and building them with
    orjson first needs every record as a Python dict (docs/benchmarks.md#design-converter).
    polars and orjson both write shortest round-trip floats, ``null``
    for NaN and infinities and the same string escapes; tests compare the two
    on every whitelisted type, random schemas, real files and random floats
    and strings.
    """
    import polars as pl

    schema = df.schema  # once: each ``df.schema`` builds the whole schema
    row = pl.struct([_json_ready(pl.col(c), schema[c]).alias(c) for c in sorted(schema)])
    return df.select(row.struct.json_encode().cast(pl.Binary)).to_series().to_list()


def _decode_avro_blocks(pl: Any, data: bytes, n: int, path: str, record_json: bool) -> ColumnRecords:
    """The ``n`` records of a small Avro file (a header and whole blocks), decoded
    by polars (the module ``pl``) into columns; raises whatever polars raises on
    blocks it cannot read."""
    df = pl.read_avro(io.BytesIO(data))
    if df.height != n or df.width == 0:
        raise ValueError(f"decoded {df.height} records x {df.width} fields, the blocks hold {n}")
    raw = {c: _raw_dtype(t) for c, t in df.schema.items()}
    if any(raw[c] != t for c, t in df.schema.items()):
        df = df.cast(raw)
    leaves = _leaves(df)  # once: each record field is a polars call
    arrays = _numeric_arrays(leaves)
    coders = _term_coders(leaves)
    # Columns go to the vectorizer as arrays and codes where they can:
    # the lists of these, and of record columns, are made only if asked for.
    # (each ``df.schema``, ``df.columns`` or ``get_column`` call walks every column: once here)
    series = df.get_columns()
    lists = {s.name: s for s in series if _has_list(s.dtype)}  # paths through lists (path_leaf)
    deferred = {s.name: s.to_list for s in series
                if s.name in arrays or s.name in coders or s.name in lists or isinstance(s.dtype, pl.Struct)}
    columns = {s.name: None if s.name in deferred else s.to_list() for s in series}
    texts = None
    if record_json:
        try:
            texts = _records_json(df)
        except Exception as e:  # the split makes them from the records instead
            _log.debug("%s: no record JSON from polars (%s: %s)", path, type(e).__name__, e)
    del df, series  # their Arrow buffers are not kept while the batch is processed (deferred columns keep theirs)
    return ColumnRecords(columns, n, arrays, texts, deferred, coders, lists)


def _iter_avro_columnar(f: IO[bytes], path: str, header: bytes, sync: bytes, pos: int, end: int | None,
                        batch_size: int, record_json: bool = False, codec: str = "null",
                        max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                        first_block: int = 0) -> Generator[RecordBatch, None, int | None]:
    """The Avro fast path: whole blocks of ``[pos, end)`` decoded by polars, a
    batch at a time (the file's header plus the batch's raw blocks make a small
    Avro file). Returns ``None`` when the range is done, or the offset of the
    first block it could not decode: the fastavro path goes on from there and
    reports what is wrong, so nothing is read twice or lost. A block that
    decompresses past ``max_block_bytes`` (``codec`` is the file's) is checked
    before polars sees it: the blocks before it are yielded, then
    ``InputFileError`` (``first_block``: the file's first block, to number it).

    Why: polars decodes in Rust, several times fastavro's rate (docs/benchmarks.md#design-converter),
    and hands over columns (``ColumnRecords``), which is the form the
    vectorizer works on.
    """
    import polars as pl  # only in processes that decode Avro

    too_big: InputFileError | None = None
    while end is None or pos < end:
        chunk_start = pos
        parts, offsets, counts = [header], [], []
        n = 0
        while n < batch_size and (end is None or pos < end):
            block = _read_raw_block(f, sync, max_block_bytes if codec == "null" else MAX_AVRO_BLOCK_BYTES)
            if block is None:
                break
            body = memoryview(block[1])[block[2]:-_SYNC_SIZE]  # (no copy)
            if _block_expands_past(codec, body, len(body), max_block_bytes) is not None:
                too_big = _block_too_big(f, path, first_block, pos, max_block_bytes)
                break
            offsets.append(pos)
            counts.append(block[0])
            parts.append(block[1])
            n += block[0]
            pos += len(block[1])
        if too_big is not None and not counts:
            raise too_big
        if not counts:  # end of file, or a block only fastavro can judge
            f.seek(chunk_start)
            return chunk_start
        if n == 0:
            if too_big is not None:
                raise too_big
            continue
        try:
            records = _decode_avro_blocks(pl, b"".join(parts), n, path, record_json)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as e:  # noqa: BLE001 - polars' Rust panics are BaseExceptions
            _log.debug("%s: the Avro fast path stops at byte %d (%s: %s); fastavro goes on",
                       path, chunk_start, type(e).__name__, e)
            f.seek(chunk_start)
            return chunk_start
        rec_offsets: list[int] = []
        indexes: list[int] = []
        for off, c in zip(offsets, counts, strict=True):
            rec_offsets.extend([off] * c)
            indexes.extend(range(c))
        parts.clear()
        yield RecordBatch(path, "avro", records, rec_offsets, indexes)
        if too_big is not None:
            raise too_big
    return None


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
            patched = _binary_meta_readable(f)
            if patched is None:
                raise
            f = patched
            blocks = fastavro.block_reader(f)
        header_end = f.tell()
        sync = _header_sync(f, header_end)
        # With logical types, records are decoded with the writer schema minus
        # ``logicalType``: fastavro converts logical types according to the
        # *writer* schema, so a reader schema cannot turn the conversion off.
        raw_header = _raw_header(blocks.writer_schema, blocks.codec, sync) if _has_logical(blocks.writer_schema) else None
    except RecursionError:
        raise InputFileError(path, _too_deep(f), 0) from None
    except _FASTAVRO_API_ERRORS as e:
        raise _fastavro_changed(e) from e
    except Exception as e:
        raise InputFileError(
            path, f"cannot read the Avro header ({_quoted(e)}); is it an Avro object container file?", 0
        ) from e
    return f, blocks, header_end, sync, raw_header


def _seek_first_block(f: IO[bytes], sync: bytes, start: int, header_end: int) -> bool:
    """Moves ``f`` to the first block starting at or after ``start``; ``False`` when there is none."""
    if start <= header_end:
        f.seek(header_end)
        return True
    # The block starting exactly at ``start`` follows a sync marker that
    # begins at ``start - 16`` (never the header's, which ends before start).
    f.seek(start - _SYNC_SIZE)
    return bool(_advance_past_sync(f, sync))


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
    if decoder == "auto" and blocks.codec in _COLUMNAR_CODECS and _columnar_schema(blocks.writer_schema):
        f.seek(0)
        header = f.read(header_end)
        f.seek(next_block)
        resume = yield from _iter_avro_columnar(f, path, header, sync, next_block, end, batch_size, record_json,
                                                blocks.codec, max_block_bytes, header_end)
        if resume is None:
            return
        next_block = resume
        f.seek(resume)
    batch = RecordBatch(path, "avro", [], [], [])
    error: InputFileError | None = None
    cause: BaseException | None = None
    while end is None or next_block < end:
        head = _peek_block_header(f)
        if head is not None and not 0 <= head[1] <= MAX_AVRO_BLOCK_BYTES:
            error = InputFileError(path, f"Avro block claims {head[1]} bytes (limit {MAX_AVRO_BLOCK_BYTES}); the file is corrupt", next_block)
            break
        expands = None if head is None else _check_block_at(f, blocks.codec, max_block_bytes)
        if expands is not None:
            error = _block_too_big(f, path, header_end, next_block, max_block_bytes)
            break
        if head is not None and head[0] > MAX_AVRO_EMPTY_RECORDS and _check_block_at(f, blocks.codec, head[0] - 1) is None:
            error = InputFileError(path, f"Avro block claims {head[0]} records in fewer decompressed bytes; the file is corrupt", next_block)
            break
        off = next_block
        try:
            block = next(blocks) if raw_header is None else _raw_block(f, raw_header)
        except StopIteration:
            break
        except RecursionError as e:
            error, cause = InputFileError(path, _too_deep(None), off), e
            break
        except _FASTAVRO_API_ERRORS as e:
            raise _fastavro_changed(e) from e
        except Exception as e:
            what = "truncated Avro block (the file ends inside it)" if isinstance(e, EOFError) else "corrupt Avro block"
            error, cause = InputFileError(path, f"{what} ({_quoted(e)})", off), e
            break
        recs = []
        try:
            recs.extend(block)
        except RecursionError as e:
            error, cause = InputFileError(path, _too_deep(None), off), e
            break
        except Exception as e:
            error, cause = InputFileError(path, f"corrupt record {len(recs)} in Avro block ({_quoted(e)})", off), e
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


#: What a fastavro whose API no longer fits raises (a renamed attribute, a
#: changed signature): recordprep's fault, never a reason to blame the file.
_FASTAVRO_API_ERRORS = (AttributeError, TypeError, NameError, ImportError)


def _fastavro_changed(e: BaseException) -> RuntimeError:
    return RuntimeError(f"internal error: recordprep's use of fastavro does not fit the installed fastavro "
                        f"{getattr(fastavro, '__version__', '?')} ({_quoted(e)}); install a fastavro in the range "
                        "pyproject.toml gives, and report this")


def _header_sync(f: IO[bytes], header_end: int) -> bytes:
    """The file's 16-byte sync marker: the last bytes of its header (Avro
    specification), read back from the file; ``f`` left at ``header_end``."""
    f.seek(header_end - _SYNC_SIZE)
    sync = f.read(_SYNC_SIZE)
    if len(sync) != _SYNC_SIZE:
        raise ValueError(f"the header ends at byte {header_end}, before a whole sync marker")
    return sync


def _raw_header(writer_schema: Any, codec: str, sync: bytes) -> bytes:
    """An Avro header declaring ``writer_schema`` minus ``logicalType``, with the
    file's codec and sync marker: a file's blocks behind it decode to the raw
    values of their logical types (``_raw_block``)."""
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(_strip_logical(writer_schema)), [], codec=codec, sync_marker=sync)
    return buf.getvalue()


def _raw_block(f: IO[bytes], raw_header: bytes) -> Any:
    """The fastavro block at ``f``'s position (``f`` left after it) read behind
    ``raw_header``, so fastavro decompresses and checks it as it does in the
    file; ``StopIteration`` at the end of the file."""
    pos = f.tell()
    h = _block_header(f.read(20))
    f.seek(pos)
    data = f.read(h[2] + h[1] + _SYNC_SIZE if h is not None and h[1] >= 0 else 20)
    if not data:
        raise StopIteration
    return next(fastavro.block_reader(io.BytesIO(raw_header + data)))


def _schema_depth(text: bytes) -> int:
    """How deeply the JSON ``text`` nests (arrays and objects), without
    recursion: for messages about schemas too deep to parse."""
    depth = deepest = 0
    in_string = escaped = False
    for b in text:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x7B, 0x5B):
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x7D, 0x5D):
            depth -= 1
    return deepest


def _too_deep(f: IO[bytes] | None) -> str:
    """Why a valid Avro file whose schema (or records) nest too deeply for
    Python's recursion limit cannot be read; with ``f``, how deep its writer
    schema nests (read from the header with a flat header schema)."""
    levels = ""
    if f is not None:
        try:
            f.seek(0)
            meta = fastavro.schemaless_reader(f, fastavro.read.HEADER_SCHEMA, None)["meta"]
            levels = f" (its JSON nests {_schema_depth(meta.get('avro.schema', b''))} deep)"
        except Exception:  # noqa: BLE001 - only a detail of the message
            pass
    return (f"the writer schema nests deeper{levels} than the Python recursion limit "
            f"({sys.getrecursionlimit()} frames, a few per level) lets fastavro read; "
            "flatten the schema (nest fewer records, arrays and unions inside each other)")


# --------------------------------------------------------------------- JSON


#: 19+ digits in a row: maybe an integer outside int64/uint64, which orjson
#: silently turns into a float; the stdlib parser keeps such integers exact.
#: Found with ``bytes.translate`` + ``find`` instead of a regex (``\d{19}``
#: backtracks at every digit run; docs/benchmarks.md#design-converter). Runs after ``.``/``e``/``E``/``+`` are fractions or exponents,
#: not integers (``0.000123456789012345678`` is common in JSON from Python).
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_NOT_AN_INTEGER_BEFORE = frozenset(b".eE+")


def _long_integer_runs(data: bytes) -> Iterator[int]:
    """Start of every run of 19+ digits in ``data`` that may be an integer literal."""
    if len(data) >= _NUMPY_SCAN_BYTES:
        yield from _long_integer_runs_numpy(data)
        return
    t = data.translate(_DIGITS_TO_ZERO)
    i = t.find(_LONG_RUN)
    while i >= 0:
        if i == 0 or t[i - 1] not in _NOT_AN_INTEGER_BEFORE:
            yield i
        i += len(_LONG_RUN)
        while i < len(t) and t[i] == 0x30:  # the rest of this run
            i += 1
        i = t.find(_LONG_RUN, i)


#: From this size on, blocks are scanned with numpy (see _long_integer_runs_numpy).
_NUMPY_SCAN_BYTES = 1 << 16


def _long_integer_runs_numpy(data: bytes) -> Iterator[int]:
    """``_long_integer_runs`` for large blocks: a digit mask, then a few ANDs of
    shifted copies leave ``e[i]`` true where 19 digits start at ``i``.

    Why: JSON Lines blocks are scanned whole, and this is faster than
    translate + find on them (docs/benchmarks.md#design-converter). Small inputs keep translate + find
    (numpy's per-call cost is larger there).
    """
    t = np.frombuffer(data, np.uint8) - np.uint8(48)  # digits become 0..9, the rest wraps above
    digit = np.less(t, 10, out=t.view(bool))
    e = digit.copy()
    n = e.size
    for w in (1, 2, 4, 8, 3):  # runs of 2, 4, 8, 16, then 19 digits
        if n <= w:
            return
        np.logical_and(e[:n - w], e[w:n], out=e[:n - w])
        n -= w
    starts = np.flatnonzero(e[:n])
    if not starts.size:
        return
    starts = starts[(starts == 0) | ~digit[starts - 1]]  # where a run begins
    for i in starts.tolist():
        if i == 0 or data[i - 1] not in _NOT_AN_INTEGER_BEFORE:
            yield i


def _maybe_long_integer(line: bytes) -> bool:
    """Whether ``line`` may hold an integer literal of 19 or more digits."""
    return next(_long_integer_runs(line), None) is not None


#: A ``\uD800``-``\uDFFF`` escape: maybe a lone surrogate, which is not Unicode
#: (it cannot be encoded as UTF-8 for vocabularies, hashing or the error output).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _loads(line: bytes) -> Any:
    if not _maybe_long_integer(line):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    # The same error, or a value orjson refuses (1e400, lone surrogates).
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply for Python's parser (about 1000 levels); flatten the record") from None
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
                             "which is not valid Unicode; fix the writer") from None
    return value


def _records_at(doc: Any, records_path: str | None, path: str) -> list[Any]:
    node = doc
    if records_path:
        for key in records_path.split("."):
            if not isinstance(node, dict) or key not in node:
                found = [k[:50] for k in sorted(node)[:10]] if isinstance(node, dict) else type(node).__name__
                raise InputFileError(path, f"--json-records-path {records_path!r}: no key {key!r} (found {found})")
            node = node[key]
    if isinstance(node, dict) and not records_path:
        return [node]
    if not isinstance(node, list):
        raise InputFileError(path, f"expected a JSON array of records, found {type(node).__name__}; pass --json-records-path to name the key holding the records")
    return node


def _iter_gzip_json(f: IO[bytes], path: str, batch_size: int, records_path: str | None,
                    max_record_bytes: int) -> Iterator[RecordBatch]:
    """JSON inside gzip; damaged gzip data makes the file unreadable (named), not a crash.
    ``GzipFile`` decompresses only what each bounded read asks for, so the
    record cap bounds memory here too."""
    try:
        yield from iter_json(gzip.GzipFile(fileobj=f, mode="rb"), path, 0, None, batch_size, records_path,  # type: ignore[arg-type]
                             max_record_bytes)
    except (OSError, EOFError, zlib.error) as e:
        raise InputFileError(path, f"not valid gzip data ({_quoted(e)}); the file starts with gzip's magic bytes") from e


def iter_json(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
              batch_size: int = 4096, records_path: str | None = None,
              max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[RecordBatch]:
    """Yield batches from JSON Lines, a JSON array, or records under a key.

    JSON Lines are streamed line by line (ranges align to line starts). A
    whole-document JSON (array, or ``records_path``) is parsed in one piece:
    JSON has no record boundaries to stream on without a second parser, so
    prefer JSON Lines for large inputs.

    ``max_record_bytes`` caps a line and a whole document: a longer line goes
    to ``bad`` (read past in bounded chunks, never held whole); a longer
    document fails the file with ``InputFileError``.
    """
    f.seek(0)
    head = f.read(2)
    f.seek(0)
    if head == GZIP_MAGIC:
        if start > 0:
            return  # not splittable: the range starting at 0 owns the whole file
        yield from _iter_gzip_json(f, path, batch_size, records_path, max_record_bytes)
        return
    buffered = f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f)  # type: ignore[arg-type]

    # Sniff by reading (not every stream has ``peek``, e.g. io.BytesIO).
    probe = buffered.read(64 * 1024)
    buffered.seek(0)
    lead = probe.lstrip(b"\xef\xbb\xbf \t\r\n")
    if records_path or lead.startswith(b"["):
        if start > 0:
            return  # one JSON document: owned by the range that starts at 0
        data = buffered.read(max_record_bytes + 4)  # + a BOM, + 1 to see a longer document
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        if len(data) > max_record_bytes:
            raise InputFileError(path, f"the JSON document is larger than {_mb(max_record_bytes)}, the cap on a JSON "
                                 "document (--max-record-mb); raise --max-record-mb to read it, or write JSON Lines "
                                 "(one record per line), which are streamed")
        if not data.strip():
            return
        try:
            doc = _loads(data)
        except ValueError as e:
            raise InputFileError(path, f"not valid JSON ({str(e)[:_MAX_QUOTED_CHARS]}); expected JSON Lines or one JSON document") from e
        recs = _records_at(doc, records_path, path)
        for s in range(0, len(recs), batch_size):
            chunk = recs[s:s + batch_size]
            yield RecordBatch(path, "json", chunk, [0] * len(chunk), list(range(s, s + len(chunk))))
        return

    pos = 0
    if start > 0:
        # Own the lines that start in [start, end): skip the partial line.
        buffered.seek(start - 1)
        pos = start - 1 + _skip_line(buffered)[0]
    yield from _iter_json_lines(buffered, path, pos, 0 if start > 0 else 1, end, batch_size, max_record_bytes)


def _skip_line(f: IO[bytes]) -> tuple[int, bool]:
    """Read past the next newline (or to the end), ``_CHECK_CHUNK_BYTES`` at a
    time, so a line of any length is never held whole: the bytes read, and
    whether they end with the newline."""
    n = 0
    while True:
        chunk = f.readline(_CHECK_CHUNK_BYTES)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return n, bool(chunk)


#: JSON Lines are read in blocks of about this many bytes (completed to the
#: next newline): one C-level split and one long-integer scan per block
#: instead of a Python iteration and a scan per line. 128 KB rather than 1 MB:
#: a block's lines stay in the CPU's cache while orjson parses them
#: (docs/benchmarks.md#design-converter; 64 KB gains nothing more).
_JSONL_BLOCK_BYTES = 1 << 17


def _iter_json_lines(buffered: IO[bytes], path: str, pos: int, line_no: int, end: int | None,
                     batch_size: int, max_line: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[RecordBatch]:
    """JSON Lines from byte ``pos`` (a line start), lines starting before ``end``.

    ``line_no`` is the 1-based number of the line at ``pos``, 0 when unknown.
    Per-line work is kept to ``orjson.loads``: blocks are split in C and the
    scan for integers orjson would round (``_long_integer_runs``) runs once per
    block. A line orjson refuses, or that may hold a long integer, goes
    through ``_loads`` (stripped), as every line did before.

    A line longer than ``max_line`` bytes goes to ``bad``: a block is completed
    to the next newline only up to the cap, and the rest of a longer line is
    read past in bounded chunks (``_skip_line``). Batches are yielded at
    ``batch_size`` records plus bad lines, so a file of bad lines is not held whole.
    """
    batch = RecordBatch(path, "json", [], [], [])
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    while end is None or pos < end:  # (a line starting before ``end`` may run past it)
        read = _json_block(buffered, max_line)
        if read is None:
            break
        block, long_head, long_len = read
        long_runs = list(_long_integer_runs(block))
        lines = block.split(b"\n")
        if block.endswith(b"\n") or not block:
            lines.pop()  # the empty piece after the last newline is not a line
        rel = 0  # offset of the current line in the block
        run = 0  # next entry of long_runs at or after the current line
        for line in lines:
            if len(batch.records) + len(batch.bad) >= batch_size:
                yield batch
                batch = RecordBatch(path, "json", [], [], [])
            off, line_start = pos + rel, rel
            rel += len(line) + 1
            this_line = line_no
            if line_no:
                line_no += 1
            if end is not None and off >= end:
                break
            if len(line) > max_line:  # (only when the cap is below the block size)
                batch.bad.append((off, this_line, _too_long(len(line), max_line), _excerpt(line)))
                continue
            if off == 0 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line or line.isspace():
                continue
            while run < len(long_runs) and long_runs[run] < line_start:
                run += 1
            try:
                if run < len(long_runs) and long_runs[run] < rel:
                    rec = _loads(line.strip())
                else:
                    try:
                        rec = loads(line)
                    except decode_error:
                        rec = _loads(line.strip())
            except ValueError as e:
                batch.bad.append((off, this_line, f"malformed JSON: {str(e)[:_MAX_QUOTED_CHARS]}", _excerpt(line.strip())))
                continue
            if not isinstance(rec, dict):
                batch.bad.append((off, this_line, f"expected a JSON object per line, found {type(rec).__name__}",
                                  _excerpt(line.strip())))
                continue
            batch.records.append(rec)
            batch.offsets.append(off)
            batch.indexes.append(this_line)
        pos += len(block)
        if long_head is not None:
            if end is not None and pos >= end:
                break
            bad, long_len = _skip_long_line(buffered, pos, line_no, long_head, long_len, max_line)
            batch.bad.append(bad)
            if line_no:
                line_no += 1
            pos += long_len
    if batch.records or batch.bad:
        yield batch


def _json_block(buffered: IO[bytes], max_line: int) -> tuple[bytes, bytes | None, int] | None:
    """The next block of whole lines, ``None`` at the end of the file.

    ``(block, long_head, long_len)``: a last line over ``max_line`` bytes is cut
    off the block; ``long_head`` is its start (``None`` when there is none) and
    ``long_len`` the bytes of it read so far (its rest is still unread).
    """
    block = buffered.read(_JSONL_BLOCK_BYTES)
    if not block:
        return None
    long_head, long_len = None, 0
    if not block.endswith(b"\n"):
        last = block.rfind(b"\n") + 1
        need = max_line + 1 - (len(block) - last)
        if need > 0:
            block += buffered.readline(need)  # complete the last line (unless at EOF or over the cap)
        if not block.endswith(b"\n") and len(block) - last > max_line:
            long_head, long_len = block[last:last + MAX_ERROR_TEXT_BYTES], len(block) - last
            block = block[:last]
    return block, long_head, long_len


def _skip_long_line(buffered: IO[bytes], pos: int, line_no: int, long_head: bytes, long_len: int,
                    max_line: int) -> tuple[tuple[int, int, str, str], int]:
    """Reads past the rest of a line over the cap that starts at ``pos``: its ``bad``
    entry, and the line's whole length (with its newline)."""
    rest, newline = _skip_line(buffered)
    long_len += rest
    text_len = long_len - newline
    return (pos, line_no, _too_long(text_len, max_line), _excerpt(long_head, text_len)), long_len


def _too_long(nbytes: int, cap: int) -> str:
    return (f"line of {nbytes} bytes is longer than {_mb(cap)}, the cap on a JSON record (--max-record-mb); "
            "raise --max-record-mb to read it")


def iter_records(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
                 batch_size: int = 4096, json_records_path: str | None = None,
                 avro_decoder: str = "auto", record_json: bool = False,
                 max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES) -> Iterator[RecordBatch]:
    """Dispatch on the file's format; see ``iter_avro`` and ``iter_json``.

    ``record_json``: the Avro fast path also gives each record's canonical
    JSON (``ColumnRecords.record_json``), for the whole-record split.
    ``max_record_bytes`` caps a JSON line or document, ``max_block_bytes`` an
    Avro block's decompressed bytes (``ConvertOptions.max_record_mb`` and
    ``max_block_mb``).
    """
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    if detect_format(path, head) == "avro":
        return iter_avro(f, path, start, end, batch_size, avro_decoder, record_json, max_block_bytes)
    return iter_json(f, path, start, end, batch_size, json_records_path, max_record_bytes)
