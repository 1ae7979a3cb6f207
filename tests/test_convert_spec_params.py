"""A feature's ``params`` in dataset_info.json carry only the options its transform takes
(plus what the analysis found); metadata that still lists every option (what earlier
versions wrote) keeps loading, applying and serving the same."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import readers
from convert.apply import apply_analysis
from convert.config import COMMON_OPTIONS, TRANSFORM_TABLE
from pipelines.cli import app

runner = CliRunner()

CONFIG = """\
label: {source: y, dtype: int64}
features:
  - {name: amount, transform: log1p}
  - {name: age, transform: zscore, missing_indicator: true}
  - {name: price, transform: bucketize, num_buckets: 4}
  - {name: country, transform: vocabulary, num_oov_buckets: 2}
  - {name: query, transform: text, max_len: 4}
  - {name: user, transform: hash, buckets: 64}
  - {name: country_x_user, transform: cross, sources: [country, user], buckets: 32}
  - {name: ts, transform: timestamp, unit: s, parts: [hour]}
"""

#: What the analysis or the layout adds beside the config's options.
ANALYSIS_KEYS = {"stats", "vocab_size", "vocabulary_file", "pad_id", "oov_ids", "boundaries"}


def _records(n: int = 60) -> list[dict]:
    return [{"amount": float(i), "age": None if i % 7 == 0 else 20 + i % 30, "price": i * 1.5,
             "country": ["US", "FR", "DE"][i % 3], "query": f"red shoes {i % 5}", "user": f"u{i % 11}",
             "ts": 1_700_000_000 + 3600 * i, "y": i % 2} for i in range(n)]


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("params")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records()))
    (root / "features.yaml").write_text(CONFIG)
    out = root / "out"
    r = runner.invoke(app, ["convert", "-i", str(data), "-c", str(root / "features.yaml"), "-o", str(out),
                            "--num-shards", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    return out


def _features(out) -> dict[str, dict]:
    meta = json.loads((out / "dataset_info.json").read_text())
    return {f["name"]: f for f in meta["features"] if f["role"] == "feature"}


def test_params_hold_only_the_options_of_their_transform(output):
    features = _features(output)
    for name, f in features.items():
        taken = set(TRANSFORM_TABLE[f["transform"]].options) | set(COMMON_OPTIONS)
        extra = set(f["params"]) - taken - ANALYSIS_KEYS
        assert not extra, f"{name} ({f['transform']}): params {sorted(extra)} do not apply to it"
    log1p = features["amount"]["params"]
    assert "num_oov_buckets" not in log1p and "lowercase" not in log1p and "top_k" not in log1p
    assert log1p["fill"] == 0.0 and log1p["on_nan"] == "error"
    assert features["country"]["params"]["num_oov_buckets"] == 2
    assert features["query"]["params"]["lowercase"] is True
    assert "fill" not in features["price"]["params"] and "lowercase" not in features["user"]["params"]
    assert features["ts"]["params"]["unit"] == "s" and features["ts"]["params"]["parts"] == ["hour"]


def test_metadata_listing_every_option_still_loads_and_applies(output, tmp_path):
    # The form earlier versions wrote: every FeatureConfig option in every feature's params.
    old = tmp_path / "old"
    old.mkdir()
    for p in output.iterdir():
        (old / p.name).symlink_to(p)
    (old / "dataset_info.json").unlink()
    meta = json.loads((output / "dataset_info.json").read_text())
    every = {"fill": 0.0, "missing_indicator": False, "on_nan": "error", "min_frequency": 1,
             "num_oov_buckets": 1, "lowercase": True, "allow_all_missing": False}
    for f in meta["features"]:
        if f["role"] == "feature":
            f["params"] = {**every, **f["params"]}
    (old / "dataset_info.json").write_text(json.dumps(meta))
    assert "num_oov_buckets" in _features(old)["amount"]["params"]

    new_info, old_info = readers.load_info(str(output)), readers.load_info(str(old))
    assert [f.name for f in old_info.features] == [f.name for f in new_info.features]
    assert {f.name: f.shape for f in old_info.features} == {f.name: f.shape for f in new_info.features}
    records = _records(10)
    new, old_batch = apply_analysis(output, records), apply_analysis(old, records)
    assert new.columns.keys() == old_batch.columns.keys()
    for name, (kind, values) in new.columns.items():
        old_kind, old_values = old_batch.columns[name]
        assert kind == old_kind and (values == old_values).all(), name
    assert (new.keep == old_batch.keep).all()


@pytest.mark.parametrize("key", ["min", "max", "mean", "std"])
def test_an_integer_past_floats_range_in_statistics_is_a_problem_not_an_overflow(key):
    """``10**400`` is valid JSON: a hand-edited ``analysis.json`` holding it is named as a
    problem by every checker (verify, --analysis-from, the readers), not an OverflowError."""
    from convert.spec import statistics_problems

    stats = {"min": 0.0, "max": 2.0, "mean": 1.0, "std": 0.5, key: 10**400}
    problems = statistics_problems("x", stats)
    assert problems and f"'{key}'" in problems[0]


# ------------------------------------------------------------- quartiles


@pytest.mark.parametrize("stats, key", [
    ({"q25": 1.0, "median": float("nan"), "q75": 3.0}, "'median'"),
    ({"q25": 1.0, "median": 2.0, "q75": float("inf")}, "'q75'"),
    ({"q25": "1", "median": 2.0, "q75": 3.0}, "'q25'"),
    ({"q25": 10**400, "median": 2.0, "q75": 3.0}, "'q25'"),
    ({"q25": 2.5, "median": 2.0, "q75": 3.0}, "'q25' 2.5 is above 'median' 2.0"),
    ({"q25": 1.0, "median": 4.0, "q75": 3.0}, "'median' 4.0 is above 'q75' 3.0"),
    ({"q25": 1.0, "q75": 0.5}, "'q25' 1.0 is above 'q75' 0.5"),
    ({"min": 0.0, "max": 4.0, "q25": -1.0, "median": 2.0, "q75": 3.0},
     "'q25' -1.0 is outside 'min' 0.0 .. 'max' 4.0 (a quartile is a value of the data)"),
    ({"min": 0.0, "max": 4.0, "q25": 1.0, "median": 2.0, "q75": 4.5}, "'q75' 4.5 is outside 'min' 0.0 .. 'max' 4.0"),
    ({"min": 0.0, "max": 4.0, "median": 7.0}, "'median' 7.0 is outside"),
    ({"min": 5.0, "max": 4.0, "median": 4.5}, "'min' 5.0 is above 'max' 4.0"),  # said once, not per quartile
])
def test_quartiles_that_are_not_finite_or_out_of_order_are_problems(stats, key):
    from convert.spec import statistics_problems

    problems = statistics_problems("r", stats)
    assert len(problems) == 1 and "stats of 'r'" in problems[0] and key in problems[0], problems


@pytest.mark.parametrize("stats", [{"q25": 1.0, "median": 2.0, "q75": 3.0}, {"q25": 2.0, "median": 2.0, "q75": 2.0},
                                   {"q25": None, "median": None, "q75": None}, {"median": -1.5},
                                   {"min": 1.0, "max": 3.0, "q25": 1.0, "median": 2.0, "q75": 3.0},  # at the ends
                                   {"min": 0.0, "q25": 9.0}, {"max": 0.0, "q75": 9.0},  # one end only: unchecked
                                   {"min": None, "max": None, "q25": None, "median": None, "q75": None}])
def test_quartiles_the_converter_writes_are_no_problem(stats):
    from convert.feature_stats import statistics_problems

    assert statistics_problems("r", stats) == []


@pytest.fixture(scope="module")
def robust_output(tmp_path_factory):
    root = tmp_path_factory.mktemp("robust")
    data = root / "data.jsonl"
    data.write_text("".join(json.dumps({"x": float(i % 13), "y": i % 2}) + "\n" for i in range(40)))
    (root / "features.yaml").write_text("label: {source: y, dtype: int64}\n"
                                        "features:\n  - {name: r, source: x, transform: robust_scale}\n")
    out = root / "out"
    r = runner.invoke(app, ["convert", "-i", str(data), "-c", str(root / "features.yaml"), "-o", str(out),
                            "--num-shards", "1", "--no-progress"])
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("where", ["params", "statistics"])
@pytest.mark.parametrize("key, value, said", [
    ("median", float("nan"), "'median' must be a finite number or null"),
    ("q25", 1e9, "'q25' 1000000000.0 is above 'median'"),
    ("q75", 1e9, "'q75' 1000000000.0 is outside 'min'"),  # still in order: only the range tells
])
def test_a_dataset_info_with_edited_quartiles_is_refused_naming_the_feature_and_key(robust_output, tmp_path, where,
                                                                                    key, value, said):
    meta = json.loads((robust_output / "dataset_info.json").read_text())
    feature = next(f for f in meta["features"] if f["name"] == "r")
    assert {"q25", "median", "q75"} <= feature["params"]["stats"].keys()  # what robust_scale writes
    readers.load_info(str(robust_output))  # as written: loads
    stats = feature["params"]["stats"] if where == "params" else meta["statistics"]["r"]
    stats[key] = value
    edited = tmp_path / "edited"
    edited.mkdir()
    for p in robust_output.iterdir():
        if p.name != "dataset_info.json":
            (edited / p.name).symlink_to(p)
    (edited / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="stats of 'r'") as e:
        readers.load_info(str(edited))
    assert said in str(e.value), e.value
