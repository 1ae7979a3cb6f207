"""The GCS stand-in: ``gcp-storage-emulator`` (PyPI, pure Python, in memory) on an ephemeral port.

``python tests/_remote.py gcs [--bucket B]``. Beam's GCS IO and ``google-cloud-storage`` reach it
through ``STORAGE_EMULATOR_HOST``; it implements the JSON batch API that Beam's rename (copy +
delete) needs. TensorFlow reaches it through the TLS proxy (``tests/_remote_proxy.py``).
:class:`GcsData` puts objects there and lists them, for a stack that has ``gcs_url`` and ``bucket``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from _remote_process import wait_for_signal

BUCKET = "recordprep-test"
PROJECT = "recordprep-test"
#: The bearer token of the fake credentials (TensorFlow's GOOGLE_AUTH_TOKEN_FOR_TESTING too).
TOKEN = "recordprep-test-token"


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
    wait_for_signal()
    srv.stop()


def add_arguments(parser) -> None:
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", default=BUCKET)


def write_fake_credentials(path: Path) -> Path:
    """An authorized-user credential file with a non-expiring token, so that Beam does not spend
    ~20 s looking for credentials (``GOOGLE_APPLICATION_CREDENTIALS``)."""
    path.write_text(json.dumps({
        "type": "authorized_user", "client_id": PROJECT, "client_secret": "unused",
        "refresh_token": "unused", "token": TOKEN,
        "expiry": "2099-01-01T00:00:00Z", "quota_project_id": PROJECT,
    }))
    return path


class GcsData:
    """Objects in the emulator at ``self.gcs_url``, bucket ``self.bucket``, straight (no proxy)."""

    gcs_url: str
    bucket: str

    def storage_client(self):
        """A ``google.cloud.storage.Client`` on the emulator (anonymous, no proxy)."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ.setdefault("STORAGE_EMULATOR_HOST", self.gcs_url)
        return storage.Client(
            project=PROJECT, credentials=AnonymousCredentials(),
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
