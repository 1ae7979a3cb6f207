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
(:data:`stores.IO_TIMEOUT_SECONDS`), so a dead store makes the lock lost, not a
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
second can both pass. Each store's calls live in its module of :mod:`stores`
(``lock_object``); this module keeps the protocol. Clock skew between hosts
and the take-over steps: docs/operations.md#one-conversion-per-output.
"""

from __future__ import annotations

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
from stores import LockObject, store_for

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


def _storage(path: str, gcs_client: Any = None) -> LockObject:
    """The lock file at ``path`` on its store (``stores``: one module per scheme, each with its
    conditional create / replace / delete); ``gcs_client`` is used on ``gs://``."""
    return store_for(path).lock_object(path, gcs_client)


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
        self._held: Any = None  # the storage's state of our lock (bytes, a GCS generation, an ETag)
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
                self._held = self._store.created_state(data)
                if getattr(self._store, "atomic_create", True) is False:  # another run may have created it too
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
                if getattr(self._store, "conditional", False) is not True:  # the delete checks nothing itself
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
