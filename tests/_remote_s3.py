"""A local S3 for the ``s3://`` tests and the bench: ``moto`` in server mode behind the latency proxy.

Like the other stand-ins (``tests/_remote.py``), each server is a separate
process bound to 127.0.0.1, announces ``READY <port>`` and is stopped by its
pid (``tests/_remote_process.py``). ``python tests/_remote_s3.py s3 --port 0``
serves moto's S3 (in memory, with conditional writes: ``If-None-Match: *`` and
``If-Match``); the latency proxy (``tests/_remote_proxy.py``) forwards plain
HTTP to it, so the time to first byte, the bandwidth cap, the straggler and the
request counts work as for ``gs://``. Clients reach it the way a user points
them at an S3-compatible store: ``AWS_ENDPOINT_URL`` and credentials in the
environment (never a config file); Beam's S3 file system and boto3 both read
them. :func:`shared_s3` keeps one per test process (the ``s3_stack`` fixture of
``tests/conftest.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _remote import HERE as REMOTE_PY
from _remote_process import ServerStack, announce_and_serve, shared
from _remote_proxy import ProxyControl, make_certs

S3_PY = Path(__file__).resolve()
S3_BUCKET = "recordprep-s3"


def serve_s3(args) -> None:
    from moto.moto_server.threaded_moto_server import MotoRequestHandler
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    app = DomainDispatcherApplication(create_backend_app)  # the service from each request's signature
    server = make_server("127.0.0.1", args.port, app, True, request_handler=MotoRequestHandler)
    announce_and_serve(server)


class S3Stack(ServerStack, ProxyControl):
    """moto's S3 + a latency proxy in front of it, and the environment that points clients there."""

    def __init__(self, *, workdir: Path | None = None) -> None:
        super().__init__(workdir, "recordprep-s3-")
        self.bucket = S3_BUCKET
        try:
            self.moto = self._start("moto", ["s3", "--port", "0"], S3_PY)
            self.moto_url = f"http://127.0.0.1:{self.moto.port}"
            certs = make_certs(self.workdir / "certs")  # the proxy needs them; S3 goes over plain HTTP
            self.proxy = self._start(
                "s3-proxy",
                ["proxy", "--port", "0", "--upstream", self.moto_url, "--cert", str(certs["cert"]),
                 "--key", str(certs["key"])], REMOTE_PY,
            )
            self.endpoint = self.proxy_url = f"http://127.0.0.1:{self.proxy.port}"
            self.client().create_bucket(Bucket=self.bucket)
        except BaseException:
            self.stop()
            raise

    def env(self) -> dict[str, str]:
        """What a user sets for an S3-compatible store: endpoint, region and keys (moto takes any)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "recordprep-test",
            "AWS_SECRET_ACCESS_KEY": "recordprep-test-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            "no_proxy": "127.0.0.1,localhost",
            "NO_PROXY": "127.0.0.1,localhost",
        }

    def client(self) -> Any:
        """A boto3 S3 client on the server, straight to moto (not through the proxy's counts)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.moto_url, region_name="us-east-1",
                            aws_access_key_id="recordprep-test", aws_secret_access_key="recordprep-test-secret")

    def upload_dir(self, local: Path, prefix: str) -> str:
        """Copy the files under ``local`` to ``s3://<bucket>/<prefix>/``; returns that URL."""
        client = self.client()
        for path in sorted(p for p in Path(local).rglob("*") if p.is_file()):
            client.put_object(Bucket=self.bucket, Key=f"{prefix.strip('/')}/{path.relative_to(local).as_posix()}",
                              Body=path.read_bytes())
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def names(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                        Prefix=prefix.strip("/") + "/")
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix.strip('/')}"

    def put(self, key: str, data: bytes) -> None:
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client().delete_object(Bucket=self.bucket, Key=key)

    def get(self, key: str) -> bytes:
        return self.client().get_object(Bucket=self.bucket, Key=key)["Body"].read()


def shared_s3() -> S3Stack:
    """One S3 stack per process, its environment applied to ``os.environ``; stopped at exit."""
    return shared(S3Stack)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("s3")
    s.add_argument("--port", type=int, default=0)
    serve_s3(ap.parse_args(argv))


if __name__ == "__main__":
    main()
