"""An ``azfs://`` path of another account than the connection string's, or two accounts in one
job, is a usage error (exit 2, one line, no traceback) for every command, raised before anything
is read or written: Beam's Azure client serves the connection string's account only. No storage
is reached (the check needs only the connection string), so no Azurite here."""

from __future__ import annotations

import pytest
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

from pipelines import remote
from pipelines.cli import app

runner = CliRunner()
ACCOUNT = "devstoreaccount1"
CONNECTION = (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey=a2V5;"
              f"BlobEndpoint=http://127.0.0.1:9/{ACCOUNT};")
OTHER = "azfs://otheraccount/recordprep/out"


@pytest.fixture(autouse=True)
def _connection_string(monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", CONNECTION)
    yield
    remote._AZURE_PATCH.close()  # were Beam's Azure exists patched, later modules find it as it was


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("az") / "d", make_records(40))


def _usage_error(r, *words):
    assert r.exit_code == 2, (r.output, r.exception)
    assert all(w in r.output for w in words) and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("command", [["inspect", OTHER], ["verify", OTHER], ["report", OTHER]])
def test_reading_another_accounts_output_is_a_usage_error(command):
    _usage_error(runner.invoke(app, command), "is for the account 'devstoreaccount1'", "otheraccount")


def test_report_against_another_account_is_a_usage_error(data, tmp_path):
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out)])
    assert r.exit_code == 0, r.output
    _usage_error(runner.invoke(app, ["report", str(out), "--against", OTHER]), "is for the account")


def test_a_job_naming_two_accounts_is_a_usage_error(data):
    r = runner.invoke(app, ["convert", "-i", f"azfs://{ACCOUNT}/recordprep/in/*.avro", "-c", str(data["config"]),
                            "-o", OTHER])
    _usage_error(r, "one account per job", ACCOUNT, "otheraccount")


@pytest.mark.parametrize("extra", [[], ["--dry-run"]])
def test_check_against_another_account_is_refused_before_the_run(data, tmp_path, extra):
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out),
                            "--check-against", OTHER, *extra])
    _usage_error(r, "is for the account 'devstoreaccount1'")
    assert not out.exists()  # nothing converted, nothing committed
