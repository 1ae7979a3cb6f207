"""One conversion per output at a time: a lock object with an owner and a heartbeat.

A conversion holds ``OUTPUT/_LOCK.json`` from before it clears or writes
anything until it ends, whatever happens::

    with OutputLock(output, fingerprint=fp, version=v):
        ...  # clear, run, commit

The lock holds its ``owner`` (host, pid, user, start time, fingerprint,
recordprep version, a random token) and a ``heartbeat`` (UTC, ISO and Unix
seconds) that a daemon thread rewrites every ``heartbeat_seconds`` while the
run lives; ``heartbeat_seconds`` and ``stale_after_seconds`` are stored too,
so a reader of the lock alone can tell a slow run from a dead one. The format
and that judgement live in :mod:`convert.lockfile` (no Beam), which
``recordprep wait`` and ``readers.wait_for_dataset`` share.

A second run finding a live lock gets :class:`LockHeldError` naming the owner
at once. A *stale* lock (heartbeat older than ``stale_after_seconds``, or an
owner on this host whose process is gone) is taken over with a warning.

A run whose lock was taken over (it stalled) must not touch the output
again: before each delete, rename or commit write it proves the lock is
still its own (:func:`fence`, :meth:`OutputLock.check`), and a lock that is
another run's, or that no refresh has proved for half the staleness bound,
is *lost*: :class:`LockLostError`. Each call to the store is bounded
(:data:`IO_TIMEOUT_SECONDS`), so a dead store makes the lock lost, not a
hang.

Creation is atomic where the storage allows it: local paths by
``O_CREAT | O_EXCL`` (a stale lock is renamed aside first, and put back if it
turns out to be another run's fresh lock), ``gs://`` by generation
preconditions (create, refresh and delete), ``s3://`` by S3's conditional
writes (``If-None-Match: *`` to create, ``If-Match: <ETag>`` to refresh and
delete; S3 has been strongly consistent since December 2020, so the lock read
back is the one written; a store refusing ``If-Match`` on delete gets an
ETag check before the delete), ``azfs://`` by Azure Blob Storage's
conditional requests (Put Blob with ``If-None-Match: *`` to create, ``If-Match:
<ETag>`` to refresh and delete; Blob Storage is strongly consistent), so no two
runs can both win; anything else
(``hdfs://``) is best effort: two runs starting within the same
second can both pass. Clock skew between hosts and the take-over steps:
docs/operations.md#one-conversion-per-output.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from convert.lockfile import (
    HEARTBEAT_SECONDS,
    LOCK_FILENAME,
    MAX_STALE_AFTER_SECONDS,
    STALE_AFTER_SECONDS,
    boot_id,
    describe_owner,
    heartbeat_age,
    is_stale,
    parse_lock,
    process_start,
    stale_bound,
)

log = logging.getLogger("recordprep")

__all__ = [
    "HEARTBEAT_SECONDS",
    "LOCK_FILENAME",
    "STALE_AFTER_SECONDS",
    "LockHeldError",
    "LockLostError",
    "OutputLock",
    "describe_owner",
    "fence",
    "is_stale",
    "lock_timing",
    "read_lock",
]


class LockHeldError(RuntimeError):
    """Another live run holds the output's lock."""

    def __init__(self, output: str, lock: dict[str, Any]):
        self.lock = lock
        owner = lock.get("owner") or {}
        since = owner.get("started") or "an unknown time"
        beat = lock.get("heartbeat") or "never"
        super().__init__(
            f"{output} is being written by another conversion: {describe_owner(owner)}, running since {since} "
            f"(last heartbeat {beat}); wait for it to finish (recordprep wait {output}) or write to another "
            f"directory. A lock whose run died is taken over once its heartbeat is "
            f"{stale_bound(lock):g} s old."
        )


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.UTC).isoformat(timespec="seconds")


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry (containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


# ---------------------------------------------------------------- storage


class _Local:
    """A lock file on a local (or NFS-like POSIX) file system."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes) -> bool:
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True

    def read(self) -> tuple[bytes, Any, float] | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return data, data, os.path.getmtime(self.path)
        except FileNotFoundError:
            return None

    def replace(self, data: bytes, held: Any) -> Any:
        tmp = f"{self.path}.{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, self.path)
        except BaseException:  # a full disk: leave no partial copy in the output
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return data

    def remove_if(self, state: Any) -> bool:
        """Remove the lock if it still is ``state`` (what was read); False if another run's."""
        aside = f"{self.path}.stale-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return True  # gone already: whoever removed it, creating is the next step
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != state:  # another run took it over in between: put its lock back
            with contextlib.suppress(FileExistsError):
                os.link(aside, self.path)
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True


#: Seconds one request of the lock may take (connect and read), and how often a
#: failed one is tried again: a store that stops answering fails the lock's
#: calls within seconds, not after a client's default minutes of retries.
IO_TIMEOUT_SECONDS = 10.0
IO_ATTEMPTS = 2


class _Gcs:
    """A lock object on GCS, every change conditional on the object's generation."""

    def __init__(self, path: str, client: Any):
        from google.cloud.storage.retry import DEFAULT_RETRY

        bucket, _, name = path[len("gs://"):].partition("/")
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

    def read(self) -> tuple[bytes, Any, float] | None:
        from google.api_core.exceptions import NotFound

        try:
            blob = self.blob.bucket.get_blob(self.blob.name, retry=self.retry, **self.io)
            if blob is None:
                return None
            data = blob.download_as_bytes(if_generation_match=blob.generation, retry=self.retry, **self.io)
        except NotFound:
            return None
        updated = blob.updated.timestamp() if blob.updated else _now()
        return data, blob.generation, updated

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


class _S3:
    """A lock object on S3, every change conditional on the object's ETag (its content's MD5).

    The client is Beam's (``--s3_*`` flags, else boto3's own search: environment,
    profile, instance role), so the lock talks to the same endpoint as the job.
    """

    def __init__(self, path: str, client: Any = None):
        self.bucket, _, self.key = path[len("s3://"):].partition("/")
        self.client = client or _s3_client()

    @staticmethod
    def _code(e: Exception) -> str:
        return str(getattr(e, "response", {}).get("Error", {}).get("Code", ""))

    def create(self, data: bytes) -> bool:
        try:
            resp = self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data,
                                          ContentType="application/json", IfNoneMatch="*")
        except Exception as e:
            if self._code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict"):
                return False
            raise
        self.etag = resp["ETag"]
        return True

    def read(self) -> tuple[bytes, Any, float] | None:
        try:
            resp = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except Exception as e:
            if self._code(e) in ("NoSuchKey", "404"):
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
            code = self._code(e)
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


