"""The transform registry: every registered transform has its own module with what
a transform is (summary, options, its serving twin's module), and the config
check accepts exactly the options its module lists."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from convert import transforms
from convert.analysis import Analyzer
from convert.config import (
    COMMON_OPTIONS,
    NUMERIC_TRANSFORMS,
    TRANSFORM_TABLE,
    TRANSFORMS,
    FeatureConfig,
    parse_config,
)
from convert.config_model import ConfigError
from convert.prepare import STAGES
from convert.transforms.registry import REGISTRY
from convert.vectorize import Vectorizer

ROOT = Path(__file__).resolve().parents[1]
#: A valid value of every option a feature may have.
VALID = {"fill": 1.5, "missing_indicator": True, "on_nan": "fill", "clip_min": 0.0, "clip_max": 9.0, "top_k": 10,
         "min_frequency": 2, "num_oov_buckets": 2, "buckets": 64, "max_len": 3, "lowercase": False,
         "num_buckets": 4, "unit": "s", "parts": ["hour"], "sources": ["a", "b"], "source": "elsewhere",
         "allow_all_missing": True, "allow_label_source": True, "length": False, "length_of": "other",
         "drift": {"js": 0.1}, "key": "country", "mutual_information": "plain", "min_diff_from_avg": 2.0,
         "ngram_range": [1, 2], "separator": "_", "smooth": False}
#: What each transform needs to be valid at all (``Transform.complete`` asks for it).
NEEDS = {"hash": {"buckets": 8}, "text": {"max_len": 4}, "clip": {"clip_min": 0.0},
         "cross": {"sources": ["a", "b"], "buckets": 8}, "zscore_per_key": {"key": "k"},
         "ngrams": {"max_len": 4, "ngram_range": [1, 2]}, "bag_of_words": {"max_len": 4}, "tfidf": {"max_len": 4}}
#: A class label: ``label_vocabulary`` ranks its terms by it (every config here has one).
LABEL = {"source": "lbl", "dtype": "int64"}
STATS_KINDS = {"numeric", "categorical", "timestamp", "hash", "bytes", "other"}


def _module(t: transforms.Transform) -> str:
    return type(t).__module__.rpartition(".")[2]


def test_every_transform_field_has_a_valid_value_here():
    assert set(VALID) == {f.name for f in dataclasses.fields(FeatureConfig)} - {"name", "transform"}


@pytest.mark.parametrize("name", transforms.names())
def test_a_registered_transform_has_its_own_module(name):
    t = transforms.get(name)
    module = _module(t)
    assert t.name == name and REGISTRY[name] is t
    assert type(t).__module__ == f"convert.transforms.{module}"
    assert (ROOT / "convert" / "transforms" / f"{module}.py").is_file()
    assert module.rstrip("_") == name, "a module is named after its transform (a suffix only against a clash)"
    assert isinstance(t.summary, str) and t.summary and "\n" not in t.summary
    assert isinstance(t.options, tuple) and all(isinstance(o, str) for o in t.options)
    assert set(t.options) <= set(VALID), "an option is a FeatureConfig field"
    assert t.serving == f"readers.transforms.{module}"
    assert t.prepared_as in STAGES and t.stats_kind in STATS_KINDS
    assert set(t.not_taken_why) <= set(VALID) | {"source"}


def test_each_module_registers_one_transform_and_no_module_is_left_out():
    names = {p.stem for p in (ROOT / "convert" / "transforms").glob("*.py")} - {"__init__", "base", "registry"}
    assert names == {_module(t) for t in REGISTRY.values()}
    assert len({_module(t) for t in REGISTRY.values()}) == len(REGISTRY)


def test_the_serving_twin_exists_where_the_serving_package_does():
    """Each transform's ``serving`` module is a file of ``readers/transforms`` (checked by path: convert
    never imports TensorFlow); skipped while that package is not there."""
    package = ROOT / "readers" / "transforms"
    if not package.is_dir():
        pytest.skip("no readers/transforms package in this tree")
    for t in REGISTRY.values():
        assert (package / f"{t.serving.rpartition('.')[2]}.py").is_file(), t.serving


def test_convert_transforms_import_neither_tensorflow_nor_readers():
    for path in (ROOT / "convert" / "transforms").glob("*.py"):
        text = path.read_text()
        assert "import tensorflow" not in text and "from readers" not in text and "import readers" not in text, path


def test_the_table_views_follow_the_registry():
    assert TRANSFORMS == transforms.names() == tuple(REGISTRY)
    for name, info in TRANSFORM_TABLE.items():
        t = transforms.get(name)
        assert (info.summary, info.options, info.numeric) == (t.summary, t.options, t.numeric)
    assert NUMERIC_TRANSFORMS == tuple(n for n in TRANSFORMS if transforms.get(n).numeric)


def test_unknown_names_are_refused():
    with pytest.raises(KeyError, match="no transform 'nope'"):
        transforms.get("nope")
    assert transforms.find("nope") is None and transforms.find(None) is None


@pytest.mark.parametrize("name", transforms.names())
def test_config_checks_accept_exactly_the_modules_options(name):
    """Each option the module lists loads; every other option (not common to all transforms) is refused."""
    t = transforms.get(name)
    common = set(COMMON_OPTIONS) - {"name", "transform"} - ({"source"} if t.reads_sources else set())
    for option, value in VALID.items():
        feature = {"name": "f", "transform": name, **NEEDS.get(name, {}), option: value}
        if option in t.options or option in common:
            if option == "length_of":
                continue  # needs another numeric list of the same list (test_convert_config)
            if option == "length" and "max_len" not in feature:
                feature["max_len"] = 2
            assert parse_config({"label": LABEL, "features": [feature]}).features[0].transform == name, (name, option)
        else:
            with pytest.raises(ConfigError) as ei:
                parse_config({"label": LABEL, "features": [feature]}, source="cfg.yaml")
            assert f"transform {name!r} does not take {option!r}" in str(ei.value), (name, option)


@pytest.mark.parametrize("name", transforms.names())
def test_required_options_come_from_the_module(name):
    """Without what ``NEEDS`` gives, the check says what is missing; with it, the feature loads."""
    asked: list[str] = []
    transforms.get(name).complete({}, asked.append)
    assert bool(asked) == (name in NEEDS)
    if asked:
        with pytest.raises(ConfigError) as ei:
            parse_config({"label": LABEL, "features": [{"name": "f", "transform": name}]}, source="cfg.yaml")
        assert all(a in str(ei.value) for a in asked)


@pytest.mark.parametrize("name", transforms.names())
def test_feature_config_properties_ask_the_registry(name):
    f = parse_config({"label": LABEL, "features": [{"name": "f", "transform": name, **NEEDS.get(name, {})}]}).features[0]
    t = transforms.transform_of(f)
    assert t is transforms.get(name)
    assert f.is_numeric == t.numeric and f.needs_vocabulary == t.vocabulary
    assert f.needs_stats == (t.numeric and t.needs_stats(f))


def _robust(values: list, **options) -> tuple[dict, np.ndarray]:
    """``robust_scale``'s statistics and written column for a training split of ``values``."""
    config = parse_config({"label": LABEL, "features": [{"name": "r", "source": "x", "transform": "robust_scale",
                                                         **options}]})
    records = [{"x": v, "lbl": 0} for v in values]
    a = Analyzer(config)
    a.add_records(records)
    analysis = a.result()
    cols = Vectorizer(config, analysis).vectorize(records + [{"lbl": 0}]).columns
    return analysis.stats["r"], cols


