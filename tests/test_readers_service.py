"""``train_dataset(..., service=...)`` through real tf.data service processes on 127.0.0.1
(``recordprep data-service dispatcher|worker``), each stopped by its pid, every wait bounded."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import _readers_fixtures as fx
import pytest
from _ports import free_port
from typer.testing import CliRunner

import readers
from pipelines.cli import app

RECORDPREP = Path(sys.executable).with_name("recordprep")
UP_TIMEOUT_S = 90.0  # TensorFlow's import on a loaded 2-core machine
STOP_TIMEOUT_S = 20.0
EPOCH_TIMEOUT_S = 120.0
SHARDS = (23, 17, 31, 9, 25, 14, 20, 11)  # 150 records
LISTENING = re.compile(r"listening on port (\d+)")


class Server:
    """One ``recordprep data-service ...`` process; ``port`` once its log line says it listens."""

    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        self.name = name
        self.err_path = tmp / f"{name}.stderr"
        self._err = open(self.err_path, "wb")
        self.proc = subprocess.Popen([str(RECORDPREP), "data-service", *args], stdout=subprocess.PIPE,
                                     stderr=self._err, stdin=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "1"})
        self.pid = self.proc.pid
        self.lines: list[str] = []
        self._port: int | None = None
        self._up = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = LISTENING.search(line)
            if m and self._port is None:
                self._port = int(m[1])
                self._up.set()
        self._up.set()

    def wait_up(self) -> int:
        """The port, or a failure naming the server and showing its output (never a hang)."""
        self._up.wait(UP_TIMEOUT_S)
        if self._port is None:
            self.stop()
            raise AssertionError(f"{self.name} (pid {self.pid}) did not come up within {UP_TIMEOUT_S:g} s; "
                                 f"stdout: {''.join(self.lines)!r}; stderr tail:\n"
                                 f"{self.err_path.read_text(errors='replace')[-3000:]}")
        return self._port

    def wait_for(self, text: str) -> None:
        """Until a stdout line holds ``text``: a failure showing the output if not within the up timeout."""
        deadline = time.monotonic() + UP_TIMEOUT_S
        while not any(text in line for line in self.lines) and time.monotonic() < deadline:
            if self.proc.poll() is not None and not any(text in line for line in self.lines):
                time.sleep(0.2)  # the reader thread may still hold the last lines
                break
            time.sleep(0.1)
        if not any(text in line for line in self.lines):
            code = self.proc.poll()
            self.stop()
            raise AssertionError(f"{self.name} (pid {self.pid}) never printed {text!r}; stdout: "
                                 f"{''.join(self.lines)!r}; exit {code}; stderr tail:\n{self.stderr()[-3000:]}")

    def exit_code(self, within_s: float) -> int:
        """The exit code once the process ends by itself within ``within_s``; else it is killed and the test fails."""
        try:
            return self.proc.wait(within_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"{self.name} (pid {self.pid}) still running after {within_s:g} s; stdout: "
                                 f"{''.join(self.lines)!r}; stderr tail:\n{self.stderr()[-3000:]}") from None

    def stderr(self) -> str:
        if not self._err.closed:
            self._err.flush()
        return self.err_path.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(STOP_TIMEOUT_S)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        self._err.close()
        return self.proc.returncode


class Service:
    """A dispatcher and workers on loopback; ``static`` gives the dispatcher the fixed worker list."""

    def __init__(self, tmp: Path, workers: int = 2, *, static: bool = False, fixed_ports: bool = False) -> None:
        self.tmp = tmp
        self.servers: list[Server] = []
        fixed = static or fixed_ports  # a worker restarted at its address needs its port again
        self.worker_ports = [free_port() for _ in range(workers)] if fixed else [0] * workers
        try:
            args = ["dispatcher", "--port", "0", "--worker-timeout-s", "3"]
            for p in self.worker_ports if static else ():
                args += ["--worker-address", f"127.0.0.1:{p}"]
            self.dispatcher = self._start("dispatcher", args)
            self.port = self.dispatcher.wait_up()
            self.workers = [self.start_worker(i) for i in range(workers)]
            for w in self.workers:
                w.wait_up()
        except BaseException:
            self.stop()
            raise

    @property
    def address(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def _start(self, name: str, args: list[str]) -> Server:
        server = Server(self.tmp, name, args)
        self.servers.append(server)
        return server

    def start_worker(self, i: int) -> Server:
        return self._start(f"worker{i}-{len(self.servers)}", [
            "worker", "--dispatcher", f"127.0.0.1:{self.port}", "--port", str(self.worker_ports[i]),
            "--advertise", "127.0.0.1", "--heartbeat-s", "0.5"])

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    return fx.write_output(tmp_path_factory.mktemp("service") / "out", {"train": SHARDS})


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory):
    service = Service(tmp_path_factory.mktemp("dynamic"))
    yield service
    service.stop()


def _ids(ds) -> list[int]:
    return fx.ids_of(ds)


# --------------------------------------------------------------------------- fast: options and CLI


def test_service_options_are_validated_with_the_others(output):
    with pytest.raises(ValueError, match="grpc://host:port"):
        readers.ReadOptions(service="localhost:5050")
    with pytest.raises(ValueError, match="service_sharding"):
        readers.ReadOptions(service="grpc://h:1", service_sharding="file")
    with pytest.raises(ValueError, match="set ReadOptions.service too"):
        readers.ReadOptions(service_job_name="shared")
    with pytest.raises(ValueError, match="grpc://host:port"):
        readers.train_dataset(str(output.root), 4, service="h:1")
    with pytest.raises(ValueError, match="cache"):
        readers.train_dataset(str(output.root), 4, service="grpc://127.0.0.1:1", cache="memory")
    with pytest.raises(ValueError, match="service_job_name"):
        import tensorflow as tf

        ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
        readers.train_dataset(str(output.root), 4, service="grpc://127.0.0.1:1", input_context=ctx)


def test_cli_rejects_bad_server_arguments_as_usage_errors():
    runner = CliRunner()
    result = runner.invoke(app, ["data-service", "worker", "--dispatcher", "nowhere", "--port", "0"])
    assert result.exit_code == 2, result.output
    assert "--dispatcher must be host:port" in result.output
    result = runner.invoke(app, ["data-service", "dispatcher", "--port", "0", "--worker-address", "w1"])
    assert result.exit_code == 2, result.output
    assert "--worker-address must be host:port" in result.output


def test_a_server_that_does_not_come_up_fails_clearly(tmp_path):
    server = Server(tmp_path, "worker", ["worker", "--dispatcher", "127.0.0.1:1", "--port", "-5"])
    with pytest.raises(AssertionError, match="did not come up"):
        server.wait_up()
    assert server.proc.returncode == 2


# --------------------------------------------------------------------------- real servers


@pytest.mark.slow
def test_dynamic_epoch_sees_every_record_exactly_once(dynamic, output):
    ds = readers.train_dataset(str(output.root), 8, num_epochs=1, seed=1, drop_remainder=False,
                               service=dynamic.address)
    assert Counter(_ids(ds)) == Counter(output.all_ids("train"))
    # Two epochs in one job: full batches (drop_remainder, the default), every record twice but
    # for the last partial batch.
    ds = readers.train_dataset(str(output.root), 8, num_epochs=2, service=dynamic.address)
    batches = [b[0]["count"].numpy() for b in ds]
    assert {len(b) for b in batches} == {8}
    got = Counter(int(v) for b in batches for v in b[:, 0])
    assert max(got.values()) == 2 and sum(got.values()) == 2 * sum(SHARDS) // 8 * 8


@pytest.mark.slow
def test_uncompressed_wire_and_buffer_shuffle_give_the_same_records(dynamic, output):
    opts = readers.ReadOptions(service=dynamic.address, service_compression="none", shuffle_mode="buffer")
    ds = readers.train_dataset(str(output.root), 8, num_epochs=1, drop_remainder=False, options=opts)
    batches = list(ds)
    assert Counter(fx.ids_of(batches)) == Counter(output.all_ids("train"))
    features, label = batches[0]
    i = int(features["count"][0, 0])
    assert float(features["num"][0, 0]) == fx.expected_values(i)["num"][0]
    assert int(label[0, 0]) == fx.expected_values(i)["label"][0]  # the label is split out on the workers


@pytest.mark.slow
def test_trainers_sharing_a_job_name_split_the_data_without_duplicates(dynamic, output):
    opts = readers.ReadOptions(service=dynamic.address, service_job_name="shared-job", shuffle_buffer=16)
    got: list[list[int]] = [[], []]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def trainer(i: int) -> None:
        try:
            ds = readers.train_dataset(str(output.root), 4, num_epochs=1, drop_remainder=False, options=opts)
            start.wait(60)
            got[i] = _ids(ds)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=trainer, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a trainer did not finish its epoch"
    assert not set(got[0]) & set(got[1])
    assert Counter(got[0] + got[1]) == Counter(output.all_ids("train"))


@pytest.mark.slow
def test_a_damaged_shard_fails_the_trainer_naming_the_shard(dynamic, output, tmp_path):
    damaged = tmp_path / "out"
    shutil.copytree(output.root, damaged)
    path = damaged / output.info.splits["train"].shards[2].file
    fx.truncate(path, fx.record_boundary(path, 5))  # cut at a record boundary: no read error at all
    opts = readers.ReadOptions(service=dynamic.address, verify_files=False)
    with pytest.raises(Exception, match=rf"shard {re.escape(str(path))} is damaged: read 5 of the 31 records"):
        _ids(readers.train_dataset(str(damaged), 8, num_epochs=1, options=opts))


class _EpochReader:
    """Reads ``it`` in a thread, keeping each record as it arrives (up to ``limit`` records): the test
    looks at what came while the epoch is still open, and a stall is a failure, not a hang."""

    def __init__(self, it, limit: int | None = None) -> None:
        self.got: list[int] = []
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(it, limit), daemon=True)
        self._thread.start()

    def _run(self, it, limit: int | None) -> None:
        try:
            for batch in it:
                self.got.extend(fx.ids_of([batch]))
                if limit is not None and len(self.got) >= limit:
                    return
        except BaseException as e:  # noqa: BLE001 - reported by wait_until() and end()
            self.errors.append(e)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def wait_until(self, what: str, done: Callable[[list[int]], bool]) -> None:
        """Until ``done(records so far)``: a failure naming ``what`` if not within the epoch timeout."""
        deadline = time.monotonic() + EPOCH_TIMEOUT_S
        while not done(list(self.got)) and not self.errors and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not self.errors, self.errors
        assert done(list(self.got)), (f"{what}: not within {EPOCH_TIMEOUT_S:g} s ({len(self.got)} records came, "
                                      f"reader {'still waiting' if self.running else 'ended'})")

    def end(self, what: str) -> list[int]:
        """The records, once the epoch ends: a failure, not a hang, if it does not end in time."""
        self._thread.join(EPOCH_TIMEOUT_S)
        assert not self._thread.is_alive(), f"{what}: the epoch did not end within {EPOCH_TIMEOUT_S:g} s"
        assert not self.errors, self.errors
        return self.got


def _rest_of_epoch(it, what: str) -> list[int]:
    return _EpochReader(it).end(what)


@pytest.mark.slow
def test_dynamic_worker_killed_mid_epoch_and_restarted_loses_at_most_its_shards_and_repeats_nothing(
        output, tmp_path):
    """DYNAMIC: a worker killed mid-epoch takes the shards it held (and the records it had read
    but not sent) with it: they are lost for this epoch, nothing repeats (at most once). Unless the
    lost worker had sent the end of its part, the epoch ends only once a worker is back at its
    address (see the lost-for-good test below); the next epoch is complete again."""
    service = Service(tmp_path, fixed_ports=True)
    try:
        opts = readers.ReadOptions(service=service.address, shuffle_buffer=8, cycle_length=1)
        it = iter(readers.train_dataset(str(output.root), 4, num_epochs=1, drop_remainder=False, options=opts))
        before = fx.ids_of([next(it) for _ in range(3)])
        service.workers[0].kill()
        service.workers[0] = service.start_worker(0)
        service.workers[0].wait_up()
        got = Counter(before + _rest_of_epoch(it, "dynamic, worker restarted"))
        assert max(got.values()) == 1  # nothing twice
        assert set(got) <= set(output.all_ids("train"))
        lost = set(output.all_ids("train")) - set(got)
        print(f"records lost with the killed worker: {len(lost)} of {sum(SHARDS)}")
        again = _rest_of_epoch(iter(readers.train_dataset(
            str(output.root), 4, num_epochs=1, drop_remainder=False, options=opts)), "the next epoch")
        assert Counter(again) == Counter(output.all_ids("train"))
    finally:
        service.stop()


@pytest.mark.slow
def test_static_sharding_exactly_once_and_a_restarted_worker_rereads_its_own_shards(output, tmp_path):
    """FILE (static): worker i of 2 owns shards i, i+2, ...; one epoch is exactly once. A worker
    killed mid-epoch and restarted at its address reads its shards again from their start: no record
    is lost, and the only repeats are records of that worker's shards."""
    service = Service(tmp_path, static=True)
    try:
        opts = readers.ReadOptions(service=service.address, service_sharding="static", shuffle_buffer=8)
        ds = readers.train_dataset(str(output.root), 8, num_epochs=1, drop_remainder=False, options=opts)
        assert Counter(_ids(ds)) == Counter(output.all_ids("train"))

        it = iter(readers.train_dataset(str(output.root), 4, num_epochs=1, drop_remainder=False, options=opts))
        before = fx.ids_of([next(it) for _ in range(3)])
        service.workers[0].kill()
        service.workers[0] = service.start_worker(0)
        service.workers[0].wait_up()
        got = Counter(before + _rest_of_epoch(it, "static, worker restarted"))
        assert set(got) == set(output.all_ids("train"))  # nothing lost
        repeated = {i for i, n in got.items() if n > 1}
        owner = {i: k % 2 for k, shard in enumerate(output.ids["train"]) for i in shard}
        assert len({owner[i] for i in repeated}) <= 1, "repeats from both workers' shards"
        print(f"records repeated after the restart: {len(repeated)}")
    finally:
        service.stop()


