"""convert.drift and the gate on it: `recordprep report --fail-on-drift`, `convert --check-against`."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from convert import drift
from convert.config import ConfigError, parse_config
from convert.stats import ValueSketch
from pipelines.cli import app

runner = CliRunner()

CONFIG = """
label: {source: y, dtype: int64}
features:
  - {name: shifted, transform: zscore}
  - {name: steady, transform: zscore}
  - {name: color, transform: vocabulary}
  - {name: shape, transform: vocabulary}
"""


# ------------------------------------------------------------------ measures


def test_js_divergence_is_0_for_equal_and_1_for_disjoint_histograms():
    assert drift.js_divergence(np.array([1.0, 2, 3]), np.array([2.0, 4, 6])) == pytest.approx(0.0)
    assert drift.js_divergence(np.array([1.0, 0]), np.array([0.0, 5])) == pytest.approx(1.0)


def _split(rows, missing=0, terms=None, values=None):
    d = {"rows": rows, "missing": missing}
    if terms is not None:
        d.update(terms=sorted(terms.items(), key=lambda kv: -kv[1]), items=sum(terms.values()), distinct=len(terms))
    if values is not None:
        s = ValueSketch()
        s.add(np.asarray(values, dtype=float))
        d["before"] = s.to_json()
    return d


def _doc(**features):
    return {"splits": {"train": {}, "eval": {}},
            "features": {name: {"kind": kind, "splits": {"train": a, "eval": b}} for name, (kind, a, b) in features.items()}}


def test_measures_of_a_pair_of_splits():
    rng = np.random.default_rng(0)
    same = rng.normal(size=4000)
    doc = _doc(
        cat=("categorical", _split(100, 10, {"a": 50, "b": 50}), _split(100, 30, {"a": 20, "b": 60, "c": 20})),
        num=("numeric", _split(4000, values=same[:2000]), _split(4000, values=same[2000:] + 1.0)),
        empty=("numeric", _split(10, values=[1.0]), _split(0)),
        unknown=("numeric", {**_split(5, values=[1.0, 2.0]), "missing": None}, _split(5, values=[1.0, 2.0])),
    )
    [c] = drift.skew(doc, drift.thresholds(None))
    got = {(f.feature, f.measure): f.value for f in c.findings}
    assert got[("cat", "linf")] == pytest.approx(0.3)  # b: 0.5 -> 0.75 of the items
    assert got[("cat", "new_terms")] == pytest.approx(0.2)
    assert got[("cat", "missing")] == pytest.approx(0.2)
    assert got[("num", "mean_shift")] == pytest.approx(1.0, abs=0.1)
    assert 0.1 < got[("num", "js")] < 0.5
    assert not any(f == "empty" for f, _ in got)  # an empty split is not compared
    assert ("unknown", "missing") not in got and ("unknown", "js") in got
    assert c.features_over() == ["cat", "num"]


def test_new_terms_within_an_output_is_the_rise_of_the_oov_share_and_across_outputs_ignores_the_long_tail():
    # skew: eval meets more terms of the long tail than the training split kept, but maps them as training does
    train = {**_split(100, terms={"a": 60, "b": 30, "c": 10}), "oov": 10, "distinct": 3}
    evald = {**_split(100, terms={"a": 50, "d": 30, "e": 20}), "oov": 15}
    [c] = drift.skew(_doc(f=("categorical", train, evald)), drift.thresholds(None))
    assert {x.measure: x.value for x in c.findings}["new_terms"] == pytest.approx(0.05)
    # drift: the base kept 2 of its terms (a long tail of 20% beyond them); 50% of the new side's items are unknown
    old = {**_split(100, terms={"a": 50, "b": 30}), "distinct": 40, "items": 100}
    new = {**_split(100, terms={"a": 50, "z": 50}), "items": 100}
    [c] = drift.drift({"splits": {"train": {}}, "features": {"f": {"kind": "categorical", "splits": {"train": new}}}},
                      {"splits": {"train": {}}, "features": {"f": {"kind": "categorical", "splits": {"train": old}}}},
                      drift.thresholds(None))
    assert {x.measure: x.value for x in c.findings}["new_terms"] == pytest.approx(0.3)


def test_thresholds_default_config_feature_then_flags():
    cfg = parse_config({"drift": {"js": 0.2}, "features": [
        {"name": "a", "transform": "zscore", "drift": {"js": 0.3, "missing": 0.01}},
        {"name": "b", "transform": "zscore"}]}).to_json()
    t = drift.thresholds(cfg)
    assert t["a"]["js"] == 0.3 and t["a"]["missing"] == 0.01 and t["b"]["js"] == 0.2
    assert t["b"]["linf"] == drift.DEFAULT_THRESHOLDS["linf"]
    t = drift.thresholds(cfg, {"js": 0.5})
    assert t["a"]["js"] == t["b"]["js"] == 0.5 and t["a"]["missing"] == 0.01


@pytest.mark.parametrize("bad", [{"jss": 0.1}, {"js": -1}, {"js": "high"}, {"js": True}, [], {}])
def test_a_bad_drift_option_is_a_config_error_naming_the_feature(bad):
    with pytest.raises(ConfigError, match="feature 'a': 'drift' must map measures"):
        parse_config({"features": [{"name": "a", "transform": "zscore", "drift": bad}]})
    with pytest.raises(ConfigError, match="'drift' must map measures"):
        parse_config({"drift": bad, "features": [{"name": "a", "transform": "zscore"}]})


def test_an_unset_drift_option_leaves_the_config_hash_alone():
    raw = {"features": [{"name": "a", "transform": "zscore"}]}
    assert "drift" not in json.dumps(parse_config(raw).to_json())


# ---------------------------------------------- two synthetic days, end to end


def _day(path, seed, shift, colors):
    rng = random.Random(seed)
    lines = []
    for i in range(3000):
        lines.append(json.dumps({
            "shifted": rng.gauss(shift, 1.0), "steady": rng.gauss(0.0, 1.0),
            "color": rng.choices("ABC", weights=colors)[0], "shape": rng.choices("xyz", weights=(5, 3, 2))[0],
            "y": i % 2}))
    path.mkdir(parents=True)
    (path / "part-0.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    root = tmp_path_factory.mktemp("days")
    (root / "features.yaml").write_text(CONFIG)
    _day(root / "in1", 1, 0.0, (5, 3, 2))
    _day(root / "in2", 2, 1.5, (2, 3, 5))  # `shifted` and `color` move, `steady` and `shape` do not
    for d in ("1", "2"):
        r = runner.invoke(app, ["convert", "-i", str(root / f"in{d}"), "-c", str(root / "features.yaml"),
                                "-o", str(root / f"out{d}"), "--no-progress"])
        assert r.exit_code == 0, r.output
    return root


def _findings(root, *extra):
    r = runner.invoke(app, ["report", str(root / "out2"), "--against", str(root / "out1"), "--json", str(root / "r.json"), *extra])
    rep = json.loads((root / "r.json").read_text())
    return r, rep, [f for c in rep["drift"] for f in c["findings"]]


def test_the_gate_flags_exactly_the_shifted_features(days):
    r, rep, _ = _findings(days, "--fail-on-drift")
    assert r.exit_code == 1
    assert rep["features_over"] == ["color", "shifted"]
    assert "shifted" in r.output and "color" in r.output and "steady" not in r.output and "shape" not in r.output
    r, _, _ = _findings(days)  # without --fail-on-drift: a warning, exit 0
    assert r.exit_code == 0 and "drift/skew over threshold" in r.output


def test_the_gate_follows_its_thresholds_both_ways(days):
    _, _, findings = _findings(days)
    by = {(f["feature"], f["measure"]): f["value"] for f in findings}
    steady = max(by[("steady", "js")], by[("steady", "mean_shift")], by[("shape", "linf")])
    moved = min(by[("shifted", "js")], by[("shifted", "mean_shift")], by[("color", "linf")])
    assert steady < moved
    top = max(v for v in by.values() if v is not None)
    above = [f"--drift-threshold={m}={top * 1.01}" for m in ("js", "mean_shift", "linf", "new_terms", "missing")]
    r, rep, _ = _findings(days, "--fail-on-drift", *above)
    assert r.exit_code == 0, r.output
    assert rep["features_over"] == []
    mid = (steady + moved) / 2
    between = [f"--drift-threshold={m}={mid}" for m in ("js", "mean_shift", "linf")]
    r, rep, _ = _findings(days, "--fail-on-drift", *between)
    assert r.exit_code == 1 and rep["features_over"] == ["color", "shifted"]
    below = [f"--drift-threshold=js={by[('steady', 'js')] * 0.5}", f"--drift-threshold=linf={by[('shape', 'linf')] * 0.5}"]
    r, rep, _ = _findings(days, "--fail-on-drift", *below)
    assert r.exit_code == 1 and {"steady", "shape"} <= set(rep["features_over"])


def test_skew_between_the_splits_of_one_day_is_below_the_defaults(days):
    r = runner.invoke(app, ["report", str(days / "out2"), "--fail-on-drift"])
    assert r.exit_code == 0, r.output
    assert "skew: train -> eval: no measure over its threshold" in r.output


def test_convert_check_against_stops_on_drift_and_keeps_the_output(days, tmp_path):
    args = ["convert", "-i", str(days / "in2"), "-c", str(days / "features.yaml"), "-o", str(tmp_path / "o"),
            "--no-progress", "--check-against", str(days / "out1")]
    r = runner.invoke(app, args)
    assert r.exit_code == 1
    assert "shifted" in r.output and "color" in r.output and "steady" not in r.output
    assert (tmp_path / "o" / "dataset_info.json").exists()
    r = runner.invoke(app, [*args, "--force", "--drift-threshold", "js=1", "--drift-threshold", "mean_shift=100",
                            "--drift-threshold", "linf=1", "--drift-threshold", "new_terms=1"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("flag", ["js", "js=x", "jss=0.1", "js=-1", "js=nan"])
def test_a_bad_threshold_flag_is_a_usage_error(days, flag):
    r = runner.invoke(app, ["report", str(days / "out2"), "--drift-threshold", flag])
    assert r.exit_code == 2 and "--drift-threshold" in r.output


def test_a_threshold_flag_without_check_against_is_refused(days, tmp_path):
    r = runner.invoke(app, ["convert", "-i", str(days / "in2"), "-c", str(days / "features.yaml"),
                            "-o", str(tmp_path / "o"), "--drift-threshold", "js=0.5"])
    assert r.exit_code == 2 and "--check-against" in r.output


# ------------------------------------------------------------------ random splits pass, real shifts fail

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


def _vocab_split(terms: list[str], vocab: set[str]) -> dict:
    """One split's statistics as convert.stats writes them for a vocabulary feature over ``vocab``."""
    counts = Counter(terms)
    d = _split(len(terms), terms=dict(counts))
    return {**d, "oov": sum(c for t, c in counts.items() if t not in vocab), "once": sum(c == 1 for c in counts.values())}


