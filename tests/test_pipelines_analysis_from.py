"""``--analysis-from`` checks the config against the reused analysis before
anything runs: a feature without matching statistics or vocabulary, or whose
transform or options differ from those the analysis was computed with, is a
usage error naming it (never silently raw z-scores, zero min-max or one bucket)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _pipelines_data import CONFIG, by_shard, make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()

#: The shared test config plus a bucketized copy of ``x``.
BASE = CONFIG + "  - {name: x_bucket, source: x, transform: bucketize, num_buckets: 4}\n"


@pytest.fixture(scope="module")
def train(tmp_path_factory):
    """A completed output whose analysis later runs reuse, and the data it came from."""
    root = tmp_path_factory.mktemp("a")
    data = write_dataset(root / "d", make_records(120))
    cfg = root / "base.yaml"
    cfg.write_text(BASE)
    out = root / "train"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(cfg), "-o", str(out), "--num-shards", "1"])
    assert r.exit_code == 0, r.output
    return {"data": data, "out": out, "config": cfg, "root": root}


def _reuse(train, tmp_path, config_text: str, *extra: str, analysis_from: Path | None = None):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(config_text)
    out = tmp_path / "out"
    args = ["convert", "-i", str(train["data"]["avro"]), "-c", str(cfg), "-o", str(out), "--num-shards", "1",
            "--analysis-from", str(analysis_from or train["out"]), *extra]
    return runner.invoke(app, args), out


def test_the_analysis_records_its_config_and_each_features_options(train):
    analysis = json.loads((train["out"] / "analysis.json").read_text())
    info = json.loads((train["out"] / "dataset_info.json").read_text())
    assert analysis["config_hash"] == info["config_hash"]
    assert analysis["features"]["x"] == {"source": "x", "transform": "zscore", "multi_valued": False}
    assert analysis["features"]["x_bucket"]["num_buckets"] == 4
    assert analysis["features"]["color"]["top_k"] is None and analysis["features"]["color"]["num_oov_buckets"] == 1
    assert analysis["features"]["text"]["lowercase"] is True
    assert "id" not in analysis["features"] and "user_name" not in analysis["features"]  # need no analysis


def test_the_same_config_reuses_it_into_the_same_shards(train, tmp_path):
    r, out = _reuse(train, tmp_path, BASE)
    assert r.exit_code == 0, r.output
    for shard in sorted(train["out"].glob("*.tfrecord.gz")):
        assert by_shard(out, shard.name).read_bytes() == shard.read_bytes(), shard.name


def test_a_feature_that_needs_no_analysis_may_be_added(train, tmp_path):
    r, _ = _reuse(train, tmp_path, BASE + "  - {name: color_hash, source: color, transform: hash, buckets: 8}\n")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("change", "expected"), [
    ("  - {name: x2, source: x, transform: zscore}\n", ["'x2'", "no statistics"]),
    ("  - {name: x_minmax, source: x, transform: minmax}\n", ["'x_minmax'", "no statistics"]),
    ("  - {name: x_b2, source: x, transform: bucketize}\n", ["'x_b2'", "no statistics"]),
    ("  - {name: color2, source: color, transform: vocabulary}\n", ["'color2'", "no vocabulary"]),
])
def test_a_feature_without_statistics_in_the_analysis_is_refused(train, tmp_path, change, expected):
    r, out = _reuse(train, tmp_path, BASE + change)
    assert r.exit_code == 2, r.output
    for text in expected:
        assert text in r.output
    assert "--analysis-from" in r.output and "Traceback" not in r.output
    assert not out.exists()


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("{name: x, transform: zscore,", "{name: x, transform: minmax,", "transform 'zscore' there, 'minmax' here"),
    ("{name: x, transform: zscore,", "{name: x, source: id, transform: zscore,", "source 'x' there, 'id' here"),
    ("{name: color, transform: vocabulary}", "{name: color, transform: vocabulary, top_k: 2}", "top_k None there, 2 here"),
    ("{name: color, transform: vocabulary}", "{name: color, transform: vocabulary, num_oov_buckets: 3}",
     "num_oov_buckets 1 there, 3 here"),
    ("{name: text, transform: text, max_len: 3}", "{name: text, transform: text, max_len: 3, lowercase: false}",
     "lowercase True there, False here"),
    ("num_buckets: 4}", "num_buckets: 5}", "num_buckets 4 there, 5 here"),
])
def test_a_feature_whose_transform_or_options_differ_is_refused(train, tmp_path, old, new, expected):
    assert old in BASE
    r, out = _reuse(train, tmp_path, BASE.replace(old, new, 1))
    assert r.exit_code == 2, r.output
    assert expected in r.output, r.output
    assert not out.exists()


def test_every_mismatch_is_named_at_once(train, tmp_path):
    text = BASE.replace("transform: zscore,", "transform: minmax,").replace("num_buckets: 4", "num_buckets: 6")
    r, _ = _reuse(train, tmp_path, text + "  - {name: x2, source: x, transform: zscore}\n")
    assert r.exit_code == 2
    assert all(name in r.output for name in ("'x'", "'x_bucket'", "'x2'")), r.output


def test_dry_run_refuses_a_mismatch_too(train, tmp_path):
    r, out = _reuse(train, tmp_path, BASE + "  - {name: x2, source: x, transform: zscore}\n", "--dry-run")
    assert r.exit_code == 2 and "'x2'" in r.output
    r, _ = _reuse(train, tmp_path, BASE, "--dry-run")
    assert r.exit_code == 0 and "fits the config" in r.output


@pytest.fixture
def old_analysis(train, tmp_path):
    """A copy of the output whose analysis.json lacks what older versions did not record."""
    old = tmp_path / "old"
    old.mkdir()
    analysis = json.loads((train["out"] / "analysis.json").read_text())
    (old / "analysis.json").write_text(json.dumps({"vocabularies": analysis["vocabularies"], "stats": analysis["stats"]}))
    return old


def test_an_old_analysis_is_checked_for_what_it_has_and_says_the_rest_is_unverified(train, tmp_path, old_analysis, caplog):
    r, _ = _reuse(train, tmp_path, BASE, analysis_from=old_analysis)
    assert r.exit_code == 0, r.output
    warning = caplog.text  # the CLI's log handler prints it on stderr
    assert "cannot be verified" in warning and "x_bucket" in warning and "color" in warning


def test_an_old_analysis_without_a_features_statistics_is_refused(train, tmp_path, old_analysis):
    r, out = _reuse(train, tmp_path, BASE + "  - {name: x2, source: x, transform: minmax}\n", analysis_from=old_analysis)
    assert r.exit_code == 2 and "'x2'" in r.output and "no statistics" in r.output
    assert not out.exists()


def test_a_file_that_is_not_an_analysis_is_refused(train, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "analysis.json").write_text('["not", "an", "analysis"]')
    r, _ = _reuse(train, tmp_path, BASE, analysis_from=bad)
    assert r.exit_code == 2 and "not a recordprep analysis" in r.output and "Traceback" not in r.output


def _edited(train, tmp_path, edit) -> Path:
    """A copy of the output's analysis.json after ``edit(analysis)``."""
    old = tmp_path / "edited"
    old.mkdir()
    analysis = json.loads((train["out"] / "analysis.json").read_text())
    edit(analysis)
    (old / "analysis.json").write_text(json.dumps(analysis))  # NaN and Infinity as Python writes them
    return old


