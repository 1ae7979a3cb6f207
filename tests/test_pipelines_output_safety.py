"""Output safety (issue 24): a conversion never deletes user data, one conversion
writes an output at a time, and every failed run says so in ``_FAILURE.json``."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import fastavro
import pytest
from _pipelines_data import SCHEMA, make_records, write_dataset
from typer.testing import CliRunner

from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from pipelines.cli import app
from pipelines.interrupt import Interrupted
from pipelines.lock import LOCK_FILENAME

runner = CliRunner()
RECORDPREP = Path(sys.executable).with_name("recordprep")
TMP = ".recordprep-tmp"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(80))


def _convert(*args: str) -> object:
    return runner.invoke(app, ["convert", *args, "--workers", "1", "--no-progress"])


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _other_config(data, tmp_path) -> Path:
    cfg = tmp_path / "other.yaml"
    cfg.write_text(Path(data["config"]).read_text().replace("buckets: 64", "buckets: 32"))
    return cfg


# ------------------------------------------------------------------ 1a: inputs are never the output


@pytest.mark.parametrize("case", ["same_dir", "input_file_inside", "inside_input_dir", "symlink_to_input_dir"])
def test_an_output_overlapping_an_input_is_refused_before_anything_is_written(data, tmp_path, case):
    same = tmp_path / "same"
    shutil.copytree(Path(data["config"]).parent, same)
    before = _snapshot(same)
    inputs, output = {
        "same_dir": (f"{same}/", str(same)),
        "input_file_inside": (str(same / "part-0.jsonl"), str(tmp_path)),
        "inside_input_dir": (str(same), str(same / "out")),
        "symlink_to_input_dir": (f"{same}/", str(tmp_path / "link")),
    }[case]
    if case == "symlink_to_input_dir":
        (tmp_path / "link").symlink_to(same)
    for extra in ([], ["--overwrite"]):
        r = _convert("-i", inputs, "-c", str(data["config"]), "-o", output, *extra)
        assert r.exit_code == 2, r.output
        assert "write to another directory" in r.output and "Traceback" not in r.output
    assert _snapshot(same) == before  # nothing written, nothing deleted
    assert not (same / "out").exists() and not (same / TMP).exists()


def test_an_output_that_is_a_file_is_refused(data, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(tmp_path / "notes.txt"))
    assert r.exit_code == 2 and "is a file, not a directory" in r.output, r.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("depth", [["out"], ["a", "b"]])
def test_an_output_under_a_file_is_refused_before_any_work(data, tmp_path, depth):
    (tmp_path / "notes.txt").write_text("mine")
    output = tmp_path.joinpath("notes.txt", *depth)
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(output))
    assert r.exit_code == 2, r.output
    assert f"lies under {tmp_path / 'notes.txt'}, a file, not a directory" in r.output and "Traceback" not in r.output
    assert _snapshot(tmp_path) == {"notes.txt": b"mine"}


@pytest.fixture
def read_only_dir(tmp_path):
    """A real read-only file system (root ignores permission bits, not a read-only mount)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True, timeout=30)


@pytest.mark.parametrize("sub", [[], ["out"], ["a", "b"]])
def test_an_output_on_a_read_only_file_system_is_refused_before_any_work(data, read_only_dir, sub):
    output = read_only_dir.joinpath(*sub)
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(output))
    assert r.exit_code == 2, r.output
    assert f"{read_only_dir} is on a read-only file system; write the dataset to a writable directory" in r.output
    assert "Traceback" not in r.output and not list(read_only_dir.iterdir())


def test_an_output_next_to_the_inputs_is_fine(data, tmp_path):
    same = tmp_path / "same"
    shutil.copytree(Path(data["config"]).parent, same)
    r = _convert("-i", str(same / "*.jsonl"), "-c", str(data["config"]), "-o", str(same / "out"))
    assert r.exit_code == 0, r.output
    assert (same / "out" / METADATA_FILENAME).exists()


# ------------------------------------------------------------------ 1b: --overwrite deletes only ours


