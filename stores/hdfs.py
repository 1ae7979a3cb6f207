"""``hdfs://`` (and ``viewfs://``): URLs, the readers' staging clients (WebHDFS, pyarrow), the lock through Beam.

TensorFlow dropped its built-in HDFS file system, so the readers stage
``hdfs://`` shards on local disk (:mod:`stores.staging`), under
``$RECORDPREP_HDFS_CACHE`` or ``~/.cache/recordprep/hdfs``, then
``<namenode>_<port>/<path on HDFS>``.

How (``$RECORDPREP_HDFS_CLIENT``): ``pyarrow`` (``pyarrow.fs.HadoopFileSystem``,
libhdfs over JNI: a Hadoop client install; Kerberos through its
configuration), ``webhdfs`` (the REST API over ``urllib``: nothing installed,
the NameNode's HTTP address from ``$RECORDPREP_WEBHDFS_URL`` or
``http://<namenode host>:9870``, simple authentication as
``$HADOOP_USER_NAME`` or the login name), or ``auto`` (the default: WebHDFS
if ``$RECORDPREP_WEBHDFS_URL`` is set, otherwise pyarrow if it can connect,
otherwise WebHDFS at the default address). Each client's setup:
docs/remote-storage.md#hdfs.

The lock is Beam's HDFS file system's create-if-absent (best effort:
:class:`stores.base.BeamFsLock`); Beam's flags for HDFS are derived in
``pipelines.remote`` from :func:`parse_hdfs_url` and the same variables.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import posixpath
import shutil
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from stores.base import ShardNotFoundError, StagedStore, StagingClient, StagingError

logger = logging.getLogger("readers")

SCHEMES = ("hdfs", "viewfs")
#: Beam's file system module of the scheme (loaded by workers only when a path uses it).
BEAM_MODULE = "apache_beam.io.hadoopfilesystem"
HDFS_CACHE_ENV = "RECORDPREP_HDFS_CACHE"
WEBHDFS_URL_ENV = "RECORDPREP_WEBHDFS_URL"
HDFS_CLIENT_ENV = "RECORDPREP_HDFS_CLIENT"
DEFAULT_WEBHDFS_PORT = 9870
HTTP_TIMEOUT_S = 120.0
_COPY_CHUNK = 8 << 20


def parse_hdfs_url(url: str) -> tuple[str, int | None, str]:
    """``hdfs://nn:8020/a/b`` -> ``("nn", 8020, "/a/b")``."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("hdfs", "viewfs"):
        raise ValueError(f"not an hdfs:// URL: {url!r}")
    return parsed.hostname or "", parsed.port, parsed.path or "/"


def is_hdfs(path: str | None) -> bool:
    """True for ``hdfs://`` and ``viewfs://`` paths."""
    return bool(path) and str(path).lower().startswith(("hdfs://", "viewfs://"))


