"""Literal paths on Beam's file systems.

``FileSystems.match`` treats ``*``, ``?`` and ``[`` anywhere in a path as
glob characters, so an output directory named ``out[1]`` would match
``out1`` (or nothing). The converter's own paths are never patterns: these
helpers take them literally and glob only the file-name pattern given
apart. Listing and ranged reads are the stores' (:mod:`stores`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable

from apache_beam.io.filesystems import FileSystems

from convert.spec import METADATA_FILENAME, DatasetInfo
from stores import escape_glob, store_for


def match_in(root: str, pattern: str) -> list[str]:
    """Paths of the files under the directory ``root`` (literal) that match ``pattern``
    (``stores.Store.list``: ``pattern`` may glob; a missing ``root`` matches nothing)."""
    return store_for(root).list(root, pattern)


def delete(paths: list[str]) -> None:
    """Delete files (directories recursively) at these literal paths.

    Beam's local and GCS ``delete`` match each path as a pattern first:
    ``out[1]/x`` would delete ``out1/x``. A missing path raises
    (``FileNotFoundError`` locally, ``BeamIOError`` elsewhere), as Beam does.
    """
    for path in paths:
        if "://" in path:
            FileSystems.delete([escape_glob(path) if path.startswith("gs://") and not path.endswith("/") else path])
        elif os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def size_of(path: str) -> int:
    """Bytes of the file at ``path`` (literal, never globbed)."""
    return int(FileSystems.get_filesystem(path).metadata(path).size_in_bytes)


def ranged_reader(path: str) -> contextlib.AbstractContextManager[Callable[[int, int], bytes]]:
    """``read(offset, size)`` of the file at ``path`` (``stores.Store.ranged_reader``: one request
    per call on gs://, a seek and a read of an open file elsewhere)."""
    return store_for(path).ranged_reader(path)


__all__ = ["delete", "escape_glob", "match_in", "ranged_reader", "size_of"]


def read_file(path: str) -> bytes | None:
    """The whole file at ``path`` (literal), or None when it does not exist.

    Through Beam's file systems, which need no TensorFlow (conversion hosts
    lack it); other errors (unreachable storage, a directory) are raised.
    Read no further than one byte past its size: a device in its place (a
    symlink to ``/dev/zero``, size 0) never ends, and the byte past makes the
    caller's parse or digest fail instead.
    """
    if not FileSystems.exists(path):
        return None
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read(size_of(path) + 1)
    except FileNotFoundError:  # removed between the two calls
        return None


def read_metadata(output: str) -> DatasetInfo | None:
    """The validated metadata of the output directory ``output``, None when it has none.

    Raises SpecError when the file is not valid recordprep metadata, OSError
    when it cannot be read.
    """
    path = FileSystems.join(output, METADATA_FILENAME)
    data = read_file(path)
    return None if data is None else DatasetInfo.loads(data, source=path)
