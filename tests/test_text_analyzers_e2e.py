"""``ngrams``, ``bag_of_words`` and ``tfidf`` end to end: their options checked with clear
errors, a conversion whose columns and metadata are what the modules define, a model
built by ``feature_encoder`` from the spec, and the serving layer bit for bit on the
bundled ``examples/data`` and the real files of ``../shared/realdata`` (slow)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import yaml
from _e2e import cli
from test_readers_serving import (
    EXAMPLES,
    REALDATA,
    _convert_and_check,
    _realdata_files,
    _records_of,
)

import readers
from convert.analysis import Analysis, AnalysisMismatchError
from convert.config import ConfigError, parse_config
from convert.records import tokenize
from convert.transforms.ngrams import ngrams_of
from convert.transforms.tfidf import idf

FEATURES = [
    {"name": "q_ng", "source": "query", "transform": "ngrams", "ngram_range": [1, 2], "max_len": 6},
    {"name": "q_bow", "source": "query", "transform": "bag_of_words", "max_len": 4, "top_k": 12},
    {"name": "q_tfidf", "source": "query", "transform": "tfidf", "max_len": 4, "ngram_range": [1, 2]},
]


def _problems(feature: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_config({"features": [feature]})
    return str(e.value)


@pytest.mark.parametrize(("feature", "says"), [
    ({"name": "g", "transform": "ngrams", "max_len": 4}, "feature 'g': transform 'ngrams' needs 'ngram_range: [min, max]'"),
    ({"name": "g", "transform": "ngrams", "ngram_range": [1, 2]}, "transform 'ngrams' needs 'max_len: N'"),
    ({"name": "g", "transform": "ngrams", "max_len": 4, "ngram_range": [2, 1]},
     "feature 'g': 'ngram_range' must be [min, max], two integers with 1 <= min <= max <= 8"),
    ({"name": "g", "transform": "bag_of_words", "max_len": 4, "ngram_range": [0, 2]}, "'ngram_range' must be [min, max]"),
    ({"name": "g", "transform": "bag_of_words", "max_len": 4, "separator": "\n"},
     "feature 'g': 'separator' must be a string of at most 16 characters without control characters"),
    ({"name": "g", "transform": "tfidf", "max_len": 4, "smooth": "yes"}, "feature 'g': 'smooth' must be true"),
    ({"name": "g", "transform": "tfidf", "max_len": 4, "num_oov_buckets": 3},
     "transform 'tfidf' does not take 'num_oov_buckets' (out-of-vocabulary terms count in a document's size but get no weight"),
    ({"name": "g", "transform": "text", "max_len": 4, "ngram_range": [1, 2]},
     "transform 'text' does not take 'ngram_range' ('ngram_range' applies to transforms ngrams / bag_of_words / tfidf)"),
    ({"name": "g", "transform": "ngrams", "max_len": 4, "ngram_range": [1, 2], "missing_indicator": True},
     "a missing text has no terms already"),
])
def test_options_are_checked_naming_the_feature_and_what_is_allowed(feature, says):
    assert says in _problems(feature)


def test_a_weights_column_clashing_with_another_feature_is_refused():
    with pytest.raises(ConfigError, match="output feature 'q_weights' is produced twice"):
        parse_config({"features": [{"name": "q", "transform": "tfidf", "max_len": 2},
                                   {"name": "q_weights", "transform": "zscore"}]})


def test_defaults_and_the_normalized_config_loads_back():
    cfg = parse_config({"features": FEATURES})
    bow = cfg.features[1]
    assert bow.ngram_range == (1, 1) and bow.separator == " " and cfg.features[2].smooth is True
    assert cfg.output_names == ["q_ng", "q_ng_len", "q_bow", "q_bow_counts", "q_bow_len", "q_tfidf",
                                "q_tfidf_weights", "q_tfidf_len"]
    again = parse_config(json.loads(json.dumps(cfg.to_json())))
    assert again == cfg and again.hash == cfg.hash
    # Other transforms' normalized configs stay as they were (no new key written).
    assert "ngram_range" not in parse_config({"features": [{"name": "t", "transform": "text", "max_len": 2}]}).to_json()["features"][0]


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("analyzers")
    (root / "features.yaml").write_text(yaml.safe_dump({"label": {"source": "clicked"}, "features": FEATURES}))
    r = cli("convert", "-i", EXAMPLES / "clicks-1.jsonl", "-c", root / "features.yaml", "-o", root / "out",
            "--splits", "train=1", "--num-shards", "1", "--order", "input", "--max-errors", "2", "--no-progress")
    assert r.exit_code == 0, r.output
    return root / "out"


def _records() -> list[dict]:
    """The records the conversion kept, in order (the bundled file has a malformed line and one without a label)."""
    out = []
    for line in (EXAMPLES / "clicks-1.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "clicked" in r:
            out.append(r)
    return out


def test_the_columns_are_what_the_modules_define(output):
    info = readers.load_info(str(output))
    enc = {f.name: (f.encoding, f.role) for f in info.features}
    assert enc["q_tfidf"] == ("weighted_tokens", "feature") and enc["q_tfidf_weights"] == ("aux", "aux")
    assert enc["q_bow"] == ("weighted_tokens", "feature") and enc["q_bow_counts"] == ("aux", "aux")
    assert enc["q_ng"] == ("tokens", "feature")
    analysis = Analysis.load(json.loads((output / "analysis.json").read_text()))
    vocab = analysis.vocabularies["q_tfidf"]
    d = analysis.document_frequencies["q_tfidf"]
    recs = _records()
    docs = [set(ngrams_of(tokenize(r["query"]), 1, 2, " ")) for r in recs]
    assert d["documents"] == len(recs) and d["df"] == [sum(t in doc for doc in docs) for t in vocab]
    batch = next(iter(readers.eval_dataset(f"{output}/train-*", batch_size=len(recs))))[0]
    ids, w = batch["q_tfidf"].numpy(), batch["q_tfidf_weights"].numpy()
    table = idf(np.array(d["df"]), d["documents"])
    for i in (0, 1, 7):
        grams = ngrams_of(tokenize(recs[i]["query"]), 1, 2, " ")
        want = sorted((2 + vocab.index(g), grams.count(g)) for g in set(grams))[:4]
        got = [(int(x), float(y)) for x, y in zip(ids[i], w[i], strict=True) if x]
        assert [x for x, _ in got] == [x for x, _ in want]
        for (x, y), (_, c) in zip(got, want, strict=True):
            assert y == np.float32(c / len(grams)) * table[x - 2]
        assert int(batch["q_tfidf_len"][i, 0]) == len(got)


def test_feature_encoder_takes_the_weights_as_inputs(output):
    info = readers.load_info(str(output))
    inputs, encoded = readers.feature_encoder(info)
    assert {"q_tfidf", "q_tfidf_weights", "q_bow", "q_bow_counts", "q_ng"} <= set(inputs)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(encoded))
    batch = next(iter(readers.eval_dataset(f"{output}/train-*", batch_size=32, features=list(inputs))))[0]
    assert model(batch).shape == (32, 1)


def test_a_reused_analysis_must_have_the_same_ngram_range(output):
    analysis = Analysis.load(json.loads((output / "analysis.json").read_text()))
    changed = [dict(f, ngram_range=[1, 3]) if f["name"] == "q_tfidf" else f for f in FEATURES]
    with pytest.raises(AnalysisMismatchError, match=r"feature 'q_tfidf': ngram_range \[1, 2\] there, \[1, 3\] here"):
        analysis.check_config(parse_config({"label": {"source": "clicked"}, "features": changed}))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["clicks-0.avro", "clicks-1.jsonl"])
def test_parity_on_examples_data(name, tmp_path):
    (tmp_path / "features.yaml").write_text(yaml.safe_dump({"label": {"source": "clicked"}, "features": FEATURES}))
    _convert_and_check(EXAMPLES / name, tmp_path / "features.yaml", tmp_path, [])


@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "README.md").is_file(), reason=f"{REALDATA} is absent (real AVRO/JSON files from other tools)")
@pytest.mark.parametrize("rel", _realdata_files() or ["absent"])
def test_parity_on_the_strings_of_real_files(rel, tmp_path):
    """Up to two string fields of each real file (every value a string or null), as ngrams,
    bag_of_words and tfidf."""
    path = REALDATA / rel
    flags = ["--json-records-path", "users"] if rel.endswith("sample_utf8_bom.json") else []
    recs = [r for r in _records_of(path, flags) if isinstance(r, dict)]
    names = sorted({k for r in recs for k, v in r.items() if isinstance(v, str) and re.fullmatch(r"[A-Za-z_]\w*", k)})
    strings = [k for k in names if all(isinstance(r.get(k), str | None) for r in recs)][:2]
    if not strings:
        pytest.skip(f"{rel} has no string field")
    feats = [{"name": f"{t}_{i}", "source": s, "transform": t, "max_len": 3, "allow_all_missing": True,
              **({"ngram_range": [1, 2]} if t != "bag_of_words" else {})}
             for i, s in enumerate(strings) for t in ("ngrams", "bag_of_words", "tfidf")]
    (tmp_path / "features.yaml").write_text(yaml.safe_dump({"features": feats}))
    _convert_and_check(path, tmp_path / "features.yaml", tmp_path, flags)
