"""JSON as a source format: JSON Lines, a top-level array of records, or one
document holding them (``--json-records-path``), gzip-compressed or not. The
reader is ``convert.formats.jsonl``.

JSON has no magic bytes: it is the format a file no other format claims is
read as (the registry's fallback).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO

from convert.formats.base import BatchOptions, SourceFormat
from convert.formats.jsonl import iter_json
from convert.source_types import RecordBatch

__all__ = ["JSON", "JsonFormat"]


class JsonFormat(SourceFormat):
    """JSON Lines, arrays and documents; ``.gz`` files are gzip-compressed JSON."""

    name = "json"
    suffixes = (".json", ".jsonl", ".ndjson", ".gz")

    def detect(self, path: str, head: bytes) -> bool:
        return False  # no magic bytes: the registry's fallback

    def read_schema(self, f: IO[bytes], path: str) -> None:
        return None  # JSON has none: infer and the checks sample records

    def splittable(self, path: str, head: bytes, options: BatchOptions) -> bool:
        """JSON Lines split at lines; an array or a document named by
        ``json_records_path`` is read whole."""
        if options.json_records_path:
            return False
        stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        return not stripped.startswith(b"[")

    def iter_batches(self, f: IO[bytes], path: str, start: int, end: int | None,
                     options: BatchOptions) -> Iterator[RecordBatch]:
        return iter_json(f, path, start, end, options.batch_size, options.json_records_path, options.max_record_bytes)

    def error_position(self, index: int) -> dict[str, int]:
        """A line's 1-based number, or a record's position in an array; none for a whole document's record 0."""
        return {"line": index} if index else {}


JSON = JsonFormat()