class WebHdfsClient:
    """WebHDFS REST client on ``urllib`` (simple auth)."""

    store = "HDFS"

    def __init__(self, base_url: str, user: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or login_name()
        self.description = f"WebHDFS at {self.base_url} as user {self.user!r}"

    def _url(self, url: str, op: str) -> str:
        _, _, path = parse_hdfs_url(url)
        query = urllib.parse.urlencode({"op": op, "user.name": self.user})
        return f"{self.base_url}/webhdfs/v1{urllib.parse.quote(path)}?{query}"

    def _open(self, url: str, op: str):  # -> http.client.HTTPResponse | None
        request_url = self._url(url, op)
        try:
            # urllib follows the NameNode's 307 redirect to a DataNode for GET.
            return urllib.request.urlopen(request_url, timeout=HTTP_TIMEOUT_S)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            detail = e.read(2000).decode("utf-8", "replace")
            raise StagingError(
                f"WebHDFS {op} {url} failed: HTTP {e.code} from {request_url}: {detail}"
            ) from e
        except (urllib.error.URLError, OSError) as e:
            raise StagingError(
                f"cannot reach {self.description} for {url} ({e}). Set {WEBHDFS_URL_ENV} to the "
                f"NameNode's HTTP address (e.g. http://namenode:9870, or :50070 on Hadoop 2), or "
                f"use {HDFS_CLIENT_ENV}=pyarrow with a Hadoop client installed, or copy the output "
                f"to local disk / gs:// and read it from there."
            ) from e

    def stat(self, url: str) -> tuple[int, float | None] | None:
        resp = self._open(url, "GETFILESTATUS")
        if resp is None:
            return None
        with resp:
            status = json.load(resp)["FileStatus"]
        if status.get("type") == "DIRECTORY":
            return None
        mtime = status.get("modificationTime")
        return int(status["length"]), (mtime / 1000.0 if mtime else None)

    def read(self, url: str) -> bytes | None:
        resp = self._open(url, "OPEN")
        if resp is None:
            return None
        with resp:
            return resp.read()

    def download(self, url: str, dest: Path) -> int:
        resp = self._open(url, "OPEN")
        if resp is None:
            raise ShardNotFoundError(f"{url} does not exist on HDFS")
        with resp, open(dest, "wb") as out:
            shutil.copyfileobj(resp, out, _COPY_CHUNK)
            return out.tell()


class PyArrowHdfsClient:
    """``pyarrow.fs.HadoopFileSystem`` (libhdfs/JNI)."""

    store = "HDFS"

    def __init__(self, host: str, port: int | None) -> None:
        from pyarrow import fs as pafs

        kwargs = (
            {"user": os.environ["HADOOP_USER_NAME"]} if "HADOOP_USER_NAME" in os.environ else {}
        )
        self.fs = pafs.HadoopFileSystem(host or "default", port or 0, **kwargs)
        self._pafs = pafs
        self.description = f"pyarrow HadoopFileSystem({host or 'default'}:{port or 'default'})"

    def stat(self, url: str) -> tuple[int, float | None] | None:
        _, _, path = parse_hdfs_url(url)
        info = self.fs.get_file_info(path)
        if info.type != self._pafs.FileType.File:
            return None
        mtime = info.mtime.timestamp() if info.mtime is not None else None
        return int(info.size), mtime

    def read(self, url: str) -> bytes | None:
        if self.stat(url) is None:
            return None
        _, _, path = parse_hdfs_url(url)
        with self.fs.open_input_stream(path) as f:
            return f.read()

    def download(self, url: str, dest: Path) -> int:
        _, _, path = parse_hdfs_url(url)
        with self.fs.open_input_stream(path) as src, open(dest, "wb") as out:
            while chunk := src.read(_COPY_CHUNK):
                out.write(chunk)
            return out.tell()


def login_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "recordprep"


def _client_mode() -> tuple[str, str]:
    """``($RECORDPREP_HDFS_CLIENT, $RECORDPREP_WEBHDFS_URL)``, the first checked."""
    mode = os.environ.get(HDFS_CLIENT_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "pyarrow", "webhdfs"):
        raise StagingError(f"{HDFS_CLIENT_ENV}={mode!r}: expected auto, pyarrow or webhdfs")
    return mode, os.environ.get(WEBHDFS_URL_ENV, "")


def _make_client(host: str, port: int | None, mode: str, webhdfs_url: str) -> StagingClient:
    default_webhdfs = webhdfs_url or f"http://{host}:{DEFAULT_WEBHDFS_PORT}"
    if mode == "webhdfs" or (mode == "auto" and webhdfs_url):
        return WebHdfsClient(default_webhdfs)
    try:
        return PyArrowHdfsClient(host, port)
    except Exception as e:  # ImportError, OSError (no libhdfs / JVM), ...
        if mode == "pyarrow":
            raise StagingError(
                f"pyarrow.fs.HadoopFileSystem could not connect to hdfs://{host}:{port} ({e}). It "
                f"needs a Hadoop client: HADOOP_HOME and JAVA_HOME set, and CLASSPATH from "
                f"`hadoop classpath --glob`. Or use {HDFS_CLIENT_ENV}=webhdfs with "
                f"{WEBHDFS_URL_ENV}=http://<namenode>:9870."
            ) from e
        logger.info(
            "pyarrow HadoopFileSystem unavailable (%s); falling back to WebHDFS at %s",
            e,
            default_webhdfs,
        )
        return WebHdfsClient(default_webhdfs)


class HdfsStore(StagedStore):
    """``hdfs://<namenode>[:port]/path``: staged for the readers, the NameNode's client per
    ``$RECORDPREP_HDFS_CLIENT`` (module docstring)."""

    scheme = "hdfs"
    name = "HDFS"
    cache_name = "hdfs"
    cache_env = HDFS_CACHE_ENV

    @property
    def reach_hint(self) -> str:  # type: ignore[override]
        return f"for hdfs://, the NameNode's WebHDFS address: {WEBHDFS_URL_ENV}"

    def parse(self, url: str) -> tuple[str, int | None, str]:
        """``(namenode host, port or None, path)``."""
        return parse_hdfs_url(url)

    def client_key(self, url: str) -> tuple[Any, ...]:
        host, port, _ = parse_hdfs_url(url)
        mode, webhdfs_url = _client_mode()
        return (host, port, f"{mode}|{webhdfs_url}")

    def client_label(self, url: str) -> str:
        host, port, _ = parse_hdfs_url(url)
        return f"hdfs://{host}:{port}" if port else f"hdfs://{host}"

    def staging_client(self, url: str) -> StagingClient:
        host, port, _ = parse_hdfs_url(url)
        mode, webhdfs_url = _client_mode()
        return _make_client(host, port, mode, webhdfs_url)

    def local_path(self, url: str, cache_root: Path) -> Path:
        host, port, path = parse_hdfs_url(url)
        path = posixpath.normpath("/" + path)  # "/a/../../x" -> "/x", as HDFS resolves it
        return cache_root / f"{host or 'default'}_{port or 'default'}" / path.lstrip("/")


STORE = HdfsStore()
