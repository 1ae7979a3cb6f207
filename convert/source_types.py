"""What every input reader shares: the caps on hostile input, ``InputFileError``
and the ``RecordBatch`` the readers yield, with the helpers that word their
messages.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from convert.column_records import ColumnRecords

GZIP_MAGIC = b"\x1f\x8b"
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
MAX_QUOTED_CHARS = 500
#: Decompressed bytes per call when measuring an Avro block's size: what the
#: check holds in memory at once.
CHECK_CHUNK_BYTES = 1 << 20
#: deflate expands at most ~1032:1, so blocks up to cap / 1032 bytes need no check.
DEFLATE_MAX_RATIO = 1032


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


def mb(nbytes: int) -> str:
    """A byte cap as the ``--max-*-mb`` options spell it (MB of 2**20 bytes)."""
    return f"{nbytes / 2**20:g} MB"


def quoted(e: BaseException) -> str:
    """``Type: message`` of an exception, cut to a bounded length (messages of
    parsers and decoders may quote input)."""
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= MAX_QUOTED_CHARS else text[:MAX_QUOTED_CHARS] + "... [cut]"


def excerpt(raw: bytes, total: int | None = None) -> str:
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
    JSON Lines its 1-based line number in the file (whichever byte range
    read it), or its position in a JSON array.
    ``bad`` lists records that could not even be parsed (malformed JSON) as
    ``(offset, index, reason, raw_text)``; they never reach ``records``.
    ``records`` is a ``ColumnRecords`` when the Avro fast path decoded the
    batch: the same values, held as columns.
    """

    path: str
    kind: str  # the format's name (convert.formats): what ``indexes`` count in
    records: list[Any] | ColumnRecords
    offsets: list[int]
    indexes: list[int]
    bad: list[tuple[int, int, str, str]] = dataclasses.field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)
