"""Worker processes started before the runner asks for them (local multi-process runs).

A local run's worker processes spend about a second importing Beam before
they do any work, and Beam's ``FnApiRunner`` starts them only when it runs the
first stage, after the launcher has built and translated the pipeline. A
``WarmPool`` starts them as soon as the launcher knows it will need them, so
the imports overlap the launcher's own work.

How: each warm process (``python -m pipelines._worker --recordprep-warm=SOCK``)
listens on a Unix socket, imports what a worker needs, and waits. The command
Beam runs for a worker (``python -m pipelines._worker --recordprep-pool=DIR``)
claims one warm process (an exclusive ``.claimed`` file next to its socket),
sends it its environment (the runner's control and logging endpoints, the
pipeline options) and arguments, and waits for its exit status, which it
returns as its own. A worker command that finds no warm process left runs
the worker itself, as before. Warm processes that nobody claimed are stopped
by ``WarmPool.close``, and stop on their own when the launcher goes away.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable

WARM_FLAG = "--recordprep-warm="
POOL_FLAG = "--recordprep-pool="
PRELOAD_FLAG = "--recordprep-preload="
#: A warm process nobody claims within this many seconds exits.
IDLE_TIMEOUT_S = 900.0
_CONNECT_TIMEOUT_S = 60.0


class WarmPool:
    """``n`` warm worker processes for one local run; use as a context manager."""

    def __init__(self, n: int, schemes: Iterable[str], preload: Iterable[str] = ()):
        from pipelines._worker import _SCHEMES_FLAG as SCHEMES_FLAG

        self.dir = tempfile.mkdtemp(prefix="recordprep-workers-")
        self._procs: list[tuple[str, subprocess.Popen]] = []
        schemes_arg = SCHEMES_FLAG + ",".join(sorted(schemes))
        preload_arg = [PRELOAD_FLAG + ",".join(preload)] if preload else []
        for i in range(n):
            sock = os.path.join(self.dir, f"{i}.sock")
            open(sock + ".slot", "w").close()  # what a worker command looks for (the socket comes later)
            cmd = [sys.executable, "-m", "pipelines._worker", schemes_arg, WARM_FLAG + sock, *preload_arg]
            self._procs.append((sock, subprocess.Popen(cmd, stdin=subprocess.DEVNULL)))

    def command_args(self) -> str:
        """What the worker command adds so that it claims one of these processes."""
        return shlex.quote(POOL_FLAG + self.dir)

    def __len__(self) -> int:
        return len(self._procs)

    def claimed(self) -> int:
        return sum(os.path.exists(sock + ".claimed") for sock, _ in self._procs)

    def close(self) -> None:
        """Stop the processes nobody claimed; wait a little for the others (their
        runner has finished with them), then stop them too."""
        for sock, p in self._procs:
            if p.poll() is None and not os.path.exists(sock + ".claimed"):
                p.kill()
        deadline = time.monotonic() + 10.0
        for _, p in self._procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> WarmPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------- worker command side


def hand_over(pool_dir: str, argv: list[str]) -> int | None:
    """Run this worker in a warm process of ``pool_dir``; its exit status, or
    None when none could be claimed (then the caller runs the worker itself)."""
    try:
        slots = sorted(n[: -len(".slot")] for n in os.listdir(pool_dir) if n.endswith(".sock.slot"))
    except OSError:
        return None
    for sock in (os.path.join(pool_dir, s) for s in slots):
        try:
            fd = os.open(sock + ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except OSError:
            continue  # another worker command has it
        os.close(fd)
        conn = _connect(sock)
        if conn is None:
            continue
        with conn:
            msg = {"env": dict(os.environ), "argv": argv, "cwd": os.getcwd()}
            conn.sendall(json.dumps(msg).encode() + b"\n")
            status = b""
            while chunk := conn.recv(16):
                status += chunk
        return int(status) if status.strip().isdigit() else 1
    return None


def _connect(path: str) -> socket.socket | None:
    deadline = time.monotonic() + _CONNECT_TIMEOUT_S
    while time.monotonic() < deadline:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            time.sleep(0.02)
        except OSError:
            s.close()
            return None
    return None


# ------------------------------------------------------------ warm side


def serve(sock_path: str, preload: list[str]) -> tuple[dict[str, str], list[str], socket.socket] | None:
    """In the warm process: listen, import, wait for the worker command's
    environment and arguments. Returns them with the connection to report the
    exit status on, or None (nobody came, or the launcher went away)."""
    import importlib

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(sock_path)
    server.listen(1)
    parent = os.getppid()

    def watch_parent() -> None:  # no orphans: the launcher died before claiming us
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch_parent, name="recordprep-warm-parent", daemon=True).start()
    for name in ["apache_beam.runners.worker.sdk_worker_main", "pipelines.transforms", *preload]:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    server.settimeout(IDLE_TIMEOUT_S)
    try:
        conn, _ = server.accept()
    except TimeoutError:
        return None
    finally:
        server.close()
    conn.settimeout(None)
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(1 << 16)
        if not chunk:
            return None
        data += chunk
    msg = json.loads(data)
    os.chdir(msg["cwd"])
    os.environ.clear()
    os.environ.update(msg["env"])
    return msg["env"], msg["argv"], conn