LOST_SHARDS = (10,) * 40  # many small shards: a worker holds only the few it is reading
QUIET_S = 3.0  # after the rest has arrived, the time an epoch that waits for a lost worker gets to end anyway


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    return fx.write_output(tmp_path_factory.mktemp("many") / "out", {"train": LOST_SHARDS})


def _one_by_one(service: Service, **fields) -> readers.ReadOptions:
    """Options under which a worker claims only the shard it reads and sends it in file order: no file
    shuffle (its buffer claims up to every shard at an epoch's start), no record shuffle, one shard at
    a time, small buffers. What a lost worker takes with it is then the tail of the shards it held."""
    return readers.ReadOptions(service=service.address, shuffle_files=False, shuffle_buffer=1, cycle_length=1,
                               num_parallel_calls=1, prefetch=1, **fields)


def _epoch(output, opts: readers.ReadOptions):
    return iter(readers.train_dataset(str(output.root), 4, num_epochs=1, drop_remainder=False, options=opts))


def _cut_shards(output, got: Counter) -> list[int]:
    """The shards of which only a part arrived, asserting that the part is a prefix in file order."""
    cut = []
    for k, shard in enumerate(output.ids["train"]):
        n = sum(1 for i in shard if i in got)
        assert all(i in got for i in shard[:n]), f"shard {k} arrived with a gap: {[i in got for i in shard]}"
        if n < len(shard):
            cut.append(k)
    return cut


