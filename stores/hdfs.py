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
:class:`HdfsLock`); Beam's flags for HDFS are derived in
``pipelines.remote`` from :func:`parse_hdfs_url` and the same variables.

Every HTTP request made here is bounded in time: the staging client's by
``HTTP_TIMEOUT_S`` (each connect and each read; a shard's body may take longer
in all), the lock's by ``stores.IO_TIMEOUT_SECONDS`` (Beam's WebHDFS client
has no limit of its own). A request that times out raises
:class:`HdfsTimeoutError`, naming the host, the operation and what to check.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import posixpath
import shutil
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from stores.base import (
    IO_TIMEOUT_SECONDS,
    BeamFsLock,
    ShardNotFoundError,
    StagedStore,
    StagingClient,
    StagingError,
)

logger = logging.getLogger("readers")

SCHEMES = ("hdfs", "viewfs")
#: Beam's file system module of the scheme (loaded by workers only when a path uses it).
BEAM_MODULE = "apache_beam.io.hadoopfilesystem"
HDFS_CACHE_ENV = "RECORDPREP_HDFS_CACHE"
WEBHDFS_URL_ENV = "RECORDPREP_WEBHDFS_URL"
HDFS_CLIENT_ENV = "RECORDPREP_HDFS_CLIENT"
DEFAULT_WEBHDFS_PORT = 9870
#: Seconds the staging client waits on one connect or one read of a response.
HTTP_TIMEOUT_S = 120.0
_COPY_CHUNK = 8 << 20
#: Exceptions ``_timed_out`` looks through (causes, wrapped errors) for a timeout.
_MAX_CAUSES = 32


class HdfsTimeoutError(StagingError, TimeoutError):
    """A WebHDFS request got no answer in its time limit (the message names the host,
    the operation and what to check)."""


def _timed_out(e: BaseException) -> bool:
    """Whether ``e`` is, or wraps, a request that timed out: a socket timeout (urllib's,
    maybe in a ``URLError``), urllib3's or requests' (Beam's HDFS file system calls the
    ``hdfs`` package, on requests; Beam wraps some errors in a ``BeamIOError``)."""
    kinds: list[type] = [TimeoutError]
    with contextlib.suppress(ImportError):
        import requests.exceptions
        import urllib3.exceptions

        kinds += [requests.exceptions.Timeout, urllib3.exceptions.TimeoutError]
    stack, seen = [e], 0
    while stack and seen < _MAX_CAUSES:
        x = stack.pop()
        seen += 1
        if isinstance(x, tuple(kinds)):
            return True
        details = getattr(x, "exception_details", None)
        stack += [c for c in (x.__cause__, x.__context__, getattr(x, "reason", None), *x.args,
                              *(details.values() if isinstance(details, dict) else ()))
                  if isinstance(c, BaseException)]
    return False


