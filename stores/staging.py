"""Staging remote shards on local disk for the readers, because TensorFlow 2.21 reads none of
``hdfs://``, ``s3://``, ``azfs://``.

For a staged store (:attr:`stores.base.Store.staged`) the readers copy the
metadata and the selected shards to a local directory, in parallel threads,
and read them from there. Only the shards this input pipeline reads are
copied (after ``input_context`` sharding), and a shard already staged with
the same size is reused, so a restart or a second epoch does not download
again.

Where: ``$<store.cache_env>`` or ``~/.cache/recordprep/<store.cache_name>``
(or ``ReadOptions.<cache_name>_cache_dir``), then the store's own layout
(:meth:`stores.base.Store.local_path`): ``<namenode>_<port>/<path>`` for
HDFS, ``<bucket>/<key>`` for S3, ``<account>/<container>/<blob>`` for Azure.
Each store's client: :mod:`stores.hdfs`, :mod:`stores.s3`, :mod:`stores.azure`.
Files are written under a temporary name and renamed, so a crash never leaves
a partial shard that looks complete; the local ``dataset_info.json`` is
written last, as the converter does.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convert.spec import METADATA_FILENAME, SpecError, check_name
from stores import store_for
from stores.base import ShardNotFoundError, StagingClient, StagingError
from stores.hdfs import HDFS_CACHE_ENV

#: The readers' logger: staging is what a reader sees happen.
logger = logging.getLogger("readers")

__all__ = ["cache_env", "client_for", "default_cache_root", "local_path_for", "stage"]


def cache_env(url: str) -> str:
    """The environment variable naming the staging directory of ``url``'s store."""
    return store_for(url).cache_env or HDFS_CACHE_ENV


def _cache_name(url: str) -> str:
    return store_for(url).cache_name or "hdfs"


def default_cache_root(url: str = "hdfs://") -> Path:
    env = os.environ.get(cache_env(url))
    if env:
        return Path(env).expanduser()
    return Path(f"~/.cache/recordprep/{_cache_name(url)}").expanduser()


def local_path_for(url: str, cache_root: Path) -> Path:
    """Where ``url`` is mirrored under ``cache_root``; ``..`` in the URL cannot climb out of it."""
    return store_for(url).local_path(url, cache_root)


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


_clients: dict[tuple[Any, ...], StagingClient] = {}
_clients_lock = threading.Lock()


def client_for(url: str) -> StagingClient:
    """The staging client for ``url``'s store, cached per process by what it serves
    (:meth:`stores.base.Store.client_key`: the endpoint, the account, the NameNode)."""
    store = store_for(url)
    key = store.client_key(url)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = store.staging_client(url)
            logger.info("%s: using %s", store.client_label(url), _clients[key].description)
        return _clients[key]


def _plan_shard(client: StagingClient, root_url: str, name: str, dest: Path) -> tuple[int, float | None, bool]:
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


def _copy_shard(client: StagingClient, root_url: str, name: str, size: int, mtime: float | None,
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


@dataclass(frozen=True)
class _Target:
    """One staging: where from, where to, through which client."""

    root_url: str
    local_root: Path
    client: StagingClient
    threads: int

    @property
    def scheme(self) -> str:
        return self.root_url.split("://", 1)[0].lower()


def _prepare(root_url: str, cache_root: Path | None, threads: int) -> _Target:
    """The staging directory of ``root_url`` (created) and its client."""
    cache_root = cache_root or default_cache_root(root_url)
    local_root = local_path_for(root_url, cache_root)
    client = client_for(root_url)
    try:
        local_root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StagingError(
            f"cannot create the {getattr(client, 'store', 'the store')} staging directory {local_root} ({e}); set "
            f"{cache_env(root_url)} or ReadOptions({_cache_name(root_url)}_cache_dir=...) "
            f"to a writable local directory with enough space"
        ) from e
    return _Target(root_url, local_root, client, threads)


def _destinations(target: _Target, files: Sequence[str]) -> dict[str, Path]:
    """Each file's local path, checked to stay inside the staging directory, before anything is written."""
    env = cache_env(target.root_url)
    return {name: _inside(target.local_root, name, env) for name in [*files, METADATA_FILENAME]}


def _copy_missing(target: _Target, files: Sequence[str], dests: dict[str, Path]) -> tuple[int, int, int]:
    """Copy the shards not already staged unchanged, in ``target.threads`` threads:
    ``(shards, copied, bytes copied)``."""
    client, root_url = target.client, target.root_url

    def plan(name: str) -> tuple[str, int, float | None, bool]:
        return (name, *_plan_shard(client, root_url, name, dests[name]))

    def copy(item: tuple[str, int, float | None, bool]) -> None:
        name, size, mtime, _ = item
        _copy_shard(client, root_url, name, size, mtime, dests[name])

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, target.threads)) as pool:
        items = list(pool.map(plan, files))
        todo = [item for item in items if item[3]]
        todo_bytes = sum(item[1] for item in todo)
        if todo:
            logger.warning(
                "TensorFlow cannot read %s:// directly: copying %d of %d shard(s) (%.1f MB) of "
                "%s into %s via %s with %d threads (%d already staged, unchanged)",
                target.scheme, len(todo), len(items), todo_bytes / 1e6, root_url, target.local_root,
                client.description, target.threads, len(items) - len(todo),
            )
        list(pool.map(copy, todo))
    return len(items), len(todo), todo_bytes


def _write_metadata(target: _Target, metadata: bytes, dest: Path) -> None:
    """The local metadata, written last and atomically, as the converter does."""
    meta_tmp = target.local_root / f".{METADATA_FILENAME}.{os.getpid()}.partial"
    meta_tmp.write_bytes(metadata)
    os.replace(meta_tmp, dest)


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
    target = _prepare(root_url, cache_root, threads)
    dests = _destinations(target, files)
    started = time.monotonic()
    shards, copied, copied_bytes = _copy_missing(target, files, dests)
    _write_metadata(target, metadata, dests[METADATA_FILENAME])
    (logger.warning if copied else logger.info)(
        "%s:// shards of %s are read from the local copy in %s (%d copied, %.1f MB in %.1f s; "
        "%d reused)",
        target.scheme, root_url, target.local_root, copied, copied_bytes / 1e6,
        time.monotonic() - started, shards - copied,
    )
    return str(target.local_root)
