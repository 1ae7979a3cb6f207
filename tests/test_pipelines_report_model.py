"""`recordprep report` as a model builder reads it: timestamps as dates, hash features by
their buckets, and each vocabulary's out-of-vocabulary share off the training split, flagged
above `--oov-threshold`."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()

CONFIG = """
label: {source: y, dtype: int64}
features:
  - {name: ts, transform: timestamp, unit: ms, parts: [hour]}
  - {name: uid, transform: hash, buckets: 64}
  - {name: city, transform: vocabulary, min_frequency: 3}
  - {name: country, transform: vocabulary}
"""


@pytest.fixture(scope="module")
def output(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    # city: a frequent value and a long tail seen once each, out of the vocabulary on every split
    recs = [{"y": i % 2, "ts": 1_767_225_600_000 + i * 60_000, "uid": f"u{i % 50}",
             "city": "Paris" if i % 3 else f"town{i}", "country": ["US", "FR"][i % 2]} for i in range(600)]
    (root / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "features.yaml").write_text(CONFIG)
    out = root / "out"
    r = runner.invoke(app, ["convert", "--no-progress", "-i", str(root / "in.jsonl"), "-c", str(root / "features.yaml"),
                            "-o", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_timestamps_show_as_dates_and_hash_features_by_their_buckets(output, tmp_path):
    r = runner.invoke(app, ["report", str(output)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "mean 2026-01-01 " in r.output and "UTC" in r.output and "e+09" not in r.output
    assert re.search(r"values hashed into \d+ of 64 buckets", r.output) and " ids" not in r.output, r.output
    r = runner.invoke(app, ["report", str(output), "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "r.html").read_text()
    assert "2026-01-01 " in page and "2025-12-31 " not in page


def test_an_oov_share_over_the_threshold_is_flagged(output, tmp_path):
    r = runner.invoke(app, ["report", str(output), "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 0, r.output
    checks = {(c["feature"], c["split"]): c for c in json.loads((tmp_path / "r.json").read_text())["oov"]}
    city, country = checks[("city", "eval")], checks[("country", "eval")]
    assert city["over"] and 0.2 < city["share"] < 0.5 and city["threshold"] == 0.05
    assert not country["over"] and country["share"] == 0
    assert not any(split == "train" for _, split in checks)
    r = runner.invoke(app, ["report", str(output)], env={"COLUMNS": "300"})
    assert "out-of-vocabulary shares over 5.0%" in r.output and "city" in r.output, r.output
    r = runner.invoke(app, ["report", str(output), "--oov-threshold", "0.9"], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and "out-of-vocabulary shares: none over 90.0%" in r.output


@pytest.mark.parametrize("bad", ["-0.1", "1.5", "nan"])
def test_an_oov_threshold_outside_zero_to_one_is_a_usage_error(output, bad):
    r = runner.invoke(app, ["report", str(output), "--oov-threshold", bad])
    assert r.exit_code == 2 and "--oov-threshold must be a fraction in 0..1" in r.output