def _check_namenode(address: str, hint: str) -> str:
    return (f"check that the NameNode at {address} is up and not overloaded (its web UI there, "
            f"`hdfs dfsadmin -report`) and that {hint} names its HTTP address, then retry")


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

    def __init__(self, base_url: str, user: str | None = None, timeout: float | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or login_name()
        self.description = f"WebHDFS at {self.base_url} as user {self.user!r}"
        #: Seconds one connect or one read of a response may take (``HTTP_TIMEOUT_S`` by default).
        self.timeout = HTTP_TIMEOUT_S if timeout is None else timeout

    @contextlib.contextmanager
    def _answered(self, op: str, url: str) -> Iterator[None]:
        """A request, or the read of its response, that times out raises :class:`HdfsTimeoutError`."""
        try:
            yield
        except HdfsTimeoutError:
            raise
        except OSError as e:  # urllib's URLError and socket timeouts are OSErrors
            if not _timed_out(e):
                raise
            host = urllib.parse.urlparse(self.base_url).netloc or self.base_url
            raise HdfsTimeoutError(
                f"WebHDFS {op} of {url}: {host} (or a DataNode it redirected to) did not answer within "
                f"{self.timeout:g}s; {_check_namenode(self.base_url, WEBHDFS_URL_ENV)}"
            ) from e

    def _url(self, url: str, op: str) -> str:
        _, _, path = parse_hdfs_url(url)
        query = urllib.parse.urlencode({"op": op, "user.name": self.user})
        return f"{self.base_url}/webhdfs/v1{urllib.parse.quote(path)}?{query}"

    def _open(self, url: str, op: str):  # -> http.client.HTTPResponse | None
        request_url = self._url(url, op)
        try:
            # urllib follows the NameNode's 307 redirect to a DataNode for GET.
            with self._answered(op, url):
                return urllib.request.urlopen(request_url, timeout=self.timeout)
        except HdfsTimeoutError:
            raise
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            with self._answered(op, url):
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
        with resp, self._answered("GETFILESTATUS", url):
            status = json.load(resp)["FileStatus"]
        if status.get("type") == "DIRECTORY":
            return None
        mtime = status.get("modificationTime")
        return int(status["length"]), (mtime / 1000.0 if mtime else None)

    def read(self, url: str) -> bytes | None:
        resp = self._open(url, "OPEN")
        if resp is None:
            return None
        with resp, self._answered("OPEN", url):
            return resp.read()

    def download(self, url: str, dest: Path) -> int:
        resp = self._open(url, "OPEN")
        if resp is None:
            raise ShardNotFoundError(f"{url} does not exist on HDFS")
        with resp, open(dest, "wb") as out, self._answered("OPEN", url):
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


class HdfsLock(BeamFsLock):
    """The lock file on HDFS: :class:`BeamFsLock` (best effort), each request bounded in time.

    Beam's HDFS file system calls WebHDFS through the ``hdfs`` package's client, which
    has no time limit: a NameNode that accepts connections and never answers would hang
    the lock's calls (the run's start, its heartbeat, its commit) instead of failing them,
    as ``pipelines.lock`` expects of every store. Each call here sets that client's
    limit to ``timeout`` seconds per connect and per read (``IO_TIMEOUT_SECONDS`` by
    default), and a request that times out raises :class:`HdfsTimeoutError` naming the
    NameNode, the operation and what to check; the base's "no lock" and "already gone"
    answers are never made of a timeout.
    """

    def __init__(self, path: str, timeout: float | None = None) -> None:
        super().__init__(path)
        self.timeout = IO_TIMEOUT_SECONDS if timeout is None else timeout
        self._namenode = "the NameNode"

    def _fs(self) -> Any:
        fs = super()._fs()
        client = getattr(fs, "_hdfs_client", None)  # hdfs.InsecureClient (Beam's attribute)
        if client is None or not hasattr(client, "_timeout"):  # another apache-beam or hdfs than constraints.txt's
            logger.warning("the HDFS lock %s: Beam's HDFS file system has no hdfs client to bound in time; its "
                           "requests have no time limit (install the versions of constraints.txt)", self.path)
            return fs
        client._timeout = self.timeout
        self._namenode = getattr(client, "url", None) or self._namenode
        return fs

    def _store_failed(self, e: BaseException) -> bool:
        return _timed_out(e)

    def _bounded(self, op: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except HdfsTimeoutError:
            raise
        except Exception as e:
            if not _timed_out(e):
                raise
            raise HdfsTimeoutError(
                f"the lock's {op} of {self.path}: WebHDFS at {self._namenode} did not answer within "
                f"{self.timeout:g}s; {_check_namenode(self._namenode, f'--hdfs_host/--hdfs_port (or {WEBHDFS_URL_ENV})')}"
            ) from e

    def create(self, data: bytes) -> bool:
        return self._bounded("create", super().create, data)

    def read(self) -> tuple[bytes, Any, float] | None:
        return self._bounded("read", super().read)

    def replace(self, data: bytes, held: Any) -> Any:
        return self._bounded("replace", super().replace, data, held)

    def remove_if(self, state: Any) -> bool:
        return self._bounded("delete", super().remove_if, state)


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

    def lock_object(self, path: str, client: Any = None) -> HdfsLock:
        """The lock file at ``path``: Beam's HDFS file system, each request bounded (:class:`HdfsLock`)."""
        return HdfsLock(path)

    def local_path(self, url: str, cache_root: Path) -> Path:
        host, port, path = parse_hdfs_url(url)
        path = posixpath.normpath("/" + path)  # "/a/../../x" -> "/x", as HDFS resolves it
        return cache_root / f"{host or 'default'}_{port or 'default'}" / path.lstrip("/")


STORE = HdfsStore()
