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
    scored = produced["examples/predict.py"].strip().splitlines()
    assert len(scored) == 5 and all(" -> outputs [" in line for line in scored), scored