def _new_terms_of(train: list[str], evald: list[str]) -> float:
    vocab = set(train)  # the default vocabulary: every training term
    doc = _doc(f=("categorical", _vocab_split(train, vocab), _vocab_split(evald, vocab)))
    [c] = drift.skew(doc, drift.thresholds(None))
    return {x.measure: x.value for x in c.findings}["new_terms"]


def _fields() -> dict[str, list[str]]:
    """High-cardinality string fields of real files: the bundled examples and ../shared/realdata."""
    import fastavro

    out: dict[str, list[str]] = {}
    files = sorted((Path(__file__).resolve().parents[1] / "examples" / "data").glob("*.avro"))
    recs = [r for p in files for r in fastavro.reader(p.open("rb"))]
    out["examples event_id"] = [str(r["event_id"]) for r in recs]
    out["examples user.id"] = [str(r["user"]["id"]) for r in recs]
    user = REALDATA / "Teradata__kylo" / "samples" / "sample-data" / "avro" / "userdata1.avro"
    if user.is_file():
        rows = list(fastavro.reader(user.open("rb")))
        for field in ("first_name", "email", "ip_address", "cc"):
            out[f"userdata1 {field}"] = [str(r[field]) for r in rows]
    rng = np.random.default_rng(1)
    for a, n in ((1.1, 5000), (1.5, 20000), (2.0, 3000)):
        out[f"zipf a={a} n={n}"] = [str(x) for x in rng.zipf(a, n)]
    out["uniform over 50k ids"] = [str(x) for x in rng.integers(0, 50_000, 8000)]
    return out


