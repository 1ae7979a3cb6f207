"""Avro object container framing, read by hand: the header (schema, codec and
the 16-byte sync marker), block headers, byte ranges (the next sync marker),
and the checks on a block's claimed and decompressed size made before either
decoder allocates it.
"""

from __future__ import annotations

import bz2
import lzma
import sys
import zlib
from collections.abc import Callable
from typing import IO, Any

from zlib_ng import zlib_ng as _zng

from convert.source_types import (
    CHECK_CHUNK_BYTES,
    DEFLATE_MAX_RATIO,
    MAX_AVRO_BLOCK_BYTES,
    MAX_AVRO_EMPTY_RECORDS,
    InputFileError,
    mb,
)

#: The first bytes of an Avro object container file (version 1).
AVRO_MAGIC = b"Obj\x01"
SYNC_SIZE = 16


def strip_logical(schema: Any) -> Any:
    """Writer schema with ``logicalType`` removed, keeping named types intact."""
    if isinstance(schema, dict):
        return {k: strip_logical(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip_logical(s) for s in schema]
    return schema


def has_logical(schema: Any) -> bool:
    if isinstance(schema, dict):
        return "logicalType" in schema or any(has_logical(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_logical(s) for s in schema)
    return False


def duplicate_field(schema: Any) -> str | None:
    """A message naming a field declared twice in one record of ``schema``, else None.

    Records at any depth are checked: nested, and inside arrays, maps and
    unions. Readers disagree on such a field (fastavro keeps one value, the
    config check another declaration, polars panics), so the file is refused.
    Iterative: a schema nested past the recursion limit is reported elsewhere.
    """
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, list):
            stack.extend((s, where) for s in node)
        elif isinstance(node, dict):
            t = node.get("type")
            if t in ("record", "error") and isinstance(node.get("fields"), list):
                seen: set[Any] = set()
                for fld in node["fields"]:
                    name = fld.get("name") if isinstance(fld, dict) else None
                    if name in seen:
                        at = f" (at {where}{name})" if where else ""
                        return (f"the Avro schema declares the field {name!r} twice in record {node.get('name')!r}{at}; "
                                "each field name may appear once in a record: rewrite the file with unique names")
                    seen.add(name)
                    if isinstance(fld, dict):
                        stack.append((fld.get("type"), f"{where}{name}."))
            elif t == "array":
                stack.append((node.get("items"), where))
            elif t == "map":
                stack.append((node.get("values"), where))
            elif isinstance(t, dict | list):
                stack.append((t, where))
    return None


def advance_past_sync(f: IO[bytes], sync: bytes, chunk: int = 1 << 16) -> bool:
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
    return bytes(out[:i + SYNC_SIZE]) if i + SYNC_SIZE <= len(head) else None


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


def _zigzag(n: int) -> bytes:
    """``n`` as an Avro long (zigzag varint): the inverse of ``_zigzag_at``."""
    u = (n << 1) ^ (n >> 63)
    out = bytearray()
    while u > 0x7F:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def null_codec_header(header: bytes) -> bytes | None:
    """The Avro header ``header`` (magic to sync marker) declaring the ``null``
    codec, every other metadata entry and the sync marker kept; ``None`` when
    ``header`` is not exactly one whole header.

    For blocks inflated before another decoder reads them (``inflate_blocks``)."""
    if not header.startswith(AVRO_MAGIC):
        return None
    meta: list[tuple[bytes, bytes]] = []
    i = len(AVRO_MAGIC)
    while True:
        got = _zigzag_at(header, i)
        if got is None:
            return None
        count, i = got
        if count == 0:
            break
        if count < 0:  # a block with its byte size
            count = -count
            if (got := _zigzag_at(header, i)) is None:
                return None
            i = got[1]
        for _ in range(count):
            pair = []
            for _ in range(2):
                got = _zigzag_at(header, i)
                if got is None or got[0] < 0 or got[1] + got[0] > len(header):
                    return None
                pair.append(header[got[1]:got[1] + got[0]])
                i = got[1] + got[0]
            meta.append((pair[0], pair[1]))
    if len(header) != i + SYNC_SIZE:
        return None
    meta = [(k, v) for k, v in meta if k != b"avro.codec"] + [(b"avro.codec", b"null")]
    out = [AVRO_MAGIC, _zigzag(len(meta))]
    for k, v in meta:
        out += [_zigzag(len(k)), k, _zigzag(len(v)), v]
    out += [_zigzag(0), header[i:]]
    return b"".join(out)


def inflate_blocks(blocks: list[tuple[int, bytes, int]]) -> list[bytes]:
    """Raw Avro blocks (``read_raw_block``'s tuples) of the ``deflate`` codec as
    ``null``-codec blocks (count, size, the inflated records, the sync marker),
    to be read behind ``null_codec_header``; raises ``zlib.error`` on a corrupt block.

    Why: zlib-ng inflates these blocks in well under the time polars' Avro reader
    takes for them (docs/benchmarks.md#design-converter)."""
    out = []
    for count, data, head in blocks:
        body = memoryview(data)[head:-SYNC_SIZE]
        raw = _zng.decompress(body, -15, 4 * len(body))
        out += [_zigzag(count), _zigzag(len(raw)), raw, data[-SYNC_SIZE:]]
    return out


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


def binary_meta_readable(f: IO[bytes]) -> IO[bytes] | None:
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


def as_record_schema(schema: Any) -> dict[str, Any]:
    """``schema``, or for data that are not records the schema of the records they are read as."""
    if is_record_schema(schema):
        return schema
    return {"type": "record", "name": "recordprep_value", "fields": [{"name": VALUE_FIELD, "type": schema}]}


def block_header(head: bytes) -> tuple[int, int, int] | None:
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


def peek_block_header(f: IO[bytes]) -> tuple[int, int] | None:
    """``(record count, byte size)`` of the block at ``f``'s position, ``f`` left
    where it was; ``None`` when no complete header is there (EOF)."""
    pos = f.tell()
    head = f.read(20)
    f.seek(pos)
    h = block_header(head)
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
    """Bytes raw deflate ``data`` expands to, counted ``CHECK_CHUNK_BYTES`` at
    a time; stops as soon as the count passes ``cap``."""
    d = zlib.decompressobj(-15)
    total = 0
    try:
        while True:
            out = d.decompress(data, CHECK_CHUNK_BYTES)
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
            out = d.decompress(data, CHECK_CHUNK_BYTES)
            total += len(out)
            while total <= cap and not d.eof and not d.needs_input:
                out = d.decompress(b"", CHECK_CHUNK_BYTES)
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


def block_expands_past(codec: str, data: bytes | memoryview | Callable[[int], bytes], size: int, cap: int) -> int | None:
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
    if codec == "deflate" and size * DEFLATE_MAX_RATIO <= cap:
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


def block_too_big(f: IO[bytes], path: str, first_block: int, offset: int, cap: int) -> InputFileError:
    """The error for the block at ``offset``, with its index in the file
    (counted from ``first_block`` by walking the block headers before it)."""
    index, pos = 0, first_block
    try:
        while pos < offset and index < _MAX_INDEX_WALK:
            f.seek(pos)
            h = block_header(f.read(20))
            if h is None:
                break
            pos += h[2] + h[1] + SYNC_SIZE
            index += 1
    except OSError:
        pass
    which = f"Avro block {index}" if pos == offset else "the Avro block"
    return InputFileError(path, f"{which} decompresses to more than {mb(cap)}, the cap on an Avro block "
                                f"(--max-block-mb); raise --max-block-mb if the file is genuine", offset)


def check_block_at(f: IO[bytes], codec: str, cap: int) -> int | None:
    """``block_expands_past`` for the block at ``f``'s position; ``f`` left where it was."""
    pos = f.tell()
    h = block_header(f.read(20))
    if h is None:
        f.seek(pos)
        return None
    _, size, i = h

    def read(n: int) -> bytes:
        f.seek(pos + i)
        return f.read(min(n, size))

    try:
        return block_expands_past(codec, read, size, cap)
    finally:
        f.seek(pos)


def read_raw_block(f: IO[bytes], sync: bytes, max_size: int = MAX_AVRO_BLOCK_BYTES) -> tuple[int, bytes, int] | None:
    """``(record count, the block's bytes, sync marker included, the length of
    its header)`` at ``f``'s position, ``f`` left after it; ``None`` at the end of the file or when the
    block does not look intact (the fastavro path then reads it and says why)."""
    pos = f.tell()
    h = block_header(f.read(20))
    if h is None:
        return None
    count, size, i = h
    if not 0 <= count <= MAX_AVRO_EMPTY_RECORDS or not 0 <= size <= min(max_size, MAX_AVRO_BLOCK_BYTES):
        return None
    f.seek(pos)
    data = f.read(i + size + SYNC_SIZE)
    if len(data) != i + size + SYNC_SIZE or data[-SYNC_SIZE:] != sync:
        return None
    return count, data, i


def header_sync(f: IO[bytes], header_end: int) -> bytes:
    """The file's 16-byte sync marker: the last bytes of its header (Avro
    specification), read back from the file; ``f`` left at ``header_end``."""
    f.seek(header_end - SYNC_SIZE)
    sync = f.read(SYNC_SIZE)
    if len(sync) != SYNC_SIZE:
        raise ValueError(f"the header ends at byte {header_end}, before a whole sync marker")
    return sync
