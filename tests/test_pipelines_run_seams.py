"""The job's typed seams: the plan is a frozen value with one user-facing view, and a run sets
Beam's file-system options for its length only (``pipelines.plan``, ``pipelines.remote``)."""

from __future__ import annotations

import dataclasses

import pytest
from _pipelines_data import make_records, write_dataset
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import remote
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.plan import Plan, plan


@pytest.fixture
def restored_filesystem_options():
    before = FileSystems._pipeline_options
    yield
    FileSystems.set_options(before)


def test_the_plan_is_frozen_and_shows_the_user_what_a_run_does(tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(40))
    opts = ConvertOptions(inputs=(str(paths["avro"]), str(paths["json"])), config=str(paths["config"]),
                          output=str(tmp_path / "out"), num_shards=3)
    with remote.filesystem_options(opts):
        p = plan(opts)
    assert isinstance(p, Plan) and p.num_shards == len(p.units) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.fingerprint = "x"  # type: ignore[misc]
    shown = p.to_json()
    assert set(shown) == {"inputs", "total_bytes", "num_shards", "units", "splits", "split_key", "features",
                          "fingerprint", "data_check"}
    assert shown["total_bytes"] == sum(f.size for f in p.files) == sum(i["size"] for i in shown["inputs"])
    lines = p.describe()
    assert lines[0] == f"inputs: {len(p.files)} files, {shown['total_bytes'] / 1e6:.2f} MB"
    assert "shards per split: 3  compression: gzip" in lines
    assert lines[-1] == f"config checked against: {shown['data_check']}"


def test_filesystem_options_are_restored_when_the_block_raises(restored_filesystem_options, monkeypatch):
    monkeypatch.delenv(remote.WEBHDFS_URL_ENV, raising=False)  # the NameNode from the path
    mine = PipelineOptions([])
    FileSystems.set_options(mine)
    opts = ConvertOptions(inputs=("hdfs://nn.example:8020/in/x.avro",), config="c.yaml", output="/tmp/out")
    with pytest.raises(RuntimeError, match="boom"), remote.filesystem_options(opts) as options:
        assert FileSystems._pipeline_options is options
        assert options.get_all_options()["hdfs_host"] == "nn.example"  # the derived hdfs:// flags
        raise RuntimeError("boom")
    assert FileSystems._pipeline_options is mine


def test_a_run_leaves_the_callers_filesystem_options_as_they_were(tmp_path, restored_filesystem_options):
    mine = PipelineOptions([])
    FileSystems.set_options(mine)
    paths = write_dataset(tmp_path / "d", make_records(60))
    result = run_convert(ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]),
                                        output=str(tmp_path / "out"), num_shards=1, workers=1))
    assert not result.skipped and FileSystems._pipeline_options is mine
    assert remote.pipeline_options(ConvertOptions(inputs=("x",), config="c", output="o")) is not mine
    assert FileSystems._pipeline_options is mine  # a getter: it sets nothing