def test_overwrite_refuses_unknown_files_and_deletes_nothing(data, tmp_path):
    out = tmp_path / "out"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2")
    assert r.exit_code == 0, r.output
    (out / "notes.txt").write_text("mine")
    (out / "mine").mkdir()
    (out / "mine" / "model.h5").write_bytes(b"\x00weights")
    (out / "vocab" / "keep" ).mkdir()
    (out / "vocab" / "keep" / "mine.csv").write_text("a,b\n")
    before = _snapshot(out)
    r = _convert("-i", str(data["json"]), "-c", str(_other_config(data, tmp_path)), "-o", str(out), "--overwrite")
    assert r.exit_code == 1, r.output
    assert "3 file(s) no recordprep run wrote" in r.output
    assert "notes.txt" in r.output and "mine/model.h5" in r.output and "vocab/keep/mine.csv" in r.output
    assert "nothing was deleted" in r.output
    assert _snapshot(out) == before  # the old dataset and the user's files, byte-identical
    assert not (out / LOCK_FILENAME).exists() and not (out / FAILURE_FILENAME).exists()


def test_overwrite_lists_the_first_unknown_files_and_their_count(data, tmp_path):
    out = tmp_path / "out"
    assert _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out)).exit_code == 0
    for i in range(12):
        (out / f"user-{i:02d}.csv").write_text(str(i))
    r = _convert("-i", str(data["json"]), "-c", str(_other_config(data, tmp_path)), "-o", str(out), "--overwrite")
    assert r.exit_code == 1
    assert "12 file(s)" in r.output and "user-00.csv" in r.output and "and 7 more" in r.output
    assert "user-11.csv" not in r.output


def test_overwrite_replaces_everything_a_previous_run_wrote(data, tmp_path):
    out = tmp_path / "out"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "3")
    assert r.exit_code == 0, r.output
    # what earlier, interrupted or failed runs may have left: recordprep's own names
    (out / "train-00007-of-00009.tfrecord.gz").write_bytes(b"old")
    (out / "vocab" / "gone_feature.txt").write_text("x\n")
    (out / "errors").mkdir()
    (out / "errors" / "errors-00000-of-00004.jsonl").write_text("{}\n")
    (out / TMP).mkdir()
    (out / TMP / "prepared-00000-deadbeef.bin").write_bytes(b"junk")
    (out / "analysis.json.tmp-0123abcd").write_text("{}")
    r = _convert("-i", str(data["json"]), "-c", str(_other_config(data, tmp_path)), "-o", str(out),
                 "--overwrite", "--num-shards", "1")
    assert r.exit_code == 0, r.output
    left = sorted(_snapshot(out))
    info = json.loads((out / METADATA_FILENAME).read_text())
    listed = {sh["file"] for sp in info["splits"].values() for sh in sp["shards"]}
    listed |= {v["file"] for v in info["vocabularies"].values()} | {METADATA_FILENAME, "analysis.json", info["stats_file"]}
    assert set(left) == listed, left
    assert all("-of-00001" in name for name in left if ".tfrecord" in name)


def test_a_rerun_into_an_output_with_user_files_is_still_a_no_op(data, tmp_path):
    out = tmp_path / "out"
    assert _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out)).exit_code == 0
    (out / "README.txt").write_text("my notes")
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--overwrite")
    assert r.exit_code == 0 and "nothing to do" in r.output
    assert (out / "README.txt").read_text() == "my notes"


