"""Staging ``hdfs://``, ``s3://`` and ``azfs://`` shards on local disk, because TensorFlow 2.21 reads none.

TensorFlow dropped its built-in HDFS file system (``tf.io.gfile`` raises
``UnimplementedError: File system scheme 'hdfs' not implemented``), so for an
``hdfs://`` pattern the readers copy the metadata and the selected shards to a
local directory, in parallel threads, and read them from there. Only the
shards this input pipeline reads are copied (after ``input_context``
sharding), and a shard already staged with the same size is reused, so a
restart or a second epoch does not download again.

Where: ``$RECORDPREP_HDFS_CACHE`` or ``~/.cache/recordprep/hdfs`` (or
``ReadOptions.hdfs_cache_dir``), then ``<namenode>_<port>/<path on HDFS>``;
for ``s3://`` ``$RECORDPREP_S3_CACHE`` or ``~/.cache/recordprep/s3`` (or
``ReadOptions.s3_cache_dir``), then ``<bucket>/<key>``; for ``azfs://``
``$RECORDPREP_AZURE_CACHE`` or ``~/.cache/recordprep/azure`` (or
``ReadOptions.azure_cache_dir``), then ``<account>/<container>/<blob>``. S3's
client is :mod:`readers._staging_s3` (boto3), Azure's
:mod:`readers._staging_azure` (azure-storage-blob).
Files are written under a temporary name and renamed, so a crash never leaves
a partial shard that looks complete; the local ``dataset_info.json`` is
written last, as the converter does.

How (``$RECORDPREP_HDFS_CLIENT``): ``pyarrow`` (``pyarrow.fs.HadoopFileSystem``,
libhdfs over JNI: a Hadoop client install; Kerberos through its
configuration), ``webhdfs`` (the REST API over ``urllib``: nothing installed,
the NameNode's HTTP address from ``$RECORDPREP_WEBHDFS_URL`` or
``http://<namenode host>:9870``, simple authentication as
``$HADOOP_USER_NAME`` or the login name), or ``auto`` (the default: WebHDFS
if ``$RECORDPREP_WEBHDFS_URL`` is set, otherwise pyarrow if it can connect,
otherwise WebHDFS at the default address). Each client's setup:
docs/remote-storage.md#hdfs.
"""

from __future__ import annotations

import concurrent.futures
import getpass
import json
import logging
import os
import posixpath
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from convert.spec import METADATA_FILENAME, SpecError, check_name
from readers.errors import ShardNotFoundError, StagingError

logger = logging.getLogger("readers")

HDFS_CACHE_ENV = "RECORDPREP_HDFS_CACHE"
S3_CACHE_ENV = "RECORDPREP_S3_CACHE"
AZURE_CACHE_ENV = "RECORDPREP_AZURE_CACHE"
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


def _is_s3(url: str) -> bool:
    return url.lower().startswith("s3://")


def _store_key(url: str) -> str:
    """``s3``, ``azure`` or ``hdfs``: the store's name in cache directories and options."""
    from readers._staging_azure import is_azure

    return "s3" if _is_s3(url) else "azure" if is_azure(url) else "hdfs"


def cache_env(url: str) -> str:
    """The environment variable naming the staging directory of ``url``'s store."""
    return {"s3": S3_CACHE_ENV, "azure": AZURE_CACHE_ENV}.get(_store_key(url), HDFS_CACHE_ENV)


def default_cache_root(url: str = "hdfs://") -> Path:
    env = os.environ.get(cache_env(url))
    if env:
        return Path(env).expanduser()
    return Path(f"~/.cache/recordprep/{_store_key(url)}").expanduser()


def local_path_for(url: str, cache_root: Path) -> Path:
    """Where ``url`` is mirrored under ``cache_root``; ``..`` in the URL cannot climb out of it."""
    if _is_s3(url):
        from readers._staging_s3 import parse_s3_url

        bucket, key = parse_s3_url(url)
        return cache_root / bucket / posixpath.normpath("/" + key).lstrip("/")
    if _store_key(url) == "azure":
        from readers._staging_azure import parse_azfs_url

        account, container, blob = parse_azfs_url(url)
        return cache_root / account / container / posixpath.normpath("/" + blob).lstrip("/")
    host, port, path = parse_hdfs_url(url)
    path = posixpath.normpath("/" + path)  # "/a/../../x" -> "/x", as HDFS resolves it
    return cache_root / f"{host or 'default'}_{port or 'default'}" / path.lstrip("/")