@pytest.mark.slow
def test_dynamic_worker_lost_for_good_training_goes_on_and_epochs_wait_for_its_address(many, tmp_path):
    """DYNAMIC, worker 0 killed mid-epoch and not restarted (docs/data-service.md, "Worker loss").
    A new epoch started meanwhile is read wholly by the remaining worker, each record once, but does
    not end: TensorFlow gives every new job a task on each worker it ever registered and waits for it.
    The open epoch repeats nothing; it ends without worker 0 only if worker 0 had already sent the end
    of its part (then nothing is lost), else it waits too. With a worker back at the address both end:
    nothing is added to the new epoch, and the open one lacks at most the unsent tails of the shards
    worker 0 held."""
    service = Service(tmp_path, fixed_ports=True)
    try:
        opts = _one_by_one(service)
        every = Counter(many.all_ids("train"))
        it = _epoch(many, opts)
        before = fx.ids_of([next(it) for _ in range(3)])
        service.workers[0].kill()
        open_epoch = _EpochReader(it)
        new_epoch = _EpochReader(_epoch(many, opts))
        new_epoch.wait_until("a new epoch, read by the remaining worker", lambda got: len(got) >= len(every))
        open_epoch.wait_until("records of the open epoch after the kill", lambda got: len(got) > 0)
        time.sleep(QUIET_S)
        assert Counter(new_epoch.got) == every
        assert new_epoch.running, "a new epoch ended without the lost worker: update docs/data-service.md"
        got = Counter(before + open_epoch.got)
        assert max(got.values()) == 1 and set(got) <= set(every)
        assert open_epoch.running or got == every, "the open epoch ended without the lost worker's records"

        service.workers[0] = service.start_worker(0)
        service.workers[0].wait_up()
        assert Counter(new_epoch.end("the new epoch, a worker back at the lost address")) == every
        got = Counter(before + open_epoch.end("the open epoch, a worker back at the lost address"))
        assert max(got.values()) == 1 and set(got) <= set(every)
        print(f"the open epoch lost {len(every) - len(got)} records: the tails of shards {_cut_shards(many, got)}")
    finally:
        service.stop()


