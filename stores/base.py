"""The store interface every scheme module implements, and its generic Beam implementation.

A *store* serves one URL scheme (local paths, ``gs://``, ``s3://``,
``azfs://``, ``hdfs://``). Its callers are ``pipelines`` (listing, ranged
reads, the output lock) and ``readers`` (stat, small reads, staging shards
to local disk, because TensorFlow 2.21 reads none of ``hdfs://``, ``s3://``,
``azfs://``). :class:`Store` is the base: a scheme module subclasses it and
overrides what its storage does better or differently; a scheme without a
module (``memory://``, ``ram://``) gets :class:`Store` itself, Apache Beam's
file system of that scheme behind it.

Nothing here imports Beam or a cloud client at module level: each method
imports what it needs, so ``readers`` (no Beam) and ``recordprep wait`` (no
TensorFlow) import this package freely.
"""

from __future__ import annotations

import contextlib
import re
import time
import urllib.parse
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

#: Seconds one request of the lock may take (connect and read), and how often a
#: failed one is tried again: a store that stops answering fails the lock's
#: calls within seconds, not after a client's default minutes of retries.
IO_TIMEOUT_SECONDS = 10.0
IO_ATTEMPTS = 2

_GLOB_CHAR = re.compile(r"([*?\[])")


class ShardNotFoundError(FileNotFoundError):
    """A shard listed in ``dataset_info.json`` does not exist."""


class StagingError(RuntimeError):
    """Remote shards could not be copied to the local staging directory."""


def escape_glob(path: str) -> str:
    """``path`` as a Beam match pattern that matches only itself (``[`` -> ``[[]``)."""
    return _GLOB_CHAR.sub(r"[\1]", path)


class StagingClient(Protocol):
    """What the readers' staging asks of a store's client (:mod:`stores.staging`)."""

    description: str
    store: str  # "HDFS", "S3": for messages

    def stat(self, url: str) -> tuple[int, float | None] | None:
        """``(length in bytes, modification time in s or None)``, or None if no such file."""

    def read(self, url: str) -> bytes | None:
        """Whole (small) file, or None if it does not exist."""

    def download(self, url: str, dest: Path) -> int:
        """Copy the file to ``dest``; return the bytes written."""


class LockObject(Protocol):
    """One lock file on a store, as :mod:`pipelines.lock` uses it.

    ``read`` gives ``(data, state, modified)``: ``state`` is what a later
    conditional change is conditional on (the bytes, a GCS generation, an
    ETag). ``conditional``: every change is conditional on that state at the
    store (no read-then-write gap). ``atomic_create``: two creators cannot
    both win.
    """

    conditional: bool
    atomic_create: bool

    def create(self, data: bytes) -> bool:
        """Write ``data`` if no lock exists; False if one does."""

    def created_state(self, data: bytes) -> Any:
        """The state of the lock the last successful :meth:`create` wrote."""

    def read(self) -> tuple[bytes, Any, float] | None:
        """``(data, state, modified time)``, or None when there is no lock."""

    def replace(self, data: bytes, held: Any) -> Any:
        """Overwrite the lock whose state is ``held``; return the new state."""

    def remove_if(self, state: Any) -> bool:
        """Remove the lock if it still is ``state``; False if it is another run's."""


class BeamFsLock:
    """A lock file on any Beam file system (HDFS): create-if-absent, not atomic.

    Two runs starting within the same second can both pass the existence
    check; the lock protocol reads the lock back after creating it
    (``atomic_create`` is False) to catch most of those. Each method makes its
    calls through one Beam file system object (``_fs``), which a store's subclass
    may configure (``stores.hdfs.HdfsLock`` bounds its requests in time).
    """

    conditional = False
    atomic_create = False

    def __init__(self, path: str):
        self.path = path

    def _fs(self) -> Any:
        """The Beam file system of ``path`` (a new object per call, as Beam makes them)."""
        from apache_beam.io.filesystems import FileSystems

        return FileSystems.get_filesystem(self.path)

    def _store_failed(self, e: BaseException) -> bool:
        """Whether ``e`` is the store failing to answer (re-raised), not the lock file vanishing
        or a delete refused (taken as no lock, and as done): none here."""
        return False

    def create(self, data: bytes) -> bool:
        fs = self._fs()
        if fs.exists(self.path):
            return False
        with fs.create(self.path, mime_type="application/json", compression_type="uncompressed") as f:
            f.write(data)
        return True

    def created_state(self, data: bytes) -> Any:
        return data

    def read(self) -> tuple[bytes, Any, float] | None:
        fs = self._fs()
        try:
            if not fs.exists(self.path):
                return None
            meta = fs.metadata(self.path)  # literal: never globbed
            with fs.open(self.path, compression_type="uncompressed") as f:
                data = f.read()
        except Exception as e:  # noqa: BLE001 - vanished between listing and reading
            if self._store_failed(e):
                raise
            return None
        return data, data, float(meta.last_updated_in_seconds or time.time())

    def replace(self, data: bytes, held: Any) -> Any:
        """Delete, then create: Beam's HDFS ``create`` refuses an existing path ("Path already exists")
        and HDFS's rename an existing target. Not atomic (best effort, as on create): a run creating the
        lock in between makes this create fail, and the caller then finds the lock is not its own."""
        fs = self._fs()
        if fs.exists(self.path):
            fs.delete([self.path])
        with fs.create(self.path, mime_type="application/json", compression_type="uncompressed") as f:
            f.write(data)
        return data

    def remove_if(self, state: Any) -> bool:
        current = self.read()
        if current is not None and current[1] != state:
            return False
        try:
            self._fs().delete([self.path])
        except Exception as e:  # noqa: BLE001 - already gone, or refused: the lock goes stale
            if self._store_failed(e):
                raise
        return True


