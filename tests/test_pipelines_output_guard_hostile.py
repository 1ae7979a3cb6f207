"""The output's guards hold for ``--dry-run`` as for the run, and for a directory the run
writes into that was replaced by a symbolic link: nothing is written outside the output."""

from __future__ import annotations

import shutil

import pytest
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run_files import ERRORS_DIR, TMP_DIR, VOCAB_DIR

runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("guard") / "d", make_records(60))


def _convert(data, output, *extra):
    return runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(output),
                               "--num-shards", "1", *extra])


@pytest.mark.parametrize("sub", [TMP_DIR, VOCAB_DIR, ERRORS_DIR])
def test_a_symlinked_directory_the_run_writes_into_is_refused(data, tmp_path, sub):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    for extra in ([], ["--dry-run"], ["--overwrite"]):
        r = _convert(data, out, *extra)
        assert r.exit_code == 2, r.output
        assert f"{out / sub} is a symbolic link" in r.output and "Traceback" not in r.output, r.output
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]  # nothing written or removed there
    assert sorted(p.name for p in out.iterdir()) == [sub]


def test_dry_run_refuses_an_output_inside_its_inputs_as_the_run_does(data, tmp_path):
    inputs = tmp_path / "inputs"
    shutil.copytree(data["config"].parent, inputs)
    args = ["convert", "-i", str(inputs), "-c", str(data["config"]), "-o", str(inputs / "out")]
    run = runner.invoke(app, args)
    dry = runner.invoke(app, [*args, "--dry-run"])
    assert run.exit_code == dry.exit_code == 2, (run.output, dry.output)
    error = run.output.splitlines()[-1]
    assert "lies inside the input directory" in error and dry.output.splitlines() == [error], dry.output
    assert not (inputs / "out").exists()
