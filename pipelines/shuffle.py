"""The scatter/gather shuffle of ``--order shuffled`` (the default).

Each unit's convert step (``pipelines.convert_pass``) frames its records as it
would for a shard, then *scatters* them (``Scatter``): a record's output shard
(its bucket) and its place in that shard come from a seeded hash of its
identity (unit, ordinal in the unit; ``shuffle_keys``), so they depend on
neither the worker count nor the runner. The scattered records go to one temp
file per unit, in spills of at most ``_SPILL_BYTES``, each spill holding one
frame per (split, bucket) it has records for. Then ``GatherShards`` runs one
element per output shard: it reads its bucket's frames from every unit (the
index rides along in the unit results, a side input: no GroupByKey of records)
and writes them sorted by their order key. Sorting by an iid uniform key gives
a uniform random order, and the bucket choice is iid uniform too: each shard
is a uniform random sample of its split. A bucket larger than
``_GATHER_BYTES`` is first split by key range into a temp file of its own (one
pass), then each range is sorted in memory: a gathering shard holds one range
whatever the input's size, and the output is the same however many ranges
there are.

On a remote file system (gs://, where every read is a request with a network
round trip) the layout and reads are sized for requests
(docs/architecture.md#the-shuffle-on-object-stores): a unit spills to a local
file and writes its scatter file as one *block* per bucket at close;
consecutive units are merged into groups (``fan_in_groups``) until a group's
blocks average ``_FAN_IN_READ_BYTES``; a gathering shard reads each group's
block in one ranged GET of exactly its bytes (``ranged_reader``; Beam's reader
fetches 16 MB from wherever a read starts), at most ``_READ_BYTES`` at a time.
Requests of the gather then grow with bytes / ``_FAN_IN_READ_BYTES``, not with
units x shards; local runs keep the plain layout (reads are cheap).

File formats (temp files in ``<output>/.recordprep-tmp/``, removed at commit;
integers little-endian; ``bucket`` below is ``split * num_shards + shard``)::

    frame         := uint32 n, n x uint64 order key, n x uint32 framed length,
                     the n framed records (TFRecord framing: length, CRCs, data)
    stored frame  := frame (local temp files), or an LZ4 frame (level 0) of it
                     (remote ones: ``tempfile_format.lz4_temp``)

    scatter-<unit>-<attempt>.bin, local:   stored frames, in spill order
    scatter-<unit>-<attempt>.bin, remote:  one block per bucket, in bucket order
    scatter-group-<first unit>-<attempt>.bin (remote):  one block per bucket, each
                     the group's units' frames of that bucket in unit order (ties
                     sort as they would across the unit files: the same output bytes)
    block         := uint32 k, k x (uint64 stored size, uint32 records,
                     uint64 framed bytes), then the k stored frames
    gather-<split>-<shard>-<attempt>.bin:  stored frames, one per source frame
                     and key range (a bucket over ``_GATHER_BYTES``; removed once
                     its shard is written)

A scatter file's index (``Scatter.close``, in its unit's result) maps each
bucket to its entries: ``(offset, size, records, framed bytes)`` per stored
frame, or ``(offset, size, records, framed bytes, k)`` per block. A short or
undecodable frame or block raises ``ConversionFailed``.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import struct
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import apache_beam as beam
import lz4.frame
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindows

from convert.tfrecord import frame_records, take_records
from pipelines import tempfile_format
from pipelines._fs import delete as fs_delete
from pipelines._fs import ranged_reader
from pipelines.local.progress import GATHER, PROGRESS_DIR, UnitProgress
from pipelines.options import ConvertOptions
from pipelines.run_files import TMP_DIR, ConversionFailed
from pipelines.tempfile_format import Serial, ShardWriter
from pipelines.unit_input import relaxed_gc

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


class Scatter:
    """A unit's framed records, scattered by bucket to its temp file.

    Frame payload: record count (uint32), order keys (uint64 each), framed
    lengths (uint32 each), the framed records. ``index`` maps
    ``split * num_shards + bucket`` to ``(offset, size, records, raw bytes)``
    of each of its frames, in file order; it is complete after ``close``.
    """

    def __init__(self, path: str, unit: int, num_shards: int, seed: int):
        self.path, self.unit, self.num_shards, self.seed = path, unit, num_shards, seed
        self._lz4 = tempfile_format.lz4_temp(path)
        # Remote: spills go to a local file first, copied out bucket by bucket at ``close``.
        self.f = (tempfile.TemporaryFile(prefix="recordprep-scatter-") if self._lz4 else
                  FileSystems.create(path, mime_type="application/octet-stream", compression_type="uncompressed"))
        self.index: dict[int, list[tuple[int, int, int, int]]] = {}
        self._pos = 0
        self._pending: dict[int, list[tuple[memoryview, np.ndarray, np.ndarray]]] = {}
        self._pending_bytes = 0
        self._bg = Serial(self._write_spill, f"recordprep-scatter-{unit}", queued=2)

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
    (see the module's file formats); returns the index of ``path``: one entry per bucket."""
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


def _read_frames(path: str, frames: list[tuple[int, int, int, int]],
                 into: memoryview | None = None) -> Iterator[tuple[np.ndarray, np.ndarray, memoryview]]:
    """``(order keys, framed lengths, framed records)`` of the frames of one scatter file
    (views of the frame's payload: no copy). With ``into``, the frames' records go
    to it back to back, a raw frame's read straight into it, and the views are of it."""
    compressed = tempfile_format.lz4_temp(path)
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
    with ranged_reader(path) as read:
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

    The pool and the stop event are made in ``setup``, not ``__init__``: the
    DoFn is pickled to reach the workers, and plain cloudpickle (what
    runners other than Beam's own use) cannot pickle a lock or an event.
    """

    def __init__(self, options: ConvertOptions, num_shards: int, parallel: int = 1):
        self.options, self.num_shards, self.parallel = options, num_shards, parallel
        self._running: list[concurrent.futures.Future] = []
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._stop: threading.Event | None = None

    def setup(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(self.parallel, thread_name_prefix="recordprep-gather")
        self._stop = threading.Event()

    def start_bundle(self) -> None:
        self._running = []
        assert self._stop is not None
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
        if self._stop is not None:
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
        with relaxed_gc():
            for s, name in enumerate(opts.splits.names):
                g = s * self.num_shards + shard
                sources = [(r["scatter"]["path"], r["scatter"]["index"][g]) for r in scattered if g in r["scatter"]["index"]]
                w = ShardWriter(FileSystems.join(tmp, f"{name}-{shard:05d}-{attempt}{suffix}"), opts.compression_type, opts.gzip_level)
                try:
                    for piece in _gathered(sources, FileSystems.join(tmp, f"gather-{name}-{shard:05d}-{attempt}.bin")):
                        if self._stop is not None and self._stop.is_set():
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
    compress = tempfile_format.lz4_temp(spill)
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
        if tempfile_format.lz4_temp(self.options.output):  # remote temp files: merge units until reads are large
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


def without_scatter_index(result: dict) -> dict:
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
            with ranged_reader(sc["path"]) as read:
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