def _inside(root: Path, name: str, env: str = HDFS_CACHE_ENV) -> Path:
    """``root / name``, after checking that ``name`` is a file name inside the output and that
    the path resolves (symlinks included) strictly under ``root``.

    The metadata loader already refuses such names (``convert.spec.check_name``); this is the
    second line of defence before anything is written, whatever the caller passes.
    """
    try:
        check_name(name, f"staging of {name!r}")
    except SpecError as e:
        raise StagingError(str(e)) from None
    dest = root / name
    resolved, base = dest.resolve(), root.resolve()
    if resolved == base or base not in resolved.parents:
        raise StagingError(
            f"staging: {name!r} resolves to {resolved}, outside the staging directory {base}; "
            f"nothing was copied. Remove the symlink or the file in the cache, or use another "
            f"{env}"
        )
    return dest


class HdfsClient(Protocol):
    description: str
    store: str  # "HDFS", "S3": for messages

    def stat(self, url: str) -> tuple[int, float | None] | None:
        """``(length in bytes, modification time in s or None)``, or None if no such file."""

    def read(self, url: str) -> bytes | None:
        """Whole (small) file, or None if it does not exist."""

    def download(self, url: str, dest: Path) -> int:
        """Copy the file to ``dest``; return the bytes written."""


class WebHdfsClient:
    """WebHDFS REST client on ``urllib`` (simple auth)."""

    store = "HDFS"

    def __init__(self, base_url: str, user: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.user = user or os.environ.get("HADOOP_USER_NAME") or _login_name()
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


def _login_name() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry (containers)
        return "recordprep"


_clients: dict[tuple[str, int | None, str], HdfsClient] = {}
_clients_lock = threading.Lock()


def client_for(url: str) -> HdfsClient:
    """The client for ``url``: boto3 for ``s3://``, azure-storage-blob for ``azfs://`` (per account
    and connection string); for HDFS the NameNode's (cached per process),
    per ``$RECORDPREP_HDFS_CLIENT``."""
    if _is_s3(url):
        from readers._staging_s3 import S3Client

        with _clients_lock:
            key = ("s3", None, os.environ.get("AWS_ENDPOINT_URL", ""))
            if key not in _clients:
                _clients[key] = S3Client()
                logger.info("s3://: using %s", _clients[key].description)
            return _clients[key]
    if _store_key(url) == "azure":
        from readers._staging_azure import CONNECTION_STRING_ENV, AzureClient, parse_azfs_url

        account = parse_azfs_url(url)[0]
        with _clients_lock:
            key = ("azfs", hash(os.environ.get(CONNECTION_STRING_ENV, "")), account)
            if key not in _clients:
                _clients[key] = AzureClient(account)
                logger.info("azfs://%s: using %s", account, _clients[key].description)
            return _clients[key]
    host, port, _ = parse_hdfs_url(url)
    mode = os.environ.get(HDFS_CLIENT_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "pyarrow", "webhdfs"):
        raise StagingError(f"{HDFS_CLIENT_ENV}={mode!r}: expected auto, pyarrow or webhdfs")
    webhdfs_url = os.environ.get(WEBHDFS_URL_ENV, "")
    key = (host, port, f"{mode}|{webhdfs_url}")
    with _clients_lock:
        if key in _clients:
            return _clients[key]
        client = _make_client(host, port, mode, webhdfs_url)
        _clients[key] = client
        logger.info("hdfs://%s: using %s", f"{host}:{port}" if port else host, client.description)
        return client


def _make_client(host: str, port: int | None, mode: str, webhdfs_url: str) -> HdfsClient:
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


def _plan_shard(client: HdfsClient, root_url: str, name: str, dest: Path) -> tuple[int, float | None, bool]:
    """``(size, mtime, needs_copy)`` of one shard: a copy at ``dest`` with the same
    size and modification time is reused."""
    url = root_url.rstrip("/") + "/" + name
    remote = client.stat(url)
    if remote is None:
        raise ShardNotFoundError(
            f"{url} is listed in {METADATA_FILENAME} but does not exist on {getattr(client, 'store', 'the store')}: the output "
            f"was modified after the conversion finished. Re-run the conversion."
        )
    size, mtime = remote
    if dest.exists():
        st = dest.stat()
        same_mtime = mtime is None or abs(st.st_mtime - mtime) < 1.0
        if st.st_size == size and same_mtime:
            return size, mtime, False
    return size, mtime, True


def _copy_shard(client: HdfsClient, root_url: str, name: str, size: int, mtime: float | None,
                dest: Path) -> None:
    """Copies one shard to ``dest`` through a temporary file, checking its size and
    keeping its modification time (so the next run can reuse it)."""
    url = root_url.rstrip("/") + "/" + name
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.partial")
    try:
        written = client.download(url, tmp)
        if written != size:
            raise StagingError(
                f"copying {url} to {tmp} got {written} bytes, {getattr(client, 'store', 'the store')} reports {size}; "
                f"the file changed during the copy or the connection dropped, retry"
            )
        if mtime is not None:
            os.utime(tmp, (mtime, mtime))
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def stage(
    root_url: str,
    files: Sequence[str],
    metadata: bytes,
    *,
    cache_root: Path | None = None,
    threads: int = 8,
) -> str:
    """Copy ``files`` (names relative to ``root_url``) and the metadata to local disk.

    Returns the local directory that mirrors ``root_url``. It holds a copy of
    the metadata (written last) and the staged shards; shards of other splits
    or other input pipelines are not copied. A shard already staged with the
    same size and modification time is reused.

    Raises:
      ShardNotFoundError: a listed shard does not exist on the store.
      StagingError: the store cannot be reached or a copy failed; the message says
        what to configure. Also, before anything is written, when a name is
        not a file inside the output or resolves outside ``local_root``.
    """
    cache_root = cache_root or default_cache_root(root_url)
    scheme = root_url.split("://", 1)[0].lower()
    local_root = local_path_for(root_url, cache_root)
    client = client_for(root_url)
    try:
        local_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StagingError(
            f"cannot create the {getattr(client, 'store', 'the store')} staging directory {local_root} ({e}); set "
            f"{cache_env(root_url)} or ReadOptions({_store_key(root_url)}_cache_dir=...) "
            f"to a writable local directory with enough space"
        ) from e
    dests = {name: _inside(local_root, name, cache_env(root_url)) for name in [*files, METADATA_FILENAME]}

    def plan(name: str) -> tuple[str, int, float | None, bool]:
        return (name, *_plan_shard(client, root_url, name, dests[name]))

    def copy(item: tuple[str, int, float | None, bool]) -> None:
        name, size, mtime, _ = item
        _copy_shard(client, root_url, name, size, mtime, dests[name])

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        items = list(pool.map(plan, files))
        todo = [item for item in items if item[3]]
        todo_bytes = sum(item[1] for item in todo)
        if todo:
            logger.warning(
                "TensorFlow cannot read %s:// directly: copying %d of %d shard(s) (%.1f MB) of "
                "%s into %s via %s with %d threads (%d already staged, unchanged)",
                scheme,
                len(todo),
                len(items),
                todo_bytes / 1e6,
                root_url,
                local_root,
                client.description,
                threads,
                len(items) - len(todo),
            )
        list(pool.map(copy, todo))
    meta_tmp = local_root / f".{METADATA_FILENAME}.{os.getpid()}.partial"
    meta_tmp.write_bytes(metadata)
    os.replace(meta_tmp, dests[METADATA_FILENAME])
    (logger.warning if todo else logger.info)(
        "%s:// shards of %s are read from the local copy in %s (%d copied, %.1f MB in %.1f s; "
        "%d reused)",
        scheme,
        root_url,
        local_root,
        len(todo),
        todo_bytes / 1e6,
        time.monotonic() - started,
        len(items) - len(todo),
    )
    return str(local_root)
