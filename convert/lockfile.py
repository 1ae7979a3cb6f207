"""The output lock's on-disk format, ``OUTPUT/_LOCK.json``, and how to tell a live run from a dead one.

A conversion writes the lock (``pipelines.lock``) before it clears or
writes anything and removes it when it ends; while it lives, a thread
rewrites its heartbeat. Three readers judge it the same way, so the rules
live here, in pure Python (no Beam, no TensorFlow): the next conversion
(which takes a dead run's lock over), ``recordprep wait`` and
``readers.wait_for_dataset`` (which report a dead run instead of waiting out
their timeout).

The document::

    {"owner": {"host", "pid", "user", "started", "fingerprint", "version",
               "token", "boot_id", "pid_start"},
     "heartbeat": ISO time, "heartbeat_unix": seconds,
     "heartbeat_seconds": the refresh period, "stale_after_seconds": the bound}

A run is dead when its heartbeat is older than the bound (the lock's own
``stale_after_seconds``, at most :data:`MAX_STALE_AFTER_SECONDS`, unless the
reader chooses another), or when it ran on this host (same boot) and its
process is gone. A heartbeat's age is the reader's clock minus the older of
the heartbeat and ``_modified`` (the object's time as the store, or the
watching reader, saw it written): a heartbeat stamped in the future by a
host whose clock is ahead therefore still ages, and a run that stops
rewriting its lock is judged dead however wrong its clock was. A writer
whose clock lags by more than the bound looks dead early; the run that
then loses its lock stops before deleting or committing anything
(``pipelines.lock.fence``).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

LOCK_FILENAME = "_LOCK.json"
#: How often a live run rewrites its heartbeat: often enough that a dead run is
#: noticed within a minute, rarely enough to cost nothing (one small write).
HEARTBEAT_SECONDS = 10.0
#: A heartbeat older than this means the run is dead: six missed beats, far
#: more than a stalled write or a long GC pause takes, and room for clock skew.
STALE_AFTER_SECONDS = 60.0
#: The largest bound a lock may record: a larger (absurd, or damaged) one is
#: cut to this, so a dead run's lock is always taken over within the hour.
MAX_STALE_AFTER_SECONDS = 3600.0


def parse_lock(data: bytes, modified: float) -> dict[str, Any]:
    """The lock document, plus ``_modified`` (when the object was last written, Unix seconds).

    A lock that does not parse as a JSON object (being created, or damaged)
    is ``{"_modified": modified}``: judged by that age alone.
    """
    try:
        lock = json.loads(data)
    except (ValueError, RecursionError):
        lock = None
    if not isinstance(lock, dict):
        lock = {}
    lock["_modified"] = modified
    return lock


def describe_owner(owner: dict[str, Any]) -> str:
    """``pid 123 of alice on host-a (recordprep 1.2)``."""
    return (f"pid {owner.get('pid', '?')} of {owner.get('user', '?')} on {owner.get('host', '?')} "
            f"(recordprep {owner.get('version', '?')})")


def boot_id() -> str:
    """This boot of this host (Linux), else ``""``: a pid means nothing across reboots."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), else ``""``: tells a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def owner_gone(owner: dict[str, Any]) -> str:
    """Why the owner's process is known to be gone (it ran on this host), else ``""``."""
    if owner.get("host") != socket.gethostname():
        return ""
    boot = boot_id()
    if boot and owner.get("boot_id") and owner["boot_id"] != boot:
        return "this host rebooted since it started"
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid < 2**31:  # os.kill overflows past it
        return ""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process {pid} is gone"
    except (PermissionError, OSError):
        return ""  # exists (another user's process)
    started = process_start(pid)
    if started and owner.get("pid_start") and started != owner["pid_start"]:
        return f"its process {pid} is gone (the pid now belongs to another process)"
    return ""


def stale_bound(lock: dict[str, Any]) -> float:
    """The bound the lock's run recorded (at most :data:`MAX_STALE_AFTER_SECONDS`), or :data:`STALE_AFTER_SECONDS`."""
    bound = _number(lock.get("stale_after_seconds"))
    return min(bound, MAX_STALE_AFTER_SECONDS) if bound is not None and bound > 0 else STALE_AFTER_SECONDS


def _number(x: Any) -> float | None:
    """``x`` as a float (an int too large for one is infinite); None for anything else or NaN."""
    if not isinstance(x, int | float) or isinstance(x, bool):
        return None
    try:
        f = float(x)
    except OverflowError:
        f = float("inf") if x > 0 else float("-inf")
    return None if f != f else f


def _beat(lock: dict[str, Any]) -> float | None:
    return _number(lock.get("heartbeat_unix"))


def _secs(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def heartbeat_age(lock: dict[str, Any], now: float | None = None) -> float:
    """Seconds since the last heartbeat (or since an unreadable lock was written).

    The heartbeat counts from the older of its own stamp and ``_modified``:
    a stamp in the future (the writer's clock is ahead) does not keep a
    lock young once it stops changing.
    """
    now = time.time() if now is None else now
    beat = _beat(lock)
    modified = _number(lock.get("_modified"))
    seen = now if modified is None else modified
    return now - (seen if beat is None else min(beat, seen))


def why_dead(lock: dict[str, Any], now: float | None = None, stale_after: float | None = None) -> str:
    """Why the run holding ``lock`` is dead (``"no heartbeat for 75 s"``), or ``""`` if it may be alive.

    ``stale_after`` overrides the lock's own bound (:func:`stale_bound`).
    """
    age = heartbeat_age(lock, now)
    owner = lock.get("owner")
    gone = owner_gone(owner) if isinstance(owner, dict) else ""
    if gone:  # certain, so said first
        return f"{gone} (last heartbeat {_secs(max(age, 0.0))} s ago)"
    bound = stale_bound(lock) if stale_after is None else stale_after
    if age > bound:
        what = "heartbeat" if _beat(lock) is not None else "readable heartbeat (the lock is damaged)"
        return f"no {what} for {_secs(age)} s (the limit is {bound:g} s)"
    return ""


def is_stale(lock: dict[str, Any], now: float | None = None, stale_after: float | None = None) -> bool:
    """Whether ``lock`` belongs to a dead run (see :func:`why_dead`)."""
    return bool(why_dead(lock, now, stale_after))


__all__ = [
    "HEARTBEAT_SECONDS",
    "LOCK_FILENAME",
    "MAX_STALE_AFTER_SECONDS",
    "STALE_AFTER_SECONDS",
    "describe_owner",
    "heartbeat_age",
    "is_stale",
    "owner_gone",
    "parse_lock",
    "stale_bound",
    "why_dead",
]