def test_a_new_output_holding_files_under_the_converters_names_is_refused(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000-of-00009.tfrecord.gz").write_bytes(b"another tool's shard")
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2")
    assert r.exit_code == 1 and "train-00000-of-00009.tfrecord.gz" in r.output and "nothing was deleted" in r.output, r.output
    assert _snapshot(out) == before


def test_leftovers_of_a_failed_run_are_cleaned_by_the_next_one(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000-of-00009.tfrecord.gz").write_bytes(b"renamed before the run died")
    (out / FAILURE_FILENAME).write_text(json.dumps({"reason": "died"}))
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2")
    assert r.exit_code == 0, r.output
    assert not (out / "train-00000-of-00009.tfrecord.gz").exists() and not (out / FAILURE_FILENAME).exists()


def test_an_output_path_with_glob_characters_is_taken_literally(data, tmp_path):
    (tmp_path / "out1").mkdir()  # what a glob 'out[1]' would match
    (tmp_path / "out1" / "train-00000-of-00002.tfrecord.gz").write_bytes(b"not ours")
    out = tmp_path / "out[1]"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2")
    assert r.exit_code == 0, r.output
    info = json.loads((out / METADATA_FILENAME).read_text())
    for sp in info["splits"].values():
        for sh in sp["shards"]:
            assert (out / sh["file"]).stat().st_size == sh["num_bytes"]
    assert not (out / TMP).exists()
    assert (tmp_path / "out1" / "train-00000-of-00002.tfrecord.gz").read_bytes() == b"not ours"
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------ 2: one conversion per output


def _cli(data, out, *extra: str) -> list[str]:
    return [str(RECORDPREP), "convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out),
            "--num-shards", "4", "--batch-size", "200", "--workers", "1", *extra]


def _start_holding_lock(data, out: Path, until: str = LOCK_FILENAME) -> subprocess.Popen:
    """A conversion in a child process, returned once ``out / until`` exists (by default
    once it holds the output's lock; ``TMP``: once it writes), or it has ended."""
    p = subprocess.Popen(_cli(data, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / until).exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return p


@pytest.mark.slow
def test_two_conversions_into_one_output_at_once(tmp_path):
    data = write_dataset(tmp_path / "d", make_records(6000))
    out = tmp_path / "out"
    first = _start_holding_lock(data, out)
    # Paused while it holds the lock, so the second run meets it however loaded the machine is.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(_cli(data, out), capture_output=True, text=True, timeout=300)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    rc, _, err = first.wait(timeout=300), *first.communicate()
    assert rc == 0, err
    refused = second.stderr + second.stdout
    assert second.returncode == 1, refused
    assert f"being written by another conversion: pid {first.pid} of" in refused, refused
    assert socket.gethostname() in refused and "running since" in refused and "Traceback" not in refused
    assert not (out / TMP).exists() and not (out / LOCK_FILENAME).exists() and not (out / FAILURE_FILENAME).exists()
    v = subprocess.run([str(RECORDPREP), "verify", str(out)], capture_output=True, text=True, timeout=120)
    assert v.returncode == 0, v.stdout + v.stderr


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _write_lock(out: Path, *, pid: int, age_s: float) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    beat = time.time() - age_s
    lock = {"owner": {"host": socket.gethostname(), "pid": pid, "user": "someone", "started": "2026-11-24T01:02:03+00:00",
                      "fingerprint": "f" * 64, "version": "0.0", "token": "t"},
            "heartbeat": "2026-11-24T01:02:03+00:00", "heartbeat_unix": beat,
            "heartbeat_seconds": 10.0, "stale_after_seconds": 60.0}
    (out / LOCK_FILENAME).write_text(json.dumps(lock))
    return lock


def test_a_live_lock_refuses_the_run_naming_its_owner(data, tmp_path):
    out = tmp_path / "out"
    lock = _write_lock(out, pid=os.getpid(), age_s=1)
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))
    assert r.exit_code == 1, r.output
    assert f"pid {os.getpid()} of someone on {socket.gethostname()}" in r.output
    assert "running since 2026-11-24T01:02:03" in r.output
    assert json.loads((out / LOCK_FILENAME).read_text()) == lock  # the owner's lock is left alone
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILENAME]  # no temp files, no failure marker
    # a dry run takes no lock: it runs beside the owner
    r = runner.invoke(app, ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / LOCK_FILENAME).read_text()) == lock


