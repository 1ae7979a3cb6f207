"""The store contract (``stores``), run against every registered scheme with a stand-in in the suite:
local disk, gs:// (the GCS emulator), s3:// (moto), azfs:// (Azurite), hdfs:// (the WebHDFS stand-in).

Each scheme's case gives a directory URL on its store and a way to put a file there behind the
store's back; the contract is then the same for all: parse a URL, stat, read a whole file, list
by pattern, ranged reads, and the lock file's create / replace / conditional delete.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import stores
from stores import REGISTRY, scheme_of, store_for


@dataclass
class Place:
    """A fresh directory on one store: ``root`` (URL), ``put(name, data)`` writes a file in it."""

    root: str
    put: Callable[[str, bytes], None]
    parts: Callable[[str], tuple[Any, ...]]  # what parse() gives for root + "/" + name
    client: Any = None  # the storage client the lock takes (gs://)
    #: The stand-in enforces the conditions of conditional writes (gcp-storage-emulator ignores
    #: generation preconditions; that is why pipelines.lock reads before every change).
    enforces_conditions: bool = True


def _local(tmp_path: Path, monkeypatch) -> Place:
    root = tmp_path / "out"
    root.mkdir()

    def put(name: str, data: bytes) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)

    return Place(str(root), put, lambda name: (str(root / name),))


def _gcs(request, monkeypatch) -> Place:
    stack = request.getfixturevalue("remote_stack")
    prefix = f"stores-{uuid.uuid4().hex[:8]}"
    client = stack.storage_client()
    bucket = client.bucket(stack.bucket)
    return Place(f"gs://{stack.bucket}/{prefix}",
                 lambda name, data: bucket.blob(f"{prefix}/{name}").upload_from_string(data),
                 lambda name: (stack.bucket, f"{prefix}/{name}"), client, enforces_conditions=False)


def _s3(request, monkeypatch) -> Place:
    stack = request.getfixturevalue("s3_stack")
    prefix = f"stores-{uuid.uuid4().hex[:8]}"
    _beam_paths(stack.url(prefix))
    return Place(stack.url(prefix), lambda name, data: stack.put(f"{prefix}/{name}", data),
                 lambda name: (stack.bucket, f"{prefix}/{name}"))


def _azure(request, monkeypatch) -> Place:
    stack = request.getfixturevalue("azure_stack")
    prefix = f"stores-{uuid.uuid4().hex[:8]}"
    _beam_paths(stack.url(prefix))
    return Place(stack.url(prefix), lambda name, data: stack.put(f"{prefix}/{name}", data),
                 lambda name: (stack.account, stack.container, f"{prefix}/{name}"))


def _hdfs(request, monkeypatch) -> Place:
    stack = request.getfixturevalue("remote_stack")
    prefix = f"stores-{uuid.uuid4().hex[:8]}"
    root = stack.hdfs_root / prefix
    root.mkdir(parents=True)
    url = f"hdfs://namenode:8020/{prefix}"
    _beam_paths(url)

    def put(name: str, data: bytes) -> None:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)

    return Place(url, put, lambda name: ("namenode", 8020, f"/{prefix}/{name}"))


def _beam_paths(url: str) -> None:
    """Beam's file system of ``url`` gets its options (the derived ``--hdfs_*`` flags, Azure's endpoint)."""
    from pipelines import remote

    remote.use_paths(url)


CASES = {"": _local, "gs": _gcs, "s3": _s3, "azfs": _azure, "hdfs": _hdfs}


#: The schemes whose readers copy the shards to a local cache first (``Store.staged``).
STAGED = sorted(s for s in CASES if store_for(f"{s}://x/y" if s else "/x/y").staged)


def _place(request, tmp_path, monkeypatch) -> Place:
    from stores import staging

    monkeypatch.setattr(staging, "_clients", {})  # staging clients of another test's endpoint
    make = CASES[request.param]
    return make(tmp_path, monkeypatch) if request.param == "" else make(request, monkeypatch)


@pytest.fixture(params=sorted(CASES, key=lambda s: s or "local"), ids=lambda s: s or "local")
def place(request, tmp_path, monkeypatch) -> Place:
    return _place(request, tmp_path, monkeypatch)


@pytest.fixture(params=STAGED)
def staged_place(request, tmp_path, monkeypatch) -> Place:
    return _place(request, tmp_path, monkeypatch)


def test_staged_schemes():
    """Local disk and gs:// are read in place (tf.io reads them); the others are staged."""
    assert STAGED == ["azfs", "hdfs", "s3"]


def test_every_registered_scheme_has_a_store_module_and_a_case_here():
    for scheme, module in REGISTRY.items():
        store = store_for(f"{scheme}://x/y" if scheme else "/x/y")
        assert type(store).__module__ == module, scheme
        assert isinstance(store, stores.Store)
    assert {store_for(f"{s}://x/y" if s else "/x/y").scheme for s in REGISTRY} <= set(CASES)


def test_scheme_of_and_the_fallback_store():
    assert scheme_of("gs://b/x") == "gs" and scheme_of("/a/b") == "" and scheme_of("file:///a") == ""
    assert scheme_of("HDFS://nn/x") == "hdfs" and scheme_of("a/b://c") == ""
    assert store_for("viewfs://nn/x") is store_for("hdfs://nn/x")
    other = store_for("memory://x")
    assert type(other) is stores.Store and other.scheme == "memory"
    assert stores.other_scheme_hint("abfs://c@a.dfs.core.windows.net/x").startswith("abfs://")
    assert "azfs://" in stores.other_scheme_hint("az://a/b/c") and stores.other_scheme_hint("gs://b/x") is None


