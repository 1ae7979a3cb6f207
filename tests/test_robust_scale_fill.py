"""``fill: median`` and robust_scale's fills: the median by default (written 0.0, as before
``fill: median`` existed), the training mean when ``fill: mean`` says so, scaled like a value;
the config hash of a config without ``fill`` unchanged, and ``median`` refused where no
quantile sketch gives it."""

from __future__ import annotations

import numpy as np
import pytest

from convert.analysis import Analyzer
from convert.config import parse_config
from convert.config_model import ConfigError
from convert.vectorize import Vectorizer

LABEL = {"source": "lbl", "dtype": "int64"}
VALUES = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1000.0]


def _config(transform: str = "robust_scale", **options):
    return parse_config({"label": LABEL, "features": [{"name": "r", "source": "x", "transform": transform,
                                                       **options}]})


def _robust(values: list, **options) -> tuple[dict, np.ndarray]:
    """``robust_scale``'s statistics and written column for a training split of ``values``, one
    record without ``x`` last."""
    config = _config(**options)
    records = [{"x": v, "lbl": 0} for v in values]
    a = Analyzer(config)
    a.add_records(records)
    analysis = a.result()
    cols = Vectorizer(config, analysis).vectorize(records + [{"lbl": 0}]).columns
    return analysis.stats["r"], cols["r"][1].ravel()


def test_the_default_fill_is_the_median_and_fill_median_says_so():
    stats, col = _robust(VALUES)
    assert col[-1] == 0.0 and not np.signbit(col[-1])
    _, named = _robust(VALUES, fill="median")
    assert named.tobytes() == col.tobytes()
    assert _config().features[0].fill == "median"


def test_fill_mean_is_the_training_mean_scaled_like_a_value():
    stats, col = _robust(VALUES, fill="mean")
    assert stats["mean"] == pytest.approx(np.mean(VALUES))
    want = np.float32((stats["mean"] - stats["median"]) / (stats["q75"] - stats["q25"]))
    assert col[-1].tobytes() == want.tobytes() and col[-1] != 0.0
    _, default = _robust(VALUES)
    assert col[:-1].tobytes() == default[:-1].tobytes(), "present values are scaled alike"


def test_a_number_fill_is_scaled_like_a_value_and_an_empty_split_fills_with_zeros():
    stats, col = _robust(VALUES, fill=0)
    assert col[-1] == np.float32((0.0 - stats["median"]) / (stats["q75"] - stats["q25"]))
    for fill in ("mean", "median"):
        _, col = _robust([None, None], fill=fill)
        assert col.tolist() == [0.0, 0.0, 0.0]


def test_a_config_without_fill_keeps_its_hash_and_an_explicit_mean_changes_it():
    # The hash this config had before ``fill: median`` existed (its outputs and analyses hold it).
    assert _config().hash == "6e52e492737eee23"
    assert _config(fill=2.5).hash == "7b912c474119066d"
    assert _config(fill="median").hash == _config().hash
    assert _config(fill="mean").hash != _config().hash


def test_the_normalized_form_loads_back_meaning_what_it_wrote():
    for fill in ("median", "mean", 2.5):
        config = _config(fill=fill)
        again = parse_config(config.to_json())
        assert again.features[0].fill == fill and again.hash == config.hash
    # An output written before ``fill: median`` existed: its config says ``mean``, its shards the median.
    old = _config().to_json()
    assert old["features"][0]["fill"] == "mean"
    assert parse_config(old).features[0].fill == "median"
    # A config a user types means what it says.
    assert _config(fill="mean").features[0].fill == "mean"


@pytest.mark.parametrize(("transform", "extra"), [("zscore", {}), ("minmax", {}), ("identity", {}),
                                                  ("zscore_per_key", {"key": "k"})])
def test_fill_median_is_refused_where_no_quantile_sketch_gives_a_median(transform, extra):
    with pytest.raises(ConfigError) as e:
        _config(transform, fill="median", **extra)
    msg = str(e.value)
    assert "feature 'r'" in msg and "'fill: median' applies to transform robust_scale" in msg
    assert f"transform {transform!r} fills a missing value with 'mean' or a number" in msg


def test_the_normalized_spelling_is_not_a_fill_a_user_types():
    with pytest.raises(ConfigError, match="'fill' must be 'mean', 'median' or a finite number"):
        _config(fill="training_mean")
    with pytest.raises(ConfigError, match="did you mean 'median'"):
        _config(fill="medain")


def test_the_feature_spec_spells_the_fill_as_the_normalized_config_does():
    """An output's spec reads as those written before ``fill: median`` existed (``apply_analysis``
    compares the two), so its ``fill`` says ``mean`` for the median."""
    for fill, spelled in (("median", "mean"), ("mean", "training_mean"), (2.5, 2.5)):
        config = _config(fill=fill)
        a = Analyzer(config)
        a.add_records([{"x": v, "lbl": 0} for v in VALUES])
        spec = Vectorizer(config, a.result()).feature_specs()[0]
        assert spec.params["fill"] == spelled == config.to_json()["features"][0]["fill"]


def test_a_dry_run_shows_the_fill_the_config_means(tmp_path):
    from _e2e import cli

    (tmp_path / "in.jsonl").write_text("".join(f'{{"x": {v}, "lbl": 0}}\n' for v in VALUES))
    (tmp_path / "c.yaml").write_text("features:\n  - {name: r, source: x, transform: robust_scale}\n"
                                     "  - {name: m, source: x, transform: robust_scale, fill: mean}\n")
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output",
            tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "robust_scale {'fill': 'median'}" in r.output and "robust_scale {'fill': 'mean'}" in r.output
