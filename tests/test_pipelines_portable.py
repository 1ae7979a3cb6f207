"""The conversion on a portable runner, for real: Beam's local job service
(``local_job_service_main``) receives the job over gRPC and runs it on an
external worker pool (``worker_pool_main``) whose SDK workers are separate
processes importing this package — the same path Flink or Spark job servers
take. Both services are started through ``pipelines.local.loopback`` so they
listen on loopback only; the test checks that too.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from _pipelines_data import by_shard, make_records, write_dataset
from _ports import free_port

from pipelines.job import run_convert
from pipelines.options import ConvertOptions

pytestmark = pytest.mark.slow



def _is_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    mapped = getattr(a, "ipv4_mapped", None)
    return (mapped or a).is_loopback


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"service exited with {proc.returncode}: {proc.stdout.read() if proc.stdout else ''}")
        try:
            with socket.create_connection(("localhost", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"nothing listening on localhost:{port} after {timeout:.0f} s")


def _listen_addresses(pid: int) -> set[str]:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    addrs = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    addrs.add(c.laddr.ip)
        except psutil.Error:
            pass
    return addrs


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    logs = tmp_path_factory.mktemp("portable-logs")
    job_port, pool_port = free_port(), free_port()
    # The pool starts SDK workers as plain `python`: make that this venv's.
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    launch = [sys.executable, "-m", "pipelines.local.loopback"]
    procs = []
    try:
        for name, args, port in (
            ("job", ["apache_beam.runners.portability.local_job_service_main", "--port", str(job_port)], job_port),
            ("pool", ["apache_beam.runners.worker.worker_pool_main", "--service_port", str(pool_port)], pool_port),
        ):
            out = open(logs / f"{name}.log", "wb")
            p = subprocess.Popen([*launch, *args], stdout=out, stderr=subprocess.STDOUT, env=env,
                                 cwd=str(Path(__file__).resolve().parents[1]))
            procs.append(p)
            _wait_listening(port, p)
        yield {"job_port": job_port, "pool_port": pool_port, "job": procs[0], "pool": procs[1], "logs": logs}
    finally:
        for p in procs:
            for child in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
                child.kill()
            p.kill()
            p.wait(timeout=30)


def test_portable_runner_with_external_workers_gives_the_same_output(services, tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(200))
    base = dict(inputs=(str(paths["avro"]),), config=str(paths["config"]), num_shards=2)
    local = run_convert(ConvertOptions(output=str(tmp_path / "local"), **base))

    sdk_workers: set[int] = set()
    stop = threading.Event()

    def watch() -> None:  # SDK workers live only while the job runs
        while not stop.is_set():
            try:
                for c in psutil.Process(services["pool"].pid).children(recursive=True):
                    if any("SdkHarness" in a or "sdk_worker_main" in a for a in c.cmdline()):
                        sdk_workers.add(c.pid)
            except psutil.Error:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        remote = run_convert(ConvertOptions(
            output=str(tmp_path / "portable"),
            beam_args=("--runner=PortableRunner", f"--job_endpoint=localhost:{services['job_port']}",
                       "--environment_type=EXTERNAL", f"--environment_config=localhost:{services['pool_port']}"),
            **base))
    finally:
        stop.set()
        t.join()

    assert sdk_workers, "no SDK worker process was started by the worker pool"
    assert os.getpid() not in sdk_workers
    assert remote.info["runner"] == "PortableRunner"
    assert remote.info["counts"] == local.info["counts"]
    # Conversion is reproducible: the same shards, byte for byte, whatever the runner.
    for split, sp in local.info["splits"].items():
        for shard in sp["shards"]:
            a = by_shard(tmp_path / "local", shard["file"]).read_bytes()
            b = by_shard(tmp_path / "portable", shard["file"]).read_bytes()
            assert a == b, f"{split} shard {shard['path']} differs between the in-process and the portable runner"


def test_beam_local_services_listen_on_loopback_only(services):
    for name in ("job", "pool"):
        addrs = _listen_addresses(services[name].pid)
        assert addrs, f"the {name} service listens nowhere?"
        wide = sorted(a for a in addrs if not _is_loopback(a))
        assert not wide, f"the {name} service listens on {wide}; expected loopback only"


_PROBE = """
import sys, concurrent.futures, grpc, psutil
if sys.argv[1] == "patched":
    from pipelines.local.loopback import bind_loopback_only
    assert bind_loopback_only()
s = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
port = s.add_insecure_port("[::]:0")
s.start()
print(sorted({c.laddr.ip for c in psutil.Process().net_connections("inet")
              if c.status == psutil.CONN_LISTEN and c.laddr.port == port}))
"""


@pytest.mark.parametrize("mode", ["plain", "patched"])
def test_wildcard_binds_become_loopback_only_when_patched(mode):
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, timeout=60, check=True)
    addrs = eval(out.stdout.strip())  # noqa: S307 - our own probe's list literal
    assert addrs
    wide = [a for a in addrs if not _is_loopback(a)]
    if mode == "plain":  # what Beam's servers do on their own: every interface
        assert wide, f"expected a wildcard bind without the patch, got {addrs}"
    else:
        assert not wide, f"patched bind still listens on {wide}"