class Store:
    """One URL scheme's storage; this base serves it through Apache Beam's file system of the scheme.

    Subclasses (one module per scheme, registered in :data:`stores.REGISTRY`)
    override what their storage needs. ``staged``: the readers copy its
    shards to local disk first (``cache_name`` names the cache directory,
    ``$<cache_env>`` and ``ReadOptions.<cache_name>_cache_dir`` choose it).
    ``reach_hint``: what to check when the store cannot be read.
    """

    scheme = ""
    name = "the store"
    staged = False
    cache_name = ""
    cache_env = ""
    reach_hint = ""

    def __init__(self, scheme: str = "") -> None:
        if scheme:
            self.scheme = scheme

    # ------------------------------------------------------------ URLs

    def parse(self, url: str) -> tuple[Any, ...]:
        """The parts of ``url`` that name a place on this store: ``(host or bucket, path)`` here."""
        parsed = urllib.parse.urlparse(url)
        return parsed.netloc, parsed.path

    def other_scheme_hint(self, url: str) -> str | None:
        """For a URL spelled in another tool's scheme for this storage (``az://``): what to write instead."""
        return None

    # ------------------------------------------------------------ reading

    def stat(self, url: str) -> tuple[int, float | None] | None:
        """``(size in bytes, modification time in s or None)`` of the file at ``url`` (literal), or None."""
        from apache_beam.io.filesystems import FileSystems

        if not FileSystems.exists(url):
            return None
        meta = FileSystems.get_filesystem(url).metadata(url)
        return int(meta.size_in_bytes), (float(meta.last_updated_in_seconds) or None)

    def read(self, url: str) -> bytes | None:
        """The whole (small) file at ``url``, or None when it does not exist."""
        from apache_beam.io.filesystems import FileSystems

        if not FileSystems.exists(url):
            return None
        try:
            with FileSystems.open(url, compression_type="uncompressed") as f:
                return f.read()
        except FileNotFoundError:  # removed between the two calls
            return None

    def list(self, root: str, pattern: str) -> list[str]:
        """Paths of the files under the directory ``root`` (literal) that match ``pattern``.

        ``pattern`` is relative to ``root`` and may glob (``train-*``,
        ``errors/errors-*.jsonl``, ``**`` on object stores). A missing
        ``root`` matches nothing.
        """
        from apache_beam.io.filesystems import FileSystems

        with warnings.catch_warnings():  # re warns about the nested set '[[]'
            warnings.simplefilter("ignore", FutureWarning)
            return [m.path for m in FileSystems.match([f"{escape_glob(root.rstrip('/'))}/{pattern}"])[0].metadata_list]

    @contextlib.contextmanager
    def ranged_reader(self, url: str) -> Iterator[Callable[[int, int], bytes]]:
        """``read(offset, size)`` of the file at ``url``: here a seek and a read of one open file."""
        from apache_beam.io.filesystems import FileSystems

        with FileSystems.open(url, compression_type="uncompressed") as f:
            def read_fs(offset: int, size: int) -> bytes:
                f.seek(offset)
                return f.read(size)
            yield read_fs

    # ------------------------------------------------------------ the lock

    def lock_object(self, path: str, client: Any = None) -> LockObject:
        """The lock file at ``path`` (``client``: a storage client to use, where the store takes one)."""
        return BeamFsLock(path)

    # ------------------------------------------------------------ staging for readers

    def client_key(self, url: str) -> tuple[Any, ...]:
        """What one cached staging client serves (:func:`stores.staging.client_for`)."""
        return (self.scheme,)

    def client_label(self, url: str) -> str:
        """How the log names what a staging client serves."""
        return f"{self.scheme}://"

    def staging_client(self, url: str) -> StagingClient:
        """A new staging client for ``url`` (callers cache it by :meth:`client_key`)."""
        raise StagingError(f"{url}: {self.scheme}:// is read directly, not staged")

    def local_path(self, url: str, cache_root: Path) -> Path:
        """Where ``url`` is mirrored under ``cache_root``; ``..`` in the URL cannot climb out of it."""
        raise StagingError(f"{url}: {self.scheme}:// is read directly, not staged")


class StagedStore(Store):
    """A store the readers stage (``staged``): stat and whole reads go through its staging client
    (``stores.staging.client_for``), which knows its URLs and credentials."""

    staged = True

    def stat(self, url: str) -> tuple[int, float | None] | None:
        from stores.staging import client_for

        return client_for(url).stat(url)

    def read(self, url: str) -> bytes | None:
        from stores.staging import client_for

        return client_for(url).read(url)
