"""convert.config: loading and validating the feature config.

Every error must be a ``ConfigError`` that names the feature and says what is
allowed, so a typo fails before any pipeline starts.
"""

from __future__ import annotations

import json
import re

import pytest

from convert.config import ConfigError, FeatureConfig, LabelConfig, load_config, parse_config

YAML_CONFIG = """
label: {source: label, dtype: int64}
features:
  - {name: age, transform: zscore}
  - {name: country, source: user.country, transform: vocabulary, top_k: 1000}
  - {name: tags, transform: vocabulary, max_len: 8}
  - {name: title, transform: text, max_len: 16}
  - {name: user, source: user_id, transform: hash, buckets: 4096}
  - {name: income, transform: log1p, fill: 0, missing_indicator: true, on_nan: fill}
  - {name: score, transform: clip, clip_min: 0, clip_max: 1.5}
  - {name: blob, transform: bytes}
"""


def _cfg(*features, label=None) -> dict:
    raw = {"features": list(features)}
    if label is not None:
        raw["label"] = label
    return raw


def _error(raw) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config(raw, source="cfg.yaml")
    return str(ei.value)


# ----------------------------------------------------------------- loading


def test_valid_yaml_config_loads_with_defaults(tmp_path):
    p = tmp_path / "features.yaml"
    p.write_text(YAML_CONFIG)
    cfg = load_config(p)
    by = {f.name: f for f in cfg.features}
    assert [f.name for f in cfg.features] == ["age", "country", "tags", "title", "user", "income", "score", "blob"]
    assert by["age"] == FeatureConfig(name="age", source="age", transform="zscore", fill="mean")
    assert by["country"].source == "user.country" and by["country"].top_k == 1000
    assert by["tags"].max_len == 8 and by["tags"].multi_valued
    assert by["user"].buckets == 4096 and by["user"].source == "user_id"
    assert by["income"].fill == 0.0 and isinstance(by["income"].fill, float)
    assert by["income"].missing_indicator and by["income"].on_nan == "fill"
    assert by["score"].clip_min == 0 and by["score"].clip_max == 1.5
    assert by["blob"].fill is None
    assert cfg.label == LabelConfig(source="label", name="label", dtype="int64")
    assert cfg.output_names == ["age", "country", "tags", "tags_len", "title", "title_len", "user",
                                "income", "income_missing", "score", "blob", "label"]


def test_valid_json_config_loads_and_equals_yaml(tmp_path):
    import yaml

    y = tmp_path / "c.yaml"
    y.write_text(YAML_CONFIG)
    j = tmp_path / "c.json"
    j.write_text(json.dumps(yaml.safe_load(YAML_CONFIG)))
    assert load_config(j) == load_config(y)
    assert load_config(j).hash == load_config(y).hash


def test_label_shorthand_and_dotted_source_name():
    cfg = parse_config(_cfg({"name": "x", "transform": "identity"}, label="meta.target"))
    assert cfg.label == LabelConfig(source="meta.target", name="meta_target", dtype="int64")
    cfg = parse_config(_cfg({"name": "x", "transform": "identity"}, label={"source": "y", "dtype": "float32", "name": "target"}))
    assert cfg.label == LabelConfig(source="y", name="target", dtype="float32")


def test_missing_file_and_invalid_syntax_raise_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "nope.yaml")
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("features: [ {name: a, transform: zscore}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(bad_yaml)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"features": [}')
    with pytest.raises(ConfigError, match=r"bad\.json: not valid JSON"):
        load_config(bad_json)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.yaml: the config file is empty"):
        load_config(empty)
    not_a_mapping = tmp_path / "list.yaml"
    not_a_mapping.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="expected a mapping with 'features'"):
        load_config(not_a_mapping)


# --------------------------------------------------------------- validation


def test_unknown_transform_names_feature_and_lists_allowed():
    msg = _error(_cfg({"name": "age", "transform": "zscroe"}))
    assert "'age'" in msg and "'zscroe'" in msg
    for t in ("identity", "zscore", "minmax", "log1p", "clip", "vocabulary", "hash", "text", "bytes"):
        assert t in msg
    assert "'age'" in _error(_cfg({"name": "age"}))  # no transform at all


