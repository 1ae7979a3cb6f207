"""Local stand-ins for remote storage: a GCS emulator, a latency proxy for TensorFlow, a WebHDFS server.

No cloud and no Hadoop cluster is reachable from the test machines, so the
remote-storage tests (``tests/test_remote_*.py``) and the remote reader
benchmark (``bench/remote.py``) run against real local servers that speak
the same protocols. Every server is a **separate process** started from this
file (``python tests/_remote.py gcs|proxy|webhdfs ...``), binds
**127.0.0.1 only**, prints ``READY <port>`` once it listens, and is stopped by
its process id (``tests/_remote_process.py``). One module per server:

``gcs`` (``tests/_remote_gcs.py``)
    ``gcp-storage-emulator``, in memory, for Beam and ``google-cloud-storage``.
``proxy`` (``tests/_remote_proxy.py``)
    TLS for TensorFlow's GCS file system (its hosts are compiled in), and the
    emulated time to first byte, bandwidth cap and stragglers of remote storage.
``webhdfs`` (``tests/_remote_webhdfs.py``)
    A minimal WebHDFS server over a local directory.

:class:`RemoteStack` starts the three, creates the bucket, and gives the
environment to use (:meth:`RemoteStack.env`); :func:`shared_stack` keeps one
per test process (the ``remote_stack`` fixture of ``tests/conftest.py``). The
local S3 (moto behind the same proxy) is ``tests/_remote_s3.py``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import _remote_gcs
import _remote_proxy
import _remote_webhdfs
from _remote_gcs import BUCKET, TOKEN, GcsData, write_fake_credentials
from _remote_process import (
    ServerMissing,
    ServerProcess,
    ServerStack,
    announce_and_serve,
    http_json,
    shared,
)
from _remote_proxy import ProxyControl, make_certs

HERE = Path(__file__).resolve()

__all__ = ["BUCKET", "HERE", "RemoteStack", "ServerMissing", "ServerProcess", "make_certs", "main",
           "shared_stack", "stats_by_file_name"]

# The names modules written against the one-file _remote imported (tests/_remote_s3.py's model).
_announce_and_serve, _http_json = announce_and_serve, http_json


class RemoteStack(ServerStack, GcsData, ProxyControl):
    """GCS emulator + latency proxy + WebHDFS server on loopback, with the environment to reach them.

    ``env()`` is what a process needs: Beam and ``google-cloud-storage`` talk
    to the emulator directly (``STORAGE_EMULATOR_HOST``; a fake authorized-user
    credential file, :func:`_remote_gcs.write_fake_credentials`), TensorFlow goes
    through the proxy (``https_proxy``/``http_proxy``, ``CURL_CA_BUNDLE``,
    ``GOOGLE_AUTH_TOKEN_FOR_TESTING``), and ``readers`` reaches the WebHDFS
    server through ``RECORDPREP_WEBHDFS_URL``. Loopback addresses bypass the
    proxy (``no_proxy``).
    """

    def __init__(self, *, ttfb_ms: float = 0.0, mbps: float = 0.0, workdir: Path | None = None,
                 gcs_stat_cache_max_age: int | None = 0) -> None:
        super().__init__(workdir, "recordprep-remote-")
        self.bucket = BUCKET
        self.hdfs_root = self.workdir / "hdfs"
        self._stat_age = gcs_stat_cache_max_age
        try:
            self.certs = make_certs(self.workdir / "certs")
            self.gcs = self._start("gcs", ["gcs", "--port", "0", "--bucket", self.bucket], HERE)
            self.gcs_url = f"http://127.0.0.1:{self.gcs.port}"
            self.proxy = self._start(
                "proxy",
                ["proxy", "--port", "0", "--upstream", self.gcs_url, "--cert", str(self.certs["cert"]),
                 "--key", str(self.certs["key"]), "--ttfb-ms", str(ttfb_ms), "--mbps", str(mbps)], HERE,
            )
            self.proxy_url = f"http://127.0.0.1:{self.proxy.port}"
            self.webhdfs = self._start("webhdfs", ["webhdfs", "--port", "0", "--root", str(self.hdfs_root)], HERE)
            self.webhdfs_url = f"http://127.0.0.1:{self.webhdfs.port}"
            self.credentials_file = write_fake_credentials(self.workdir / "fake-adc.json")
        except BaseException:
            self.stop()
            raise

    def env(self, *, counted: bool = False) -> dict[str, str]:
        """``counted``: Beam and ``google-cloud-storage`` reach the emulator through the proxy
        too (as a reverse proxy), so its ``/_stats`` count their requests and bytes."""
        env = {
            "STORAGE_EMULATOR_HOST": self.proxy_url if counted else self.gcs_url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials_file),
            "GOOGLE_CLOUD_PROJECT": _remote_gcs.PROJECT,
            "NO_GCE_CHECK": "true",
            "https_proxy": self.proxy_url,
            "HTTPS_PROXY": self.proxy_url,
            "http_proxy": self.proxy_url,
            "HTTP_PROXY": self.proxy_url,
            "no_proxy": "127.0.0.1,localhost,::1,[::1]",  # loopback is never proxied
            "NO_PROXY": "127.0.0.1,localhost,::1,[::1]",
            "CURL_CA_BUNDLE": str(self.certs["ca"]),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
            "RECORDPREP_HDFS_CLIENT": "webhdfs",
            "RECORDPREP_WEBHDFS_URL": self.webhdfs_url,
        }
        if self._stat_age is not None:
            env["GCS_STAT_CACHE_MAX_AGE"] = str(self._stat_age)
        return env

    def hdfs_beam_args(self, user: str = "recordprep") -> list[str]:
        return ["--hdfs_host", "127.0.0.1", "--hdfs_port", str(self.webhdfs.port), "--hdfs_user", user,
                "--hdfs_full_urls"]

    def webhdfs_stats(self, reset: bool = False) -> dict[str, Any]:
        return http_json("POST" if reset else "GET", f"{self.webhdfs_url}/_stats")


def shared_stack() -> RemoteStack:
    """One stack per process, its environment applied to ``os.environ``; stopped at exit."""
    return shared(RemoteStack)


def stats_by_file_name(data: bytes) -> Any:
    """A ``stats.json`` document with every input path (gs://, hdfs:// or local) cut to its file name.

    Its per-file counts name the inputs, so a remote run's and a local run's statistics compare equal this way.
    """
    def cut(doc: Any) -> Any:
        if isinstance(doc, dict):
            return {cut(k): cut(v) for k, v in doc.items()}
        if isinstance(doc, list):
            return [cut(v) for v in doc]
        if isinstance(doc, str) and doc.endswith((".avro", ".jsonl", ".json")):
            return doc.rsplit("/", 1)[-1]
        return doc

    return cut(json.loads(data))


#: subcommand -> (the server's module: add_arguments(parser), serve function)
_SERVERS = {
    "gcs": (_remote_gcs, _remote_gcs.serve_gcs),
    "proxy": (_remote_proxy, _remote_proxy.serve_proxy),
    "webhdfs": (_remote_webhdfs, _remote_webhdfs.serve_webhdfs),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, (module, _) in _SERVERS.items():
        module.add_arguments(sub.add_parser(name))
    args = ap.parse_args(argv)
    _SERVERS[args.cmd][1](args)


if __name__ == "__main__":
    main()