@pytest.mark.parametrize("stale", ["old_heartbeat", "dead_pid_on_this_host"])
def test_a_stale_lock_is_taken_over_with_a_warning(data, tmp_path, stale):
    out = tmp_path / "out"
    # an old heartbeat (whatever the pid), or a fresh one whose process is gone
    _write_lock(out, pid=_dead_pid() if stale == "dead_pid_on_this_host" else os.getpid(),
                age_s=3600 if stale == "old_heartbeat" else 1)
    r = subprocess.run(_cli(data, out), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "taking over the lock" in r.stderr and "someone" in r.stderr
    assert (out / METADATA_FILENAME).exists() and not (out / LOCK_FILENAME).exists()


# ------------------------------------------------------------------ 3, 4: every failed run says so


def _assert_failed_cleanly(out: Path, reason: str) -> None:
    marker = json.loads((out / FAILURE_FILENAME).read_text())
    assert reason in marker["reason"] and "\n" not in marker["reason"], marker
    assert not (out / TMP).exists() and not (out / LOCK_FILENAME).exists()
    assert not (out / METADATA_FILENAME).exists()
    r = runner.invoke(app, ["wait", str(out), "--timeout", "5", "--poll", "0.1"])
    assert r.exit_code == 1 and reason in r.output and "still incomplete" not in r.output, r.output  # not the timeout


def test_a_truncated_avro_input_leaves_a_failure_marker(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    with open(src / "t.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, make_records(300), codec="deflate", sync_interval=2000)
    whole = (src / "t.avro").read_bytes()
    (src / "t.avro").write_bytes(whole[: len(whole) * 2 // 3])
    cfg = tmp_path / "features.yaml"
    cfg.write_text(Path(write_dataset(tmp_path / "d", make_records(2))["config"]).read_text())
    out = tmp_path / "out"
    r = _convert("-i", str(src / "t.avro"), "-c", str(cfg), "-o", str(out))
    assert r.exit_code == 1, r.output
    assert "t.avro" in r.output and "Traceback" not in r.output
    _assert_failed_cleanly(out, "t.avro")


def test_an_exception_in_the_commit_leaves_a_failure_marker_and_no_shards(data, tmp_path, monkeypatch):
    from pipelines import commit

    real = commit._rename_replacing

    def broken_rename(src, dst):  # the shards' renames fail, the rest works
        if any(".tfrecord" in d for d in dst):
            raise OSError("injected rename failure")
        real(src, dst)

    monkeypatch.setattr(commit, "_rename_replacing", broken_rename)
    out = tmp_path / "out"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--num-shards", "2")
    assert r.exit_code == 1 and "injected rename failure" in r.output, r.output
    _assert_failed_cleanly(out, "injected rename failure")
    assert not list(out.glob("*.tfrecord*"))


def test_a_config_that_fails_at_commit_places_no_shards_before_it_fails(data, tmp_path, monkeypatch):
    """Anything that can fail on the config (metadata, feature specs) is built before
    the first shard is renamed into the output."""
    from pipelines import commit

    def too_big(*a, **k):
        raise MemoryError("injected: num_oov_buckets too large")

    monkeypatch.setattr(commit, "DatasetInfo", too_big)
    out = tmp_path / "out"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))
    assert r.exit_code == 1, r.output
    _assert_failed_cleanly(out, "MemoryError: injected")
    assert sorted(p.name for p in out.iterdir()) == [FAILURE_FILENAME]  # no shards, vocabularies, analysis
    monkeypatch.undo()
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))  # the next run just works
    assert r.exit_code == 0, r.output
    assert not (out / FAILURE_FILENAME).exists()


def test_after_a_full_disk_temp_files_go_before_the_marker_is_written(data, tmp_path, monkeypatch):
    """The clean-up order, with ENOSPC injected in the commit (the real full disk is below)."""
    from pipelines import commit, job

    real = commit._rename_replacing

    def full(src, dst):
        if any(".tfrecord" in d for d in dst):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(src, dst)

    calls = []
    cleanup, write = job.cleanup_tmp, job.write_atomic

    def record_cleanup(out):
        calls.append(("cleanup", (Path(out) / TMP).exists()))
        cleanup(out)

    def record_write(path, payload):
        calls.append(("marker", (Path(path).parent / TMP).exists()))
        write(path, payload)

    monkeypatch.setattr(commit, "_rename_replacing", full)
    monkeypatch.setattr(job, "cleanup_tmp", record_cleanup)
    monkeypatch.setattr(job, "write_atomic", record_write)
    out = tmp_path / "out"
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))
    assert r.exit_code == 1, r.output
    assert calls == [("cleanup", True), ("marker", False)]
    _assert_failed_cleanly(out, "No space left on device")


@pytest.mark.slow
def test_an_interrupted_run_leaves_a_failure_marker(tmp_path):
    data = write_dataset(tmp_path / "d", make_records(6000))
    out = tmp_path / "out"
    p = _start_holding_lock(data, out, until=TMP)
    p.send_signal(signal.SIGINT)  # Ctrl-C, once the run writes the output
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    _assert_failed_cleanly(out, "interrupted")


def _interrupt_in(monkeypatch, name: str, *, done: bool) -> None:
    """Ctrl-C arriving while ``pipelines.job.<name>`` runs: before it did anything, or
    once it ``done`` its work."""
    from pipelines import job

    real = getattr(job, name)

    def interrupted(*args, **kwargs):
        if done:
            real(*args, **kwargs)
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(job, name, interrupted)


