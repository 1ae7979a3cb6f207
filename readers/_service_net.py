"""The network side of ``recordprep data-service``: bind address, port ownership, dispatcher probe.

TensorFlow 2.21's tf.data service servers (``GrpcDataServerBase::Start``)
always listen on ``0.0.0.0:<port>`` (gRPC makes it ``[::]``, every interface)
with ``SO_REUSEPORT``, and neither address nor socket options can be passed
in. What this module enforces around them (Linux), and how:

- **Bind address.** A listener bound to a specific address takes that
  address's connections before a wildcard one does (the kernel looks up the
  exact address first). So for ``--bind 127.0.0.1`` (the default) a
  :class:`Shadows` listener on the same port, with ``SO_REUSEPORT``, holds
  every other address of the host and closes each connection it gets: the
  server is reachable on loopback only. Addresses that appear later are
  shadowed at the next :meth:`Shadows.refresh`.
- **One server per port.** ``SO_REUSEPORT`` lets a second server of the same
  user start on a taken port and silently share its connections.
  :func:`claim_port` binds the port without ``SO_REUSEPORT`` first (taken:
  :class:`PortInUse`), and :func:`check_sole_listener` then verifies, from
  ``/proc/net/tcp*``, that no other process's socket listens on it (a server
  started at the same moment).
- **Dispatcher probe.** :func:`wait_for_dispatcher` asks the dispatcher's
  ``GetVersion`` over gRPC until it answers or the start timeout passes; the
  caller's stop event (set by its signal handlers) ends the wait at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import ipaddress
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass

WILDCARDS = ("0.0.0.0", "::", "*")


class PortInUse(OSError):
    """The port is taken by another process (or a server that just started there)."""


class DispatcherUnreachable(RuntimeError):
    """The dispatcher did not answer within the start timeout, or is not a tf.data dispatcher."""


@dataclass(frozen=True)
class Bind:
    """Where a server is reachable: ``address`` (None: every interface) and loopback."""

    address: str | None

    @property
    def everywhere(self) -> bool:
        return self.address is None

    @property
    def loopback_only(self) -> bool:
        return self.address is not None and ipaddress.ip_address(self.address).is_loopback

    def describe(self) -> str:
        if self.everywhere:
            return ("all interfaces, UNAUTHENTICATED: any host that reaches this port can run its own tf.data "
                    "graph here; keep it on a private network")
        if self.loopback_only:
            return f"{self.address}, loopback only"
        return f"{self.address} and loopback, UNAUTHENTICATED: any host that reaches {self.address} can run its own tf.data graph here"


def parse_bind(value: str) -> Bind:
    """``--bind``: an IP address of this host, ``localhost``, or ``0.0.0.0``/``::`` for every interface."""
    if value in WILDCARDS:
        return Bind(None)
    text = "127.0.0.1" if value == "localhost" else value
    try:
        ip = ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        raise ValueError(f"--bind must be an IP address of this host, localhost, or 0.0.0.0 for every "
                         f"interface; found {value!r}") from None
    if not ip.is_loopback:
        if sys.platform != "linux":
            raise ValueError(f"--bind {value}: only 127.0.0.1 or 0.0.0.0 on {sys.platform} (TensorFlow listens "
                             "on every interface; recordprep narrows that on Linux only)")
        if ip not in local_addresses():
            raise ValueError(f"--bind {value}: not an address of this host; pass one of "
                             f"{', '.join(sorted(map(str, local_addresses())))}, or 0.0.0.0 for every interface")
    elif sys.platform != "linux":
        raise ValueError(f"--bind {value}: TensorFlow listens on every interface and recordprep narrows that on "
                         "Linux only; pass --bind 0.0.0.0 here, on a private network")
    return Bind(str(ip))


# --------------------------------------------------------------------------- local addresses


class _Sockaddr(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort)]


class _Sockaddr4(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16), ("addr", ctypes.c_ubyte * 4)]


class _Sockaddr6(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("port", ctypes.c_uint16), ("flowinfo", ctypes.c_uint32),
                ("addr", ctypes.c_ubyte * 16), ("scope_id", ctypes.c_uint32)]


class _Ifaddrs(ctypes.Structure):
    pass


_Ifaddrs._fields_ = [("next", ctypes.POINTER(_Ifaddrs)), ("name", ctypes.c_char_p), ("flags", ctypes.c_uint),
                     ("addr", ctypes.POINTER(_Sockaddr)), ("netmask", ctypes.c_void_p),
                     ("ifu", ctypes.c_void_p), ("data", ctypes.c_void_p)]


def _ifaddrs() -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """Every address of this host's interfaces with its scope id (libc ``getifaddrs``)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        raise OSError(ctypes.get_errno(), "getifaddrs failed")
    found = []
    try:
        node = head
        while node:
            sa = node.contents.addr
            if sa and sa.contents.family == socket.AF_INET:
                v4 = ctypes.cast(sa, ctypes.POINTER(_Sockaddr4)).contents
                found.append((ipaddress.IPv4Address(bytes(v4.addr)), 0))
            elif sa and sa.contents.family == socket.AF_INET6:
                v6 = ctypes.cast(sa, ctypes.POINTER(_Sockaddr6)).contents
                found.append((ipaddress.IPv6Address(bytes(v6.addr)), v6.scope_id))
            node = node.contents.next
    finally:
        libc.freeifaddrs(head)
    return found


