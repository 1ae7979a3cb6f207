"""A WebHDFS stand-in over a local directory: ``python tests/_remote.py webhdfs --root DIR``."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import posixpath
import shutil
import threading
import urllib.parse
from collections import Counter
from pathlib import Path
from typing import Any

from _remote_process import announce_and_serve, read_body


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
        return read_body(self.rfile, headers)

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
    announce_and_serve(server)



def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--root", required=True)
    parser.add_argument("--owner", default="recordprep")
