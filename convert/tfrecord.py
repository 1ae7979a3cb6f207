"""TFRecord framing in bulk.

A TFRecord file is a sequence of ``uint64 length | uint32 masked_crc32c(length)
| data | uint32 masked_crc32c(data)``. Beam's ``WriteToTFRecord`` frames one
element at a time; the converter frames a whole encoded batch at once from the
buffer ``convert.example.encode_examples`` returns, so a shard write is one
``write()`` per batch. CRCs come from ``google-crc32c`` (C implementation);
``frame_records`` and ``take_records`` run in C (``convert/_tfrecord.c``, the
same bytes) when it is built.
"""

from __future__ import annotations

import itertools
import struct
from typing import IO

import google_crc32c
import numpy as np

try:  # the same bytes in C; absent when built without a C compiler
    from convert._tfrecord import frame as _frame_c
    from convert._tfrecord import take as _take_c
except ImportError:
    _frame_c = _take_c = None

_MASK_DELTA = 0xA282EAD8


def masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


#: length -> its 12 header bytes (length, masked CRC of it): Example sizes
#: repeat, so most headers are a lookup.
_HEADERS: dict[int, bytes] = {}


def _header(n: int) -> bytes:
    h = _HEADERS.get(n)
    if h is None:
        if len(_HEADERS) >= 1 << 16:
            _HEADERS.clear()
        length = struct.pack("<Q", n)
        h = _HEADERS[n] = length + struct.pack("<I", masked_crc(length))
    return h


def frame_records(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """TFRecord-framed bytes for the records ``buf[starts[i]:starts[i]+lengths[i]]``.

    Per record only a slice and a CRC call; the CRC masking is one numpy
    expression, headers come from a cache, and one ``join`` assembles the
    frames (faster than a per-record loop, docs/benchmarks.md#design-converter).
    """
    if _frame_c is not None:
        return _frame_c(np.ascontiguousarray(buf, dtype=np.uint8), np.ascontiguousarray(starts, dtype=np.int64),
                        np.ascontiguousarray(lengths, dtype=np.int64))
    data = np.ascontiguousarray(buf, dtype=np.uint8).tobytes()  # google-crc32c takes bytes only
    ln = lengths.tolist()
    recs = [data[s:s + n] for s, n in zip(starts.tolist(), ln, strict=True)]
    crc = np.fromiter(map(google_crc32c.value, recs), dtype=np.uint64, count=len(recs))
    masked = (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)
    tail = masked.astype("<u4").view("V4").tolist()  # each CRC's 4 bytes, little-endian
    heads = list(map(_header, ln))
    return b"".join(itertools.chain.from_iterable(zip(heads, recs, tail, strict=True)))


def take_records(data: bytes | bytearray | memoryview, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """The records ``data[starts[i]:starts[i]+lengths[i]]`` back to back, in that order
    (a gather by index: the shuffle writes its shards' records so)."""
    if _take_c is not None:
        return _take_c(data, np.ascontiguousarray(starts, dtype=np.int64), np.ascontiguousarray(lengths, dtype=np.int64))
    mv = memoryview(data)
    return b"".join([mv[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist(), strict=True)])


#: Record data is read this many bytes at a time past this size, so a length
#: field claiming terabytes (a damaged or hostile shard; ``inspect`` reads
#: without checking its CRC) costs what the file holds, not an allocation of
#: the claimed size.
_READ_CHUNK = 64 << 20


def _read_up_to(f: IO[bytes], n: int) -> bytes:
    """``n`` bytes of ``f``, fewer at its end; never asks ``read`` for more than ``_READ_CHUNK``."""
    if n <= _READ_CHUNK:
        return f.read(n)
    parts = []
    while n > 0:
        part = f.read(min(n, _READ_CHUNK))
        if not part:
            break
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def iter_records(f: IO[bytes], path: str = "<stream>", verify: bool = True):
    """Yield records from a TFRecord stream, checking CRCs.

    Raises ``ValueError`` naming the path and byte offset on a truncated or
    corrupt record (used by ``recordprep verify``, which must not need TF).
    """
    offset = 0
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) < 12:
            raise ValueError(f"{path}: truncated record header at byte {offset}")
        (n,) = struct.unpack("<Q", header[:8])
        (hcrc,) = struct.unpack("<I", header[8:])
        if verify and masked_crc(header[:8]) != hcrc:
            raise ValueError(f"{path}: corrupt record length (CRC mismatch) at byte {offset}")
        data = _read_up_to(f, n)
        tail = f.read(4)
        if len(data) < n or len(tail) < 4:
            raise ValueError(f"{path}: truncated record at byte {offset} (expected {n} bytes)")
        if verify and masked_crc(data) != struct.unpack("<I", tail)[0]:
            raise ValueError(f"{path}: corrupt record data (CRC mismatch) at byte {offset}")
        yield data
        offset += 16 + n
