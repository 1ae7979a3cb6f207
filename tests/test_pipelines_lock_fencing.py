"""A run that lost its output's lock deletes and commits nothing (issue 44, item 1), locally; the
judgement of a dead run with a wrong clock or an absurd bound; a lock whose refreshes fail."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _lock_fencing import split_brain_is_refused
from _pipelines_data import make_records, write_dataset

from convert.lockfile import MAX_STALE_AFTER_SECONDS, is_stale, parse_lock, stale_bound
from pipelines.lock import LOCK_FILENAME, LockHeldError, LockLostError, OutputLock, fence


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["clear", "commit-shards", "commit-metadata"])
def test_a_paused_run_whose_lock_was_taken_over_stops_without_touching_the_output(tmp_path, stage):
    data = write_dataset(tmp_path / "d", make_records(600))
    out = tmp_path / "out"
    err = split_brain_is_refused(data, str(out), lambda: _files(out), stage)
    assert "was removed (another run took it over and finished)" in err, err


# ------------------------------------------------------------------ the fence itself


def test_the_fence_passes_for_the_holder_and_refuses_once_another_run_took_over(tmp_path):
    out = str(tmp_path / "out")
    lock = OutputLock(out, heartbeat_seconds=0.5, stale_after_seconds=3).acquire()
    fence(out, lock.token, lock.lost_after, "commit-shards (renaming)")  # the holder (this process)
    lock.release()
    other = OutputLock(out, heartbeat_seconds=0.5, stale_after_seconds=3).acquire()
    with pytest.raises(LockLostError, match=r"stopped before renaming: the lock of .* was taken over by pid"):
        fence(out, lock.token, lock.lost_after, "commit-shards (renaming)")  # as a worker would check it
    other.release()


def test_a_holder_whose_lock_was_replaced_loses_it_and_never_removes_the_new_one(tmp_path):
    out = tmp_path / "out"
    lock = OutputLock(str(out), heartbeat_seconds=0.5, stale_after_seconds=3).acquire()
    (out / LOCK_FILENAME).write_text(json.dumps({"owner": {"user": "bob", "token": "b"}, "heartbeat_unix": time.time()}))
    with pytest.raises(LockLostError, match="taken over by pid . of bob"):
        lock.check("clear (clearing the previous dataset)")
    assert lock.lost and not lock.still_ours()
    with pytest.raises(LockLostError):
        lock.check("commit-metadata (writing dataset_info.json)")  # every later step too
    lock.release()
    assert json.loads((out / LOCK_FILENAME).read_text())["owner"]["user"] == "bob"


def test_a_worker_fence_refuses_an_old_heartbeat_even_when_the_token_is_ours(tmp_path):
    out = str(tmp_path / "out")
    lock = OutputLock(out, heartbeat_seconds=0.5, stale_after_seconds=3).acquire()
    path = tmp_path / "out" / LOCK_FILENAME
    doc = json.loads(path.read_text())
    doc["heartbeat_unix"] = time.time() - 10
    path.write_text(json.dumps(doc))
    os.utime(path, (time.time() - 10, time.time() - 10))
    from pipelines import lock as lock_module

    lock_module._HELD.clear()  # as seen from another process
    with pytest.raises(LockLostError, match="no heartbeat for 10 s"):
        fence(out, lock.token, lock.lost_after, "commit-tmp (removing the temp files)")
    lock.release()


class _DeadStore:
    """A store that stopped answering after the lock was taken."""

    def __init__(self, store):
        self.store, self.dead = store, False

    def __getattr__(self, name):
        real = getattr(self.store, name)

        def call(*a, **k):
            if self.dead:
                raise ConnectionError("connection refused")
            return real(*a, **k)
        return call


def test_a_lock_that_cannot_be_refreshed_is_lost_after_half_the_bound_and_the_run_is_told(tmp_path):
    out = str(tmp_path / "out")
    lock = OutputLock(out, heartbeat_seconds=0.2, stale_after_seconds=1.2)
    lock._store = _DeadStore(lock._store)
    told = []
    lock.on_lost = told.append
    lock.acquire()
    lock.start_heartbeat()
    lock._store.dead = True
    deadline = time.monotonic() + 60
    while not told and time.monotonic() < deadline:
        time.sleep(0.05)
    assert told and isinstance(told[0], LockLostError), lock.lost
    assert "could not be refreshed for" in lock.lost and "connection refused" in lock.lost
    with pytest.raises(LockLostError, match="cannot prove it still holds it"):
        lock.check("commit-shards (renaming the shards into place)")
    lock._store.dead = False
    lock.release()  # its own lock, never taken over: removed
    assert not (tmp_path / "out" / LOCK_FILENAME).exists()


# ------------------------------------------------------------------ judging a dead run


def test_a_heartbeat_in_the_future_still_ages_by_the_stores_time():
    now = time.time()
    lock = parse_lock(json.dumps({"owner": {"host": "elsewhere", "pid": 1}, "heartbeat_unix": now + 86400,
                                  "stale_after_seconds": 60}).encode(), now - 120)
    assert is_stale(lock, now)  # written 120 s ago by a host whose clock is a day ahead
    fresh = parse_lock(json.dumps({"owner": {"host": "elsewhere", "pid": 1}, "heartbeat_unix": now + 86400}).encode(), now)
    assert not is_stale(fresh, now)


@pytest.mark.parametrize("bound", [1e12, float("inf"), 10 ** 400])
def test_an_absurd_bound_is_cut(bound):
    assert stale_bound({"stale_after_seconds": bound}) == MAX_STALE_AFTER_SECONDS
    now = time.time()
    lock = {"owner": {"host": "elsewhere", "pid": 1}, "heartbeat_unix": now - 2 * MAX_STALE_AFTER_SECONDS,
            "stale_after_seconds": bound, "_modified": now - 2 * MAX_STALE_AFTER_SECONDS}
    assert is_stale(lock, now)


def test_a_future_lock_on_disk_is_taken_over_once_its_file_is_old(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    path = out / LOCK_FILENAME
    path.write_text(json.dumps({"owner": {"host": "elsewhere", "pid": 1, "user": "bob"},
                                "heartbeat_unix": time.time() + 86400, "stale_after_seconds": 1e12}))
    with pytest.raises(LockHeldError, match="taken over once its heartbeat is 3600 s old"):
        OutputLock(str(out)).acquire()  # written just now: alive
    os.utime(path, (time.time() - 7200, time.time() - 7200))
    with OutputLock(str(out)) as lock:
        assert lock.took_over["owner"]["user"] == "bob"


def test_wait_reports_a_run_whose_heartbeat_lies_in_the_future_once_it_stops_changing(tmp_path):
    import readers

    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILENAME).write_text(json.dumps({
        "owner": {"host": "elsewhere", "pid": 1, "user": "bob", "started": "then"},
        "heartbeat_unix": time.time() + 86400, "heartbeat_seconds": 0.1, "stale_after_seconds": 1e12}))
    # judged by this reader's own clock: the lock has not changed for longer than the limit
    with pytest.raises(readers.DatasetDeadError, match="appears dead: no heartbeat for"):
        readers.wait_for_dataset(str(out), timeout=120, poll=0.1, stale_after=1)
