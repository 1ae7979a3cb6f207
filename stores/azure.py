"""Azure Blob Storage for recordprep: ``azfs://`` URLs, the client from the standard credentials,
the staging client of the readers (:mod:`stores.staging`) and the lock by conditional requests.

The scheme is Beam's own, ``azfs://<account>/<container>/<blob path>``, so a path
a user writes is the path Beam lists, reads and writes, with no translation
between the conversion and the readers. ``az://`` (tensorflow-io's spelling)
and ``abfs://`` (Hadoop's) are refused with a message naming the ``azfs://``
form.

Credentials, the way the Azure SDK reads them (recordprep never reads a secret
itself, stores one in a file or logs one):

* ``AZURE_STORAGE_CONNECTION_STRING``: an account key or a SAS token, and the
  endpoint (``BlobEndpoint=`` for Azurite or a sovereign cloud);
* otherwise ``DefaultAzureCredential`` (``AZURE_CLIENT_ID`` /
  ``AZURE_TENANT_ID`` / ``AZURE_CLIENT_SECRET``, workload or managed identity,
  ``az login``) against ``https://<account>.blob.core.windows.net``.

Beam's client serves one account (the connection string's or the endpoint's)
whatever account a path names, so :func:`check_account` refuses a path of
another account before anything is read or written.

TensorFlow 2.21 has no Azure file system (``tensorflow-io`` had one; the
readers never need it): shards are copied to local disk like ``hdfs://`` and
``s3://`` ones, each in parallel ranged GETs of the Azure SDK.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stores.base import (
    IO_ATTEMPTS,
    IO_TIMEOUT_SECONDS,
    ShardNotFoundError,
    StagedStore,
    StagingError,
)

SCHEME = "azfs"
#: Beam's file system module of the scheme (loaded by workers only when a path uses it).
BEAM_MODULE = "apache_beam.io.azure.blobstoragefilesystem"
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"  # the Azure SDK's and Beam's name
_URL = re.compile(r"^azfs://([a-z0-9]{3,24})/([a-z0-9](?:[a-z0-9]|-(?!-)){1,61}[a-z0-9])(?:/(.*))?$")
OTHER_SCHEMES = ("az", "abfs", "abfss", "wasb", "wasbs")


def is_azure(path: str) -> bool:
    return str(path).lower().startswith(f"{SCHEME}://")


def parse_azfs_url(url: str) -> tuple[str, str, str]:
    """``azfs://account/container/a/b`` -> ``("account", "container", "a/b")``."""
    match = _URL.match(url)
    if match is None:
        raise ValueError(
            f"{url!r} is not an Azure Blob Storage path: write azfs://<account>/<container>/<path> "
            f"(account: 3-24 lowercase letters or digits; container: 3-63 lowercase letters, digits, "
            f"single hyphens)"
        )
    return match.group(1), match.group(2), match.group(3) or ""


def other_scheme_hint(path: str) -> str | None:
    """For ``az://``, ``abfs://``, ``wasb://`` paths: what to write instead; else None."""
    scheme = str(path).split("://", 1)[0].lower() if "://" in str(path) else ""
    if scheme not in OTHER_SCHEMES:
        return None
    return (f"{path}: recordprep reads Azure Blob Storage as azfs://<account>/<container>/<path> "
            f"(Apache Beam's scheme), not {scheme}://; see docs/remote-storage.md#azure")


def _connection_account(conn: str) -> str | None:
    parts = dict(p.split("=", 1) for p in conn.split(";") if "=" in p)
    return parts.get("AccountName")


class AzureAccountError(ValueError):
    """An ``azfs://`` path names another account than the client's (its connection string)."""


def check_account(account: str, connection_string: str | None = None) -> None:
    """Raise :class:`AzureAccountError` when the connection string is for another account than ``account``."""
    conn = connection_string if connection_string is not None else os.environ.get(CONNECTION_STRING_ENV, "")
    named = _connection_account(conn) if conn else None
    if named and named != account:
        raise AzureAccountError(
            f"azfs://{account}/...: the connection string ({CONNECTION_STRING_ENV} or --azure_connection_string) "
            f"is for the account {named!r}, and Azure's client serves only that account; use its "
            f"connection string, or a path on azfs://{named}/"
        )


