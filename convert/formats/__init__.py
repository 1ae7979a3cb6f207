"""Input formats: one interface (``SourceFormat``), one module per format and
one registry table (``_REGISTRY``).

A format detects its files (magic bytes; its ``suffixes`` when no magic
matches), reads their record schema in Avro's record model (what ``infer``
and the config checks read types from), says whether byte ranges of a file
may go to different workers and which unit a range owns, and reads the
records of a range in batches. The rest of recordprep goes through
``format_of`` and ``get`` and never asks for a format by name; the entry
points a run and the commands call are ``convert.sources``'.

Adding a format: its module here (a ``SourceFormat`` subclass and its
instance), one line in ``_REGISTRY``, its cases in
``tests/test_convert_formats.py``.
"""

from __future__ import annotations

from convert.formats.avro import AVRO
from convert.formats.base import BatchOptions, SourceFormat
from convert.formats.json import JSON
from convert.formats.parquet import PARQUET

__all__ = ["BatchOptions", "SourceFormat", "format_of", "get", "names", "suffixes"]

#: Every input format, in the order detection asks them (by magic bytes, then by
#: name). The first whose magic bytes match a file's head reads it.
_REGISTRY: tuple[SourceFormat, ...] = (
    AVRO,
    PARQUET,
    JSON,
)
#: What a file no format claims is read as: JSON has no magic bytes and no fixed name.
_FALLBACK: SourceFormat = JSON

_BY_NAME = {f.name: f for f in _REGISTRY}


def format_of(path: str, head: bytes) -> SourceFormat:
    """The format of the file at ``path`` whose first bytes are ``head``: by
    its magic bytes, else by its name (so that the format's reader reports a
    damaged file as one of its own), else the fallback, JSON."""
    for fmt in _REGISTRY:
        if fmt.detect(path, head):
            return fmt
    lower = path.lower()
    for fmt in _REGISTRY:
        if lower.endswith(fmt.suffixes):
            return fmt
    return _FALLBACK


def get(name: str) -> SourceFormat:
    """The registered format called ``name`` (``RecordBatch.kind``); ``KeyError`` for another name."""
    return _BY_NAME[name]


def names() -> tuple[str, ...]:
    """The registered formats' names, in detection order."""
    return tuple(_BY_NAME)


def suffixes() -> tuple[str, ...]:
    """Every registered format's file name suffixes (lower case): input discovery keeps the files ending in one."""
    return tuple(s for fmt in _REGISTRY for s in fmt.suffixes)