@pytest.mark.slow
def test_dynamic_endless_reading_trains_on_the_remaining_worker(many, tmp_path):
    """``num_epochs=None`` (``model.fit`` with ``steps_per_epoch``) has no epoch end to wait for: after
    a worker is lost for good the remaining one serves every record of the split, again and again."""
    service = Service(tmp_path)
    try:
        it = iter(readers.train_dataset(str(many.root), 4, num_epochs=None, options=_one_by_one(service)))
        fx.ids_of([next(it) for _ in range(3)])
        service.workers[0].kill()
        epochs = 3 * sum(LOST_SHARDS)
        after = _EpochReader(it, limit=epochs)
        del it
        after.wait_until("three epochs' worth of records after the kill", lambda got: len(got) >= epochs)
        assert set(after.got) == set(many.all_ids("train"))
    finally:
        service.stop()


@pytest.mark.slow
def test_static_worker_lost_for_good_its_shards_are_never_read_and_epochs_wait_for_it(many, tmp_path):
    """FILE (static), worker 0 of 2 killed mid-epoch and not restarted: the other worker's shards
    (1, 3, ...) arrive whole, each record once, in the open epoch and in a new one started meanwhile;
    no one reads worker 0's shards of the new epoch, and neither epoch ends. Back at its address the
    worker reads its shards from their start: the new epoch is then exactly once, the open one whole
    with repeats only in worker 0's shards."""
    service = Service(tmp_path, static=True)
    try:
        opts = _one_by_one(service, service_sharding="static")
        every = Counter(many.all_ids("train"))
        lost_shards = {i for k, shard in enumerate(many.ids["train"]) if k % 2 == 0 for i in shard}
        remaining = set(every) - lost_shards
        it = _epoch(many, opts)
        before = fx.ids_of([next(it) for _ in range(3)])
        service.workers[0].kill()
        open_epoch = _EpochReader(it)
        new_epoch = _EpochReader(_epoch(many, opts))
        new_epoch.wait_until("a new epoch, the remaining worker's shards", lambda got: remaining <= set(got))
        open_epoch.wait_until("the open epoch, the remaining worker's shards",
                              lambda got: remaining <= set(before + got))
        time.sleep(QUIET_S)
        assert Counter(new_epoch.got) == Counter(remaining)  # worker 0's shards: never read
        assert new_epoch.running, "a new epoch ended without the lost worker's shards: update docs/data-service.md"
        got = Counter(before + open_epoch.got)
        assert all(got[i] == 1 for i in remaining) and set(got) <= set(every)
        assert open_epoch.running or got == every, "the open epoch ended without the lost worker's records"

        service.workers[0] = service.start_worker(0)
        service.workers[0].wait_up()
        assert Counter(new_epoch.end("the new epoch, worker 0 back")) == every
        got = Counter(before + open_epoch.end("the open epoch, worker 0 back"))
        assert set(got) == set(every) and all(got[i] == 1 for i in remaining)
        print(f"the open epoch repeated {sum(n > 1 for n in got.values())} records of worker 0's shards")
    finally:
        service.stop()


