"""convert.config's messages: options a transform does not take are refused
naming the transform's own options, every problem of a config is reported in
one run, and near misses get a "did you mean"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from convert.config import (
    COMMON_OPTIONS,
    MAX_PROBLEMS,
    TRANSFORM_TABLE,
    TRANSFORMS,
    ConfigError,
    load_config,
    parse_config,
)
from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

#: A valid value of each option (for the transforms that take it).
VALID = {"fill": 1.5, "missing_indicator": True, "on_nan": "fill", "clip_min": 0.0, "clip_max": 9.0, "top_k": 10,
         "min_frequency": 2, "num_oov_buckets": 2, "buckets": 64, "max_len": 3, "lowercase": False,
         "num_buckets": 4, "unit": "s", "parts": ["hour"], "sources": ["a", "b"], "source": "elsewhere",
         "allow_all_missing": True}
#: What each transform needs to be valid at all.
NEEDS = {"hash": {"buckets": 8}, "text": {"max_len": 4}, "clip": {"clip_min": 0.0},
         "cross": {"sources": ["a", "b"], "buckets": 8}, "zscore_per_key": {"key": "k"},
         "ngrams": {"max_len": 4, "ngram_range": [1, 2]}, "bag_of_words": {"max_len": 4}, "tfidf": {"max_len": 4}}


def _cfg(feature: dict) -> dict:
    """A config of ``feature`` alone; with an int64 label where its transform ranks by one (``label_vocabulary``)."""
    label = {"label": {"source": "lbl", "dtype": "int64"}} if feature["transform"] == "label_vocabulary" else {}
    return {**label, "features": [feature]}
#: One config using every transform with its options (fingerprints of outputs made before must not move).
EVERY_TRANSFORM = {"label": {"source": "y", "dtype": "float32"}, "features": [
    {"name": "a", "transform": "identity", "fill": 2, "missing_indicator": True, "on_nan": "keep", "max_len": 3},
    {"name": "b", "transform": "zscore"}, {"name": "c", "transform": "minmax", "fill": "mean"},
    {"name": "d", "transform": "log1p"}, {"name": "e", "transform": "clip", "clip_min": -1, "clip_max": 1},
    {"name": "f", "transform": "bucketize", "num_buckets": 4, "missing_indicator": True, "on_nan": "fill"},
    {"name": "g", "transform": "vocabulary", "top_k": 9, "min_frequency": 2, "num_oov_buckets": 3, "max_len": 2},
    {"name": "h", "transform": "hash", "buckets": 99, "max_len": 2},
    {"name": "i", "transform": "text", "max_len": 5, "lowercase": False}, {"name": "j", "transform": "bytes"},
    {"name": "k", "transform": "timestamp", "unit": "s", "parts": ["hour"], "missing_indicator": True},
    {"name": "l", "transform": "cross", "sources": ["a", "b"], "buckets": 7},
    {"name": "m", "transform": "zscore", "allow_all_missing": True}]}


def _problems(raw) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        parse_config(raw, source="cfg.yaml")
    assert str(ei.value).splitlines()[: len(ei.value.problems)] == ei.value.problems
    return ei.value.problems


# ------------------------------------------------ options a transform does not take


@pytest.mark.parametrize("transform, option, own", [
    ("zscore", "top_k", "fill, missing_indicator, on_nan"),
    ("vocabulary", "buckets", "top_k, min_frequency, num_oov_buckets, max_len"),
    ("hash", "clip_min", "buckets, max_len"),
    ("text", "unit", "max_len, lowercase, top_k, min_frequency, num_oov_buckets"),
    ("identity", "clip_max", "fill, missing_indicator, on_nan, max_len"),
    ("vocabulary", "lowercase", "top_k, min_frequency, num_oov_buckets, max_len"),
    ("timestamp", "on_nan", "unit, parts, missing_indicator"),
    ("minmax", "num_buckets", "fill, missing_indicator, on_nan"),
    ("cross", "source", "sources, buckets"),
])
def test_option_the_transform_does_not_take_is_refused_naming_its_options(transform, option, own):
    feature = {"name": "f", "transform": transform, **NEEDS.get(transform, {}), option: VALID[option]}
    [msg] = _problems({"features": [feature]})
    assert msg.startswith("cfg.yaml: feature 'f': ")
    assert f"transform {transform!r} does not take {option!r}" in msg and own in msg, msg


def test_the_table_is_what_validation_accepts():
    """Each option of each transform in TRANSFORM_TABLE loads; every other option is refused."""
    options = set(VALID)
    for transform in TRANSFORMS:
        takes = set(TRANSFORM_TABLE[transform].options) | (set(COMMON_OPTIONS) - {"name", "transform"})
        if transform == "cross":
            takes.discard("source")
        for option in options:
            feature = {"name": "f", "transform": transform, **NEEDS.get(transform, {}), option: VALID[option]}
            if option in takes:
                assert parse_config(_cfg(feature)).features[0].transform == transform, (transform, option)
            else:
                [msg] = _problems(_cfg(feature))
                assert f"does not take {option!r}" in msg, (transform, option, msg)


def test_null_means_the_default_for_any_option():
    cfg = parse_config({"features": [{"name": "f", "transform": "zscore", "top_k": None, "unit": None}]})
    assert cfg.features[0].top_k is None and cfg.features[0].unit is None


@pytest.mark.parametrize("transform", TRANSFORMS)
def test_normalized_config_loads_back_for_every_transform(transform):
    """``Config.to_json()`` (the metadata's config) lists every option, at the value the transform gives it."""
    feature = {"name": "f", "transform": transform, **NEEDS.get(transform, {})}
    cfg = parse_config(_cfg(feature))
    again = parse_config(cfg.to_json())
    assert again == cfg and again.hash == cfg.hash
    normalized = cfg.to_json()["features"][0]
    changed = {"bucketize": ("fill", 1.0), "cross": ("source", "other")}.get(transform, ("lowercase", False))
    if changed[0] not in TRANSFORM_TABLE[transform].options:  # a value the transform would not give it
        [msg] = _problems(_cfg({**normalized, changed[0]: changed[1]}))
        assert f"does not take {changed[0]!r}" in msg, msg


def test_config_hash_of_configs_valid_before_is_unchanged():
    """Fixed values computed before options were checked against the transform: outputs keep their fingerprint."""
    assert parse_config(EVERY_TRANSFORM).hash == "5f3e837fa1e45f47"
    assert load_config(ROOT / "examples" / "features.yaml").hash == "94f6d9a96375d4f8"
    assert load_config(ROOT / "bench" / "features.yaml").hash == "572e8fce835a291a"


def test_shipped_and_documented_configs_load():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [(page, b) for page in pages
              for b in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"), re.S) if "features:" in b]
    assert {page.name for page, _ in blocks} >= {"README.md", "feature-config.md"}
    for page, block in blocks:
        parse_config(yaml.safe_load(block), source=str(page.relative_to(ROOT)))
    for path in (ROOT / "examples" / "features.yaml", ROOT / "bench" / "features.yaml"):
        load_config(path)


# ------------------------------------------------------------ all problems at once


def test_every_problem_is_reported_in_one_error():
    problems = _problems({
        "features": [
            {"name": "age", "transform": "zscore", "top_k": 5},
            {"name": "country", "transform": "vocabulary", "buckets": 9},
            {"name": "ok", "transform": "identity"},
            {"name": "user", "transform": "hash"},
            {"name": "t", "transform": "zcore"},
            {"name": "n", "transform": "identity", "on_nan": "drop", "max_len": 0},
        ],
        "label": {"source": "y", "dtype": "int32"},
    })
    assert len(problems) == 7, problems
    want = [("feature 'age'", "'top_k'"), ("feature 'country'", "'buckets'"), ("feature 'user'", "needs 'buckets"),
            ("feature 't'", "'zcore'"), ("feature 'n'", "'max_len'"), ("feature 'n'", "'on_nan'"),
            ("label", "int32")]
    for where, what in want:
        assert any(p.startswith(f"cfg.yaml: {where}: ") and what in p for p in problems), (where, what, problems)


def test_problems_are_bounded():
    features = [{"name": f"f{i}", "transform": "zscore", "top_k": 3} for i in range(MAX_PROBLEMS + 30)]
    with pytest.raises(ConfigError) as ei:
        parse_config({"features": features}, source="cfg.yaml")
    assert len(ei.value.problems) == MAX_PROBLEMS and ei.value.more == 30
    lines = str(ei.value).splitlines()
    assert len(lines) == MAX_PROBLEMS + 1 and "30 more problem" in lines[-1]


def test_cli_lists_every_problem_and_exits_2(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"age": 1, "country": "a", "user": "u"}\n')
    cfg = tmp_path / "features.yaml"
    cfg.write_text("label: {source: age, dtype: float}\nfeatures:\n"
                   "  - {name: age, transform: zscore, top-k: 5}\n"
                   "  - {name: country, transform: vocabulary, buckts: 9}\n"
                   "  - {name: user, transform: hsh, buckets: 9}\n"
                   "  - {name: score, source: age, transform: zscore, buckets: 3}\n")
    r = runner.invoke(app, ["convert", "-i", str(data), "-c", str(cfg), "-o", str(tmp_path / "out")])
    assert r.exit_code == 2, r.output
    for where, hint in [("feature 'age'", "did you mean 'top_k'?"), ("feature 'country'", "did you mean 'buckets'?"),
                        ("feature 'user'", "did you mean 'hash'?"), ("label", "did you mean 'float32'?")]:
        assert re.search(rf"{re.escape(str(cfg))}: {where}: .*{re.escape(hint)}", r.output), (where, r.output)
    assert f"{cfg}: feature 'score': transform 'zscore' does not take 'buckets'" in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


# ------------------------------------------------------------------ did you mean


@pytest.mark.parametrize("feature, hint", [
    ({"name": "f", "transform": "vocabulary", "top-k": 5}, "did you mean 'top_k'?"),
    ({"name": "f", "transform": "vocabulary", "topk": 5}, "did you mean 'top_k'?"),
    ({"name": "f", "transform": "hash", "buckets": 4, "max-len": 2}, "did you mean 'max_len'?"),
    ({"name": "f", "transform": "hash", "buckts": 5}, "did you mean 'buckets'?"),
    ({"name": "f", "transform": "zcore"}, "did you mean 'zscore'?"),
    ({"name": "f", "transform": "Vocabulary"}, "did you mean 'vocabulary'?"),
    ({"name": "f", "transform": "zscore", "on_nan": "fil"}, "did you mean 'fill'?"),
    ({"name": "f", "transform": "timestamp", "unit": "millis"}, "did you mean 'ms'?"),
    ({"name": "f", "transform": "timestamp", "parts": ["hours"]}, "did you mean 'hour'?"),
])
def test_near_misses_get_a_suggestion(feature, hint):
    problems = _problems({"features": [feature]})
    assert any(hint in p for p in problems), problems


def test_suggested_option_the_transform_does_not_take_says_so():
    [msg] = _problems({"features": [{"name": "f", "transform": "zscore", "topk": 5}]})
    assert "did you mean 'top_k'? transform 'zscore' does not take it either" in msg


@pytest.mark.parametrize("dtype, words", [
    ("int", ["did you mean 'int64'?"]), ("float", ["did you mean 'float32'?"]),
    ("string", ["for class names use transform: vocabulary"]),
])
def test_label_dtype_suggestions(dtype, words):
    [msg] = _problems({"features": [{"name": "f", "transform": "zscore"}], "label": {"source": "y", "dtype": dtype}})
    for w in words:
        assert w in msg, msg


@pytest.mark.parametrize("label, words", [
    ({"source": "gender", "transform": "vocab"}, ["transform must be vocabulary", "did you mean 'vocabulary'?"]),
    ({"source": "gender", "transform": "vocabulary", "dtype": "float32"}, ["class ids are int64"]),
    ({"source": "gender", "transfrom": "vocabulary"}, ["did you mean 'transform'?"]),
])
def test_label_transform_mistakes_are_named(label, words):
    [msg] = _problems({"features": [{"name": "f", "transform": "zscore"}], "label": label})
    for w in words:
        assert w in msg, msg


def test_top_level_key_suggestion():
    [msg] = _problems({"feature": [], "features": [{"name": "f", "transform": "zscore"}]})
    assert "did you mean 'features'?" in msg


# ---------------------------------------------------------------------- property

_JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 10**6), st.floats(), st.text(max_size=6),
                  st.lists(st.text(max_size=3), max_size=3), st.sampled_from(["mean", "ms", "hour", "fill", "keep"]))