def account_url(account: str) -> str:
    return f"https://{account}.blob.core.windows.net"


def service_client(account: str) -> Any:
    """A ``BlobServiceClient`` for ``account`` from the standard credentials (module docstring)."""
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError as e:
        raise StagingError(
            "reading azfs:// needs azure-storage-blob and azure-identity (installed with recordprep's "
            "dependencies, apache-beam[azure]), or copy the output to local disk first"
        ) from e
    from azure.storage.blob import ExponentialRetry

    # The SDK's default retries (15 s, then x3) keep an unreachable store silent for 80 s; these
    # wait 1, 3, 5, 9 s (plus jitter) before the error names what to check.
    kwargs = {"max_single_get_size": 16 << 20, "max_chunk_get_size": 16 << 20, "connection_timeout": 20,
              "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=4)}
    conn = os.environ.get(CONNECTION_STRING_ENV, "")
    if conn:
        check_account(account, conn)
        return BlobServiceClient.from_connection_string(conn, **kwargs)
    from azure.identity import DefaultAzureCredential

    return BlobServiceClient(account_url(account), credential=DefaultAzureCredential(), **kwargs)


class AzureClient:
    """stat / read / download of blobs (the :class:`stores.base.StagingClient` protocol), one account."""

    store = "Azure Blob Storage"

    def __init__(self, account: str) -> None:
        self.account = account
        self._service = service_client(account)
        how = "connection string" if os.environ.get(CONNECTION_STRING_ENV) else "DefaultAzureCredential"
        # The URL only: a SAS token in the query would be a secret.
        self.description = f"azure-storage-blob ({self._service.primary_endpoint.split('?')[0]}, {how})"

    def _blob(self, url: str) -> Any:
        account, container, blob = parse_azfs_url(url)
        if account != self.account:
            raise StagingError(f"{url}: the staging client is for the account {self.account!r}")
        return self._service.get_blob_client(container, blob)

    def _fail(self, op: str, url: str, e: Exception) -> StagingError:
        return StagingError(
            f"Azure {op} {url} failed ({type(e).__name__}: {getattr(e, 'reason', None) or str(e)[:300]}). "
            f"Check {CONNECTION_STRING_ENV} (or the identity DefaultAzureCredential finds: AZURE_CLIENT_ID/"
            f"AZURE_TENANT_ID/AZURE_CLIENT_SECRET, managed identity, az login) and that the account and "
            f"container exist; or copy the output to local disk first."
        )

    def _call(self, op: str, url: str, fn: Callable[[Any], Any], missing: Callable[[Exception], Any]) -> Any:
        """``fn(blob client of url)``; a missing blob goes to ``missing``, any other failure is a StagingError."""
        from azure.core.exceptions import ResourceNotFoundError

        blob = self._blob(url)
        try:
            return fn(blob)
        except ResourceNotFoundError as e:
            return missing(e)
        except Exception as e:
            raise self._fail(op, url, e) from e

    def stat(self, url: str) -> tuple[int, float | None] | None:
        props = self._call("HEAD", url, lambda b: b.get_blob_properties(), lambda e: None)
        return None if props is None else (int(props.size), props.last_modified.timestamp())

    def read(self, url: str) -> bytes | None:
        return self._call("GET", url, lambda b: b.download_blob().readall(), lambda e: None)

    def download(self, url: str, dest: Path) -> int:
        def missing(e: Exception) -> None:
            raise ShardNotFoundError(f"{url} does not exist on Azure Blob Storage") from e

        def copy(blob: Any) -> None:
            with open(dest, "wb") as out:
                blob.download_blob(max_concurrency=4).readinto(out)

        self._call("GET", url, copy, missing)
        return dest.stat().st_size


class AzureLock:
    """A lock blob on Azure Blob Storage, every change conditional on the blob's ETag.

    The client is Beam's (``--azure_connection_string``, else
    ``$AZURE_STORAGE_CONNECTION_STRING``, else ``--blob_service_endpoint`` with
    ``DefaultAzureCredential``), so the lock talks to the same account as the job.
    A lease would also exclude other writers, but its holder must renew it at
    most every 60 s and a dead holder's lease blocks every other run until it
    expires; the ETag conditions need no renewal and leave the judgement of a
    dead run to the heartbeat, as on the other stores.
    """

    conditional = True
    atomic_create = True

    def __init__(self, path: str, client: Any = None):
        _, container, name = parse_azfs_url(path)
        self.blob = (client or beam_client()).get_blob_client(container, name)
        # azure-core reads these per request: bounded connect/read time and retries.
        self.io = {"connection_timeout": IO_TIMEOUT_SECONDS, "read_timeout": IO_TIMEOUT_SECONDS,
                   "retry_total": IO_ATTEMPTS - 1}

    def create(self, data: bytes) -> bool:
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError
        from azure.storage.blob import ContentSettings

        try:  # overwrite=False sends If-None-Match: *
            resp = self.blob.upload_blob(data, overwrite=False,
                                         content_settings=ContentSettings(content_type="application/json"), **self.io)
        except (ResourceExistsError, ResourceModifiedError):  # 409 BlobAlreadyExists, or 412 from a proxy
            return False
        self.etag = resp["etag"]
        return True

    def created_state(self, data: bytes) -> Any:
        return self.etag

    def read(self) -> tuple[bytes, Any, float] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            stream = self.blob.download_blob(**self.io)
            data = stream.readall()
        except ResourceNotFoundError:
            return None
        return data, stream.properties.etag, stream.properties.last_modified.timestamp()

    def replace(self, data: bytes, held: Any) -> Any:
        from azure.core import MatchConditions
        from azure.storage.blob import ContentSettings

        resp = self.blob.upload_blob(data, overwrite=True, etag=held, match_condition=MatchConditions.IfNotModified,
                                     content_settings=ContentSettings(content_type="application/json"), **self.io)
        return resp["etag"]

    def remove_if(self, state: Any) -> bool:
        from azure.core import MatchConditions
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            self.blob.delete_blob(etag=state, match_condition=MatchConditions.IfNotModified, **self.io)
        except ResourceNotFoundError:
            return True
        except ResourceModifiedError:
            return False
        return True


def beam_client() -> Any:
    """Beam's Azure client, from the options the job set on ``FileSystems`` (or none)."""
    from apache_beam.io.azure.blobstorageio import BlobStorageIO
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    # The options the job set on FileSystems (pipelines.remote.pipeline_options), if any.
    options = getattr(FileSystems, "_pipeline_options", None) or PipelineOptions([])
    return BlobStorageIO(pipeline_options=options).client


class AzureStore(StagedStore):
    """``azfs://<account>/<container>/<blob>``: staged for the readers
    (``$RECORDPREP_AZURE_CACHE``, ``<account>/<container>/<blob>``)."""

    scheme = SCHEME
    name = "Azure Blob Storage"
    cache_name = "azure"
    cache_env = "RECORDPREP_AZURE_CACHE"
    reach_hint = "for azfs://, AZURE_STORAGE_CONNECTION_STRING or the identity DefaultAzureCredential finds"

    def parse(self, url: str) -> tuple[str, str, str]:
        """``(account, container, blob)``."""
        return parse_azfs_url(url)

    def other_scheme_hint(self, url: str) -> str | None:
        return other_scheme_hint(url)

    def lock_object(self, path: str, client: Any = None) -> AzureLock:
        return AzureLock(path, client)

    def client_key(self, url: str) -> tuple[Any, ...]:
        return ("azfs", hash(os.environ.get(CONNECTION_STRING_ENV, "")), parse_azfs_url(url)[0])

    def client_label(self, url: str) -> str:
        return f"azfs://{parse_azfs_url(url)[0]}"

    def staging_client(self, url: str) -> AzureClient:
        return AzureClient(parse_azfs_url(url)[0])

    def local_path(self, url: str, cache_root: Path) -> Path:
        account, container, blob = parse_azfs_url(url)
        return cache_root / account / container / posixpath.normpath("/" + blob).lstrip("/")


STORE = AzureStore()
