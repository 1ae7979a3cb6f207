"""The ``s3://`` client of the readers' staging (:mod:`readers._staging`), on boto3.

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

import urllib.parse
from pathlib import Path
from typing import Any

from readers.errors import ShardNotFoundError, StagingError

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
    """stat / read / download of S3 objects (the ``HdfsClient`` protocol of ``_staging``)."""

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