_FEATURE = st.builds(
    lambda name, transform, opts: {"name": name, "transform": transform, **opts},
    st.sampled_from(["a", "b", "c"]), st.one_of(st.sampled_from(TRANSFORMS), st.text(max_size=8)),
    st.dictionaries(st.sampled_from(sorted(VALID) + ["topk", "dtype"]),
                    st.one_of(st.sampled_from(list(VALID.values())), _JUNK), max_size=5))


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_FEATURE, min_size=1, max_size=4), st.one_of(st.none(), st.sampled_from(["y", {"source": "y", "dtype": "int"}])))
def test_any_near_valid_config_loads_within_its_table_or_lists_its_problems(features, label):
    raw = {"features": features, **({"label": label} if label else {})}
    try:
        cfg = parse_config(raw, source="cfg.yaml")
    except ConfigError as e:
        assert 1 <= len(e.problems) <= MAX_PROBLEMS and all(p.startswith("cfg.yaml") for p in e.problems)
        return
    for given_, f in zip(features, cfg.features, strict=True):
        takes = {"name", "transform", "source", "allow_all_missing", *TRANSFORM_TABLE[f.transform].options}
        if f.transform == "cross":
            takes.discard("source")
        assert {k for k, v in given_.items() if v is not None} <= takes, given_
    assert parse_config(cfg.to_json()) == cfg  # the normalized form loads back