def test_unknown_option_names_feature_and_lists_allowed():
    msg = _error(_cfg({"name": "tags", "transform": "vocabulary", "topk": 10}))
    assert "'tags'" in msg and "'topk'" in msg and "top_k" in msg and "allowed" in msg


def test_hash_without_buckets():
    msg = _error(_cfg({"name": "user", "transform": "hash"}))
    assert "'user'" in msg and "buckets" in msg


def test_text_without_max_len():
    msg = _error(_cfg({"name": "title", "transform": "text"}))
    assert "'title'" in msg and "max_len" in msg


@pytest.mark.parametrize("fill", ["median", True, [1], {"a": 1}, float("nan"), float("inf")])
def test_bad_fill_names_feature_and_says_number_or_mean(fill):
    msg = _error(_cfg({"name": "age", "transform": "zscore", "fill": fill}))
    assert "'age'" in msg and "fill" in msg and "'mean'" in msg


def test_fill_on_categorical_feature_rejected():
    msg = _error(_cfg({"name": "c", "transform": "vocabulary", "fill": 0}))
    assert "'c'" in msg and "fill" in msg and "numeric" in msg


@pytest.mark.parametrize("features", [
    [{"name": "a", "transform": "vocabulary", "max_len": 3}, {"name": "a_len", "transform": "identity"}],
    [{"name": "a_len", "transform": "identity"}, {"name": "a", "transform": "text", "max_len": 3}],
    [{"name": "x", "transform": "identity", "missing_indicator": True}, {"name": "x_missing", "transform": "identity"}],
    [{"name": "a", "transform": "identity"}, {"name": "a", "source": "b", "transform": "zscore"}],
])
def test_duplicate_output_names_rejected(features):
    msg = _error(_cfg(*features))
    dup = {"a_len", "x_missing", "a"} & set(msg.replace("'", " ").split())
    assert dup, msg
    assert "twice" in msg and "rename" in msg


def test_label_name_colliding_with_feature_rejected():
    msg = _error(_cfg({"name": "y", "transform": "identity"}, label={"source": "y"}))
    assert "'y'" in msg and "twice" in msg


@pytest.mark.parametrize("label", [{"source": "y", "dtype": "int32"}, {"source": "y", "dtype": "string"}])
def test_label_dtype_must_be_int64_or_float32(label):
    msg = _error(_cfg({"name": "x", "transform": "identity"}, label=label))
    assert "label" in msg and "int64" in msg and "float32" in msg and repr(label["dtype"]) in msg


@pytest.mark.parametrize("label", [{"dtype": "int64"}, 5, {"source": "y", "weight": 1},
                                   {"source": "y", "name": 7}, {"source": "y", "name": "bad name"}])
def test_malformed_label_rejected(label):
    msg = _error(_cfg({"name": "x", "transform": "identity"}, label=label))
    assert "label" in msg


