"""The keyed-analyzer bench (``bench/analyzers_keyed.py``): recordprep's side of each row on a
tiny copy of the bench data, so the configs it converts keep converting; TF Transform's side
runs in ``python -m bench.analyzers_keyed`` only (its own virtualenv)."""

from __future__ import annotations

from bench import analyzers_keyed


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