# ------------------------------------------------ length: false and length_of

_IMP = [
    {"name": "id", "source": "imp[].id", "transform": "hash", "buckets": 64, "max_len": 4},
    {"name": "pos", "source": "imp[].pos", "transform": "identity", "max_len": 4},
]


@pytest.mark.parametrize("feature, expected", [
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length": False},
     "transform 'identity' does not take 'length' (a numeric list pads with 0.0, which is also a value"),
    ({"name": "t", "source": "imp[].t", "transform": "vocabulary", "max_len": 4, "length_of": "pos"},
     "transform 'vocabulary' does not take 'length_of' (a list of ids drops null items"),
    ({"name": "u", "transform": "vocabulary", "length": False},
     "'length: false' leaves out <name>_len, which only lists (max_len) write"),
    ({"name": "u", "transform": "hash", "buckets": 8, "max_len": 2, "length": "no"},
     "'length' must be true or false, found 'no'"),
    ({"name": "p", "source": "price", "transform": "identity", "length_of": "pos"},
     "length_of: only a list (max_len) has a length to share"),
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length_of": "poss"},
     "length_of: no feature is named 'poss' (did you mean 'pos'?)"),
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length_of": "p"},
     "length_of: a feature cannot share its own length"),
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length_of": "id"},
     "length_of: 'id' is not a numeric list (identity, log1p or clip with max_len)"),
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 3, "length_of": "pos"},
     "length_of: 'pos' keeps max_len 4 items, this feature 3"),
    ({"name": "p", "source": "clicks[].price", "transform": "identity", "max_len": 4, "length_of": "pos"},
     "length_of: sources 'clicks[].price' and 'imp[].pos' are not fields of the items of one list"),
    ({"name": "p", "source": "imp[].prices[]", "transform": "identity", "max_len": 4, "length_of": "pos"},
     "length_of: sources 'imp[].prices[]' and 'imp[].pos' are not fields of the items of one list"),
    ({"name": "p", "source": "prices", "transform": "identity", "max_len": 4, "length_of": "pos"},
     "length_of: sources 'prices' and 'imp[].pos' are not fields"),
    ({"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length_of": 3},
     "'length_of' must name another feature (a numeric list of the same list), found 3"),
])
def test_a_length_option_that_would_misstate_a_length_is_refused(feature, expected):
    [msg] = _problems({"features": [*_IMP, feature]})
    assert msg.startswith(f"cfg.yaml: feature {feature['name']!r}: ") and expected in msg, msg