@pytest.mark.parametrize("feature, words", [
    ({"name": "s", "transform": "clip"}, ["'s'", "clip_min"]),
    ({"name": "s", "transform": "clip", "clip_min": "zero"}, ["'s'", "clip_min", "number"]),
    ({"name": "s", "transform": "clip", "clip_min": 2, "clip_max": 1}, ["'s'", "clip_min", "clip_max"]),
    ({"name": "v", "transform": "vocabulary", "top_k": 0}, ["'v'", "top_k", ">= 1"]),
    ({"name": "v", "transform": "vocabulary", "top_k": True}, ["'v'", "top_k"]),
    ({"name": "v", "transform": "vocabulary", "num_oov_buckets": 1.5}, ["'v'", "num_oov_buckets"]),
    ({"name": "v", "transform": "vocabulary", "min_frequency": 0}, ["'v'", "min_frequency"]),
    ({"name": "h", "transform": "hash", "buckets": -3}, ["'h'", "buckets"]),
    ({"name": "n", "transform": "zscore", "on_nan": "drop"}, ["'n'", "on_nan", "error", "fill", "keep"]),
    ({"name": "n", "transform": "zscore", "max_len": 3}, ["'n'", "identity", "clip", "log1p"]),
    ({"name": "n", "transform": "identity", "missing_indicator": "yes"}, ["'n'", "missing_indicator", "true"]),
    ({"name": "t", "transform": "text", "max_len": 4, "lowercase": "no"}, ["'t'", "lowercase", "true"]),
    ({"name": "b", "transform": "bytes", "max_len": 2}, ["'b'", "max_len"]),
    ({"name": "c", "transform": "vocabulary", "missing_indicator": True}, ["'c'", "missing_indicator"]),
    ({"name": "c", "transform": "identity", "source": ""}, ["'c'", "source"]),
    ({"name": "bad name", "transform": "identity"}, ["features[0]", "name"]),
    ("age", ["features[0]", "mapping", "'age'"]),
    (["age"], ["features[0]", "mapping"]),
])
def test_invalid_feature_options_name_feature_and_fix(feature, words):
    msg = _error(_cfg(feature))
    assert msg.startswith("cfg.yaml: ")
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("raw, words", [
    ([1, 2], ["mapping", "features"]),
    ({"features": []}, ["features", "non-empty"]),
    ({"feature": [{"name": "a", "transform": "identity"}]}, ["'feature'", "allowed", "features"]),
])
def test_top_level_errors(raw, words):
    msg = _error(raw)
    for w in words:
        assert w in msg, (w, msg)


# ------------------------------------------------------------------- hash


def test_config_hash_stable_across_key_order_and_defaults():
    a = parse_config({"label": {"source": "y", "dtype": "int64"},
                      "features": [{"name": "age", "transform": "zscore"},
                                   {"name": "c", "transform": "vocabulary", "top_k": 5}]})
    b = parse_config({"features": [{"transform": "zscore", "name": "age", "fill": "mean", "source": "age"},
                                   {"top_k": 5, "transform": "vocabulary", "name": "c", "num_oov_buckets": 1}],
                      "label": {"dtype": "int64", "source": "y", "name": "y"}})
    assert a.hash == b.hash
    assert len(a.hash) == 16 and a.hash == parse_config(a.to_json()).hash  # to_json round-trips


def test_config_hash_fill_int_and_float_equal_but_changes_with_content():
    base = {"features": [{"name": "x", "transform": "identity", "fill": 1}]}
    same = {"features": [{"name": "x", "transform": "identity", "fill": 1.0}]}
    other = {"features": [{"name": "x", "transform": "identity", "fill": 2}]}
    assert parse_config(base).hash == parse_config(same).hash
    assert parse_config(base).hash != parse_config(other).hash


def test_config_hash_is_a_fixed_value():
    """Same config -> same hash on every machine and run (guards against e.g. set ordering)."""
    cfg = parse_config({"features": [{"name": "x", "transform": "identity"}]})
    h1 = cfg.hash
    assert parse_config({"features": [{"name": "x", "transform": "identity"}]}).hash == h1
    assert all(c in "0123456789abcdef" for c in h1)


@pytest.mark.parametrize("feature", [
    {"name": "clicks", "source": "clicked", "transform": "identity"},
    {"name": "c", "source": "clicked", "transform": "vocabulary"},
    {"name": "x", "transform": "cross", "sources": ["country", "clicked"], "buckets": 10},
])
def test_a_feature_reading_the_label_source_is_refused_unless_it_says_so(feature):
    raw = {"label": {"source": "clicked"}, "features": [{"name": "country", "transform": "vocabulary"}, feature]}
    with pytest.raises(ConfigError, match=rf"feature {feature['name']!r}: .*'clicked' is the label's source "
                                          r"'clicked', so the feature would hold the label's values .* drop the "
                                          r"feature or pick another source .*set allow_label_source: true"):
        parse_config(raw, source="c.yaml")
    allowed = parse_config({**raw, "features": [raw["features"][0], {**feature, "allow_label_source": True}]})
    f = allowed.features[1]
    assert f.allow_label_source
    assert parse_config(allowed.to_json()) == allowed  # the option survives the metadata's round trip
    with pytest.raises(ConfigError, match="'allow_label_source' must be true or false"):
        parse_config({**raw, "features": [{**feature, "allow_label_source": "yes"}]})


