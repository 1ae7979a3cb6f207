"""``gs://`` (Google Cloud Storage): Beam's storage client; the lock by generation preconditions.

Listing, stat and whole reads go through Beam's GCS file system (the base
:class:`stores.base.Store`); a ranged read is one request per range (Beam's
reader would fetch 16 MB from the offset on, whatever was asked).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from stores.base import IO_ATTEMPTS, IO_TIMEOUT_SECONDS, Store

SCHEME = "gs"
#: Beam's file system module of the scheme (loaded by workers only when a path uses it).
BEAM_MODULE = "apache_beam.io.gcp.gcsfilesystem"


def parse_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs://bucket/name URL: {url!r}")
    bucket, _, name = url[len("gs://"):].partition("/")
    return bucket, name


_CLIENTS: dict[str | None, Any] = {}
_CLIENTS_LOCK = threading.Lock()


def beam_client(path: str) -> Any:
    """Beam's storage client for ``path``, one per process and endpoint (making one takes
    a credential lookup; ``STORAGE_EMULATOR_HOST`` is the endpoint of the test emulator)."""
    from apache_beam.io.filesystems import FileSystems

    key = os.environ.get("STORAGE_EMULATOR_HOST")
    with _CLIENTS_LOCK:
        if key not in _CLIENTS:
            gcsio = getattr(FileSystems.get_filesystem(path), "_gcsIO", None)
            _CLIENTS[key] = gcsio().client if gcsio is not None else None
        return _CLIENTS[key]


class GcsLock:
    """A lock object on GCS, every change conditional on the object's generation."""

    conditional = True
    atomic_create = True

    def __init__(self, path: str, client: Any):
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket, name = parse_gs_url(path)
        self.blob = client.bucket(bucket).blob(name)
        self.io: dict[str, Any] = {"timeout": IO_TIMEOUT_SECONDS}
        self.retry = DEFAULT_RETRY.with_deadline(IO_TIMEOUT_SECONDS * IO_ATTEMPTS)

    def create(self, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self.blob.upload_from_string(data, content_type="application/json", if_generation_match=0,
                                         retry=self.retry, **self.io)
        except PreconditionFailed:
            return False
        return True

    def created_state(self, data: bytes) -> Any:
        return self.blob.generation

    def read(self) -> tuple[bytes, Any, float] | None:
        from google.api_core.exceptions import NotFound

        try:
            blob = self.blob.bucket.get_blob(self.blob.name, retry=self.retry, **self.io)
            if blob is None:
                return None
            # The generation before the download: a download resets the blob's properties from its
            # response headers, which a store (or emulator) may leave out.
            generation, updated = blob.generation, blob.updated
            data = blob.download_as_bytes(if_generation_match=generation, retry=self.retry, **self.io)
        except NotFound:
            return None
        return data, generation, updated.timestamp() if updated else time.time()

    def replace(self, data: bytes, held: Any) -> Any:
        self.blob.upload_from_string(data, content_type="application/json", if_generation_match=held,
                                     retry=self.retry, **self.io)
        return self.blob.generation

    def remove_if(self, state: Any) -> bool:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self.blob.delete(if_generation_match=state, retry=self.retry, **self.io)
        except NotFound:
            return True
        except PreconditionFailed:
            return False
        return True


class GcsStore(Store):
    """``gs://bucket/name``."""

    scheme = SCHEME
    name = "GCS"

    def parse(self, url: str) -> tuple[str, str]:
        """``(bucket, object name)``."""
        return parse_gs_url(url)

    @contextlib.contextmanager
    def ranged_reader(self, url: str) -> Iterator[Callable[[int, int], bytes]]:
        """One request per ``read(offset, size)`` (Beam's reader as the fallback when it has no client)."""
        client = beam_client(url)
        if client is None:
            with super().ranged_reader(url) as read:
                yield read
            return
        bucket, name = parse_gs_url(url)
        blob = client.bucket(bucket).blob(name)
        yield lambda offset, size: blob.download_as_bytes(start=offset, end=offset + size - 1,
                                                          raw_download=True, checksum=None)

    def lock_object(self, path: str, client: Any = None) -> GcsLock:
        """The lock object at ``path``; ``client``: a ``google.cloud.storage`` client, else a new one of Beam's."""
        if client is None:
            from apache_beam.io.gcp.gcsio import create_storage_client
            from apache_beam.options.pipeline_options import PipelineOptions

            client = create_storage_client(PipelineOptions([]))
        return GcsLock(path, client)


STORE = GcsStore()