def _set(*path_value):
    *path, value = path_value

    def edit(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value(d[path[-1]]) if callable(value) else value
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set("stats", "x", "mean", float("nan")), ["'x'", "'mean'", "nan"]),
    (_set("stats", "x", "mean", float("inf")), ["'x'", "'mean'", "inf"]),
    (_set("stats", "x", "mean", "1.5"), ["'x'", "'mean'", "'1.5'"]),
    (_set("stats", "x", "std", -2.0), ["'x'", "'std'", "-2.0"]),
    (_set("stats", "x", "std", float("-inf")), ["'x'", "'std'", "-inf"]),
    (_set("stats", "x", "count", -1), ["'x'", "'count'", "-1"]),
    (_set("stats", "x", "min", 9.0), ["'x'", "'min'", "above 'max'"]),
    (_set("stats", "x_bucket", "boundaries", lambda b: b[::-1]), ["'x_bucket'", "'boundaries'", "increase"]),
    (_set("stats", "x_bucket", "boundaries", lambda b: [*b[:-1], float("nan")]), ["'x_bucket'", "'boundaries'"]),
    (_set("vocabularies", "color", lambda t: [t[0], *t]), ["'color'", "appears twice"]),
    (_set("vocabularies", "color", lambda t: [*t, 7]), ["'color'", "string", "7"]),
    (_set("vocabularies", "tags", "abc"), ["'tags'", "list of strings"]),
    (_set("stats", "x", 1.0), ["'x'", "mapping"]),
])
def test_an_edited_analysis_is_refused_before_any_work_naming_feature_key_and_value(train, tmp_path, edit, words):
    r, out = _reuse(train, tmp_path, BASE, analysis_from=_edited(train, tmp_path, edit))
    assert r.exit_code == 2, r.output
    assert "not a recordprep analysis" in r.output and all(w in r.output for w in words), r.output
    assert "Traceback" not in r.output
    assert not out.exists()


def test_a_constant_features_zero_std_is_reused(train, tmp_path):
    r, _ = _reuse(train, tmp_path, BASE, analysis_from=_edited(train, tmp_path, _set("stats", "x", "std", 0.0)))
    assert r.exit_code == 0, r.output


def test_verify_checks_the_outputs_analysis(train, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for p in train["out"].iterdir():
        if p.is_file():
            (out / p.name).write_bytes(p.read_bytes())
    if (train["out"] / "vocab").is_dir():
        (out / "vocab").mkdir()
        for p in (train["out"] / "vocab").iterdir():
            (out / "vocab" / p.name).write_bytes(p.read_bytes())
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code == 0, r.output
    analysis = json.loads((out / "analysis.json").read_text())
    analysis["stats"]["x"]["std"] = -1.0
    (out / "analysis.json").write_text(json.dumps(analysis))
    r = runner.invoke(app, ["verify", str(out)])
    assert r.exit_code != 0 and "analysis.json" in r.output and "'std'" in r.output, r.output