@pytest.fixture(scope="module")
def fields() -> dict[str, list[str]]:
    return _fields()


def test_random_90_10_splits_of_high_cardinality_fields_pass_the_default_new_terms(fields):
    """200 random 90/10 splits of each field: none goes over the default new_terms threshold,
    which an iid split of ids (every term seen once) exceeded before the unseen terms' share was allowed for."""
    limit = drift.DEFAULT_THRESHOLDS["new_terms"]
    rng = random.Random(0)
    for name, values in fields.items():
        worst = 0.0
        for _ in range(200):
            is_eval = [rng.random() < 0.1 for _ in values]
            train = [v for v, e in zip(values, is_eval, strict=True) if not e]
            evald = [v for v, e in zip(values, is_eval, strict=True) if e]
            worst = max(worst, _new_terms_of(train, evald))
        assert worst <= limit, (name, worst)


def test_a_real_shift_in_a_high_cardinality_field_still_fails(fields):
    """Eval records of which a third carry terms of another population: over the threshold."""
    rng = random.Random(1)
    for name, values in fields.items():
        if sum(c == 1 for c in Counter(values).values()) > len(values) / 2:
            continue  # mostly distinct ids: a random sample's terms are mostly new too
        is_eval = [rng.random() < 0.1 for _ in values]
        train = [v for v, e in zip(values, is_eval, strict=True) if not e]
        evald = [v if rng.random() < 2 / 3 else f"shifted-{rng.random()}" for v, e in zip(values, is_eval, strict=True) if e]
        assert _new_terms_of(train, evald) > drift.DEFAULT_THRESHOLDS["new_terms"], name


def test_a_converted_random_split_of_ids_passes_the_skew_check(tmp_path):
    """Through the real convert and report: a vocabulary over the examples' unique event ids."""
    data = Path(__file__).resolve().parents[1] / "examples" / "data" / "clicks-0.avro"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("label: {source: clicked, dtype: int64}\nfeatures:\n  - {name: event_id, transform: vocabulary}\n")
    r = runner.invoke(app, ["convert", "-i", str(data), "-c", str(cfg), "-o", str(tmp_path / "out"), "--no-progress"])
    assert r.exit_code == 0, r.output
    stats = json.loads((tmp_path / "out" / "stats.json").read_text())["features"]["event_id"]["splits"]
    assert stats["train"]["once"] == stats["train"]["items"] > 0  # every id seen once
    r = runner.invoke(app, ["report", str(tmp_path / "out"), "--fail-on-drift"])
    assert r.exit_code == 0, r.output
