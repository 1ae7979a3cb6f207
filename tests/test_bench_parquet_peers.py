"""The pure-Python pieces of the Ray Data / Petastorm table: break-even epochs, the shard
comparison's verdicts, recordprep's split rule and tokens as the peers restate them, the report.

Nothing here builds the peers' virtualenvs (``make bench`` does)."""

from __future__ import annotations

import numpy as np
import pytest

from bench.parquet_peers import break_even, compare_columns, markdown, ratios
from bench.peers import break_even_epochs


def test_break_even_solves_convert_plus_reads_equal_parquet_reads():
    # 10 s to convert; an epoch of 100k examples: 1 s from shards, 5 s from Parquet -> 4 s saved per epoch.
    e = break_even_epochs(10.0, 100_000, 100_000.0, 20_000.0)
    assert e == pytest.approx(2.5)
    assert 10.0 + e * 1.0 == pytest.approx(e * 5.0)


def test_break_even_counts_the_parquet_paths_own_set_up():
    assert break_even_epochs(10.0, 100_000, 100_000.0, 20_000.0, parquet_setup_s=2.0) == pytest.approx(2.0)
    assert break_even_epochs(1.0, 100_000, 100_000.0, 20_000.0, parquet_setup_s=2.0) == 0.0


def test_break_even_never_when_the_shards_feed_no_faster():
    assert break_even_epochs(10.0, 100_000, 20_000.0, 20_000.0) is None
    assert break_even_epochs(10.0, 100_000, 10_000.0, 20_000.0) is None


def test_break_even_refuses_nonsense():
    with pytest.raises(ValueError, match="positive rates"):
        break_even_epochs(10.0, 100, 0.0, 1.0)


def test_compare_columns_verdicts():
    a = {"x": np.array([[1.0], [2.0]], np.float32), "f": np.array([[1.0], [2.0]], np.float32),
         "ids": np.array([[2], [3], [2]]), "bad": np.array([[2], [3], [4]]), "n": np.array([[5], [6]])}
    b = {"x": np.array([[1.0], [2.0]], np.float32), "f": np.array([[1.0], [2.000001]], np.float32),
         "ids": np.array([[7], [4], [7]]), "bad": np.array([[7], [7], [4]]), "n": np.array([[5], [6]])}
    out = compare_columns(a, b)
    assert out["x"]["status"] == "exact" and out["n"]["status"] == "exact"
    assert out["f"]["status"] == "close"
    assert out["ids"]["status"] == "relabelled"  # the same partition of the rows, other numbers
    assert out["bad"] == {"status": "differs", "rows_differ": pytest.approx(2 / 3)}  # 2 and 3 both became 7


def test_split_rule_and_tokens_match_recordprep():
    from bench.naive import split_index
    from bench.peer_common import split_indexes, tokens
    from convert.records import tokenize
    from convert.splits import Splits

    rows = [{"id": i, "name": f"n{i}", "nested": {"v": i * 0.5}} for i in range(200)]
    splits = Splits()
    assert splits.weights == (0.9, 0.1)  # the peers' SPLITS
    assert split_indexes(rows) == [split_index(r, splits) for r in rows]
    assert 150 < split_indexes(rows).count(0) < 200
    for text in ("Hello, World_1 -- ÉTÉ!", "a\x00b", "", "  x  "):
        assert tokens(text) == tokenize(text)
    assert tokens(None) == []


def _table(conv_s: float, mine: float, peta: float, ray: float) -> dict:
    row = lambda **k: {"ok": True, "label": "x", "runs": 1, **k}  # noqa: E731
    rows = {"recordprep_convert": row(records=1000, records_per_s=100.0, cpu_s_per_1k=1.0, peak_rss_mb=300.0,
                                      work_wall_s=conv_s, raw=[{"result": {"written": {"train": 900}}}]),
            "ray_convert": row(records=1000, records_per_s=10.0, cpu_s_per_1k=5.0, peak_rss_mb=900.0),
            "recordprep_feed": row(examples_per_s=mine, setup_s=0.0, peak_rss_mb=500.0),
            "petastorm_feed": row(examples_per_s=peta, setup_s=1.0, peak_rss_mb=700.0),
            "ray_feed": row(examples_per_s=ray, setup_s=3.0, peak_rss_mb=900.0)}
    table = {"rows": rows, "cores": 2, "comparison": None,
             "peers": {"ray": {"versions": {"ray": "2.58.0"}, "built": "now"}, "petastorm": {"skipped": "no wheel"}}}
    table["break_even"] = break_even(table)
    return table


def test_ratios_and_break_even_of_a_table():
    t = _table(conv_s=10.0, mine=900.0, peta=90.0, ray=180.0)
    q = ratios(t)
    assert q["ray_convert_rate"] == pytest.approx(10.0) and q["ray_convert_rss"] == pytest.approx(1 / 3)
    assert q["petastorm_feed_rate"] == pytest.approx(10.0) and q["ray_feed_rate"] == pytest.approx(5.0)
    # petastorm: (10 - 1) / (10 - 1) = 1 epoch; ray: (10 - 3) / (5 - 1) = 1.75 epochs; the later counts
    assert t["break_even"]["petastorm_feed"]["epochs"] == pytest.approx(1.0)
    assert q["parquet_break_even"] == pytest.approx(1.75)
    assert t["break_even"]["ray_feed"]["epochs_without_setup"] == pytest.approx(10 / 4)
    text = "\n".join(markdown(t))
    assert "petastorm: skipped: no wheel" in text and "1.75 epochs" in text
