"""The docs site: `mkdocs build --strict` (what `make docs` runs) fails on a broken link, a missing
anchor, a page left out of the nav or an API reference to an object that is gone; every error class
the code defines has its troubleshooting entry; the pages' Python examples parse; the README's links
into the docs resolve."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DOCS = ROOT / "docs"


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
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
    # what the code cites (``docs/benchmarks.md#design-converter``) is a page and a heading of the site
    broken = _broken_code_citations(site)
    assert not broken, f"code cites docs pages or headings that do not exist: {broken}"


_CITATION = re.compile(r"docs/([a-z0-9_/-]+)\.md(?:#([A-Za-z0-9_-]+))?")


def _broken_code_citations(site: Path) -> list[str]:
    """``file:line: docs/page.md#anchor`` for each citation in the code whose page or anchor the built site lacks."""
    broken = []
    for package in ("convert", "readers", "pipelines", "stores", "bench", "examples"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(part.startswith(".") for part in path.relative_to(ROOT).parts):
                continue  # bench/.peers/ (the TF Transform virtualenv) and other hidden trees are not ours
            for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for page, anchor in _CITATION.findall(line):
                    html = site / f"{page}.html"
                    if not html.is_file() or (anchor and f'id="{anchor}"' not in html.read_text(encoding="utf-8")):
                        broken.append(f"{path.relative_to(ROOT)}:{lineno}: docs/{page}.md{'#' + anchor if anchor else ''}")
    return broken


@pytest.mark.slow
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


def _error_classes() -> list[str]:
    """Every exception class defined at module level in convert/, readers/, pipelines/ and stores/ (by name)."""
    names = []
    for package in ("convert", "readers", "pipelines", "stores"):
        for path in sorted((ROOT / package).glob("*.py")):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef) and (
                        re.search(r"(Error|Failed|Warning)$", node.name) or node.name == "Interrupted"):
                    names.append(node.name)
    return names


def test_troubleshooting_covers_every_error_class():
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    classes = _error_classes()
    assert len(classes) > 20  # the scan finds them (a broken scan would pass vacuously)
    missing = [name for name in classes if f"`{name}`" not in page]
    assert not missing, f"docs/troubleshooting.md says nothing about {missing}: add what each means and what to do"


def test_python_examples_in_the_docs_parse():
    blocks = 0
    for page in sorted(DOCS.rglob("*.md")):
        for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)):
            blocks += 1
            try:
                ast.parse(block)
            except SyntaxError as e:
                pytest.fail(f"{page.relative_to(ROOT)}: python block {i + 1} does not parse: {e}")
    assert blocks >= 5


def test_readme_is_short():
    # the README introduces and links; the details live in docs/ (issue 21: at most 1,500 words)
    words = len((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert words <= 1500, f"README.md has {words} words (at most 1,500): move details into a docs/ page"


def test_readme_links_resolve():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = [t for t in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme) if "://" not in t]
    assert any(t.startswith("docs/") for t in links), "the README links into the docs"
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