def test_length_of_a_feature_that_shares_its_length_names_the_one_that_writes_it():
    chain = [*_IMP, {"name": "p", "source": "imp[].price", "transform": "identity", "max_len": 4, "length_of": "pos"},
             {"name": "c", "source": "imp[].cost", "transform": "log1p", "max_len": 4, "length_of": "p"}]
    [msg] = _problems({"features": chain})
    assert "feature 'c': length_of: 'p' shares the length of 'pos' itself: name 'pos'" in msg, msg


def test_length_options_leave_out_their_len_and_keep_the_config_hash_of_configs_without_them():
    shared = [*_IMP, {"name": "p", "source": "imp[].price", "transform": "clip", "clip_min": 0, "max_len": 4,
                      "length_of": "pos"},
              {"name": "same", "source": "imp[].pos", "transform": "log1p", "max_len": 4, "length_of": "pos"},
              {"name": "t", "source": "imp[].title", "transform": "text", "max_len": 8, "length": False}]
    cfg = parse_config({"features": [{**shared[0], "length": False}, *shared[1:]]})
    assert cfg.output_names == ["id", "pos", "pos_len", "p", "same", "t"]
    assert parse_config(cfg.to_json()) == cfg
    plain = parse_config({"features": _IMP})
    assert "length" not in json.dumps(plain.to_json()) and parse_config({"features": [
        {**f, "length": True} for f in _IMP[:1]] + _IMP[1:]}).hash == plain.hash