def _label_and(label: str, feature: dict) -> dict:
    return {"label": {"name": "lab", "source": label},
            "features": [{"name": "other", "transform": "identity"}, {"name": "f", **feature}]}


@pytest.mark.parametrize(("label", "feature", "says"), [
    ("y[0]", {"source": "y", "transform": "identity"}, "its source 'y' holds"),
    ("y[0]", {"source": "y[]", "transform": "vocabulary", "max_len": 4}, "its source 'y[]' may read the same value as"),
    ("y[0]", {"source": "y[-1]", "transform": "identity"}, "may read the same value as"),  # one item: the same
    ("y", {"source": "y[0]", "transform": "identity"}, "its source 'y[0]' reads inside"),
    ("user.segment", {"source": "user", "transform": "vocabulary"}, "its source 'user' holds"),
    ("user.segment", {"source": "user[]", "transform": "vocabulary", "max_len": 4}, "may read the same value as"),
    ('m["k"]', {"source": "m[entries]", "transform": "hash", "buckets": 8, "max_len": 4}, "may read the same"),
    ('m["k"]', {"source": "m", "transform": "identity"}, "its source 'm' holds"),
    ("y[0]", {"transform": "cross", "sources": ["other", "y"], "buckets": 10}, "one of its sources 'y' holds"),
    ("y[0]", {"source": "a", "transform": "zscore_per_key", "key": "y[-1]"}, "its key 'y[-1]' may read the same"),
    ("y[0]", {"source": "y[0]", "transform": "count"}, "its source 'y[0]' is"),  # counts the label itself
])
def test_a_feature_whose_path_overlaps_the_label_is_refused(label, feature, says):
    """Paths overlap step by step, whichever is longer and however spelled; the message names
    the feature, its path, the label's, why and what to do."""
    with pytest.raises(ConfigError, match=rf"c.yaml: feature 'f': .*{re.escape(says)}.* the label's source "
                                          rf"{re.escape(repr(label))}, so the feature would hold the label's "
                                          r"values and the model would see the answer; drop the feature or pick "
                                          r"another source"):
        parse_config(_label_and(label, feature), source="c.yaml")
    assert parse_config(_label_and(label, {**feature, "allow_label_source": True})).features[1].allow_label_source


@pytest.mark.parametrize(("label", "feature"), [
    ("y[0]", {"source": "y[1]", "transform": "identity"}),  # another item
    ("y[-1]", {"source": "y[-2]", "transform": "identity"}),
    ('["a.b"]', {"source": "a.b", "transform": "identity"}),  # the field named a.b, not b inside a
    ("a.b", {"source": '["a.b"]', "transform": "identity"}),
    ("y", {"source": "yy", "transform": "identity"}),
    ("user.segment", {"source": "user.id", "transform": "identity"}),
    ('m["0"]', {"source": "m[0]", "transform": "identity"}),  # a key is not an index
])
def test_a_feature_beside_the_label_passes(label, feature):
    assert parse_config(_label_and(label, feature)).features[1].source == feature["source"]


@pytest.mark.parametrize(("label", "feature"), [
    ("y[0]", {"source": "y", "transform": "count"}),
    ("y[0]", {"source": "y[]", "transform": "count"}),
    ("user.segment", {"source": "user", "transform": "count"}),
    ('m["k"]', {"source": "m", "transform": "count"}),
    ('m["k"]', {"source": "m[keys]", "transform": "vocabulary", "max_len": 4}),
    ("orders[0].items[0].price", {"source": "orders[].items", "transform": "count"}),
])
def test_reading_only_the_length_or_keys_of_what_holds_the_label_passes(label, feature):
    """A count or a [keys] path reads none of the label's values; the presence it implies is the
    same in every record written (records without a label are rejected). docs/feature-config.md."""
    assert not parse_config(_label_and(label, feature)).features[1].allow_label_source


def test_allow_label_source_left_out_keeps_the_config_hash():
    raw = {"label": "y", "features": [{"name": "a", "transform": "identity"}]}
    assert parse_config(raw).hash == parse_config(
        {**raw, "features": [{**raw["features"][0], "allow_label_source": False}]}).hash
