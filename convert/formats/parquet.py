"""Parquet as a source format: detected by its magic ``PAR1``, its schema
mapped to Avro's record model, row groups as the units of byte ranges.

The reader (``convert.formats.parquet_reader``) needs pyarrow, which a
conversion that reads no Parquet never imports: this module only names the
format, and imports the reader when a Parquet file is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import IO, Any

from convert.formats.base import BatchOptions, SourceFormat
from convert.source_types import RecordBatch

__all__ = ["PARQUET", "PARQUET_MAGIC", "ParquetFormat"]

#: The first (and last) bytes of a Parquet file.
PARQUET_MAGIC = b"PAR1"


class ParquetFormat(SourceFormat):
    """Parquet files (not encrypted: those are refused before pyarrow parses them)."""

    name = "parquet"
    suffixes = (".parquet",)

    def detect(self, path: str, head: bytes) -> bool:
        return head.startswith(PARQUET_MAGIC)  # no JSON text starts with "P"

    def read_schema(self, f: IO[bytes], path: str) -> dict[str, Any]:
        """The Avro-equivalent schema of its Arrow schema (``convert.formats.parquet_types``)."""
        # pyarrow, imported only where Parquet is read
        from convert.formats.parquet_reader import read_parquet_schema

        f.seek(0)
        return read_parquet_schema(f, path)

    def splittable(self, path: str, head: bytes, options: BatchOptions) -> bool:
        return True  # at row groups: a range owns those whose first page starts in it

    def iter_batches(self, f: IO[bytes], path: str, start: int, end: int | None,
                     options: BatchOptions) -> Iterator[RecordBatch]:
        # pyarrow, imported only where Parquet is read
        from convert.formats.parquet_reader import iter_parquet

        return iter_parquet(f, path, start, end, options.batch_size, options.avro_decoder, options.record_json,
                            options.max_block_bytes, options.columns)

    def error_position(self, index: int) -> dict[str, int]:
        return {"row_in_row_group": index}  # the byte offset is the row group's


PARQUET = ParquetFormat()
