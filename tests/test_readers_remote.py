"""Non-local paths: TensorFlow file systems (ram:// standing in for gs://), hdfs:// staging
against an in-process fake WebHDFS server, and unsupported schemes."""

from __future__ import annotations

import http.server
import json
import logging
import os
import socket
import threading
import urllib.parse
from collections import Counter
from pathlib import Path

import _readers_fixtures as fx
import pytest
import tensorflow as tf

import readers
from readers import ShardNotFoundError, StagingError
from stores import staging as _staging


class FakeWebHdfs:
    """Serves ``root`` as an HDFS namespace: GETFILESTATUS, and OPEN via a DataNode redirect."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: Counter[tuple[str, str]] = Counter()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                url = urllib.parse.urlparse(self.path)
                query = urllib.parse.parse_qs(url.query)
                if url.path.startswith("/datanode/"):
                    local = fake.root / urllib.parse.unquote(url.path[len("/datanode/") :])
                    body = local.read_bytes()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                assert url.path.startswith("/webhdfs/v1/"), url.path
                assert query.get("user.name"), "simple auth needs user.name"
                hdfs_path = urllib.parse.unquote(url.path[len("/webhdfs/v1") :])
                local = fake.root / hdfs_path.lstrip("/")
                op = query["op"][0]
                fake.requests[(op, hdfs_path)] += 1
                if not local.exists():
                    self.send_response(404)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"RemoteException": {"exception": "FileNotFoundException"}}')
                    return
                if op == "GETFILESTATUS":
                    st = local.stat()
                    body = json.dumps(
                        {
                            "FileStatus": {
                                "length": st.st_size,
                                "type": "DIRECTORY" if local.is_dir() else "FILE",
                                "modificationTime": int(st.st_mtime * 1000),
                            }
                        }
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif op == "OPEN":
                    self.send_response(307)
                    self.send_header("Location", f"/datanode/{hdfs_path.lstrip('/')}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self.send_response(400)
                    self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hdfs(tmp_path, monkeypatch):
    namespace = tmp_path / "namespace"
    o = fx.write_output(namespace / "data" / "out")
    monkeypatch.setattr(_staging, "_clients", {})
    monkeypatch.setenv("RECORDPREP_HDFS_CLIENT", "webhdfs")
    monkeypatch.setenv("RECORDPREP_HDFS_CACHE", str(tmp_path / "stage"))
    with FakeWebHdfs(namespace) as server:
        monkeypatch.setenv("RECORDPREP_WEBHDFS_URL", server.url)
        yield o, server, tmp_path / "stage"


def test_hdfs_metadata_and_training_through_staging(hdfs, caplog):
    o, server, stage = hdfs
    url = "hdfs://namenode:8020/data/out"
    assert readers.load_info(url + "/train-*") == o.info
    with caplog.at_level(logging.INFO, logger="readers"):
        ds = readers.train_dataset(url + "/train-*", 8, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == o.all_ids("train")
    staged = stage / "namenode_8020" / "data" / "out"
    assert sorted(p.name for p in staged.glob("train-*")) == [
        s.file for s in o.info.splits["train"].shards
    ]
    assert not list(staged.glob("eval-*"))  # only what this reader reads
    assert (staged / "dataset_info.json").exists()
    assert "copying 4 of 4 shard(s)" in caplog.text and str(staged) in caplog.text

    def shard_opens():
        return sum(
            n
            for (op, path), n in server.requests.items()
            if op == "OPEN" and path.endswith(".tfrecord")
        )

    opens = shard_opens()
    assert opens == 4

    # Second use: nothing is downloaded again; eval stages only its own shards.
    again = readers.train_dataset(url + "/train-*", 8, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(again)) == o.all_ids("train")
    assert shard_opens() == opens
    assert fx.ids_of(readers.eval_dataset(url, 4, split="eval")) == o.all_ids("eval")


def test_hdfs_restaged_when_the_remote_file_changes(hdfs):
    o, server, stage = hdfs
    url = "hdfs://namenode:8020/data/out/train-*"
    _staging.stage(
        "hdfs://namenode:8020/data/out",
        [o.info.splits["train"].shards[0].file],
        b"{}",
        cache_root=stage,
    )
    path = o.shard_path("train", 0)
    os.utime(path, (1_000_000_000, 1_000_000_000))  # same size, new mtime on "HDFS"
    readers.train_dataset(url, 8, num_epochs=1)
    shard_opens = server.requests[("OPEN", "/data/out/" + o.info.splits["train"].shards[0].file)]
    assert shard_opens == 2


def test_hdfs_missing_shard_names_it(hdfs):
    o, _, _ = hdfs
    o.shard_path("train", 2).unlink()
    with pytest.raises(ShardNotFoundError, match=o.info.splits["train"].shards[2].file):
        readers.train_dataset("hdfs://namenode:8020/data/out/train-*", 8)


def test_hdfs_missing_metadata_is_incomplete(hdfs):
    with pytest.raises(readers.DatasetIncompleteError, match="has not finished"):
        readers.load_info("hdfs://namenode:8020/data/nothing-here/train-*")


def test_unreachable_webhdfs_says_what_to_configure(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(_staging, "_clients", {})
    monkeypatch.setenv("RECORDPREP_HDFS_CLIENT", "webhdfs")
    monkeypatch.setenv("RECORDPREP_WEBHDFS_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(StagingError) as err:
        readers.load_info("hdfs://namenode:8020/data/out")
    message = str(err.value)
    assert "RECORDPREP_WEBHDFS_URL" in message and "pyarrow" in message


def test_bad_client_setting(monkeypatch):
    monkeypatch.setattr(_staging, "_clients", {})
    monkeypatch.setenv("RECORDPREP_HDFS_CLIENT", "carrier-pigeon")
    with pytest.raises(StagingError, match="auto, pyarrow or webhdfs"):
        _staging.client_for("hdfs://nn/x")


# ---------------------------------------------------------------- TensorFlow file systems


def _copy_to_ram(o, name):
    root = f"ram://{name}/out"
    tf.io.gfile.makedirs(root)
    for path in sorted(o.root.iterdir()):
        tf.io.gfile.copy(str(path), f"{root}/{path.name}", overwrite=True)
    return root


def test_reading_through_a_tensorflow_file_system(tmp_path, request):
    # ram:// goes through tf.io.gfile exactly like gs://; remote=True exercises the
    # remote defaults (threaded stat of every shard, large buffers, 16-wide cycle).
    o = fx.write_output(tmp_path / "out", compression="GZIP")
    root = _copy_to_ram(o, request.node.name)
    assert readers.load_info(root + "/train-*.tfrecord.gz") == o.info
    opts = readers.ReadOptions(remote=True)
    ds = readers.train_dataset(
        root + "/train-*", 8, num_epochs=1, drop_remainder=False, options=opts
    )
    assert sorted(fx.ids_of(ds)) == o.all_ids("train")
    assert fx.ids_of(readers.eval_dataset(root, 4, split="eval", options=opts)) == o.all_ids("eval")

    tf.io.gfile.remove(f"{root}/{o.info.splits['train'].shards[1].file}")
    with pytest.raises(ShardNotFoundError, match=o.info.splits["train"].shards[1].file):
        readers.train_dataset(root + "/train-*", 8, options=opts)
    tf.io.gfile.remove(f"{root}/dataset_info.json")
    with pytest.raises(readers.DatasetIncompleteError, match="has not finished"):
        readers.load_info(root)


def test_unsupported_scheme_says_what_to_do():
    with pytest.raises(RuntimeError, match="copy the output directory to local disk"):
        readers.load_info("oss://bucket/out/train-*")


def test_az_and_abfs_paths_name_the_azfs_form():
    for path in ("az://account/container/out/train-*", "abfs://container@account.dfs.core.windows.net/out"):
        with pytest.raises(RuntimeError, match=r"azfs://<account>/<container>/<path>"):
            readers.load_info(path)


def test_unreachable_s3_says_what_to_check(monkeypatch):
    """s3:// is staged through boto3 (no tensorflow-io); a store that does not answer is named."""
    from _ports import free_port

    from readers.errors import StagingError

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(StagingError, match=r"s3://bucket/out/.*AWS_ENDPOINT_URL"):
        readers.load_info("s3://bucket/out/train-*")
