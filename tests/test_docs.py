"""The docs site builds: `mkdocs build --strict` (what `make docs` runs) fails on a broken link,
a missing anchor, a page left out of the nav or an API reference to an object that is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


def test_docs_build_strict(tmp_path):
    site = tmp_path / "site"
    run = _build(ROOT / "mkdocs.yml", site)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (site / "index.html").is_file()
    api = (site / "api" / "readers.html").read_text(encoding="utf-8")
    # the API reference renders each public object from its docstring
    for anchor in ("dataset.train_dataset", "dataset.eval_dataset", "info.load_info", "info.keras_inputs",
                   "info.wait_for_dataset", "serving.transform_layer", "serving.export_serving",
                   "options.ReadOptions"):
        assert f'id="readers.{anchor}"' in api, anchor
    pipelines = (site / "api" / "pipelines.html").read_text(encoding="utf-8")
    for anchor in ("job.run_convert", "options.ConvertOptions", "job.ConvertResult"):
        assert f'id="pipelines.{anchor}"' in pipelines, anchor
    convert = (site / "api" / "convert.html").read_text(encoding="utf-8")
    for anchor in ("config.load_config", "infer.infer_config", "apply.apply_analysis"):
        assert f'id="convert.{anchor}"' in convert, anchor
    # nothing in the built pages loads from another host (fonts, scripts, styles)
    for page in site.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html, page


def test_docs_build_fails_on_a_broken_link(tmp_path):
    # the check above can fail: a copy of the site with one broken link does not build
    docs = tmp_path / "docs"
    subprocess.run(["cp", "-r", str(ROOT / "docs"), str(docs)], check=True)
    (docs / "getting-started.md").write_text(
        (docs / "getting-started.md").read_text(encoding="utf-8") + "\n[gone](no-such-page.md)\n",
        encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text(encoding="utf-8").replace(
        "paths: [.]", f"paths: [{ROOT}]"), encoding="utf-8")
    run = _build(config, tmp_path / "site")
    assert run.returncode != 0
    assert "no-such-page.md" in run.stdout + run.stderr
