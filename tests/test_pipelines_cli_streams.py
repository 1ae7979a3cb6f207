"""What the CLI prints where: convert's report on stdout in order, TensorFlow's start-up lines hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pipelines_data import CONFIG, make_records

RECORDPREP = Path(sys.executable).with_name("recordprep")
TIMEOUT_S = 300
TF_STARTUP = ("oneDNN custom operations", "cpu_feature_guard", "absl::InitializeLog")


def _run(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(RECORDPREP), *map(str, args)], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=env)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    root = tmp_path_factory.mktemp("streams")
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in make_records(40)))
    (root / "features.yaml").write_text(CONFIG)
    r = _run("convert", "-i", root / "d.jsonl", "-c", root / "features.yaml", "-o", root / "out", "--no-progress")
    assert r.returncode == 0, r.stderr
    return r, root


def test_convert_prints_its_start_line_and_summary_on_stdout_in_order(converted):
    r, root = converted
    lines = r.stdout.splitlines()
    assert lines[0] == f"converting {root / 'd.jsonl'} -> {root / 'out'}", r.stdout
    assert any(line.startswith("records read: 40") for line in lines[1:]), r.stdout
    assert "converting" not in r.stderr and "records read" not in r.stderr


def _tf_env(**set_: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_ENABLE_ONEDNN_OPTS")}
    return {**env, **set_}


@pytest.mark.slow
def test_export_hides_tensorflows_start_up_lines_unless_the_user_sets_the_variables(converted, tmp_path):
    _, root = converted
    (tmp_path / "m.keras").write_bytes(b"not a model")  # TensorFlow is loaded before the model is refused
    r = _run("export", root / "out", tmp_path / "m.keras", tmp_path / "exp", env=_tf_env())
    assert r.returncode == 1 and "cannot load the model" in r.stderr, r.stderr
    assert not [m for m in TF_STARTUP if m in r.stderr], r.stderr
    # A value the user set is kept: TensorFlow's own defaults print the oneDNN line on x86 builds.
    r = _run("export", root / "out", tmp_path / "m.keras", tmp_path / "exp",
             env=_tf_env(TF_CPP_MIN_LOG_LEVEL="0", TF_ENABLE_ONEDNN_OPTS="1"))
    assert r.returncode == 1 and "oneDNN custom operations are on" in r.stderr, r.stderr
