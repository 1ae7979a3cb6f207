"""What the job needs of a runner past the local one: every DoFn ships with plain cloudpickle,
input paths mean the same on a worker whose working directory differs, and ``--runner`` values
outside the supported runners are refused before anything runs (``pipelines.shuffle``,
``pipelines.plan``, ``pipelines.options``)."""

from __future__ import annotations

import collections
import copyreg
import io
import os
import threading
from pathlib import Path

import apache_beam as beam
import pytest
from _pipelines_data import make_records, write_dataset
from apache_beam.internal.cloudpickle import cloudpickle
from typer.testing import CliRunner

from pipelines import local, remote
from pipelines.cli import app
from pipelines.job import _build_pipeline
from pipelines.lock import OutputLock
from pipelines.options import SUPPORTED_RUNNERS, ConvertOptions, OptionsError
from pipelines.plan import plan
from pipelines.unit_input import prepare_unit

#: Beam's own pickler registers reducers for locks in the class-level table of the cloudpickle it
#: vendors (``apache_beam.internal.cloudpickle_pickler``) the first time it pickles: left out here,
#: so this pickles as plain cloudpickle does (Dask's, for one).
_BEAM_ONLY = (type(threading.Lock()), type(threading.RLock()))


class _PlainCloudPickler(cloudpickle.Pickler):
    dispatch_table = collections.ChainMap(
        {k: v for k, v in cloudpickle.Pickler._dispatch_table.items() if k not in _BEAM_ONLY}, copyreg.dispatch_table)


def _plain_dumps(obj: object) -> bytes:
    with io.BytesIO() as f:
        _PlainCloudPickler(f).dump(obj)
        return f.getvalue()


class _Fns(beam.pipeline.PipelineVisitor):
    """Every DoFn and CombineFn of a pipeline, by transform label."""

    def __init__(self) -> None:
        self.fns: dict[str, object] = {}

    def visit_transform(self, node) -> None:
        fn = getattr(node.transform, "fn", None)
        if isinstance(fn, beam.DoFn | beam.CombineFn):
            self.fns[node.full_label] = fn

    enter_composite_transform = visit_transform


@pytest.mark.parametrize("in_process", [True, False])
def test_every_function_of_the_job_pickles_with_plain_cloudpickle(tmp_path, in_process):
    """Runners other than Beam's (Dask's, for one) ship DoFns with cloudpickle, which cannot pickle a
    lock or an event: the gather's stop event used to be made in ``__init__``."""
    paths = write_dataset(tmp_path / "d", make_records(60))
    opts = ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]), output=str(tmp_path / "out"),
                          num_shards=3)
    with remote.filesystem_options(opts):
        p = plan(opts)
    runner = local.Runner(None, [], "test", in_process, 1, None, None)
    visitor = _Fns()
    lock = OutputLock(opts.output)  # not acquired: the pipeline only records its token and age bound
    _build_pipeline(p, None, runner, lock).visit(visitor)
    names = {type(fn).__name__ for fn in visitor.fns.values()}
    assert {"_AnalyzeUnit", "_CountPartition", "_GatherShard"} <= names, names  # the job's own, shuffled and spilled
    for label, fn in visitor.fns.items():
        try:
            back = cloudpickle.loads(_plain_dumps(fn))
        except Exception as e:  # noqa: BLE001 - the label says which DoFn
            pytest.fail(f"{label} ({type(fn).__name__}) does not pickle with cloudpickle: {e}")
        assert type(back) is type(fn)


def test_relative_input_paths_are_read_from_any_working_directory(tmp_path, monkeypatch):
    """A worker's working directory is not the launcher's: the plan gives the units absolute paths,
    while what the user sees (metadata, messages, the fingerprint) keeps the path as given."""
    paths = write_dataset(tmp_path / "d", make_records(40))
    monkeypatch.chdir(tmp_path)
    rel = os.path.relpath(paths["avro"], tmp_path)
    opts = ConvertOptions(inputs=(rel,), config=str(paths["config"]), output=str(tmp_path / "out"), num_shards=2)
    with remote.filesystem_options(opts):
        p = plan(opts)
    assert p.files and all(not os.path.isabs(f.path) for f in p.files)
    ranges = [r for u in p.units for r in u.ranges]
    assert ranges and all(r.location == str(tmp_path / r.path) for r in ranges)
    from convert.prepare import Preparer

    def read() -> int:
        return sum(item.read for u in p.units for item in prepare_unit(u, opts, Preparer(p.config)))

    here = read()
    elsewhere = tmp_path / "worker-cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # as on a Dask or Flink worker
    assert read() == here > 0


@pytest.mark.parametrize("flag", ["--runner=DaskRunner", "--runner=apache_beam.runners.dask.dask_runner.DaskRunner",
                                  "--runner=InteractiveRunner", "--runner=KafkaStreamsRunner"])
def test_an_unsupported_runner_is_refused_naming_the_supported_ones(tmp_path, flag):
    with pytest.raises(OptionsError) as e:
        ConvertOptions(inputs=("x.avro",), config="c.yaml", output=str(tmp_path / "o"), beam_args=(flag,))
    assert flag.split("=")[1] in str(e.value) and "DataflowRunner" in str(e.value) and "PortableRunner" in str(e.value)


@pytest.mark.parametrize("name", ["DirectRunner", "Direct", "dataflow", "DataflowRunner", "PortableRunner", "FlinkRunner",
                                  "SparkRunner", "PrismRunner", "FnApiRunner",
                                  "apache_beam.runners.portability.portable_runner.PortableRunner"])
def test_supported_runners_are_taken_as_beam_names_them(tmp_path, name):
    opts = ConvertOptions(inputs=("x.avro",), config="c.yaml", output=str(tmp_path / "o"), beam_args=("--runner", name))
    assert opts.beam_args == ("--runner", name)
    assert "DataflowRunner" in SUPPORTED_RUNNERS


def test_the_cli_refuses_an_unsupported_runner_with_exit_2(tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(20))
    r = CliRunner().invoke(app, ["convert", "-i", str(paths["avro"]), "-c", str(paths["config"]),
                                 "-o", str(tmp_path / "o"), "--", "--runner", "DaskRunner"])
    assert r.exit_code == 2, r.output
    assert "DaskRunner" in r.output and "DataflowRunner" in r.output
    assert not Path(tmp_path / "o").exists()
