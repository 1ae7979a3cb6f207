"""The serving registry (``readers.transforms``) names exactly the converter's
transforms, each with its module and its serving hooks, so a transform cannot
be registered on one side only. That each one serves bit for bit is the
parity tests' (``tests/test_readers_serving.py`` runs a feature of every
registered transform through the converter and the layer).
"""
from __future__ import annotations

import importlib

import pytest

import readers
from convert.config import TRANSFORMS, FeatureConfig, parse_config
from readers import transforms
from readers._serving_wire import FORMS, Wire

#: What a feature of each transform needs besides its source (the options a config must give).
_REQUIRED = {"clip": {"clip_min": 0}, "hash": {"buckets": 8}, "cross": {"sources": ["a", "b"], "buckets": 8}, "text": {"max_len": 3},
             "zscore_per_key": {"key": "b"},
             "ngrams": {"max_len": 3, "ngram_range": [1, 2]}, "bag_of_words": {"max_len": 3}, "tfidf": {"max_len": 3}}
_HOOKS = ("forms", "paths", "term_paths", "wire_path", "is_list", "list_use", "hashed", "grouped_numeric",
          "grouped_ids", "shares_table", "own_table", "ids", "columns")


def test_the_serving_registry_names_the_converters_transforms():
    assert transforms.names() == tuple(TRANSFORMS)


@pytest.mark.parametrize("name", transforms.names())
def test_each_transform_has_its_module_with_the_serving_hooks(name):
    module = importlib.import_module(f"readers.transforms.{name}")
    t = module.TRANSFORM
    assert transforms.get(name) is t
    assert isinstance(t, transforms.ServingTransform) and t.name == name
    for hook in _HOOKS:
        assert callable(getattr(t, hook)), (name, hook)
    f = FeatureConfig(name="f", source="f", transform=name)
    assert transforms.serving_of(f) is t
    assert isinstance(t, transforms.NumericTransform) == f.is_numeric
    if t.grouped_numeric(f):
        step, params = t.step(f, {"mean": 1.0, "std": 2.0, "min": 0.0, "max": 4.0})
        assert isinstance(step, transforms.NumericStep) and isinstance(params, dict)


@pytest.mark.parametrize("name", transforms.names())
def test_a_feature_of_each_transform_travels_on_the_wire(name):
    feature = {"name": "f", "source": "a", "transform": name, **_REQUIRED.get(name, {})}
    if name == "cross":
        del feature["source"]
    config = parse_config({"label": {"source": "lbl", "dtype": "int64"}, "features": [feature]})
    wire = Wire(config)
    f = config.features[0]
    t = transforms.serving_of(f)
    paths = {t.wire_path(p) for p in t.paths(f)}
    assert {s.path for s in wire.sources} == paths
    for s in wire.sources:
        assert set(s.forms) == set(t.forms(f)) and set(s.forms) <= set(FORMS)
        assert s.is_list == t.is_list(f)
    assert set(readers.example_keys(config, wire)) == paths
    records = [{"a": 1, "b": "x"}, {"a": None}, {}]
    inputs, rejected = wire.encode(records)
    assert not rejected and set(inputs) == set(wire.input_names())


@pytest.mark.parametrize("name", transforms.names())
def test_the_converters_module_names_its_serving_twin(name):
    """Once the converter's transforms have their package, each module's ``serving`` is this one's."""
    converter = pytest.importorskip("convert.transforms")
    serving = converter.get(name).serving
    assert serving == f"readers.transforms.{name}"
    assert importlib.import_module(serving).TRANSFORM is transforms.get(name)


def test_an_unknown_transform_names_the_registered_ones():
    with pytest.raises(KeyError, match="no serving transform 'nope'; registered: identity, zscore"):
        transforms.get("nope")


def test_instances_is_public():
    assert "instances" in readers.__all__
    assert readers.instances([]) == []
