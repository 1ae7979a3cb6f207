"""``azfs://`` paths in the readers without a server: parsing, where staged blobs land, the account
check against the connection string, and the messages for the schemes recordprep does not take."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.remote import azure_beam_args
from stores import staging as _staging
from stores.azure import check_account, other_scheme_hint, parse_azfs_url

CONN = "DefaultEndpointsProtocol=https;AccountName=trainstore;AccountKey=c2VjcmV0;EndpointSuffix=core.windows.net"


def test_parse_azfs_url():
    assert parse_azfs_url("azfs://trainstore/events/dt=1/part-0.avro") == ("trainstore", "events", "dt=1/part-0.avro")
    assert parse_azfs_url("azfs://trainstore/events") == ("trainstore", "events", "")
    for bad in ("azfs://Train/events/x", "azfs://trainstore/a/x", "azfs://trainstore/bad--name/x", "az://a/b/c"):
        with pytest.raises(ValueError, match=r"azfs://<account>/<container>/<path>"):
            parse_azfs_url(bad)


def test_staged_blobs_stay_inside_the_cache(tmp_path):
    root = tmp_path / "cache"
    assert _staging.local_path_for("azfs://trainstore/events/out/a.gz", root) == root / "trainstore/events/out/a.gz"
    # ".." in a blob name cannot climb out of the container's directory
    assert _staging.local_path_for("azfs://trainstore/events/../../x", root) == root / "trainstore/events/x"
    assert _staging.cache_env("azfs://trainstore/events") == "RECORDPREP_AZURE_CACHE"


def test_default_cache_root_is_per_store(monkeypatch):
    monkeypatch.delenv("RECORDPREP_AZURE_CACHE", raising=False)
    assert _staging.default_cache_root("azfs://a1b/c1d/x") == Path("~/.cache/recordprep/azure").expanduser()
    monkeypatch.setenv("RECORDPREP_AZURE_CACHE", "/srv/stage")
    assert _staging.default_cache_root("azfs://a1b/c1d/x") == Path("/srv/stage")


def test_a_connection_string_of_another_account_is_refused_without_showing_the_key():
    check_account("trainstore", CONN)  # the same account
    with pytest.raises(ValueError, match="is for the account 'trainstore'") as e:
        check_account("otherstore", CONN)
    assert "c2VjcmV0" not in str(e.value)


def test_beam_flags_for_azure_paths(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    assert azure_beam_args(["/local/in", "azfs://trainstore/events/out"], []) == [
        "--blob_service_endpoint", "https://trainstore.blob.core.windows.net"]
    assert azure_beam_args(["azfs://trainstore/events/out"], ["--blob_service_endpoint", "https://x"]) == []
    assert azure_beam_args(["/local/in", "gs://b/out"], []) == []
    with pytest.raises(ValueError, match="one account per job"):
        azure_beam_args(["azfs://trainstore/events/in/*", "azfs://otherstore/events/out"], [])
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", CONN)
    assert azure_beam_args(["azfs://trainstore/events/out"], []) == []  # the connection string names the endpoint
    with pytest.raises(ValueError, match="is for the account 'trainstore'"):
        azure_beam_args(["azfs://otherstore/events/out"], [])


def test_other_azure_schemes_name_the_azfs_form():
    for path in ("az://trainstore/events/out", "abfs://events@trainstore.dfs.core.windows.net/out",
                 "wasbs://events@trainstore.blob.core.windows.net/out"):
        assert "azfs://<account>/<container>/<path>" in other_scheme_hint(path)
        with pytest.raises(ValueError, match="azfs://"):
            azure_beam_args([path], [])
    assert other_scheme_hint("gs://b/out") is None and other_scheme_hint("/local") is None
