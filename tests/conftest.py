"""Fixtures shared by the test files: the local remote-storage stand-ins, one per test session,
and a tiny copy of the bench data for the bench modules' tests.

The servers are real processes on 127.0.0.1 (tests/_remote.py, tests/_remote_s3.py, tests/_remote_azure.py), started on
first use and stopped at exit. A stack's environment (emulator host, proxy, credentials) is
applied to os.environ from the first test that uses it (TensorFlow reads the GCS settings once per
process) and restored when the session's fixtures end; TensorFlow keeps the GCS settings it read,
which only gs:// paths use.
"""

from __future__ import annotations

import pytest
from _remote import shared_stack
from _remote_process import ServerMissing
from _remote_s3 import shared_s3

_INSTALL = "install the dev extra: pip install -c constraints.txt -e '.[dev]'"


@pytest.fixture(scope="session")
def remote_stack():
    """GCS emulator + latency proxy + WebHDFS (tests/_remote.py: RemoteStack)."""
    try:
        stack = shared_stack()
    except ServerMissing as e:  # only when a server package is genuinely not installed
        pytest.skip(f"remote-storage servers unavailable: {e} ({_INSTALL})")
    yield stack
    stack.restore_env()


@pytest.fixture(scope="session")
def s3_stack():
    """moto's S3 behind the latency proxy (tests/_remote_s3.py: S3Stack)."""
    try:
        stack = shared_s3()
    except ServerMissing as e:  # only when moto is genuinely not installed
        pytest.skip(f"local S3 server unavailable: {e} ({_INSTALL})")
    yield stack
    stack.restore_env()


@pytest.fixture(scope="session")
def azure_stack():
    """Microsoft's Azurite (from npm, cached) behind the latency proxy (tests/_remote_azure.py: AzureStack)."""
    from _remote_azure import shared_azure

    try:
        stack = shared_azure()
    except ServerMissing as e:  # Node.js missing or the npm registry unreachable
        pytest.skip(f"Azurite unavailable: {e}")
    yield stack
    stack.restore_env()


@pytest.fixture(scope="session")
def tiny_bench_avro(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The bench data's first 600 records (``bench.make_data``) as one deflate Avro file."""
    import fastavro

    from bench import make_data

    path = tmp_path_factory.mktemp("bench-data") / "part-00000.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(make_data.SCHEMA), make_data.records(0, 600), codec="deflate")
    return [str(path)]