@pytest.mark.slow
def test_servers_stop_cleanly_on_sigterm(tmp_path):
    service = Service(tmp_path, workers=1)
    codes = [server.stop() for server in reversed(service.servers)]
    assert codes == [0, 0]
    assert service.dispatcher.lines[-1].startswith("recordprep data-service dispatcher: stopped")


@pytest.mark.slow
def test_dispatcher_with_a_work_dir_is_fault_tolerant_and_journals_there(tmp_path):
    journal = tmp_path / "journal"
    dispatcher = Server(tmp_path, "dispatcher", ["dispatcher", "--port", "0", "--work-dir", str(journal)])
    try:
        dispatcher.wait_up()
        assert f"fault-tolerant, journal in {journal}" in dispatcher.lines[0]
        assert journal.is_dir() and any(journal.rglob("*"))
    finally:
        assert dispatcher.stop() == 0


# --------------------------------------------------------------------------- bind, port, start (issue 37)

START_TIMEOUT_S = 4.0  # --start-timeout of the workers whose dispatcher does not answer
SIGNAL_EXIT_S = 10.0  # a server told to stop while it starts exits within this


def _answer(host: str, port: int, up: bool = False) -> str:
    """How a gRPC call to a method no server knows ends at ``host:port``: UNIMPLEMENTED means a
    TensorFlow server answered, UNAVAILABLE that nothing did. ``up``: the server should answer
    there, so the call waits (bounded) for the channel to connect, as a loaded machine may need."""
    import grpc

    # Straight to the address: the session's remote-storage stand-ins set http(s)_proxy for other tests.
    with grpc.insecure_channel(f"{host}:{port}", options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            channel.unary_unary("/recordprep.test.Nothing/Here")(b"", timeout=20 if up else 5, wait_for_ready=up)
        except grpc.RpcError as e:
            return e.code().name
    return "OK"


def _outside_addresses() -> list[str]:
    """This host's addresses other than loopback, as gRPC host parts; the test skips without one."""
    from readers._service_net import local_addresses

    found = [f"[{ip}]" if ip.version == 6 else str(ip) for ip in local_addresses()
             if not ip.is_loopback and not ip.is_link_local]
    if not found:
        pytest.skip("this host has no address but loopback")
    return sorted(found)


@pytest.mark.slow
def test_servers_answer_on_loopback_only_unless_bound_wider(tmp_path):
    """Issue 37.3: by default neither server answers on the host's other addresses; --bind 0.0.0.0
    answers everywhere and its line says the service is unauthenticated."""
    outside = _outside_addresses()
    service = Service(tmp_path, workers=1)
    try:
        for server, port in ((service.dispatcher, service.port), (service.workers[0], service.workers[0].wait_up())):
            assert _answer("127.0.0.1", port, up=True) == "UNIMPLEMENTED", server.name
            assert _answer("[::1]", port, up=True) == "UNIMPLEMENTED", server.name
            assert {host: _answer(host, port) for host in outside} == dict.fromkeys(outside, "UNAVAILABLE"), server.name
        assert "loopback only" in service.dispatcher.lines[0]
        wide = Server(tmp_path, "wide", ["dispatcher", "--port", "0", "--bind", "0.0.0.0"])
        try:
            port = wide.wait_up()
            assert "UNAUTHENTICATED" in wide.lines[0]
            assert {host: _answer(host, port, up=True) for host in outside} == dict.fromkeys(outside, "UNIMPLEMENTED")
        finally:
            assert wide.stop() == 0
    finally:
        service.stop()


def test_bind_must_be_an_address_of_this_host():
    result = CliRunner().invoke(app, ["data-service", "dispatcher", "--port", "0", "--bind", "192.0.2.254"])
    assert result.exit_code == 2, result.output
    assert "--bind 192.0.2.254: not an address of this host" in result.output
    result = CliRunner().invoke(app, ["data-service", "worker", "--dispatcher", "127.0.0.1:1", "--bind", "my-host"])
    assert result.exit_code == 2, result.output
    assert "--bind must be an IP address" in result.output


@pytest.mark.slow
def test_a_second_server_on_a_taken_port_fails_and_the_first_keeps_it(tmp_path):
    """Issue 37.10 and 37.11: gRPC's SO_REUSEPORT let a second dispatcher start on the same port
    and take half the connections. Now it exits 2 saying the port is in use, before it listens;
    the same for a port some other program holds."""
    first = Server(tmp_path, "first", ["dispatcher", "--port", "0"])
    try:
        port = first.wait_up()
        second = Server(tmp_path, "second", ["dispatcher", "--port", str(port)])
        assert second.exit_code(UP_TIMEOUT_S) == 2, second.lines
        assert f"port {port} is in use by another process" in second.stderr()
        assert not any(LISTENING.search(line) for line in second.lines)
        assert _answer("127.0.0.1", port) == "UNIMPLEMENTED"  # the first one still serves
        assert first.proc.poll() is None
    finally:
        assert first.stop() == 0
    import socket

    with socket.socket() as other:  # a program that is not a tf.data server, on loopback only
        other.bind(("127.0.0.1", 0))
        other.listen()
        taken = other.getsockname()[1]
        worker = Server(tmp_path, "worker", ["worker", "--dispatcher", "127.0.0.1:1", "--port", str(taken)])
        assert worker.exit_code(UP_TIMEOUT_S) == 2, worker.lines
        assert f"port {taken} is in use by another process" in worker.stderr()
        assert "Could not start gRPC server" not in worker.stderr()


@pytest.mark.slow
def test_a_worker_whose_dispatcher_does_not_answer_fails_naming_it(tmp_path):
    """Issue 37.9: TensorFlow's worker retries its dispatcher forever; ours gives up after --start-timeout."""
    nowhere = f"127.0.0.1:{free_port()}"
    worker = Server(tmp_path, "worker", ["worker", "--dispatcher", nowhere, "--port", "0",
                                         "--start-timeout", str(START_TIMEOUT_S)])
    worker.wait_for(f"for dispatcher {nowhere}")
    assert worker.exit_code(START_TIMEOUT_S + SIGNAL_EXIT_S) == 1
    assert f"dispatcher {nowhere} did not answer within {START_TIMEOUT_S:g} s" in worker.stderr()


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_starting_worker_stops_on_sigterm_and_ctrl_c(tmp_path, sig, code):
    """Issue 37.9: a worker waiting for its dispatcher stops on the signal, at once, saying so;
    so does one signalled while it imports TensorFlow."""
    nowhere = f"127.0.0.1:{free_port()}"
    worker = Server(tmp_path, "worker", ["worker", "--dispatcher", nowhere, "--port", "0"])  # 60 s default
    worker.wait_for(f"for dispatcher {nowhere}")
    time.sleep(1.0)
    os.kill(worker.pid, sig)
    assert worker.exit_code(SIGNAL_EXIT_S) == code
    assert f"stopped by {sig.name} before it was up" in worker.stderr()

    early = Server(tmp_path, "early", ["worker", "--dispatcher", nowhere, "--port", "0"])
    time.sleep(0.5)  # the CLI's own handlers are installed first thing; TensorFlow is still loading
    os.kill(early.pid, sig)
    assert early.exit_code(UP_TIMEOUT_S) in (code, -sig)


_HALF_DISPATCHER = """
import sys
from concurrent import futures
import grpc

class Half(grpc.GenericRpcHandler):
    # GetVersion answers as TensorFlow 2.21's dispatcher does (version 9); everything else,
    # the worker's registration included, is UNAVAILABLE, which TensorFlow retries forever.
    def service(self, details):
        if details.method.endswith("/GetVersion"):
            return grpc.unary_unary_rpc_method_handler(lambda request, context: b"\\x08\\x09")
        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
        return grpc.unary_unary_rpc_method_handler(refuse)

server = grpc.server(futures.ThreadPoolExecutor(4))
server.add_generic_rpc_handlers((Half(),))
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
server.wait_for_termination()
"""


@pytest.fixture
def half_dispatcher():
    """A dispatcher that answers the worker's probe and then refuses its registration: the window in
    which TensorFlow's start holds the GIL and retries forever."""
    proc = subprocess.Popen([sys.executable, "-c", _HALF_DISPATCHER], stdout=subprocess.PIPE, text=True)
    try:
        yield f"127.0.0.1:{int(proc.stdout.readline())}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)


@pytest.mark.slow
def test_a_worker_stuck_registering_is_bounded_and_stops_on_sigterm(tmp_path, half_dispatcher):
    """Issue 37.9, inside TensorFlow's start: the start timeout still ends the worker (exit 1), and
    SIGTERM ends it at once."""
    worker = Server(tmp_path, "stuck", ["worker", "--dispatcher", half_dispatcher, "--port", "0",
                                        "--start-timeout", str(START_TIMEOUT_S)])
    worker.wait_for("answered; registering")
    assert worker.exit_code(START_TIMEOUT_S + SIGNAL_EXIT_S) == 1
    assert "Timeout" in worker.stderr()

    worker = Server(tmp_path, "stuck-term", ["worker", "--dispatcher", half_dispatcher, "--port", "0"])
    worker.wait_for("answered; registering")
    time.sleep(1.0)
    os.kill(worker.pid, signal.SIGTERM)
    assert worker.exit_code(SIGNAL_EXIT_S) == -signal.SIGTERM


_REUSEPORT_LISTENER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/net/tcp and SO_REUSEPORT sharing are Linux's")
def test_a_server_sharing_its_port_through_so_reuseport_is_found():
    """Issue 37.10, two servers started at the same moment (both pass the bind check): the one that
    looks after listening finds the other one's socket on its port."""
    import socket

    from readers._service_net import PortInUse, check_sole_listener

    other = subprocess.Popen([sys.executable, "-c", _REUSEPORT_LISTENER, "0"], stdout=subprocess.PIPE, text=True)
    try:
        port = int(other.stdout.readline())
        with socket.socket() as mine:
            mine.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            mine.bind(("127.0.0.1", port))
            mine.listen()
            with pytest.raises(PortInUse, match=f"port {port} is in use by another process too"):
                check_sole_listener(port)
            os.kill(other.pid, signal.SIGKILL)
            other.wait(STOP_TIMEOUT_S)
            check_sole_listener(port)  # its own socket alone
    finally:
        if other.poll() is None:
            os.kill(other.pid, signal.SIGKILL)
            other.wait(STOP_TIMEOUT_S)


@pytest.mark.skipif(sys.platform != "linux", reason="the shadow listeners rely on Linux's socket lookup")
def test_shadow_listeners_leave_only_loopback_to_a_wildcard_server():
    """Issue 37.3's mechanism without TensorFlow: a wildcard SO_REUSEPORT listener (as TensorFlow's)
    beside ``Shadows`` gets the loopback connections; every other address's connection is closed."""
    import socket

    from readers._service_net import Shadows

    outside = [h.strip("[]") for h in _outside_addresses()]
    with socket.socket(socket.AF_INET6) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        server.bind(("::", 0))
        server.listen()
        server.settimeout(5)
        port = server.getsockname()[1]
        shadows = Shadows(port, "127.0.0.1")
        try:
            for host in ("127.0.0.1", "::1", *outside):
                with socket.create_connection((host, port), timeout=5) as client:
                    client.settimeout(5)
                    if _is_loopback(host):
                        conn, _ = server.accept()
                        conn.close()
                    else:
                        assert client.recv(1) == b"", f"{host}: the connection stayed open"
        finally:
            shadows.close()


def _is_loopback(host: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(host).is_loopback