def test_a_run_interrupted_while_taking_the_lock_releases_it(data, tmp_path, monkeypatch):
    """Ctrl-C just after the lock file is made: the lock is removed, and no marker is left
    (nothing was written; the output's files were not checked yet)."""
    from pipelines import lock

    real = lock.OutputLock.acquire

    def acquire(self):
        real(self)
        assert (tmp_path / "out" / LOCK_FILENAME).exists()
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(lock.OutputLock, "acquire", acquire)
    with pytest.raises(Interrupted):  # main() turns it into exit code 130
        _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(tmp_path / "out"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == []


def test_a_run_interrupted_while_checking_the_output_leaves_it_as_it_was(data, tmp_path, monkeypatch):
    """Ctrl-C while the output's files are checked: no marker, since a marker makes the next
    run take files there for a failed run's leftovers; the lock is released."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000-of-00001.tfrecord.gz").write_bytes(b"someone else's")
    _interrupt_in(monkeypatch, "_check_output", done=False)
    with pytest.raises(Interrupted):
        _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["train-00000-of-00001.tfrecord.gz"]
    monkeypatch.undo()
    r = _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out))
    assert r.exit_code == 1 and "nothing was deleted" in r.output, r.output


def test_a_run_interrupted_while_clearing_the_previous_dataset_leaves_a_failure_marker(data, tmp_path, monkeypatch):
    out = tmp_path / "out"
    assert _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out)).exit_code == 0
    _interrupt_in(monkeypatch, "_clear_previous", done=True)
    with pytest.raises(Interrupted):
        _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--force")
    _assert_failed_cleanly(out, "interrupted by SIGINT")


def test_an_overwrite_reads_the_previous_metadata_once_under_the_lock(data, tmp_path, monkeypatch):
    """The check under the lock reads the output's metadata once (each read is a round trip on
    gs://): one read before the lock (nothing to do?), one under it, and the new dataset's after the run."""
    from pipelines import job

    out = tmp_path / "out"
    assert _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out)).exit_code == 0
    reads: list[str] = []
    real = job.read_existing
    monkeypatch.setattr(job, "read_existing", lambda output: reads.append(output) or real(output))
    r = _convert("-i", str(data["json"]), "-c", str(_other_config(data, tmp_path)), "-o", str(out), "--overwrite")
    assert r.exit_code == 0, r.output
    assert len(reads) == 3, reads


@contextlib.contextmanager
def _tmpfs(path: Path, size: str):
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs (a disk that fills up) needs root")
def test_a_full_disk_leaves_a_failure_marker_and_frees_the_temp_files(tmp_path):
    data = write_dataset(tmp_path / "d", make_records(6000))
    with _tmpfs(tmp_path / "disk", "256k") as disk:
        out = disk / "out"
        r = subprocess.run(_cli(data, out), capture_output=True, text=True, timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "Traceback" not in r.stderr
        _assert_failed_cleanly(out, "No space left on device")
        st = os.statvfs(disk)
        assert st.f_bfree * st.f_frsize > 200 * 1024  # the temp files no longer fill it


# ------------------------------------------------------------------ the same on gs:// (GCS emulator)


@pytest.mark.slow
def test_on_gcs_overwrite_keeps_unknown_objects_and_an_overlapping_output_is_refused(data, tmp_path, remote_stack):
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions
    from pipelines.output_guard import OutputExistsError, OutputPathError

    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    out = f"gs://{remote_stack.bucket}/safety/out"
    opts = {"inputs": (str(data["json"]),), "output": out, "workers": 1, "progress": False}
    run_convert(ConvertOptions(config=str(data["config"]), **opts))
    bucket.blob("safety/out/notes/readme.txt").upload_from_string(b"mine")
    before = remote_stack.gcs_names("safety/out")
    with pytest.raises(OutputExistsError, match="notes/readme.txt"):
        run_convert(ConvertOptions(config=str(_other_config(data, tmp_path)), overwrite=True, **opts))
    assert remote_stack.gcs_names("safety/out") == before
    assert bucket.blob("safety/out/notes/readme.txt").download_as_bytes() == b"mine"

    gs_in = remote_stack.upload_dir(Path(data["config"]).parent, "safety/in")
    for output in (gs_in, gs_in + "/", f"gs://{remote_stack.bucket}/safety", gs_in + "/sub"):
        with pytest.raises(OutputPathError, match="write to another directory"):
            run_convert(ConvertOptions(inputs=(gs_in,), config=str(data["config"]), output=output, overwrite=True))
    assert not [n for n in remote_stack.gcs_names("safety/in") if "tfrecord" in n or "_LOCK" in n]
