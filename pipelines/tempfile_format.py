"""The run's temp files: prepared batches, temp shards, and the thread that writes them.

Prepared batches (``prepared-<unit>-<attempt>.bin`` in ``<output>/.recordprep-tmp/``) carry a
unit's input, decoded and prepared once by the analysis pass, to the convert pass
(``pipelines.unit_input.prepare_unit`` makes them, ``pipelines.convert_pass`` reads them). The file
is a sequence of frames, one per ``Prepared`` batch::

    frame    := uint64 n (little-endian), then n bytes of payload
    payload  := item, or an LZ4 frame (level 0) of item where ``lz4_temp(path)``
    item     := uint32 k, uint64 x (k + 1) lengths (the pickle's, then each buffer's),
                the pickle (protocol 5, numpy arrays out of band), the k buffers

A file ends after its last whole frame; a short or undecodable frame raises
``ConversionFailed`` (re-run: temp files never outlive their run). The files
are this process's own (the pickles name this module's ``Prepared``): they
are not a format kept across versions.

Temp shards (``{split}-<unit or shard>-<attempt>.tfrecord[.gz]``) are TFRecord files the commit
renames into place: ``ShardWriter`` writes them, gzip-compressed by ISA-L's
or zlib-ng's deflate (``gzip_file``; ISA-L's kept from depending on where its
compressor lies in memory, ``AddressFreeIGzipFile``), on a ``Serial`` thread.
"""

from __future__ import annotations

import dataclasses
import gzip
import pickle
import queue
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import google_crc32c
import lz4.frame
import numpy as np
from apache_beam.io.filesystems import FileSystems
from isal import isal_zlib
from isal.igzip import IGzipFile
from zlib_ng.gzip_ng import GzipNGFile

from convert.prepare import PreparedBatch
from pipelines._fs import size_of
from pipelines.run_files import ConversionFailed, posix_basename

_FRAME = struct.Struct("<Q")


@dataclasses.dataclass
class Prepared:
    """One input batch, prepared: all the convert pass needs from the input."""

    path: str
    read: int  # records + unparseable lines
    errors: list[bytes]  # its error-output lines, in output order
    split: np.ndarray | None  # split index per record; None: no records
    batch: PreparedBatch | None
    #: A vocabulary label: error lines of the rows finishing may reject (``pipelines.unit_input``).
    late_errors: dict[int, bytes] | None = None


class Serial:
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


def lz4_temp(path: str) -> bool:
    """Whether the temp file ``path`` (prepared batches, scatter, key ranges) holds LZ4 frames.

    On a remote file system its bytes cross the network, and LZ4 (level 0)
    cuts them severalfold for a little CPU (docs/benchmarks.md#design-converter).
    On a local disk they are written as they are: LZ4's CPU
    costs more than the page cache's copies, for temp files about the size
    of the uncompressed output that live for one pass.
    """
    return "://" in path


def _prepared_parts(item: Prepared) -> list[Any]:
    """``item`` pickled with its numpy arrays out of band (protocol 5): a head (buffer
    count, then the pickle's and each buffer's length), the pickle, the arrays' memory.
    Arrays are not copied into the pickle, nor out of it when read (``_unpickle_prepared``)."""
    bufs: list[pickle.PickleBuffer] = []
    main = pickle.dumps(item, protocol=5, buffer_callback=bufs.append)
    views = [b.raw() for b in bufs]
    return [struct.pack(f"<I{len(views) + 1}Q", len(views), len(main), *(v.nbytes for v in views)), main, *views]


def _unpickle_prepared(data: bytearray, path: str) -> Prepared:
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


class PreparedWriter:
    """A unit's prepared batches in a temp file: length-prefixed frames of ``_prepared_parts``,
    LZ4-compressed where ``lz4_temp``.

    Pickling and a raw frame's writes happen in ``write`` (the arrays are
    written from the batch's own memory, before the caller goes on); LZ4 and
    its writes run on a ``Serial`` thread (they release the GIL). The convert
    pass removes the file once it has read it (the commit removes the temp
    directory in any case).
    """

    def __init__(self, path: str):
        self.f = FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed")
        self._lz4 = lz4_temp(path)
        self._bg = Serial(self._compress_and_write, f"recordprep-prepared-{posix_basename(path)}") if self._lz4 else None

    def _compress_and_write(self, data: bytes) -> None:
        data = lz4.frame.compress(data, compression_level=0)
        self.f.write(_FRAME.pack(len(data)))
        self.f.write(data)

    def write(self, item: Prepared) -> None:
        parts = _prepared_parts(item)
        if self._bg is not None:
            self._bg.submit(b"".join(parts))  # a copy: the batch's arrays are the caller's again once this returns
            return
        self.f.write(_FRAME.pack(sum(memoryview(p).nbytes for p in parts)))
        for p in parts:
            self.f.write(p)

    def __enter__(self) -> PreparedWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        try:
            if self._bg is not None and exc_type is None:
                self._bg.close()  # LZ4 frames: the thread writes what is queued
            elif self._bg is not None:
                self._bg.abort()
        finally:
            self.f.close()


def read_prepared(path: str) -> Iterator[Prepared]:
    compressed = lz4_temp(path)
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


