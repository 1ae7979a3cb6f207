"""Literal paths on Beam's file systems.

``FileSystems.match`` treats ``*``, ``?`` and ``[`` anywhere in a path as
glob characters, so an output directory named ``out[1]`` would match
``out1`` (or nothing). The converter's own paths are never patterns: these
helpers take them literally and glob only the file-name pattern given
apart. ``ranged_reader`` reads byte ranges in one request each on gs://.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from apache_beam.io.filesystems import FileSystems

from convert.spec import METADATA_FILENAME, DatasetInfo

_GLOB_CHAR = re.compile(r"([*?\[])")


def escape_glob(path: str) -> str:
    """``path`` as a Beam match pattern that matches only itself (``[`` -> ``[[]``)."""
    return _GLOB_CHAR.sub(r"[\1]", path)


def match_in(root: str, pattern: str) -> list[str]:
    """Paths of the files under the directory ``root`` (literal) that match ``pattern``.

    ``pattern`` is relative to ``root`` and may glob (``train-*``,
    ``errors/errors-*.jsonl``, ``**`` on object stores). A missing ``root``
    matches nothing.
    """
    if "://" not in root:
        return sorted(p for p in glob.glob(os.path.join(glob.escape(root), pattern)) if os.path.isfile(p))
    with warnings.catch_warnings():  # re warns about the nested set '[[]'
        warnings.simplefilter("ignore", FutureWarning)
        return [m.path for m in FileSystems.match([f"{escape_glob(root.rstrip('/'))}/{pattern}"])[0].metadata_list]


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


_GCS_CLIENTS: dict[str | None, Any] = {}
_GCS_LOCK = threading.Lock()


def _gcs_client(path: str) -> Any:
    """Beam's storage client for ``path``, one per process and endpoint (making one takes
    a credential lookup; ``STORAGE_EMULATOR_HOST`` is the endpoint of the test emulator)."""
    key = os.environ.get("STORAGE_EMULATOR_HOST")
    with _GCS_LOCK:
        if key not in _GCS_CLIENTS:
            gcsio = getattr(FileSystems.get_filesystem(path), "_gcsIO", None)
            _GCS_CLIENTS[key] = gcsio().client if gcsio is not None else None
        return _GCS_CLIENTS[key]


@contextlib.contextmanager
def ranged_reader(path: str) -> Iterator[Callable[[int, int], bytes]]:
    """``read(offset, size)``: one request per call on gs:// (Beam's reader would fetch 16 MB
    from ``offset`` on, whatever was asked), a seek and a read of an open file elsewhere."""
    client = _gcs_client(path) if path.startswith("gs://") else None
    if client is not None:
        bucket, name = path[len("gs://"):].split("/", 1)
        blob = client.bucket(bucket).blob(name)
        yield lambda offset, size: blob.download_as_bytes(start=offset, end=offset + size - 1,
                                                          raw_download=True, checksum=None)
        return
    with FileSystems.open(path, compression_type="uncompressed") as f:
        def read_fs(offset: int, size: int) -> bytes:
            f.seek(offset)
            return f.read(size)
        yield read_fs


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
