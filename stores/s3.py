"""``s3://``: URLs, the readers' staging client (boto3), and the lock by S3's conditional writes.

TensorFlow 2.21 has no S3 file system (``tensorflow-io`` had one; the readers
never need it), so ``s3://`` shards are copied to local disk like ``hdfs://``
ones and read from there. boto3 finds the endpoint and credentials the
standard way: ``AWS_ENDPOINT_URL`` (an S3-compatible store), keys in the
environment, a profile (``AWS_PROFILE``, ``~/.aws``) or the instance role;
recordprep never reads or logs them. A shard is downloaded with S3's ranged
GETs in parallel parts (boto3's transfer manager), each shard in its own
thread of the staging pool.
"""

from __future__ import annotations

import os
import posixpath
import urllib.parse
from pathlib import Path
from typing import Any

from stores.base import (
    IO_ATTEMPTS,
    IO_TIMEOUT_SECONDS,
    ShardNotFoundError,
    StagedStore,
    StagingError,
)

SCHEME = "s3"
#: Beam's file system module of the scheme (loaded by workers only when a path uses it).
BEAM_MODULE = "apache_beam.io.aws.s3filesystem"

_MISSING = ("404", "NoSuchKey", "NotFound")


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3://bucket/key URL: {url!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def _pool_config() -> Any:
    from botocore.config import Config

    return Config(max_pool_connections=32)  # 8 staging threads x 4 parts each


def _code(e: Exception) -> str:
    return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))


class S3Client:
    """stat / read / download of S3 objects (the :class:`stores.base.StagingClient` protocol)."""

    store = "S3"

    def __init__(self) -> None:
        try:
            import boto3
            from boto3.s3.transfer import TransferConfig
        except ImportError as e:
            raise StagingError(
                "reading s3:// needs boto3 (installed with recordprep's dependencies: "
                "pip install 'recordprep[tf]'), or copy the output to local disk or gs:// first"
            ) from e
        # One client for all staging threads: boto3 clients are thread-safe (sessions are not),
        # and each new one costs tens of ms of CPU loading its service model.
        self._s3 = boto3.session.Session().client("s3", config=_pool_config())
        self._transfer = TransferConfig(multipart_threshold=16 << 20, multipart_chunksize=16 << 20,
                                        max_concurrency=4)
        self.description = f"boto3 (endpoint {self._s3.meta.endpoint_url})"

    def _client(self) -> Any:
        return self._s3

    def _fail(self, op: str, url: str, e: Exception) -> StagingError:
        return StagingError(
            f"S3 {op} {url} failed ({e}). Check the credentials boto3 finds (AWS_ACCESS_KEY_ID/"
            f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the instance role), the region, and for an "
            f"S3-compatible store AWS_ENDPOINT_URL; or copy the output to local disk first."
        )

    def stat(self, url: str) -> tuple[int, float | None] | None:
        bucket, key = parse_s3_url(url)
        try:
            head = self._client().head_object(Bucket=bucket, Key=key)
        except Exception as e:
            if _code(e) in _MISSING:
                return None
            raise self._fail("HEAD", url, e) from e
        return int(head["ContentLength"]), head["LastModified"].timestamp()

    def read(self, url: str) -> bytes | None:
        bucket, key = parse_s3_url(url)
        try:
            return self._client().get_object(Bucket=bucket, Key=key)["Body"].read()
        except Exception as e:
            if _code(e) in _MISSING:
                return None
            raise self._fail("GET", url, e) from e

    def download(self, url: str, dest: Path) -> int:
        bucket, key = parse_s3_url(url)
        try:
            self._client().download_file(bucket, key, str(dest), Config=self._transfer)
        except Exception as e:
            if _code(e) in _MISSING:
                raise ShardNotFoundError(f"{url} does not exist on S3") from e
            raise self._fail("GET", url, e) from e
        return dest.stat().st_size


class S3Lock:
    """A lock object on S3, every change conditional on the object's ETag (its content's MD5).

    The client is Beam's (``--s3_*`` flags, else boto3's own search: environment,
    profile, instance role), so the lock talks to the same endpoint as the job.
    """

    conditional = True
    atomic_create = True

    def __init__(self, path: str, client: Any = None):
        # Split as written: a key may hold '?' or '#', which urlparse would cut off.
        self.bucket, _, self.key = path[len("s3://"):].partition("/")
        self.client = client or beam_client()

    def create(self, data: bytes) -> bool:
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data,
                                          ContentType="application/json", IfNoneMatch="*")
        except Exception as e:
            if _code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        self.etag = resp["ETag"]
        return True

    def created_state(self, data: bytes) -> Any:
        return self.etag

    def read(self) -> tuple[bytes, Any, float] | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as e:
            if _code(e) in ("NoSuchKey", "404"):
                return None
            raise
        return resp["Body"].read(), resp["ETag"], resp["LastModified"].timestamp()

    def replace(self, data: bytes, held: Any) -> Any:
        resp = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data,
                                      ContentType="application/json", IfMatch=held)
        return resp["ETag"]

    def remove_if(self, state: Any) -> bool:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.key, IfMatch=state)
        except Exception as e:
            code = _code(e)
            if code in ("NoSuchKey", "404"):
                return True
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            if code not in ("NotImplemented", "501", "InvalidArgument", "InvalidRequest"):
                raise
            # A store without conditional deletes: check the ETag, then delete (best effort).
            current = self.read()
            if current is not None and current[1] != state:
                return False
            self.client.delete_object(Bucket=self.bucket, Key=self.key)
        return True


def beam_client() -> Any:
    """A boto3 client as Beam's S3 file system makes it, with bounded timeouts and retries."""
    import boto3
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options
    from botocore.config import Config

    # The options the run set on FileSystems (pipelines.remote.filesystem_options), if any.
    o = (getattr(FileSystems, "_pipeline_options", None) or PipelineOptions([])).view_as(S3Options)
    return boto3.session.Session().client(
        service_name="s3", region_name=o.s3_region_name, api_version=o.s3_api_version, use_ssl=not o.s3_disable_ssl,
        verify=o.s3_verify, endpoint_url=o.s3_endpoint_url, aws_access_key_id=o.s3_access_key_id,
        aws_secret_access_key=o.s3_secret_access_key, aws_session_token=o.s3_session_token,
        config=Config(connect_timeout=IO_TIMEOUT_SECONDS, read_timeout=IO_TIMEOUT_SECONDS,
                      retries={"max_attempts": IO_ATTEMPTS, "mode": "standard"}))


class S3Store(StagedStore):
    """``s3://bucket/key``: staged for the readers (``$RECORDPREP_S3_CACHE``, ``<bucket>/<key>``)."""

    scheme = SCHEME
    name = "S3"
    cache_name = "s3"
    cache_env = "RECORDPREP_S3_CACHE"
    reach_hint = "for s3://, the credentials, region and AWS_ENDPOINT_URL boto3 finds"

    def parse(self, url: str) -> tuple[str, str]:
        """``(bucket, key)``."""
        return parse_s3_url(url)

    def lock_object(self, path: str, client: Any = None) -> S3Lock:
        return S3Lock(path, client)

    def client_key(self, url: str) -> tuple[Any, ...]:
        return ("s3", None, os.environ.get("AWS_ENDPOINT_URL", ""))

    def staging_client(self, url: str) -> S3Client:
        return S3Client()

    def local_path(self, url: str, cache_root: Path) -> Path:
        bucket, key = parse_s3_url(url)
        return cache_root / bucket / posixpath.normpath("/" + key).lstrip("/")


STORE = S3Store()
