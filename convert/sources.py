"""Reading AVRO and JSON input into batches of records.

Functions here take an already-open *binary* file object (the pipeline opens
files through Beam's filesystems, so local, ``gs://`` and ``hdfs://`` work the
same) and a byte range, and yield ``RecordBatch``es. Working on batches is what
lets the rest of the job use numpy instead of per-record Python.

Byte ranges follow Beam's ``avroio``/``textio`` convention: a range
``[start, end)`` owns every Avro block (JSON line) that *starts* in it, so
ranges of one file can be read by different workers with no record read twice
or lost.

Avro logical types are read from their raw integers/bytes (the reader schema is
the writer schema with ``logicalType`` removed): real files hold timestamps in
year 0 or 10000 and ``time-millis`` of 24:00, which crash ``datetime``
conversion.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections.abc import Iterator
from typing import IO, Any

import fastavro
import orjson

AVRO_MAGIC = b"Obj\x01"
GZIP_MAGIC = b"\x1f\x8b"
_SYNC_SIZE = 16
#: Avro blocks claiming more than this are rejected before allocation (guards
#: against corrupt headers asking for gigabytes).
MAX_AVRO_BLOCK_BYTES = 256 * 1024 * 1024


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


@dataclasses.dataclass
class RecordBatch:
    """Records plus where each came from.

    ``offsets[i]`` is the byte offset of the Avro block (or JSON line) holding
    record ``i``; ``indexes[i]`` is its position in that Avro block, or for
    JSON its 1-based line number (0 when unknown: a range that starts
    mid-file), or its position in a JSON array.
    ``bad`` lists records that could not even be parsed (malformed JSON) as
    ``(offset, index, reason, raw_text)``; they never reach ``records``.
    """

    path: str
    kind: str  # "avro" | "json"
    records: list[Any]
    offsets: list[int]
    indexes: list[int]
    bad: list[tuple[int, int, str, str]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)


def detect_format(path: str, head: bytes) -> str:
    """``"avro"`` or ``"json"`` from the magic bytes, falling back to the name."""
    if head.startswith(AVRO_MAGIC):
        return "avro"
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


def read_avro_schema(f: IO[bytes], path: str) -> dict[str, Any]:
    """The writer schema of an Avro container file (for ``infer`` and checks)."""
    f.seek(0)
    try:
        return fastavro.reader(f).writer_schema
    except Exception as e:  # fastavro raises many types for bad headers
        raise InputFileError(path, f"not a readable Avro file ({type(e).__name__}: {e}); check the file is an Avro object container", 0) from e


def iter_avro(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
              batch_size: int = 4096) -> Iterator[RecordBatch]:
    """Yield batches of records from Avro blocks starting in ``[start, end)``."""
    f.seek(0)
    try:
        blocks = fastavro.block_reader(f)
        header_schema = blocks.writer_schema
        if _has_logical(header_schema):
            f.seek(0)
            blocks = fastavro.block_reader(f, reader_schema=_strip_logical(header_schema))
        sync = blocks._header["sync"]
    except Exception as e:
        raise InputFileError(
            path, f"cannot read the Avro header ({type(e).__name__}: {e}); is it an Avro object container file?", 0
        ) from e

    header_end = f.tell()
    pos = max(start - _SYNC_SIZE, 0)
    if pos < header_end:
        f.seek(header_end)
    else:
        f.seek(pos)
        if not _advance_past_sync(f, sync):
            return
    next_block = f.tell()
    batch = RecordBatch(path, "avro", [], [], [])
    while end is None or next_block < end:
        try:
            block = next(blocks)
        except StopIteration:
            break
        except Exception as e:
            raise InputFileError(path, f"corrupt Avro block ({type(e).__name__}: {e})", next_block) from e
        if block.size > MAX_AVRO_BLOCK_BYTES:
            raise InputFileError(path, f"Avro block claims {block.size} bytes (limit {MAX_AVRO_BLOCK_BYTES}); the file is corrupt", next_block)
        off = block.offset
        try:
            for i, rec in enumerate(block):
                batch.records.append(rec)
                batch.offsets.append(off)
                batch.indexes.append(i)
        except Exception as e:
            raise InputFileError(path, f"corrupt record {len(batch.records)} in Avro block ({type(e).__name__}: {e})", off) from e
        next_block = block.offset + block.size
        if len(batch.records) >= batch_size:
            yield batch
            batch = RecordBatch(path, "avro", [], [], [])
    if batch.records:
        yield batch


# --------------------------------------------------------------------- JSON


def _loads(line: bytes) -> Any:
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        # orjson rejects integers beyond 64 bits; the stdlib keeps them exact.
        return json.loads(line)


def _records_at(doc: Any, records_path: str | None, path: str) -> list[Any]:
    node = doc
    if records_path:
        for key in records_path.split("."):
            if not isinstance(node, dict) or key not in node:
                found = sorted(node)[:10] if isinstance(node, dict) else type(node).__name__
                raise InputFileError(path, f"--json-records-path {records_path!r}: no key {key!r} (found {found})")
            node = node[key]
    if isinstance(node, dict) and not records_path:
        return [node]
    if not isinstance(node, list):
        raise InputFileError(path, f"expected a JSON array of records, found {type(node).__name__}; pass --json-records-path to name the key holding the records")
    return node


def iter_json(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
              batch_size: int = 4096, records_path: str | None = None) -> Iterator[RecordBatch]:
    """Yield batches from JSON Lines, a JSON array, or records under a key.

    JSON Lines are streamed line by line (ranges align to line starts). A
    whole-document JSON (array, or ``records_path``) is parsed in one piece:
    JSON has no record boundaries to stream on without a second parser, so
    prefer JSON Lines for large inputs.
    """
    f.seek(0)
    head = f.read(2)
    f.seek(0)
    if head == GZIP_MAGIC:
        f = gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[assignment]
        start, end = 0, None
    buffered = f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f)  # type: ignore[arg-type]

    probe = buffered.peek(64 * 1024)[: 64 * 1024] if hasattr(buffered, "peek") else b""
    lead = probe.lstrip(b"\xef\xbb\xbf \t\r\n")
    if records_path or lead.startswith(b"["):
        data = buffered.read()
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        if not data.strip():
            return
        try:
            doc = _loads(data)
        except ValueError as e:
            raise InputFileError(path, f"not valid JSON ({e}); expected JSON Lines or one JSON document") from e
        recs = _records_at(doc, records_path, path)
        for s in range(0, len(recs), batch_size):
            chunk = recs[s:s + batch_size]
            yield RecordBatch(path, "json", chunk, [0] * len(chunk), list(range(s, s + len(chunk))))
        return

    pos = 0
    if start > 0:
        # Own the lines that start in [start, end): skip the partial line.
        buffered.seek(start - 1)
        pos = start - 1
        first = buffered.readline()
        pos += len(first)
    line_no = 0 if start > 0 else 1  # 0: unknown (range starts mid-file)
    batch = RecordBatch(path, "json", [], [], [])
    for line in buffered:
        off = pos
        pos += len(line)
        this_line = line_no
        if line_no:
            line_no += 1
        if end is not None and off >= end:
            break
        if off == 0 and line.startswith(b"\xef\xbb\xbf"):
            line = line[3:]
        text = line.strip()
        if not text:
            continue
        try:
            rec = _loads(text)
        except ValueError as e:
            batch.bad.append((off, this_line, f"malformed JSON: {e}", text.decode("utf-8", "replace")))
            continue
        if not isinstance(rec, dict):
            batch.bad.append((off, this_line, f"expected a JSON object per line, found {type(rec).__name__}", text.decode("utf-8", "replace")))
            continue
        batch.records.append(rec)
        batch.offsets.append(off)
        batch.indexes.append(this_line)
        if len(batch.records) >= batch_size:
            yield batch
            batch = RecordBatch(path, "json", [], [], [])
    if batch.records or batch.bad:
        yield batch


def iter_records(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
                 batch_size: int = 4096, json_records_path: str | None = None) -> Iterator[RecordBatch]:
    """Dispatch on the file's format; see ``iter_avro`` and ``iter_json``."""
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    if detect_format(path, head) == "avro":
        return iter_avro(f, path, start, end, batch_size)
    return iter_json(f, path, start, end, batch_size, json_records_path)
