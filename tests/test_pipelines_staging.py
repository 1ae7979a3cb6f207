"""Shipping the package to remote workers (Dataflow, Docker-based portable
runners) without a setup.py. No Dataflow is reachable here, so the wheel is
checked the way a worker uses it: Beam's own stager accepts it, pip installs
it with nothing but the wheel, and the installed code imports and converts
a record without TensorFlow.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.stager import Stager

from convert import example, prepare_values, tfrecord
from pipelines.staging import build_wheel, needs_staging, staging_args


def test_wheel_holds_the_packages_and_base_requirements_only(tmp_path):
    whl = Path(build_wheel(tmp_path))
    assert whl.name.startswith("recordprep-") and whl.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(whl) as zf:
        names = set(zf.namelist())
        meta = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        record = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/RECORD"))
    for mod in ("convert/sources.py", "convert/vectorize.py", "pipelines/convert_pass.py", "pipelines/job.py",
                "stores/__init__.py", "stores/gcs.py"):
        assert mod in names
    # Compiled modules only under this platform's full suffix, which no other platform or Python imports
    ext = sysconfig.get_config_var("EXT_SUFFIX")
    assert ("convert/_tokens" + ext in names) == (prepare_values._TokenTable is not None)
    assert ("convert/_example" + ext in names) == (example._encode_c is not None)
    assert ("convert/_tfrecord" + ext in names) == (tfrecord._frame_c is not None)
    assert all(n.endswith((".py", ext)) or ".dist-info/" in n for n in names), sorted(names)
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert any("fastavro" in r for r in requires)
    assert any("apache-beam" in r for r in requires)
    assert not any("tensorflow" in r.lower() for r in requires), requires
    assert all(n in record for n in names)


def test_wheel_is_reproducible(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert Path(build_wheel(a)).read_bytes() == Path(build_wheel(b)).read_bytes()


def test_pip_installs_the_wheel_and_workers_can_use_it(tmp_path):
    whl = build_wheel(tmp_path)
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", str(target), whl], check=True, timeout=120)
    # A worker's interpreter: the installed wheel first, no access to this checkout.
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import convert.vectorize, pipelines.convert_pass, pipelines.commit, convert.example;"
        "assert convert.vectorize.__file__.startswith(sys.argv[1]), convert.vectorize.__file__;"
        "assert 'tensorflow' not in sys.modules;"
        + "".join(f"import convert.{m}; assert convert.{m}.__file__.startswith(sys.argv[1]);"  # the staged C paths
                  for m, built in (("_tokens", prepare_values._TokenTable), ("_example", example._encode_c),
                                   ("_tfrecord", tfrecord._frame_c)) if built is not None)
        + "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", probe, str(target)], capture_output=True, text=True,
                         cwd=str(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_beam_stager_stages_the_wheel_for_dataflow(tmp_path):
    args = staging_args("DataflowRunner", ["--project", "p", "--region", "r"])
    assert args[0] == "--extra_package"
    opts = PipelineOptions(["--runner", "DataflowRunner", "--temp_location", str(tmp_path), *args])
    (tmp_path / "stage").mkdir()
    resources = Stager.create_job_resources(opts, str(tmp_path / "stage"), log_submission_env_dependencies=False)
    staged = [str(r) for r in resources]
    assert any(Path(args[1]).name in s for s in staged), resources
    assert any("extra_packages.txt" in str(r) for r in resources)


@pytest.mark.parametrize("runner, flags, expected", [
    (None, [], False),
    ("DirectRunner", [], False),
    ("apache_beam.runners.portability.fn_api_runner.FnApiRunner", [], False),
    ("DataflowRunner", [], True),
    ("DataflowRunner", ["--setup_file", "./setup.py"], False),
    ("DataflowRunner", ["--extra_package=mine.whl"], False),
    ("PortableRunner", [], True),  # default environment: Docker workers
    ("PortableRunner", ["--environment_type=EXTERNAL"], False),
    ("FlinkRunner", ["--environment_type", "LOOPBACK"], False),
])
def test_staging_is_automatic_for_remote_workers_only(runner, flags, expected):
    assert needs_staging(runner, flags) is expected
