"""Local stand-ins for remote storage: a GCS emulator, a latency proxy for TensorFlow, a WebHDFS server.

No cloud and no Hadoop cluster is reachable from the test machines, so the
remote-storage tests (``tests/test_remote_*.py``) and the remote reader
benchmark (``bench/remote.py``) run against real local servers that speak
the same protocols. Every server is a **separate process** started from this
file (``python tests/_remote.py gcs|proxy|webhdfs ...``), binds
**127.0.0.1 only**, prints ``READY <port>`` once it listens, and is stopped by
its process id (:class:`ServerProcess`).

``gcs``
    ``gcp-storage-emulator`` (PyPI, pure Python, in memory) on an ephemeral
    port. Beam's GCS IO and ``google-cloud-storage`` reach it through
    ``STORAGE_EMULATOR_HOST``; it implements the JSON batch API that Beam's
    rename (copy + delete) needs.

``proxy``
    TensorFlow's own GCS file system has no endpoint override: the hosts
    ``www.googleapis.com`` and ``storage.googleapis.com`` are compiled in. It
    does honour libcurl's proxy variables and ``CURL_CA_BUNDLE``, so this
    HTTP(S) proxy accepts ``CONNECT`` to those hosts, terminates TLS with a
    certificate from a throw-away CA made at start-up (:func:`make_certs`),
    and forwards the plain HTTP requests to the emulator. It also forwards
    plain ``http://`` proxy requests (resumable-upload locations come back as
    http), drops the ``Transfer-Encoding: identity`` header TensorFlow sends on
    empty POSTs, and **emulates remote storage**: a configurable delay before
    the first byte of every response (time to first byte) and a per-connection
    bandwidth cap on response bodies (the kernel here has no netem). Both can
    be changed while it runs: ``POST /_config?ttfb_ms=100&mbps=20``. A
    **straggler** (:class:`Straggler`: one named object, or one shard in N,
    served with 10x the time to first byte and 1/10 of the bandwidth, or held
    until released) is set the same way: ``straggler=<name>``,
    ``straggler_every=16``, ``straggler_factor=10``, ``straggler_hold=1|0``;
    ``GET /_stats`` returns request and byte counts (and ranged GETs by the
    length they asked for).

``webhdfs``
    :class:`WebHdfsHandler`, a minimal WebHDFS server over a local directory.

:class:`RemoteStack` starts the three, creates the bucket, and gives the
environment to use (:meth:`RemoteStack.env`). :func:`remote_stack` is the
pytest fixture (one stack per test process).
"""

from __future__ import annotations

import argparse
import atexit
import datetime as _dt
import hashlib
import http.client
import http.server
import json
import os
import posixpath
import re
import shutil
import signal
import socketserver
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
INTERCEPTED_HOSTS = ("www.googleapis.com", "storage.googleapis.com")
BUCKET = "recordprep-test"
READY_TIMEOUT_S = 60.0


# ----------------------------------------------------------------------------- certificates


