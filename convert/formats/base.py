"""What an input format is to the rest of recordprep: ``SourceFormat``, the
hooks each format module implements, and ``BatchOptions``, what a read asks
of any format.

The registry (``convert.formats``) holds one instance of each format; nothing
outside this package asks which format a file is by name.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Collection, Iterator
from typing import IO, Any

from convert.source_types import DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_RECORD_BYTES, RecordBatch


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """How one read decodes a file, whatever its format; a format uses the
    fields that apply to it. ``ConvertOptions`` (pipelines) validates the
    values a run passes.

    ``record_json``: the Avro and Parquet fast paths also give each record's
    canonical JSON (``ColumnRecords.record_json``), for the whole-record
    split. ``max_record_bytes`` caps a JSON line or document,
    ``max_block_bytes`` an Avro block's decompressed bytes or a Parquet
    batch's decoded ones. ``columns``: the top-level fields to decode where
    the format can leave the others undecoded (Parquet); ``None`` for all.
    """

    batch_size: int = 4096
    json_records_path: str | None = None
    avro_decoder: str = "auto"
    record_json: bool = False
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
    columns: Collection[str] | None = None


class SourceFormat(abc.ABC):
    """One input format: how a file is recognized, its schema, how it splits
    into work units and how its records are read.

    ``name`` is what ``RecordBatch.kind`` holds for the format's batches;
    ``suffixes`` (lower case) are the file names that mean the format: input
    discovery keeps files by them, and detection falls back on them when no
    format's magic bytes match.
    """

    name: str
    suffixes: tuple[str, ...]

    @abc.abstractmethod
    def detect(self, path: str, head: bytes) -> bool:
        """Whether ``head`` (a file's first bytes, four or more when the file
        has them) says the file is in this format: its magic bytes. A name
        alone never claims a file here (see ``suffixes``)."""

    @abc.abstractmethod
    def read_schema(self, f: IO[bytes], path: str) -> dict[str, Any] | None:
        """The file's record schema in Avro's record model (the type mapping
        ``infer`` and the config checks read types from), or ``None`` for a
        format without one. ``f`` is at any position. A file that cannot be
        read raises ``InputFileError`` naming it."""

    @abc.abstractmethod
    def splittable(self, path: str, head: bytes, options: BatchOptions) -> bool:
        """Whether byte ranges of the file may be read by different workers:
        then a range ``[start, end)`` owns every unit of the format (an Avro
        block, a Parquet row group, a JSON line) that starts in it, so no
        record is read twice or lost. An unsplittable file is read whole by
        the range that starts at 0."""

    @abc.abstractmethod
    def iter_batches(self, f: IO[bytes], path: str, start: int, end: int | None,
                     options: BatchOptions) -> Iterator[RecordBatch]:
        """The records of the units starting in ``[start, end)`` (``end``
        ``None``: to the end of the file), in file order. A damaged unit
        raises ``InputFileError`` (file and offset) after the batches of the
        intact units before it."""

    @abc.abstractmethod
    def error_position(self, index: int) -> dict[str, int]:
        """Where a record sits inside its unit, for the error output: the
        key and value ``RecordBatch.indexes[i]`` means for this format."""