def local_addresses() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return {ip for ip, _ in _ifaddrs()}


# --------------------------------------------------------------------------- the port


def claim_port(port: int) -> int:
    """``port`` (0: a free one) if no socket listens on it, else :class:`PortInUse`.

    Binds the wildcard address without ``SO_REUSEPORT`` (with ``SO_REUSEADDR``,
    so connections of a server stopped a moment ago, in TIME_WAIT, do not
    count), which any listener on the port refuses.
    """
    families = [socket.AF_INET6, socket.AF_INET] if socket.has_ipv6 else [socket.AF_INET]
    for family in families:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise PortInUse(f"port {port} is in use by another process (another dispatcher or "
                                    f"worker?): stop it or pass another --port") from None
                if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):  # no IPv6 here
                    continue
                raise
            port = s.getsockname()[1]
    return port


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def check_sole_listener(port: int) -> None:
    """:class:`PortInUse` if a socket of another process also listens on ``port`` (Linux; a no-op elsewhere)."""
    tables = [p for p in ("/proc/net/tcp", "/proc/net/tcp6") if os.path.exists(p)]
    if not tables:
        return
    own = _own_socket_inodes()
    for table in tables:
        with open(table) as fh:
            next(fh)
            for line in fh:
                cols = line.split()
                if cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port and cols[9] not in own:
                    raise PortInUse(f"port {port} is in use by another process too (started at the same "
                                    "moment?): stop it or pass another --port")


class Shadows:
    """Listeners on ``port`` at every non-loopback address of this host but ``keep``, closing what they accept."""

    def __init__(self, port: int, keep: str | None) -> None:
        self.port = port
        self.keep = ipaddress.ip_address(keep) if keep else None
        self._socks: dict[tuple[str, int], socket.socket] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.refresh()
        threading.Thread(target=self._refuse, name="data-service-shadows", daemon=True).start()

    def refresh(self) -> None:
        """Shadow the addresses this host has now (call it again to cover addresses added since)."""
        for ip, scope in _ifaddrs():
            if ip.is_loopback or ip == self.keep or (str(ip), scope) in self._socks:
                continue
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            s = socket.socket(family, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((str(ip), self.port, 0, scope) if family == socket.AF_INET6 else (str(ip), self.port))
            except OSError as e:
                s.close()
                if e.errno == errno.EADDRNOTAVAIL:  # not usable yet (IPv6 duplicate detection): next refresh
                    continue
                if e.errno == errno.EADDRINUSE:
                    raise PortInUse(f"port {self.port} at {ip} is in use by another process: stop it or "
                                    "pass another --port") from None
                raise
            s.listen(64)
            s.setblocking(False)
            with self._lock:
                self._socks[(str(ip), scope)] = s

    def _refuse(self) -> None:
        import selectors

        sel = selectors.DefaultSelector()
        watched: set[socket.socket] = set()
        while not self._closed.is_set():
            with self._lock:
                for s in set(self._socks.values()) - watched:
                    sel.register(s, selectors.EVENT_READ)
                    watched.add(s)
            for key, _ in sel.select(timeout=0.2):
                try:
                    conn, _peer = key.fileobj.accept()
                    conn.close()
                except OSError:
                    pass
        sel.close()

    def close(self) -> None:
        self._closed.set()
        time.sleep(0.25)
        with self._lock:
            for s in self._socks.values():
                s.close()
            self._socks.clear()


# --------------------------------------------------------------------------- the dispatcher


def wait_for_dispatcher(target: str, timeout_s: float, stop: threading.Event) -> bool:
    """Until the tf.data dispatcher at ``target`` answers (True) or ``stop`` is set (False).

    :class:`DispatcherUnreachable` after ``timeout_s`` seconds, or at once if a
    gRPC server there does not know the dispatcher's ``GetVersion``.
    """
    import grpc

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    with grpc.insecure_channel(target) as channel:
        get_version = channel.unary_unary("/tensorflow.data.DispatcherService/GetVersion")
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DispatcherUnreachable(
                    f"dispatcher {target} did not answer within {timeout_s:g} s ({last}): start "
                    "`recordprep data-service dispatcher` there first, check --dispatcher, or raise --start-timeout")
            call = get_version.future(b"", timeout=min(left, 2.0))
            while not call.done():
                if stop.wait(0.05):
                    call.cancel()
                    return False
            try:
                call.result()
                return True
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise DispatcherUnreachable(f"{target} answers gRPC but is not a tf.data service dispatcher "
                                                f"({e.details()}): check --dispatcher") from None
                last = f"{e.code().name}: {e.details()}"
            if stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                return False