def test_robust_scale_is_median_and_iqr_of_the_training_split():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 1000.0]  # the outlier moves neither
    stats, cols = _robust(values, missing_indicator=True, on_nan="fill")
    q25, med, q75 = np.quantile(values, [0.25, 0.5, 0.75], method="inverted_cdf")
    assert (stats["q25"], stats["median"], stats["q75"]) == (q25, med, q75)
    want = ((np.asarray(values + [med]) - med) / (q75 - q25)).astype(np.float32)
    assert cols["r"][1].ravel().tobytes() == want.tobytes()
    assert cols["r"][1].ravel()[-1] == 0.0, "the default fill is the median, written 0.0"
    assert cols["r_missing"][1].ravel().tolist() == [0] * len(values) + [1]


def test_robust_scale_iqr_of_zero_or_an_empty_split_scales_by_one():
    stats, cols = _robust([3.0] * 10 + [4.0], fill=1.0)
    assert stats["q75"] == stats["q25"] == 3.0
    assert cols["r"][1].ravel().tolist() == [0.0] * 10 + [1.0, -2.0]
    stats, cols = _robust([None, None], fill=2.5)
    assert stats["median"] is None
    assert cols["r"][1].ravel().tolist() == [2.5, 2.5, 2.5]


def test_robust_scale_is_a_standardizing_transform_with_the_numeric_options():
    t = transforms.get("robust_scale")
    assert set(t.options) == {"fill", "missing_indicator", "on_nan"} and t.encoding == "scaled"
    assert t.quantiles and t.sketch_keys == ("q25", "median", "q75")