def _s3_client() -> Any:
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


class _Azure:
    """A lock blob on Azure Blob Storage, every change conditional on the blob's ETag.

    The client is Beam's (``--azure_connection_string``, else
    ``$AZURE_STORAGE_CONNECTION_STRING``, else ``--blob_service_endpoint`` with
    ``DefaultAzureCredential``), so the lock talks to the same account as the job.
    A lease would also exclude other writers, but its holder must renew it at
    most every 60 s and a dead holder's lease blocks every other run until it
    expires; the ETag conditions need no renewal and leave the judgement of a
    dead run to the heartbeat, as on the other stores.
    """

    def __init__(self, path: str, client: Any = None):
        from readers._staging_azure import parse_azfs_url

        _, container, name = parse_azfs_url(path)
        self.blob = (client or _azure_client()).get_blob_client(container, name)
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


def _azure_client() -> Any:
    from apache_beam.io.azure.blobstorageio import BlobStorageIO
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    # The options the job set on FileSystems (pipelines.remote.pipeline_options), if any.
    options = getattr(FileSystems, "_pipeline_options", None) or PipelineOptions([])
    return BlobStorageIO(pipeline_options=options).client


class _BeamFs:
    """Any other Beam file system (HDFS): create-if-absent, not atomic (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path

    def create(self, data: bytes) -> bool:
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.exists(self.path):
            return False
        with FileSystems.create(self.path, mime_type="application/json", compression_type="uncompressed") as f:
            f.write(data)
        return True

    def read(self) -> tuple[bytes, Any, float] | None:
        from apache_beam.io.filesystems import FileSystems

        try:
            if not FileSystems.exists(self.path):
                return None
            meta = FileSystems.get_filesystem(self.path).metadata(self.path)  # literal: never globbed
            with FileSystems.open(self.path, compression_type="uncompressed") as f:
                data = f.read()
        except Exception:  # noqa: BLE001 - vanished between listing and reading
            return None
        return data, data, float(meta.last_updated_in_seconds or _now())

    def replace(self, data: bytes, held: Any) -> Any:
        """Delete, then create: Beam's HDFS ``create`` refuses an existing path ("Path already exists")
        and HDFS's rename an existing target. Not atomic (best effort, as on create): a run creating the
        lock in between makes this create fail, and the caller then finds the lock is not its own."""
        from apache_beam.io.filesystems import FileSystems

        if FileSystems.exists(self.path):
            FileSystems.delete([self.path])
        with FileSystems.create(self.path, mime_type="application/json", compression_type="uncompressed") as f:
            f.write(data)
        return data

    def remove_if(self, state: Any) -> bool:
        from apache_beam.io.filesystems import FileSystems

        current = self.read()
        if current is not None and current[1] != state:
            return False
        with contextlib.suppress(Exception):
            FileSystems.delete([self.path])
        return True


def _storage(path: str, gcs_client: Any = None) -> Any:
    if "://" not in path:
        return _Local(path)
    if path.startswith("gs://"):
        if gcs_client is None:
            from apache_beam.io.gcp.gcsio import create_storage_client
            from apache_beam.options.pipeline_options import PipelineOptions

            gcs_client = create_storage_client(PipelineOptions([]))
        return _Gcs(path, gcs_client)
    if path.startswith("s3://"):
        return _S3(path)
    if path.startswith("azfs://"):
        return _Azure(path)
    return _BeamFs(path)


def _lock_path(output: str) -> str:
    return output.rstrip("/") + "/" + LOCK_FILENAME


_parse = parse_lock


def read_lock(output: str, gcs_client: Any = None) -> dict[str, Any] | None:
    """The lock of ``output`` as stored (plus ``_modified``, the object's own time), or None."""
    got = _storage(_lock_path(output), gcs_client).read()
    return None if got is None else _parse(got[0], got[2])


# ---------------------------------------------------------------- the lock

#: The lock's staleness bound in seconds (1 to MAX_STALE_AFTER_SECONDS; the
#: heartbeat is a sixth of it), when a deployment (or a test) must notice dead
#: runs sooner than a minute. An environment setting, not a convert option: it
#: must be the same for every run of an output.
STALE_AFTER_ENV = "RECORDPREP_LOCK_STALE_AFTER"
#: Test hook: a run with this set to a fence's step (``clear``, ``commit-shards``,
#: ...) stops itself with SIGSTOP right before that step's check, once, so a
#: test can take its lock over while it is paused.
PAUSE_ENV = "RECORDPREP_TEST_PAUSE_AT"

_HELD: dict[str, OutputLock] = {}  # output -> the lock this process holds on it


def lock_timing() -> tuple[float, float]:
    """``(heartbeat_seconds, stale_after_seconds)``: the defaults, or from ``$RECORDPREP_LOCK_STALE_AFTER``."""
    raw = os.environ.get(STALE_AFTER_ENV, "").strip()
    if not raw:
        return HEARTBEAT_SECONDS, STALE_AFTER_SECONDS
    try:
        bound = float(raw)
    except ValueError:
        bound = float("nan")
    if not 1.0 <= bound <= MAX_STALE_AFTER_SECONDS:  # NaN fails too
        raise ValueError(f"${STALE_AFTER_ENV} must be a number of seconds from 1 to {MAX_STALE_AFTER_SECONDS:g}, "
                         f"found {raw!r}")
    return bound / 6, bound


class LockLostError(RuntimeError):
    """This run no longer holds its output's lock, or cannot prove it does: it must not
    delete, rename or write anything in the output, and stops."""

    def __init__(self, output: str, why: str, step: str = ""):
        self.output, self.why, self.step = output, why, step
        before = f" before {step.split(' ', 1)[-1].strip('()')}" if step else ""
        super().__init__(
            f"this run stopped{before}: the lock of {output} {why}. It deleted and committed nothing "
            f"from then on; the output belongs to the lock's new holder (if none, re-run the conversion)")


def _key(output: str) -> str:
    return output.rstrip("/")


def _pause_if_asked(step: str) -> None:
    """:data:`PAUSE_ENV`: stop this process before ``step``'s check, once (tests only)."""
    if os.environ.get(PAUSE_ENV) and os.environ[PAUSE_ENV] == step.split(" ", 1)[0]:
        del os.environ[PAUSE_ENV]
        import signal

        log.warning("pausing (SIGSTOP) before %s, as $%s asks", step, PAUSE_ENV)
        os.kill(os.getpid(), signal.SIGSTOP)


def fence(output: str, token: str, max_age: float, step: str) -> None:
    """The check before a destructive step of the run whose lock carries ``token``.

    Returns only if the lock is provably that run's right now; raises
    :class:`LockLostError` otherwise. In the process holding the lock (the
    launcher, or an in-process runner's commit) the proof is a conditional
    refresh (:meth:`OutputLock.check`). Elsewhere (a worker process) it is a
    read: the lock carries ``token`` and a heartbeat at most ``max_age`` old,
    so no other run can take it over for ``stale_after - max_age`` seconds
    (the time the step has). ``step`` is ``"id (what it does)"``; an empty
    ``token`` (no lock) checks nothing.
    """
    if not token:
        return
    held = _HELD.get(_key(output))
    if held is not None and held.owner["token"] == token and held.owner["pid"] == os.getpid():
        held.check(step)
        return
    _pause_if_asked(step)
    try:
        got = _storage(_lock_path(output)).read()
    except Exception as e:  # noqa: BLE001 - unreadable: ownership unproven
        raise LockLostError(output, f"could not be read ({_lock_path(output)}: {_first_line(e)})", step) from e
    lock = _parse(got[0], got[2]) if got else None
    why = _not_ours(lock, token)
    if not why and heartbeat_age(lock or {}) > max_age:
        why = f"has had no heartbeat for {heartbeat_age(lock or {}):.0f} s (this run's own limit is {max_age:g} s)"
    if why:
        raise LockLostError(output, why, step)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _not_ours(lock: dict[str, Any] | None, token: str) -> str:
    """Why ``lock`` (None: absent) is not the one carrying ``token``, or ``""``."""
    if lock is None:
        return "was removed (another run took it over and finished)"
    owner = lock.get("owner") if isinstance(lock.get("owner"), dict) else {}
    if owner.get("token") != token:
        return f"was taken over by {describe_owner(owner)} (started {owner.get('started', '?')})"
    return ""


class OutputLock:
    """The lock of one conversion's output; see the module docstring.

    ``acquire()`` takes it (or raises :class:`LockHeldError`), ``start_heartbeat()``
    starts the daemon thread that refreshes it, ``release()`` stops the thread
    and deletes the lock if it is still ours. As a context manager it does all
    three. The thread starts separately because a launcher may fork worker
    processes after taking the lock, which must happen while it has no thread.

    The lock is *lost* once a refresh finds another run's lock (or none), or
    once no refresh has succeeded for ``lost_after`` seconds (half the
    staleness bound: well before another run may judge it dead). Then
    ``lost`` says why, ``on_lost`` (if set) is called from the heartbeat
    thread, and every :meth:`check` (the fence before each delete, rename or
    commit write) raises :class:`LockLostError`.
    """

    def __init__(self, output: str, *, fingerprint: str = "", version: str = "",
                 heartbeat_seconds: float = HEARTBEAT_SECONDS, stale_after_seconds: float = STALE_AFTER_SECONDS,
                 gcs_client: Any = None):
        if not heartbeat_seconds > 0 or not stale_after_seconds > heartbeat_seconds:
            raise ValueError("the lock needs heartbeat_seconds > 0 and stale_after_seconds > heartbeat_seconds")
        if not stale_after_seconds <= MAX_STALE_AFTER_SECONDS:
            raise ValueError(f"the lock's stale_after_seconds must be at most {MAX_STALE_AFTER_SECONDS:g}")
        self.output = output
        self.path = _lock_path(output)
        self.heartbeat_seconds = float(heartbeat_seconds)
        self.stale_after_seconds = float(stale_after_seconds)
        self.lost_after = self.stale_after_seconds / 2
        self._store = _storage(self.path, gcs_client)
        now = _now()
        self.owner = {
            "host": socket.gethostname(), "pid": os.getpid(), "user": _user(), "started": _iso(now),
            "fingerprint": fingerprint, "version": version, "token": uuid.uuid4().hex,
            "boot_id": boot_id(), "pid_start": process_start(os.getpid()),
        }
        self._held: Any = None  # the storage's state of our lock (bytes, or a GCS generation)
        self._last_ok = 0.0  # time.monotonic() of the last write that proved the lock ours
        self.lost = ""  # why the lock is no longer (provably) ours
        self.on_lost: Callable[[LockLostError], None] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._io = threading.Lock()  # heartbeat, checks and release never write at once
        self.took_over: dict[str, Any] | None = None  # the stale lock replaced, if any

    @property
    def token(self) -> str:
        return self.owner["token"]

    def _document(self) -> bytes:
        now = _now()
        return json.dumps({
            "owner": self.owner, "heartbeat": _iso(now), "heartbeat_unix": now,
            "heartbeat_seconds": self.heartbeat_seconds, "stale_after_seconds": self.stale_after_seconds,
        }, indent=2).encode()

    def acquire(self) -> OutputLock:
        for _ in range(3):  # create; else take over a stale lock and create again
            data = self._document()
            if self._store.create(data):
                self._held = (self._store.blob.generation if isinstance(self._store, _Gcs)
                              else self._store.etag if isinstance(self._store, _S3 | _Azure) else data)
                if isinstance(self._store, _BeamFs):
                    self._check_still_ours()
                self._last_ok = time.monotonic()
                _HELD[_key(self.output)] = self
                return self
            got = self._store.read()
            if got is None:
                continue  # released in between
            lock = _parse(got[0], got[2])
            if not is_stale(lock):
                raise LockHeldError(self.output, lock)
            owner = lock.get("owner") or {}
            log.warning("taking over the lock of %s from a dead conversion (%s, last heartbeat %s)",
                        self.output, describe_owner(owner), lock.get("heartbeat", "never"))
            if self._store.remove_if(got[1]):
                self.took_over = lock
        got = self._store.read()
        raise LockHeldError(self.output, _parse(got[0], got[2]) if got else {})

    def _check_still_ours(self) -> None:
        got = self._store.read()
        lock = _parse(got[0], got[2]) if got else {}
        if (lock.get("owner") or {}).get("token") != self.owner["token"]:
            raise LockHeldError(self.output, lock)

    def start_heartbeat(self) -> None:
        if self._thread is None and self._held is not None:
            self._thread = threading.Thread(target=self._beat, name="recordprep-lock-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                self.refresh()
            except LockLostError as e:
                if self.on_lost is not None and not self._stop.is_set():
                    self.on_lost(e)
                return
            except Exception as e:  # noqa: BLE001 - a missed beat is not fatal; lost_after of them is
                log.warning("could not refresh the lock %s: %s (the run stops if this lasts %g s)",
                            self.path, _first_line(e), self.lost_after)

    def refresh(self) -> None:
        """Rewrite the heartbeat now, only if the lock is still ours (the thread does it every ``heartbeat_seconds``).

        Raises :class:`LockLostError` once the lock is lost (see the class
        docstring); another error of the store is one missed beat and passes.
        """
        with self._io:
            if self.lost:
                raise LockLostError(self.output, self.lost)
            if self._held is None:
                return
            try:
                # Read first on every store: a precondition alone would let a store (or emulator)
                # that ignores it overwrite another run's lock.
                got = self._store.read()
                why = _not_ours(_parse(got[0], got[2]) if got else None, self.token)
                if why:
                    self._lose(why, drop=True)
                self._held = self._store.replace(self._document(), self._held)
            except LockLostError:
                raise
            except Exception as e:
                self._judge_failure(e)
                raise
            self._last_ok = time.monotonic()

    def _judge_failure(self, e: Exception) -> None:
        """After a failed refresh: lose the lock if another run has it, or if none succeeded for ``lost_after``."""
        try:
            got = self._store.read()
            why = _not_ours(_parse(got[0], got[2]) if got else None, self.token)
        except Exception:  # noqa: BLE001 - the store does not answer: judged by time alone
            why = ""
        if why:
            self._lose(why, drop=True)
        silent = time.monotonic() - self._last_ok
        if silent > self.lost_after:
            self._lose(f"could not be refreshed for {silent:.0f} s ({self.path}: {_first_line(e)}), so this "
                       f"run cannot prove it still holds it", drop=False)

    def _lose(self, why: str, *, drop: bool) -> None:
        """Mark the lock lost (``drop``: it is another run's now, never to be deleted by this one); raise."""
        self.lost = why
        if drop:
            self._held = None
        log.error("the lock %s %s; this run stops before it deletes or commits anything more", self.path, why)
        raise LockLostError(self.output, why)

    def check(self, step: str) -> None:
        """The fence before a destructive step: return only once a conditional refresh proved the lock ours.

        A store error is tried again until the lock is lost (``lost_after``
        without a successful refresh). Raises :class:`LockLostError`.
        """
        _pause_if_asked(step)
        while True:
            if self._held is None and not self.lost:
                raise LockLostError(self.output, "is not held by this run", step)
            try:
                self.refresh()
                return
            except LockLostError as e:
                raise LockLostError(self.output, e.why, step) from None
            except Exception:  # noqa: BLE001 - one failed refresh; _judge_failure decides when it is lost
                time.sleep(min(1.0, self.heartbeat_seconds / 2))

    def still_ours(self) -> bool:
        """One read: whether the lock is provably ours now (False on any error).

        Ours: it carries this run's token and a heartbeat at most
        ``lost_after`` old. A read, not a refresh, so that a run failing on
        a full disk (no room for the heartbeat) still records its failure.
        """
        with self._io:
            if self.lost or self._held is None:
                return False
            try:
                got = self._store.read()
            except Exception:  # noqa: BLE001 - unproven is not ours
                return False
        lock = _parse(got[0], got[2]) if got else None
        return not _not_ours(lock, self.token) and heartbeat_age(lock or {}) <= self.lost_after

    def release(self) -> None:
        """Stop the heartbeat and delete the lock if it is still ours; never raises."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if _HELD.get(_key(self.output)) is self:
            del _HELD[_key(self.output)]
        with self._io:
            held, self._held = self._held, None
            if held is None:
                return
            try:
                if not isinstance(self._store, _Gcs | _S3 | _Azure):
                    got = self._store.read()
                    if got is None or (_parse(got[0], got[2]).get("owner") or {}).get("token") != self.owner["token"]:
                        return
                    held = got[1]
                self._store.remove_if(held)
            except Exception as e:  # noqa: BLE001 - the run's own outcome matters more
                log.warning("could not remove the lock %s: %s; the next run takes it over once stale", self.path, e)

    def __enter__(self) -> OutputLock:
        self.acquire()
        self.start_heartbeat()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