def test_parse(place):
    url = place.root + "/dir/a.bin"
    assert store_for(url).parse(url) == place.parts("dir/a.bin")


def test_stat_read_list_and_ranged_reads(place):
    store = store_for(place.root)
    data = bytes(range(256)) * 4
    place.put("train-00000.bin", data)
    place.put("train-00001.bin", b"x")
    place.put("eval-00000.bin", b"yy")
    url = place.root + "/train-00000.bin"
    size, mtime = store.stat(url)
    assert size == len(data) and (mtime is None or mtime > 0)
    assert store.stat(place.root + "/missing.bin") is None
    assert store.read(url) == data and store.read(place.root + "/missing.bin") is None
    listed = store.list(place.root, "train-*")
    assert sorted(p.rsplit("/", 1)[-1] for p in listed) == ["train-00000.bin", "train-00001.bin"]
    if scheme_of(place.root) != "hdfs":  # Beam's HDFS listing raises for a missing directory
        assert store.list(place.root + "/nothing-here", "*") == []
    with store.ranged_reader(url) as read:
        assert read(3, 5) == data[3:8]
        assert read(1000, 24) == data[1000:1024]
        assert read(0, 2) == data[:2]


def test_lock_create_replace_and_conditional_delete(place):
    path = place.root + "/_LOCK.json"
    lock = store_for(path).lock_object(path, place.client)
    assert lock.read() is None
    assert lock.create(b'{"a": 1}') is True
    state = lock.created_state(b'{"a": 1}')
    if place.enforces_conditions:
        assert lock.create(b'{"b": 2}') is False  # it exists
    data, read_state, modified = lock.read()
    assert data == b'{"a": 1}' and read_state == state and modified > 0
    new_state = lock.replace(b'{"a": 2}', state)
    assert lock.read()[0] == b'{"a": 2}' and lock.read()[1] == new_state
    if place.enforces_conditions:
        assert lock.remove_if(state) is False  # an older state: another run's lock now
        assert lock.read()[0] == b'{"a": 2}'
    assert lock.remove_if(new_state) is True
    assert lock.read() is None


def test_staging_mirrors_a_staged_store(staged_place, tmp_path):
    place = staged_place
    from stores import staging

    place.put("train-00000.bin", b"shard")
    local = staging.stage(place.root, ["train-00000.bin"], b"{}", cache_root=tmp_path / "cache", threads=2)
    assert Path(local, "train-00000.bin").read_bytes() == b"shard"
    assert Path(local, "dataset_info.json").read_bytes() == b"{}"
    assert Path(local).is_relative_to(tmp_path / "cache")


# ------------------------------------------------------------ hdfs:// time limits


@pytest.fixture(params=["silent", "stalled body"])
def hung_namenode(request) -> Iterator[str]:
    """``host:port`` of a real local server that accepts connections and never answers
    ("silent"), or answers a status line and headers and never the body ("stalled body")."""
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.05)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            conns.append(conn)
            if request.param == "stalled body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 999\r\n\r\n{")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in conns:
        conn.close()
    srv.close()


def test_webhdfs_staging_requests_time_out_naming_host_operation_and_what_to_do(hung_namenode, tmp_path):
    from stores.hdfs import HdfsTimeoutError, StagingError, WebHdfsClient

    client = WebHdfsClient(f"http://{hung_namenode}", user="me", timeout=0.2)  # the test's short limit
    calls = {"GETFILESTATUS": lambda url: client.stat(url), "OPEN": lambda url: client.read(url)}
    calls["OPEN (download)"] = lambda url: client.download(url, tmp_path / "shard")
    for op, call in calls.items():
        with pytest.raises(HdfsTimeoutError) as e:
            call("hdfs://nn:8020/out/train-00000.tfrecord")
        msg = str(e.value)
        assert isinstance(e.value, StagingError) and isinstance(e.value, TimeoutError)
        assert hung_namenode in msg and op.split()[0] in msg and "did not answer within 0.2s" in msg, msg
        assert "NameNode" in msg and "RECORDPREP_WEBHDFS_URL" in msg and "retry" in msg, msg


def test_hdfs_lock_requests_time_out_naming_host_operation_and_what_to_do(hung_namenode, monkeypatch):
    """Beam's WebHDFS client has no time limit: the lock sets one on it, so a NameNode that
    never answers fails each lock call (``pipelines.lock`` then judges the lock) instead of hanging it."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    from stores.hdfs import HdfsLock, HdfsTimeoutError

    host, port = hung_namenode.split(":")
    monkeypatch.setattr(FileSystems, "_pipeline_options", PipelineOptions(
        ["--hdfs_host", host, "--hdfs_port", port, "--hdfs_user", "me", "--hdfs_full_urls"]))
    path = "hdfs://nn:8020/out/_LOCK.json"
    default = store_for(path).lock_object(path)
    assert isinstance(default, HdfsLock) and default.timeout == stores.IO_TIMEOUT_SECONDS
    lock = HdfsLock(path, timeout=0.2)  # the test's short limit
    calls = {"create": lambda: lock.create(b"{}"), "read": lock.read, "replace": lambda: lock.replace(b"{}", b"{}"),
             "read (the conditional delete's check)": lambda: lock.remove_if(b"{}")}
    for op, call in calls.items():
        with pytest.raises(HdfsTimeoutError) as e:
            call()
        msg = str(e.value)
        assert f"the lock's {op.split()[0]} of {path}" in msg and hung_namenode in msg and "within 0.2s" in msg, msg
        assert "--hdfs_host" in msg and "retry" in msg, msg
