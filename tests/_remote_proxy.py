"""The latency proxy: TLS for TensorFlow's GCS client, and remote storage's time to first byte, bandwidth and stragglers.

``python tests/_remote.py proxy --upstream URL --cert C --key K [--ttfb-ms T] [--mbps M]``.

TensorFlow's own GCS file system has no endpoint override: the hosts
``www.googleapis.com`` and ``storage.googleapis.com`` are compiled in. It
does honour libcurl's proxy variables and ``CURL_CA_BUNDLE``, so this
HTTP(S) proxy accepts ``CONNECT`` to those hosts, terminates TLS with a
certificate from a throw-away CA made at start-up (:func:`make_certs`),
and forwards the plain HTTP requests to the upstream (the GCS emulator, or
moto's S3). It also forwards plain ``http://`` proxy requests (resumable-upload
locations come back as http), drops the ``Transfer-Encoding: identity`` header
TensorFlow sends on empty POSTs, and **emulates remote storage**: a
configurable delay before the first byte of every response (time to first
byte) and a per-connection bandwidth cap on response bodies (the kernel here
has no netem). Both can be changed while it runs: ``POST
/_config?ttfb_ms=100&mbps=20``. A **straggler** (:class:`Straggler`: one named
object, or one shard in N, served with 10x the time to first byte and 1/10 of
the bandwidth, or held until released) is set the same way:
``straggler=<name>``, ``straggler_every=16``, ``straggler_factor=10``,
``straggler_hold=1|0``; ``GET /_stats`` returns request and byte counts (and
ranged GETs by the length they asked for). :class:`ProxyControl` is the client
side of those endpoints.
"""

from __future__ import annotations

import datetime as _dt
import http.client
import json
import posixpath
import re
import socketserver
import ssl
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from _remote_process import announce_and_serve, header, http_json, read_body, read_headers

INTERCEPTED_HOSTS = ("www.googleapis.com", "storage.googleapis.com")


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


# ----------------------------------------------------------------------------- latency proxy

#: Headers of one hop, never forwarded.
_HOP_BY_HOP = {
    "connection", "proxy-connection", "keep-alive", "transfer-encoding", "te", "trailer",
    "upgrade", "proxy-authorization", "proxy-authenticate",
}

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
            headers = read_headers(rfile)
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
            body = read_body(rfile, headers)
            if target.startswith(("http://", "https://")):
                parsed = urllib.parse.urlsplit(target)
                path = parsed.path + (f"?{parsed.query}" if parsed.query else "")
                state.count("plain_http")
            else:
                path = target
                if not tls and path.startswith("/_"):
                    self._control(sock, method, path, state)
                    continue
            keep_alive = (header(headers, "connection") or "").lower() != "close"
            ranged = method == "GET" and header(headers, "range") is not None
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
        rng = header(headers, "range")
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
            head.append(f"Content-Length: {header(resp_headers, 'content-length') or 0}")
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
    announce_and_serve(server)



def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--ttfb-ms", type=float, default=0.0)
    parser.add_argument("--mbps", type=float, default=0.0, help="per-connection cap in MB/s (0: none)")


class ProxyControl:
    """A stack's handle on its running proxy (at ``self.proxy_url``): latency, stragglers, counts."""

    proxy_url: str

    def set_latency(self, ttfb_ms: float, mbps: float) -> dict[str, Any]:
        q = urllib.parse.urlencode({"ttfb_ms": ttfb_ms, "mbps": mbps})
        return http_json("POST", f"{self.proxy_url}/_config?{q}")

    def set_straggler(self, name: str | None = None, *, every: int | None = None, factor: float = 10.0,
                      hold: bool = False) -> dict[str, Any]:
        """Serve one object (``name``, part of its path) or one shard in ``every`` slowly
        (:class:`Straggler`); ``hold`` stalls its reads until ``set_straggler(..., hold=False)``.
        No name and no ``every``: no straggler."""
        q = urllib.parse.urlencode({"straggler": name or "", "straggler_every": every or 0,
                                    "straggler_factor": factor, "straggler_hold": int(hold)})
        return http_json("POST", f"{self.proxy_url}/_config?{q}")

    def proxy_stats(self, reset: bool = False) -> dict[str, Any]:
        return http_json("POST" if reset else "GET", f"{self.proxy_url}/_stats")