#: ``--gzip-level`` values written by ISA-L's igzip (python-isal, its levels 1 and 2); 0 and 3..9
#: are zlib-ng's. igzip's levels are far cheaper than zlib-ng's lowest for about the bytes of
#: zlib's level 1 (docs/benchmarks.md#design-converter), so the scale stays monotonic: each
#: step up is slower and smaller.
ISAL_LEVELS = (1, 2)


def gzip_file(fileobj: Any, level: int) -> gzip.GzipFile:
    """A gzip writer over ``fileobj`` at ``level`` (``ConvertOptions.gzip_level``): no name and no
    mtime in its header, and ISA-L's compressor kept from depending on its address
    (``AddressFreeIGzipFile``), so the same records give the same bytes."""
    if level in ISAL_LEVELS:
        return AddressFreeIGzipFile(filename="", fileobj=fileobj, mode="wb", compresslevel=level, mtime=0)
    return GzipNGFile(filename="", fileobj=fileobj, mode="wb", compresslevel=level, mtime=0)


#: ISA-L's hash mask per level of ``ISAL_LEVELS`` (``LVL1_HASH_MASK``, ``LVL2_HASH_MASK``).
_ISAL_HASH_MASKS = {1: (8 << 10) - 1, 2: (32 << 10) - 1}
_CRC_OF_ZEROS = google_crc32c.value(bytes(4))
#: Compressors made before the last one is kept whatever its address (each new one lies at
#: another address, neutral unless its bucket is one of three of 8 192 or 32 768).
_COMPRESSOR_TRIES = 8


def isal_hash(word: bytes, level: int) -> int:
    """The hash bucket ISA-L's level-``level`` deflate files the 4 bytes ``word`` under: the x86
    ``crc32`` instruction (CRC-32C from 0, no final inversion) of them, masked."""
    return (google_crc32c.value(word) ^ _CRC_OF_ZEROS) & _ISAL_HASH_MASKS[level]


def address_buckets(compressor: Any, level: int) -> set[int]:
    """The buckets ISA-L's level-``level`` deflate may file a stream's third byte under from
    ``compressor``'s address (``AddressFreeIGzipFile``): bits 16..47 of its stream's address,
    which lies in the compressor's first 128 bytes (python-isal's ``compobject``)."""
    return {isal_hash((((id(compressor) + at) >> 16) & 0xFFFFFFFF).to_bytes(4, "little"), level) for at in (0, 128)}


def first_bytes_buckets(head: bytes, level: int) -> set[int]:
    """The buckets of a stream's first three positions (``head``: its first 6 bytes; windows
    beyond a shorter ``head`` are left out)."""
    return {isal_hash(head[i:i + 4], level) for i in range(3) if len(head) >= i + 4}


class AddressFreeIGzipFile(IGzipFile):
    """ISA-L's gzip writer, whose bytes do not depend on where its compressor lies in memory.

    ISA-L's level 1 and 2 deflate on x86 (``write_first_byte`` in ``igzip_icf_body_h1_gr_bt.asm``,
    python-isal 1.9.1's ISA-L 2.32.1) hashes a stream's third byte from a register that still
    holds the stream's address, not from the input: that position is filed under a bucket of
    the address. At almost every address that bucket is one the start of the stream does not
    use, and the bytes are the same; at an address whose bucket is one of the first three
    positions' own (3 of 8 192 buckets at level 1, of 32 768 at level 2) the start of the stream
    is matched otherwise, and the same records give other gzip bytes. Where the compressor lies
    depends on the process's heap, so a shard written in one process (an in-process run, or a
    long-lived one) could differ from the same shard written in another (a worker).

    Before the first bytes reach the compressor, one at such an address is replaced by a new
    one (made while the old one is held, so at another address): every stream gets the bytes
    of the common case. Writers of TFRecord frames write 16 bytes or more at first; a first
    write under 6 bytes is checked on the positions it covers only.
    """

    def __init__(self, *args: Any, compresslevel: int, **kwargs: Any) -> None:
        super().__init__(*args, compresslevel=compresslevel, **kwargs)
        self._level = compresslevel
        self._checked = False

    def write(self, data: Any) -> int:
        if not self._checked and len(memoryview(data)):
            self._checked = True
            self.compress = self._neutral_compressor(bytes(memoryview(data).cast("B")[:6]))
        return super().write(data)

    def _neutral_compressor(self, head: bytes) -> Any:
        """This file's compressor, or a new one, whose address bucket is none of ``head``'s."""
        taken = first_bytes_buckets(head, self._level)
        held = [self.compress]  # alive until a neutral one is made: each new one lies elsewhere
        while address_buckets(held[-1], self._level) & taken and len(held) < _COMPRESSOR_TRIES:
            held.append(isal_zlib.compressobj(self._level, isal_zlib.DEFLATED, -isal_zlib.MAX_WBITS,
                                              isal_zlib.DEF_MEM_LEVEL, 0))
        return held[-1]


class ShardWriter:
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
        self._bg = (Serial(lambda data: self.f.write(data), f"recordprep-writer-{posix_basename(path)}", self._QUEUED)
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
