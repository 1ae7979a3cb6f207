"""The keyed-analyzer bench (``bench/analyzers_keyed.py``): recordprep's side of each row on a
tiny copy of the bench data, so the configs it converts keep converting; TF Transform's side
runs in ``python -m bench.analyzers_keyed`` only (its own virtualenv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import analyzers_keyed


@pytest.mark.parametrize("case", sorted(analyzers_keyed.CASES))
def test_recordprep_side_converts_each_analyzer(case: str, tiny_bench_avro: list[str], tmp_path: Path) -> None:
    m = analyzers_keyed.recordprep_row(case, tiny_bench_avro, tmp_path, log=lambda *_: None)
    assert m.ok, m.error
    assert m.result["records"] == 600 and m.result["errors"] == 0
    assert m.peak_rss_mb > 0 and m.result["work_wall_s"] > 0
    if case in analyzers_keyed.RANKED:
        name = analyzers_keyed.RANKED[case]
        terms = (tmp_path / f"{case}-recordprep" / "vocab" / f"{name}.txt").read_text().splitlines()
        assert 0 < len(terms) <= analyzers_keyed.TOP_K



def test_agreement_of_two_rankings() -> None:
    a = [f"t{i}" for i in range(120)]
    b = a[:10] + [f"u{i}" for i in range(50)] + a[10:]
    assert analyzers_keyed.agreement(a, b) == {"top100_shared": 0.5, "top10_same_order": True}
    assert analyzers_keyed.agreement(a[::-1], b)["top10_same_order"] is False


def test_markdown_names_each_row() -> None:
    row = {"label": "x", "ok": True, "records_per_s": 1234.5, "cpu_s_per_1k": 0.5, "peak_rss_mb": 300.0}
    table = {"rows": {"cyclical": {"recordprep": row, "tft": {"label": "TF Transform cyclical", "ok": False,
                                                              "error": "no venv"}}}}
    text = analyzers_keyed.markdown(table)
    assert "| `cyclical` | recordprep | 1,234 | 0.50 | 300 MB |" in text and "failed: no venv" in text