def make_certs(directory: Path, hosts: tuple[str, ...] = INTERCEPTED_HOSTS) -> dict[str, Path]:
    """A throw-away CA and a server certificate for ``hosts`` (files in ``directory``).

    Returns ``{"ca": ca.pem, "cert": server.pem, "key": server.key}``. The CA
    file is what ``CURL_CA_BUNDLE`` points TensorFlow's libcurl at.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = _dt.datetime.now(_dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "recordprep test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(days=1))
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(days=1))
        .not_valid_after(now + _dt.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in hosts]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


# ----------------------------------------------------------------------------- HTTP helpers

_HOP_BY_HOP = {
    "connection", "proxy-connection", "keep-alive", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-authenticate",
}


def _read_headers(rfile) -> list[tuple[str, str]] | None:
    headers = []
    while True:
        line = rfile.readline(65537)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return headers
        name, _, value = line.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def _read_body(rfile, headers: list[tuple[str, str]]) -> bytes:
    """Request body by Content-Length, or de-chunked (``identity`` means no body framing)."""
    te = (_header(headers, "transfer-encoding") or "").lower()
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
    length = int(_header(headers, "content-length") or 0)
    return rfile.read(length) if length else b""


# ----------------------------------------------------------------------------- latency proxy


#: ``...-00003-of-00016...``: the shard number in a recordprep shard name (convert.spec.shard_name).
_SHARD_NUMBER = re.compile(r"-(\d+)-of-\d+")


class Straggler:
    """Which objects the proxy serves slowly, and how (``POST /_config?straggler...``).

    An object is a straggler when its decoded path contains ``name``, or
    when its shard number (``-00003-of-00016``) is a multiple of ``every``
    (``every=16``: one shard in 16, shard 0 first). Only reads of object
    bytes straggle (GETs outside the JSON metadata API, ``/storage/v1/``), so
    listings and size checks answer at the normal pace: a cold or busy object
    still lists quickly. A straggler's response waits ``factor`` times the
    time to first byte and is sent at 1/``factor`` of the bandwidth; while
    ``hold`` is set it waits, before its first byte, until ``hold`` is
    cleared (an event, so a test can stall a shard for as long as it needs,
    without timing).
    """

    def __init__(self) -> None:
        self.name: str | None = None
        self.every: int | None = None
        self.factor = 10.0
        self.released = threading.Event()
        self.released.set()

    def matches(self, method: str, path: str) -> bool:
        if method != "GET" or path.startswith("/storage/v1/") or not (self.name or self.every):
            return False
        obj = urllib.parse.unquote(urllib.parse.urlsplit(path).path)
        if self.name and self.name in obj:
            return True
        number = _SHARD_NUMBER.search(posixpath.basename(obj))
        return bool(self.every and number and int(number[1]) % self.every == 0)

    def configure(self, query: dict[str, list[str]]) -> None:
        if "straggler" in query:  # an object name (or part of one); empty: none
            self.name = query["straggler"][0] or None
        if "straggler_every" in query:  # one shard in N; 0: none
            self.every = int(query["straggler_every"][0]) or None
        if "straggler_factor" in query:
            self.factor = max(1.0, float(query["straggler_factor"][0]))
        if "straggler_hold" in query:
            if query["straggler_hold"][0] in ("1", "true"):
                self.released.clear()
            else:
                self.released.set()

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "every": self.every, "factor": self.factor,
                "hold": not self.released.is_set()}


class _ProxyState:
    def __init__(self, upstream: str, ttfb_s: float, bytes_per_s: float | None) -> None:
        parsed = urllib.parse.urlparse(upstream)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.ttfb_s = ttfb_s
        self.bytes_per_s = bytes_per_s
        self.lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.active: dict[str, int] = {}
        self.straggler = Straggler()

    def count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] += n

    def in_flight(self, key: str, delta: int) -> None:
        """Track requests of a kind being served; ``counts[f"{key} max in flight"]``
        keeps the most at once (since the last reset)."""
        with self.lock:
            self.active[key] = self.active.get(key, 0) + delta
            peak = f"{key} max in flight"
            self.counts[peak] = max(self.counts[peak], self.active[key])


def object_kind(path: str) -> str:
    """What a request is about, for the counts: the object name's basename up to its first
    ``-`` or ``.`` (``scatter``, ``train``, ``part``; ``-`` for a request naming no object)."""
    parsed = urllib.parse.urlsplit(path)
    name = urllib.parse.parse_qs(parsed.query).get("name", [""])[0]
    if not name and "/o/" in parsed.path:
        name = urllib.parse.unquote(parsed.path.split("/o/", 1)[1])
    base = posixpath.basename(name.rstrip("/"))
    return re.split(r"[-.]", base, maxsplit=1)[0] or "-"


class LatencyProxyHandler(socketserver.StreamRequestHandler):
    """One client connection: CONNECT + TLS to an intercepted host, or plain HTTP proxying."""

    server: Any
    rbufsize = 1 << 16

    def handle(self) -> None:
        try:
            self._serve(self.rfile, self.connection, tls=False)
        except (ConnectionError, ssl.SSLError, OSError):
            pass

    def _serve(self, rfile, sock, *, tls: bool) -> None:
        state: _ProxyState = self.server.state
        while True:
            line = rfile.readline(65537)
            if not line.strip():
                return
            received = time.monotonic()
            try:
                method, target, _version = line.decode("latin-1").split()
            except ValueError:
                return
            headers = _read_headers(rfile)
            if headers is None:
                return
            if method == "CONNECT" and not tls:
                host = target.rsplit(":", 1)[0]
                if host not in INTERCEPTED_HOSTS:
                    sock.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                    return
                state.count("connect")
                sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                tls_sock = self.server.tls_context.wrap_socket(sock, server_side=True)
                try:
                    self._serve(tls_sock.makefile("rb", buffering=1 << 16), tls_sock, tls=True)
                finally:
                    try:
                        tls_sock.unwrap()
                    except (OSError, ssl.SSLError, ValueError):
                        pass
                return
            body = _read_body(rfile, headers)
            if target.startswith(("http://", "https://")):
                parsed = urllib.parse.urlsplit(target)
                path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
                state.count("plain_http")
            else:
                path = target
                if not tls and path.startswith("/_"):
                    self._control(sock, method, path, state)
                    continue
            keep_alive = (_header(headers, "connection") or "").lower() != "close"
            ranged = method == "GET" and _header(headers, "range") is not None
            if ranged:  # from the request's arrival to its last byte sent
                state.in_flight("GET range", +1)
            try:
                keep_alive = self._respond(sock, state, method, path, headers, body, received, keep_alive)
            finally:
                if ranged:
                    state.in_flight("GET range", -1)
            if not keep_alive:
                return

    def _respond(self, sock, state: _ProxyState, method: str, path: str, headers, body: bytes,
                 received: float, keep_alive: bool) -> bool:
        """Forward one request upstream and send the answer after the emulated time to
        first byte, at the emulated bandwidth; returns whether to keep the connection."""
        status, reason, resp_headers, data = self._forward(state, method, path, headers, body)
        state.count("requests")
        rng = _header(headers, "range")
        state.count(f"{method} {'range' if rng else 'plain'}")
        span = re.fullmatch(r"bytes=(\d+)-(\d+)", (rng or "").strip())
        if span:  # what the client asked for (the object may be shorter)
            state.count(f"GET range of {int(span[2]) - int(span[1]) + 1} bytes")
        slow = state.straggler.matches(method, path)
        factor = state.straggler.factor if slow else 1.0
        if slow:
            state.count("straggler requests")
            if not state.straggler.released.is_set():
                state.count("straggler requests held")
                state.straggler.released.wait()
        wait = state.ttfb_s * factor - (time.monotonic() - received)
        if wait > 0:
            time.sleep(wait)
        head = [f"HTTP/1.1 {status} {reason}"]
        for k, v in resp_headers:
            if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                head.append(f"{k}: {v}")
        if method != "HEAD" or data:
            head.append(f"Content-Length: {len(data)}")
        else:
            head.append(f"Content-Length: {_header(resp_headers, 'content-length') or 0}")
        head.append("Connection: keep-alive" if keep_alive else "Connection: close")
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        kind = object_kind(path)
        state.count(f"{method} {kind}")
        if rng:
            state.count(f"GET range {kind}")
        state.count("bytes_in", len(body))
        state.count(f"bytes_in {kind}", len(body))
        if method != "HEAD":
            self._paced_send(sock, data, state, factor)
            state.count("bytes_out", len(data))
            state.count(f"bytes_out {kind}", len(data))
            if rng:
                state.count(f"bytes_out range {kind}", len(data))
        return keep_alive

    @staticmethod
    def _forward(state: _ProxyState, method: str, path: str, headers, body: bytes):
        conn = http.client.HTTPConnection(*state.upstream, timeout=300)
        try:
            out_headers = {}
            for k, v in headers:
                if k.lower() not in _HOP_BY_HOP and k.lower() != "content-length":
                    out_headers[k] = v
            if body or method in ("POST", "PUT", "PATCH"):
                out_headers["Content-Length"] = str(len(body))
            conn.request(method, path, body=body or None, headers=out_headers)
            resp = conn.getresponse()
            data = resp.read()  # eagerly: the (single-threaded) emulator is freed at once
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    @staticmethod
    def _paced_send(sock, data: bytes, state: _ProxyState, slowdown: float = 1.0) -> None:
        rate = state.bytes_per_s / slowdown if state.bytes_per_s else None
        view = memoryview(data)
        if not rate:
            sock.sendall(view)
            return
        chunk = max(16 << 10, min(256 << 10, int(rate / 100)))
        start = time.monotonic()
        sent = 0
        while sent < len(view):
            n = min(chunk, len(view) - sent)
            sock.sendall(view[sent : sent + n])
            sent += n
            ahead = start + sent / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)

    @staticmethod
    def _control(sock, method: str, path: str, state: _ProxyState) -> None:
        parsed = urllib.parse.urlsplit(path)
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)  # straggler= clears it
        if parsed.path == "/_config" and method == "POST":
            if "ttfb_ms" in query:
                state.ttfb_s = float(query["ttfb_ms"][0]) / 1000.0
            if "mbps" in query:
                mbps = float(query["mbps"][0])
                state.bytes_per_s = mbps * 1e6 if mbps > 0 else None
            state.straggler.configure(query)
        if parsed.path == "/_stats" and method == "POST":
            with state.lock:
                state.counts.clear()
        with state.lock:
            payload = {
                "ttfb_ms": state.ttfb_s * 1000.0,
                "mbps": (state.bytes_per_s or 0) / 1e6,
                "straggler": state.straggler.describe(),
                "counts": dict(state.counts),
            }
        body = json.dumps(payload).encode()
        sock.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: keep-alive\r\n\r\n"
            + body
        )


class _ThreadingTCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def serve_proxy(args) -> None:
    state = _ProxyState(args.upstream, args.ttfb_ms / 1000.0, args.mbps * 1e6 if args.mbps > 0 else None)
    server = _ThreadingTCPServer(("127.0.0.1", args.port), LatencyProxyHandler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.tls_context = ctx
    server.state = state
    _announce_and_serve(server)


# ----------------------------------------------------------------------------- GCS emulator


def serve_gcs(args) -> None:
    """gcp-storage-emulator, in memory, with a listen backlog that survives parallel readers."""
    from http import server as http_server

    from gcp_storage_emulator import server as emulator

    class _Backlogged(http_server.HTTPServer):
        request_queue_size = 256

    emulator.server.HTTPServer = _Backlogged  # its module-level `from http import server`
    srv = emulator.create_server("127.0.0.1", args.port, in_memory=True, default_bucket=args.bucket)
    srv.start()
    port = srv._api._httpd.server_address[1]
    print(f"READY {port}", flush=True)
    _wait_for_signal()
    srv.stop()


# ----------------------------------------------------------------------------- WebHDFS


class WebHdfsHandler(http.server.BaseHTTPRequestHandler):
    """A minimal WebHDFS server over a local directory; it stands in for a real HDFS cluster.

    No HDFS or WebHDFS server can be installed on the test machines (none on
    PyPI, Debian or npm, and no JVM), so the HDFS paths of recordprep (Beam's
    ``HadoopFileSystem`` through the ``hdfs`` package for the conversion, and
    ``readers``' WebHDFS staging client) are tested against this server. It
    follows the WebHDFS REST API of Hadoop 3 (``/webhdfs/v1/<path>?op=...``,
    simple authentication through ``user.name``, JSON ``RemoteException``
    errors with HTTP 403/404) for these operations:

    * ``GETFILESTATUS``, ``LISTSTATUS`` (a file lists itself),
      ``GETFILECHECKSUM``, ``GETCONTENTSUMMARY``, ``GETHOMEDIRECTORY``;
    * ``OPEN`` with ``offset``/``length``: the "NameNode" answers 307 with a
      ``Location`` on the "DataNode" endpoint (same port, ``datanode=true``),
      which serves the bytes, as a real cluster does;
    * ``CREATE`` (``overwrite``; 403 ``FileAlreadyExistsException`` without
      it; parents created) and ``APPEND``: two steps, 307 to the DataNode,
      then the body (``Content-Length`` or chunked, as the ``hdfs`` package
      streams it);
    * ``RENAME`` (``destination``): ``{"boolean": false}`` when the source is
      missing, the destination is an existing file or its parent is missing;
      into the directory when the destination is one - HDFS semantics, which
      differ from POSIX (no replacing rename);
    * ``DELETE`` (``recursive``; ``false`` when missing), ``MKDIRS``;
      ``SETPERMISSION``/``SETOWNER``/``SETTIMES`` are accepted and ignored.

    Not implemented: Kerberos/delegation tokens, snapshots, ACLs, xattrs,
    block locations, ``CONCAT``/``TRUNCATE``, HTTPS. ``GET /_stats`` returns the
    operation counts (``POST`` resets them).
    """

    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, *args: Any) -> None:
        pass

    # -- plumbing

    def _send_json(self, code: int, payload: Any) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, code: int, exception: str, message: str) -> None:
        java = {
            "FileNotFoundException": "java.io.FileNotFoundException",
            "FileAlreadyExistsException": "org.apache.hadoop.fs.FileAlreadyExistsException",
            "IllegalArgumentException": "java.lang.IllegalArgumentException",
            "IOException": "java.io.IOException",
            "PathIsNotEmptyDirectoryException": "org.apache.hadoop.fs.PathIsNotEmptyDirectoryException",
            "UnsupportedOperationException": "java.lang.UnsupportedOperationException",
        }.get(exception, exception)
        self._send_json(
            code, {"RemoteException": {"exception": exception, "javaClassName": java, "message": message}}
        )

    def _request_body(self) -> bytes:
        headers = list(self.headers.items())
        return _read_body(self.rfile, headers)

    def _local(self, hdfs_path: str) -> Path:
        norm = posixpath.normpath("/" + hdfs_path.lstrip("/"))
        return self.server.root / norm.lstrip("/")

    def _status(self, local: Path, suffix: str) -> dict[str, Any]:
        st = local.stat()
        is_dir = local.is_dir()
        return {
            "accessTime": 0 if is_dir else int(st.st_atime * 1000),
            "blockSize": 0 if is_dir else 134217728,
            "childrenNum": len(list(local.iterdir())) if is_dir else 0,
            "fileId": st.st_ino,
            "group": "supergroup",
            "length": 0 if is_dir else st.st_size,
            "modificationTime": int(st.st_mtime * 1000),
            "owner": self.server.owner,
            "pathSuffix": suffix,
            "permission": "755" if is_dir else "644",
            "replication": 0 if is_dir else 1,
            "storagePolicy": 0,
            "type": "DIRECTORY" if is_dir else "FILE",
        }

    def _parse(self) -> tuple[str, str, dict[str, str]] | None:
        url = urllib.parse.urlsplit(self.path)
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
        if url.path in ("/_stats",):
            if self.command == "POST":
                with self.server.lock:
                    self.server.counts.clear()
            with self.server.lock:
                self._send_json(200, {"counts": dict(self.server.counts)})
            return None
        if not url.path.startswith("/webhdfs/v1"):
            self._error(404, "IllegalArgumentException", f"not a WebHDFS path: {url.path}")
            return None
        path = urllib.parse.unquote(url.path[len("/webhdfs/v1") :]) or "/"
        op = query.get("op", "").upper()
        datanode = query.get("datanode") == "true"
        with self.server.lock:
            self.server.counts[f"{op}{' (datanode)' if datanode else ''}"] += 1
        return path, op, query

    def _redirect_to_datanode(self, path: str, query: dict[str, str]) -> None:
        q = dict(query, datanode="true", namenoderpcaddress="127.0.0.1:8020")
        host, port = self.server.server_address[:2]
        location = (
            f"http://{host}:{port}/webhdfs/v1{urllib.parse.quote(path)}?{urllib.parse.urlencode(q)}"
        )
        self.send_response(307)
        self.send_header("Location", location)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", "0")
        self.end_headers()

    # -- verbs

    def do_GET(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        path, op, query = parsed
        local = self._local(path)
        if op == "GETHOMEDIRECTORY":
            return self._send_json(200, {"Path": f"/user/{query.get('user.name', 'dr.who')}"})
        if not local.exists():
            return self._error(404, "FileNotFoundException", f"File does not exist: {path}")
        if op == "GETFILESTATUS":
            return self._send_json(200, {"FileStatus": self._status(local, "")})
        if op == "LISTSTATUS":
            if local.is_dir():
                entries = [self._status(c, c.name) for c in sorted(local.iterdir())]
            else:
                entries = [self._status(local, "")]
            return self._send_json(200, {"FileStatuses": {"FileStatus": entries}})
        if op == "GETCONTENTSUMMARY":
            files = [p for p in local.rglob("*") if p.is_file()] if local.is_dir() else [local]
            dirs = [p for p in local.rglob("*") if p.is_dir()] if local.is_dir() else []
            length = sum(p.stat().st_size for p in files)
            return self._send_json(
                200,
                {"ContentSummary": {"directoryCount": len(dirs) + local.is_dir(), "fileCount": len(files),
                                    "length": length, "quota": -1, "spaceConsumed": length,
                                    "spaceQuota": -1}},
            )
        if op == "GETFILECHECKSUM":
            if local.is_dir():
                return self._error(404, "FileNotFoundException", f"Path is not a file: {path}")
            digest = hashlib.md5(local.read_bytes()).hexdigest()
            return self._send_json(
                200,
                {"FileChecksum": {"algorithm": "MD5-of-0MD5-of-512CRC32C", "bytes": digest + "0" * 8,
                                  "length": 28}},
            )
        if op == "OPEN":
            if local.is_dir():
                return self._error(404, "FileNotFoundException", f"Path is not a file: {path}")
            if query.get("datanode") != "true":
                return self._redirect_to_datanode(path, query)
            size = local.stat().st_size
            offset = int(query.get("offset") or 0)
            if offset > size:
                return self._error(403, "IOException", f"Offset={offset} out of the range [0, {size}); {path}")
            length = int(query["length"]) if query.get("length") else size - offset
            length = max(0, min(length, size - offset))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            with open(local, "rb") as f:
                f.seek(offset)
                left = length
                while left:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    left -= len(chunk)
            return None
        return self._error(400, "IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op}")

    def do_PUT(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        path, op, query = parsed
        local = self._local(path)
        if op == "CREATE":
            overwrite = query.get("overwrite", "false").lower() == "true"
            if query.get("datanode") != "true":
                self._request_body()  # a client may send the body to the NameNode: drop it
                if local.is_dir():
                    return self._error(403, "FileAlreadyExistsException", f"{path} already exists as a directory")
                if local.exists() and not overwrite:
                    return self._error(403, "FileAlreadyExistsException", f"{path} for client 127.0.0.1 already exists")
                return self._redirect_to_datanode(path, query)
            data = self._request_body()
            local.parent.mkdir(parents=True, exist_ok=True)
            with open(local, "wb") as f:
                f.write(data)
            self.send_response(201)
            self.send_header("Location", f"hdfs://127.0.0.1:8020{path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self._request_body()
        if op == "MKDIRS":
            if local.exists() and not local.is_dir():
                return self._error(403, "FileAlreadyExistsException", f"Parent path is not a directory: {path}")
            local.mkdir(parents=True, exist_ok=True)
            return self._send_json(200, {"boolean": True})
        if op == "RENAME":
            dest = query.get("destination", "")
            if not dest.startswith("/"):
                return self._error(400, "IllegalArgumentException", f"Invalid destination {dest!r}")
            target = self._local(dest)
            if not local.exists() or path == "/":
                return self._send_json(200, {"boolean": False})
            if target.is_dir():
                target = target / local.name
            if target.exists() or not target.parent.is_dir():
                return self._send_json(200, {"boolean": False})
            os.rename(local, target)
            return self._send_json(200, {"boolean": True})
        if op in ("SETPERMISSION", "SETOWNER", "SETTIMES", "SETREPLICATION"):
            if not local.exists():
                return self._error(404, "FileNotFoundException", f"File does not exist: {path}")
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self._error(400, "IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op}")

    def do_POST(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        path, op, query = parsed
        local = self._local(path)
        if op == "APPEND":
            if not local.is_file():
                self._request_body()
                return self._error(404, "FileNotFoundException", f"File does not exist: {path}")
            if query.get("datanode") != "true":
                self._request_body()
                return self._redirect_to_datanode(path, query)
            data = self._request_body()
            with open(local, "ab") as f:
                f.write(data)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self._request_body()
        return self._error(400, "IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op}")

    def do_DELETE(self) -> None:
        parsed = self._parse()
        if parsed is None:
            return
        path, op, query = parsed
        self._request_body()
        if op != "DELETE":
            return self._error(400, "IllegalArgumentException", f"Invalid value for webhdfs parameter \"op\": {op}")
        local = self._local(path)
        if not local.exists():
            return self._send_json(200, {"boolean": False})
        if local.is_dir():
            if any(local.iterdir()) and query.get("recursive", "false").lower() != "true":
                return self._error(403, "PathIsNotEmptyDirectoryException", f"{path} is non empty': Directory is not empty")
            if local == self.server.root:
                return self._send_json(200, {"boolean": False})
            shutil.rmtree(local)
        else:
            local.unlink()
        return self._send_json(200, {"boolean": True})


class _WebHdfsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def serve_webhdfs(args) -> None:
    server = _WebHdfsServer(("127.0.0.1", args.port), WebHdfsHandler)
    server.root = Path(args.root).resolve()
    server.root.mkdir(parents=True, exist_ok=True)
    server.owner = args.owner
    server.lock = threading.Lock()
    server.counts = Counter()
    _announce_and_serve(server)


# ----------------------------------------------------------------------------- process plumbing


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        if os.getppid() == 1:  # parent died without stopping us
            break


def _announce_and_serve(server) -> None:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    print(f"READY {server.server_address[1]}", flush=True)
    _wait_for_signal()
    server.shutdown()
    server.server_close()


class ServerMissing(RuntimeError):
    """A server's package or binary is not installed (the caller may skip)."""


class ServerProcess:
    """A server started from this file in its own process; stopped by its pid."""

    def __init__(self, name: str, args: list[str], log_dir: Path, script: Path = HERE) -> None:
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


def _http_json(method: str, url: str) -> dict[str, Any]:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with opener.open(req, timeout=30) as resp:
        return json.load(resp)


class RemoteStack:
    """GCS emulator + latency proxy + WebHDFS server on loopback, with the environment to reach them.

    ``env()`` is what a process needs: Beam and ``google-cloud-storage`` talk
    to the emulator directly (``STORAGE_EMULATOR_HOST``; a fake authorized-user
    credential file with a non-expiring token so that Beam does not spend
    ~20 s looking for credentials), TensorFlow goes through the proxy
    (``https_proxy``/``http_proxy``, ``CURL_CA_BUNDLE``,
    ``GOOGLE_AUTH_TOKEN_FOR_TESTING``), and ``readers`` reaches the WebHDFS
    server through ``RECORDPREP_WEBHDFS_URL``. Loopback addresses bypass the
    proxy (``no_proxy``).
    """

    def __init__(self, *, ttfb_ms: float = 0.0, mbps: float = 0.0, workdir: Path | None = None,
                 gcs_stat_cache_max_age: int | None = 0) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="recordprep-remote-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.bucket = BUCKET
        self.hdfs_root = self.workdir / "hdfs"
        self.processes: list[ServerProcess] = []
        self._stat_age = gcs_stat_cache_max_age
        try:
            self.certs = make_certs(self.workdir / "certs")
            self.gcs = self._start("gcs", ["gcs", "--port", "0", "--bucket", self.bucket])
            self.gcs_url = f"http://127.0.0.1:{self.gcs.port}"
            self.proxy = self._start(
                "proxy",
                ["proxy", "--port", "0", "--upstream", self.gcs_url, "--cert", str(self.certs["cert"]),
                 "--key", str(self.certs["key"]), "--ttfb-ms", str(ttfb_ms), "--mbps", str(mbps)],
            )
            self.proxy_url = f"http://127.0.0.1:{self.proxy.port}"
            self.webhdfs = self._start("webhdfs", ["webhdfs", "--port", "0", "--root", str(self.hdfs_root)])
            self.webhdfs_url = f"http://127.0.0.1:{self.webhdfs.port}"
            self.credentials_file = self.workdir / "fake-adc.json"
            self.credentials_file.write_text(json.dumps({
                "type": "authorized_user", "client_id": "recordprep-test", "client_secret": "unused",
                "refresh_token": "unused", "token": "recordprep-test-token",
                "expiry": "2099-01-01T00:00:00Z", "quota_project_id": "recordprep-test",
            }))
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: list[str]) -> ServerProcess:
        proc = ServerProcess(name, args, self.workdir)
        self.processes.append(proc)
        return proc

    def env(self, *, counted: bool = False) -> dict[str, str]:
        """``counted``: Beam and ``google-cloud-storage`` reach the emulator through the proxy
        too (as a reverse proxy), so its ``/_stats`` count their requests and bytes."""
        env = {
            "STORAGE_EMULATOR_HOST": self.proxy_url if counted else self.gcs_url,
            "GOOGLE_APPLICATION_CREDENTIALS": str(self.credentials_file),
            "GOOGLE_CLOUD_PROJECT": "recordprep-test",
            "NO_GCE_CHECK": "true",
            "https_proxy": self.proxy_url,
            "HTTPS_PROXY": self.proxy_url,
            "http_proxy": self.proxy_url,
            "HTTP_PROXY": self.proxy_url,
            "no_proxy": "127.0.0.1,localhost,::1,[::1]",  # loopback is never proxied
            "NO_PROXY": "127.0.0.1,localhost,::1,[::1]",
            "CURL_CA_BUNDLE": str(self.certs["ca"]),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": "recordprep-test-token",
            "RECORDPREP_HDFS_CLIENT": "webhdfs",
            "RECORDPREP_WEBHDFS_URL": self.webhdfs_url,
        }
        if self._stat_age is not None:
            env["GCS_STAT_CACHE_MAX_AGE"] = str(self._stat_age)
        return env

    def apply_env(self) -> None:
        env = self.env()
        self._saved_env = {k: os.environ.get(k) for k in env}
        os.environ.update(env)

    def restore_env(self) -> None:
        for k, v in getattr(self, "_saved_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env = {}

    def hdfs_beam_args(self, user: str = "recordprep") -> list[str]:
        return ["--hdfs_host", "127.0.0.1", "--hdfs_port", str(self.webhdfs.port), "--hdfs_user", user,
                "--hdfs_full_urls"]

    # -- control

    def set_latency(self, ttfb_ms: float, mbps: float) -> dict[str, Any]:
        q = urllib.parse.urlencode({"ttfb_ms": ttfb_ms, "mbps": mbps})
        return _http_json("POST", f"{self.proxy_url}/_config?{q}")

    def set_straggler(self, name: str | None = None, *, every: int | None = None, factor: float = 10.0,
                      hold: bool = False) -> dict[str, Any]:
        """Serve one object (``name``, part of its path) or one shard in ``every`` slowly
        (:class:`Straggler`); ``hold`` stalls its reads until ``set_straggler(..., hold=False)``.
        No name and no ``every``: no straggler."""
        q = urllib.parse.urlencode({"straggler": name or "", "straggler_every": every or 0,
                                    "straggler_factor": factor, "straggler_hold": int(hold)})
        return _http_json("POST", f"{self.proxy_url}/_config?{q}")

    def proxy_stats(self, reset: bool = False) -> dict[str, Any]:
        return _http_json("POST" if reset else "GET", f"{self.proxy_url}/_stats")

    def webhdfs_stats(self, reset: bool = False) -> dict[str, Any]:
        return _http_json("POST" if reset else "GET", f"{self.webhdfs_url}/_stats")

    # -- data

    def storage_client(self):
        """A ``google.cloud.storage.Client`` on the emulator (anonymous, no proxy)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ.setdefault("STORAGE_EMULATOR_HOST", self.gcs_url)
        return storage.Client(
            project="recordprep-test", credentials=AnonymousCredentials(),
            client_options={"api_endpoint": self.gcs_url},
        )

    def upload_dir(self, local: Path, prefix: str) -> str:
        """Copy the files under ``local`` to ``gs://<bucket>/<prefix>/``; returns that URL."""
        bucket = self.storage_client().bucket(self.bucket)
        local = Path(local)
        names = sorted(p for p in local.rglob("*") if p.is_file())
        for path in names:
            rel = path.relative_to(local).as_posix()
            bucket.blob(f"{prefix.strip('/')}/{rel}").upload_from_filename(str(path))
        return f"gs://{self.bucket}/{prefix.strip('/')}"

    def gcs_names(self, prefix: str) -> list[str]:
        client = self.storage_client()
        return sorted(b.name for b in client.list_blobs(self.bucket, prefix=prefix.strip("/") + "/"))

    def stop(self) -> None:
        for proc in reversed(self.processes):
            try:
                proc.stop()
            except Exception:  # noqa: BLE001 - stop the others anyway
                pass
        self.processes = []
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RemoteStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ----------------------------------------------------------------------------- pytest

_STACK: RemoteStack | None = None


def shared_stack() -> RemoteStack:
    """One stack per process, its environment applied to ``os.environ`` (TensorFlow reads
    the GCS settings once per process); stopped at exit."""
    global _STACK
    if _STACK is None:
        _STACK = RemoteStack()
        _STACK.apply_env()
        atexit.register(_STACK.stop)
    return _STACK


try:
    import pytest

    @pytest.fixture(scope="session")
    def remote_stack():
        try:
            stack = shared_stack()
        except ServerMissing as e:  # only when a server package is genuinely not installed
            pytest.skip(f"remote-storage servers unavailable: {e} (install the dev extra: "
                        f"pip install -c constraints.txt -e '.[dev]')")
        yield stack
        # Other test files must not inherit the proxy or the emulator; TensorFlow keeps the GCS
        # settings it read, which only gs:// paths use.
        stack.restore_env()
except ImportError:  # bench/ without pytest
    pass


# ----------------------------------------------------------------------------- CLI


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gcs")
    g.add_argument("--port", type=int, default=0)
    g.add_argument("--bucket", default=BUCKET)
    p = sub.add_parser("proxy")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--upstream", required=True)
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--ttfb-ms", type=float, default=0.0)
    p.add_argument("--mbps", type=float, default=0.0, help="per-connection cap in MB/s (0: none)")
    w = sub.add_parser("webhdfs")
    w.add_argument("--port", type=int, default=0)
    w.add_argument("--root", required=True)
    w.add_argument("--owner", default="recordprep")
    args = ap.parse_args(argv)
    {"gcs": serve_gcs, "proxy": serve_proxy, "webhdfs": serve_webhdfs}[args.cmd](args)


if __name__ == "__main__":
    main()
