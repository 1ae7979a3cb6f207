"""bench.run's table selection: what a skip flag leaves out is said in the report, not silently missing."""

from __future__ import annotations

import json

import pytest

from bench import run


@pytest.mark.slow
def test_skip_conversion_runs_no_table_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    argv = ["--size", "small", "--skip-conversion", "--skip-tft", "--skip-ray", "--skip-petastorm",
            "--skip-analysis-memory", "--skip-shuffle"]
    assert run.main(argv) == 0
    (raw,) = tmp_path.glob("*-small.json")
    results = json.loads(raw.read_text())
    assert "conversion" not in results and "readers" not in results
    assert any("--skip-conversion" in n for n in results["notes"])
    md = (tmp_path / "latest-small.md").read_text()
    assert "_conversion table not run_" in md and "_reader table not run_" in md
