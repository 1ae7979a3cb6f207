"""``bench/analyzers_text.py``: its recordprep side runs on tiny data (TF Transform's side needs the
peer virtualenv and runs in the bench only), its configs load, and its tokenizer is recordprep's."""

from __future__ import annotations

import json

import fastavro

from bench import analyzers_text
from convert.config import parse_config
from convert.records import TEXT_DELIMITERS_RE


def test_the_peers_tokens_are_recordprep_s():
    assert analyzers_text.TEXT_DELIMITERS_RE == TEXT_DELIMITERS_RE


def test_each_analyzers_config_loads(tmp_path):
    for a in analyzers_text.FEATURES:
        raw = json.loads(analyzers_text.write_config(a, tmp_path / f"{a}.json").read_text())
        assert parse_config(raw).features[0].transform == a


def test_the_recordprep_rows_run_and_the_peer_is_reported_missing(tmp_path):
    schema = {"type": "record", "name": "E", "fields": [{"name": "query", "type": "string"},
                                                        {"name": "clicked", "type": "int"}]}
    words = "red blue shoes cheap hat new big".split()
    recs = [{"query": " ".join(words[(i * k) % 7] for k in range(1 + i % 5)), "clicked": i % 2} for i in range(300)]
    with open(tmp_path / "in.avro", "wb") as f:
        fastavro.writer(f, schema, recs)
    out = analyzers_text.run([str(tmp_path / "in.avro")], len(recs), ["ngrams", "tfidf"], work=tmp_path / "work",
                             log=lambda _: None)
    for a in ("ngrams", "tfidf"):
        row = out["rows"][a]["recordprep"]
        assert row["ok"] and row["records"] == 300 and row["peak_rss_mb"] > 0, row
        assert "not built" in out["rows"][a]["tft"]["skipped"]
    md = "\n".join(analyzers_text.table(out))
    assert "| tfidf | recordprep |" in md and "| tfidf | TF Transform | TF Transform's virtualenv is not built" in md
