"""A local Azure Blob Storage for the ``azfs://`` tests and the bench: Microsoft's Azurite behind the latency proxy.

Azurite comes from the npm registry (the version pinned below), installed once
into ``~/.cache/recordprep/azurite/<version>`` (or ``$RECORDPREP_AZURITE_CACHE``)
and reused; ``npm install`` is retried, since a registry proxy may refuse
requests for a while. Each test session starts ``azurite-blob`` on 127.0.0.1
(a free port picked by Azurite, in-memory storage, telemetry off) and stops it
by its pid, like the Python stand-ins of ``tests/_remote.py``; the latency
proxy of that file forwards plain HTTP to it, so the time to first byte, the
straggler and the request counts work as for ``gs://`` and ``s3://``.

Clients reach it the way a user points them at Azure: a connection string in
``AZURE_STORAGE_CONNECTION_STRING`` (never a config file) with Azurite's
well-known development account, which Beam's Azure file system, the lock and
the readers' staging all read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from _remote import HERE as REMOTE_PY
from _remote_process import READY_TIMEOUT_S, ServerMissing, ServerProcess, ServerStack, shared
from _remote_proxy import ProxyControl, make_certs

AZURITE_VERSION = "3.37.0"
AZURITE_CACHE_ENV = "RECORDPREP_AZURITE_CACHE"
#: Azurite's development account: its name and key are public, documented by Microsoft.
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CONTAINER = "recordprep"
_LISTENING = re.compile(r"successfully listens on http://127\.0\.0\.1:(\d+)")
NPM_ATTEMPTS = 3


def azurite_dir() -> Path:
    root = os.environ.get(AZURITE_CACHE_ENV) or "~/.cache/recordprep/azurite"
    return Path(root).expanduser() / AZURITE_VERSION


def install_azurite() -> Path:
    """The ``azurite-blob`` executable, installed from npm on first use; ``ServerMissing`` saying why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        raise ServerMissing("Node.js and npm are not installed (apt-get install nodejs npm)")
    home = azurite_dir()
    binary = home / "node_modules" / ".bin" / "azurite-blob"
    home.mkdir(parents=True, exist_ok=True)
    (home / "package.json").write_text(
        f'{{"name": "recordprep-azurite", "private": true, "dependencies": {{"azurite": "{AZURITE_VERSION}"}}}}\n')
    error = ""
    for attempt in range(NPM_ATTEMPTS):
        if binary.exists():
            return binary
        if attempt:
            time.sleep(15)
        try:
            run = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--fetch-retries=4",
                                  "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=20000"],
                                 cwd=home, capture_output=True, text=True, timeout=400)
            error = run.stderr.strip()[-500:]
        except subprocess.TimeoutExpired:
            error = "npm install timed out"
    if binary.exists():
        return binary
    raise ServerMissing(f"npm install azurite@{AZURITE_VERSION} failed {NPM_ATTEMPTS} times "
                        f"(is the npm registry reachable?): {error}")


class AzuriteProcess(ServerProcess):
    """``azurite-blob`` in its own process on 127.0.0.1; ready once it prints the port it listens on."""

    def __init__(self, binary: Path, workdir: Path) -> None:
        self.name = "azurite"
        self.log_path = workdir / "azurite.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(binary), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
             "--extentMemoryLimit", "1024", "--disableTelemetry", "--skipApiVersionCheck", "--loose", "--silent"],
            cwd=workdir, stdout=subprocess.PIPE, stderr=self._log, stdin=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")},
        )
        self.pid = self.proc.pid
        self.port = self._wait_ready()

    def _wait_ready(self) -> int:
        seen: list[str] = []
        port: list[int] = []

        def read() -> None:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                seen.append(line)
                match = _LISTENING.search(line)
                if match:
                    port.append(int(match.group(1)))
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(READY_TIMEOUT_S)
        if not port:
            self.stop()
            raise RuntimeError(f"Azurite did not start (pid {self.pid}): {''.join(seen)[-2000:]}"
                               f"{self.log_path.read_text(errors='replace')[-2000:]}")
        return port[0]


class AzureStack(ServerStack, ProxyControl):
    """Azurite + a latency proxy in front of it, and the environment that points clients there."""

    def __init__(self, *, workdir: Path | None = None) -> None:
        super().__init__(workdir, "recordprep-azure-")
        self.account, self.container = ACCOUNT, CONTAINER
        try:
            self.azurite = AzuriteProcess(install_azurite(), self.workdir)
            self.processes.append(self.azurite)
            self.azurite_url = f"http://127.0.0.1:{self.azurite.port}"
            certs = make_certs(self.workdir / "certs")  # the proxy needs them; Azurite is plain HTTP
            self.proxy = self._start(
                "azure-proxy", ["proxy", "--port", "0", "--upstream", self.azurite_url, "--cert",
                                str(certs["cert"]), "--key", str(certs["key"])], REMOTE_PY)
            self.endpoint = self.proxy_url = f"http://127.0.0.1:{self.proxy.port}"
            self.service().create_container(self.container)
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def connection_string(url: str) -> str:
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={ACCOUNT_KEY};"
                f"BlobEndpoint={url}/{ACCOUNT};")

    def env(self) -> dict[str, str]:
        """What a user sets for Azure: the connection string (here through the proxy)."""
        return {
            "AZURE_STORAGE_CONNECTION_STRING": self.connection_string(self.endpoint),
            "no_proxy": "127.0.0.1,localhost,::1",
            "NO_PROXY": "127.0.0.1,localhost,::1",
        }

    def url(self, prefix: str) -> str:
        return f"azfs://{self.account}/{self.container}/{prefix.strip('/')}"

    def service(self) -> Any:
        """A ``BlobServiceClient`` straight to Azurite (not through the proxy's counts)."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string(self.azurite_url))

    def _container(self) -> Any:
        return self.service().get_container_client(self.container)

    def put(self, name: str, data: bytes) -> None:
        self._container().upload_blob(name, data, overwrite=True)

    def get(self, name: str) -> bytes:
        return self._container().download_blob(name).readall()

    def delete(self, name: str) -> None:
        self._container().delete_blob(name)

    def names(self, prefix: str) -> list[str]:
        return sorted(b.name for b in self._container().list_blobs(name_starts_with=prefix.strip("/") + "/"))

    def upload_dir(self, local: Path, prefix: str) -> str:
        """Copy the files under ``local`` to ``azfs://<account>/<container>/<prefix>/``; returns that URL."""
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            self.put(f"{prefix.strip('/')}/{path.relative_to(local).as_posix()}", path.read_bytes())
        return self.url(prefix)


def shared_azure() -> AzureStack:
    """One Azure stack per process, its environment applied to ``os.environ``; stopped at exit."""
    return shared(AzureStack)
