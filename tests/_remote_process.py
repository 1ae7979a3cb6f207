"""What every local storage stand-in shares: a server process, its readiness, its stop, and a stack of them.

A stand-in server (``tests/_remote_gcs.py``, ``_remote_proxy.py``, ``_remote_webhdfs.py``,
``_remote_s3.py``) is a **separate process** started from a script (:class:`ServerProcess`),
binds **127.0.0.1 only**, prints ``READY <port>`` once it listens (:func:`announce_and_serve`)
and is stopped by its process id (SIGTERM, then SIGKILL). A :class:`ServerStack` holds the
servers one kind of remote storage needs and the environment that points clients at them;
:func:`shared` keeps one stack of a kind per test process.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any, TypeVar

READY_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- HTTP parsing (proxy, WebHDFS)


def read_headers(rfile) -> list[tuple[str, str]] | None:
    """An HTTP message's headers up to the blank line; None at the end of the stream."""
    headers = []
    while True:
        line = rfile.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))


def header(headers: list[tuple[str, str]], name: str) -> str | None:
    """The first value of header ``name`` (lower case), or None."""
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def read_body(rfile, headers: list[tuple[str, str]]) -> bytes:
    """Request body by Content-Length, or de-chunked (``identity`` means no body framing)."""
    te = (header(headers, "transfer-encoding") or "").lower()
    if "chunked" in te:
        parts = []
        while True:
            size_line = rfile.readline(65537)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            parts.append(rfile.read(size))
            rfile.readline(65537)
    length = int(header(headers, "content-length") or 0)
    return rfile.read(length) if length else b""


def http_json(method: str, url: str) -> dict[str, Any]:
    """A stand-in's control endpoint (``/_config``, ``/_stats``): JSON, never through a proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with opener.open(req, timeout=30) as resp:
        return json.load(resp)


# ----------------------------------------------------------------------------- the server's side


def wait_for_signal() -> None:
    """Block until SIGTERM/SIGINT, or until the parent is gone."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if os.getppid() == 1:  # parent died without stopping us
            break


def announce_and_serve(server) -> None:
    """Serve a ``socketserver`` server in a thread, print ``READY <port>``, stop on a signal."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(f"READY {server.server_address[1]}", flush=True)
    wait_for_signal()
    server.shutdown()
    server.server_close()


# ----------------------------------------------------------------------------- the test's side


class ServerMissing(RuntimeError):
    """A server's package or binary is not installed (the caller may skip)."""


class ServerProcess:
    """A server started as ``python <script> ARGS`` in its own process; stopped by its pid."""

    def __init__(self, name: str, args: list[str], log_dir: Path, script: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        )
        self.pid = self.proc.pid
        self.port = self._wait_ready()

    def _wait_ready(self) -> int:
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline().decode()), daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT_S)
        line = result[0] if result else ""
        if not line.startswith("READY "):
            self.stop()
            log = self.log_path.read_text(errors="replace")[-3000:]
            if "ModuleNotFoundError" in log or "No module named" in log:
                raise ServerMissing(f"{self.name}: {log.strip().splitlines()[-1]}")
            raise RuntimeError(f"{self.name} did not start (pid {self.pid}); its log:\n{log}")
        return int(line.split()[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()


class ServerStack:
    """Server processes started in order, stopped in reverse, their logs in ``workdir``.

    A subclass starts its servers in ``__init__`` (:meth:`_start`; on an error it calls
    :meth:`stop` and re-raises) and says in :meth:`env` how a client reaches them.
    """

    def __init__(self, workdir: Path | None, prefix: str) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.processes: list[ServerProcess] = []
        self._saved_env: dict[str, str | None] = {}

    def _start(self, name: str, args: list[str], script: Path) -> ServerProcess:
        proc = ServerProcess(name, args, self.workdir, script=script)
        self.processes.append(proc)
        return proc

    def env(self) -> dict[str, str]:
        raise NotImplementedError

    def apply_env(self) -> None:
        env = self.env()
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def restore_env(self) -> None:
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def stop(self) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - stop the others anyway
                pass
        self.processes = []
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


S = TypeVar("S", bound=ServerStack)
_SHARED: dict[type, ServerStack] = {}


def shared(kind: type[S]) -> S:
    """One stack of ``kind`` per process, its environment applied to ``os.environ`` (TensorFlow
    reads the GCS settings once per process); stopped at exit."""
    if kind not in _SHARED:
        stack = kind()
        stack.apply_env()
        atexit.register(stack.stop)
        _SHARED[kind] = stack
    return _SHARED[kind]  # type: ignore[return-value]
