"""The README's quick tour, command by command, as written: through the real CLI and scripts, in order.

The commands are read from README.md, so the README cannot drift from what runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 600


def tour_commands() -> list[str]:
    """The shell commands of the README's "Quick tour" bash block, comments dropped."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick tour", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README.md's Quick tour has no bash block"
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_tour_commands_are_parsed_from_the_readme():
    cmds = tour_commands()
    assert [c.split()[1] if c.startswith("recordprep") else c.split()[1] for c in cmds][:2] == ["infer", "convert"]
    assert not [c for c in cmds if "#" in c], cmds


@pytest.mark.slow
def test_the_readme_tour_runs_as_written(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # the tour runs from the project's root
    bin_dir = str(Path(sys.executable).parent)  # recordprep and python of this environment
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # as a user's shell: the commands quiet TensorFlow themselves
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)
    produced = {}
    for cmd in tour_commands():
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=TIMEOUT_S)
        assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        assert "Traceback" not in r.stderr and "oneDNN" not in r.stderr, f"{cmd}\n{r.stderr[-3000:]}"
        produced[cmd.split()[1]] = r.stdout
    assert (tmp_path / "out" / "dataset_info.json").is_file() and (tmp_path / "report.html").is_file()
    assert (tmp_path / "export" / "1" / "saved_model.pb").is_file()
    # The tour trains a model that learns: the eval AUC its train command prints (the bundled data's
    # Bayes-optimal AUC is about 0.68; a model fed a raw epoch timestamp scored 0.50).
    auc = re.search(r"^eval: .*\bauc ([0-9.]+)$", produced["examples/train.py"], re.M)
    assert auc, produced["examples/train.py"][-2000:]
    assert float(auc.group(1)) >= 0.60, produced["examples/train.py"][-2000:]
    scored = produced["examples/predict.py"].strip().splitlines()
    assert len(scored) == 5 and all(" -> outputs [" in line for line in scored), scored


def demo_commands() -> list[str]:
    """`make demo`'s recipe lines, ``$(BIN)/`` and ``$(DEMO_ENV)`` taken out (the test's environment has both)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "the Makefile has no demo target"
    return [line.strip().replace("$(BIN)/", "").replace("$(DEMO_ENV) ", "") for line in recipe.group(1).splitlines()]


@pytest.mark.slow
def test_make_demo_trains_a_model_that_learns(tmp_path):
    """`make demo`'s Avro conversion and training, as the Makefile runs them: eval AUC >= 0.62."""
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    cmds = demo_commands()
    convert = next(c for c in cmds if c.startswith("recordprep convert") and "demo-out/avro" in c)
    train = next(c for c in cmds if "examples/train.py demo-out/avro" in c)
    for cmd in (convert, train):
        r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert r.returncode == 0, f"{cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    auc = re.search(r"^eval: .*\bauc ([0-9.]+)$", r.stdout, re.M)
    assert auc and float(auc.group(1)) >= 0.62, r.stdout[-2000:]
