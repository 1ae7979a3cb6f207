"""The serving layer maps raw records to exactly the converter's features.

Parity is checked against Examples the converter's own code serializes
(``OutputAnalysis.vectorize``, what ``--analysis-from`` runs, then
``convert.example``) parsed back by TensorFlow, record for record: int and
string features equal, float32 features equal as bits. Rejections must agree:
every record the converter rejects is flagged by the layer; a record the layer
flags and the converter accepts is allowed only for the documented serving
limits (ISO 8601 strings, timestamps beyond int64). The slow tests run the real
CLI (``--analysis-from``) and read the shards, export a SavedModel and run it in
a process without recordprep, and cover ``examples/data`` and ``../shared/realdata``.
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _e2e import cli, error_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readers
from convert.apply import OutputAnalysis, apply_analysis
from convert.check import unit_problems
from convert.config import load_config
from convert.example import encode_examples, split_buffer
from convert.formats.jsonl import iter_json
from readers import _serving_wire, serving, serving_ops, transforms
from readers._serving_wire import KIND_NESTED

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "data"
REALDATA = ROOT.parent / "shared" / "realdata"
#: Layer errors allowed on records the converter accepts (documented serving limits).
SERVING_LIMITS = ("ISO 8601 form is not supported", "beyond int64; the serving layer")

BASE_FEATURES = """
  - {name: n_id, source: num, transform: identity, on_nan: keep}
  - {name: n_z, source: num, transform: zscore, missing_indicator: true, on_nan: fill}
  - {name: n_mm, source: num2, transform: minmax, on_nan: keep}
  - {name: n_mm_fill, source: num2, transform: minmax, fill: 2.5, on_nan: fill}
  - {name: n_log, source: num2, transform: log1p, fill: 1.5, on_nan: fill}
  - {name: n_log_keep, source: num, transform: log1p, on_nan: keep, missing_indicator: true}
  - {name: n_clip, source: num3, transform: clip, clip_min: 0, clip_max: 10.5, missing_indicator: true}
  - {name: n_clip_lo, source: num, transform: clip, clip_min: -0.0, on_nan: keep}
  - {name: n_id_mean, source: num3, transform: identity, fill: mean}
  - {name: n_list, source: nums, transform: identity, max_len: 3, on_nan: keep, fill: mean, missing_indicator: true}
  - {name: n_list_log, source: nums, transform: log1p, max_len: 2, on_nan: fill}
  - {name: n_list_clip, source: nums, transform: clip, clip_max: 1, max_len: 4, on_nan: fill, fill: -3}
  - {name: b, source: num, transform: bucketize, num_buckets: 4, missing_indicator: true, on_nan: keep}
  - {name: b_fill, source: num2, transform: bucketize, on_nan: fill}
  - {name: cat, transform: vocabulary, min_frequency: 2}
  - {name: cat_top, source: cat, transform: vocabulary, top_k: 3}
  - {name: cat_empty, source: cat, transform: vocabulary, min_frequency: 1000000, allow_all_missing: true}
  - {name: tags, transform: vocabulary, max_len: 3}
  - {name: seg, source: user.segment, transform: vocabulary}
  - {name: ts, transform: timestamp, parts: [hour, day_of_week, month], missing_indicator: true}
  - {name: ts_ns, source: ts, transform: timestamp, unit: ns, parts: [month]}
  - {name: day, transform: timestamp, unit: days, parts: [day_of_week, month]}
  - {name: secs, transform: timestamp, unit: s, parts: [hour]}
  - {name: cyc, source: ts, transform: cyclical, parts: [hour, day_of_week, day_of_month, day_of_year, month], missing_indicator: true}
  - {name: cyc_s, source: secs, transform: cyclical, unit: s}
  - {name: n_key, source: num2, transform: zscore_per_key, key: cat, missing_indicator: true, on_nan: fill}
  - {name: n_key_seg, source: num, transform: zscore_per_key, key: user.segment, fill: 2.5, on_nan: keep}
  - {name: cat_mi, source: cat, transform: label_vocabulary, top_k: 4}
  - {name: seg_mi, source: user.segment, transform: label_vocabulary, mutual_information: plain, min_diff_from_avg: 0}
  - {name: tags_mi, source: tags, transform: label_vocabulary, max_len: 3, mutual_information: plain, min_diff_from_avg: 0}
  - {name: blob, transform: bytes}
  - {name: n_tags, source: tags, transform: count}
  - {name: deep, source: deep.a.b, transform: vocabulary}
  - {name: deep_n, source: deep.a.n, transform: identity, fill: 7, missing_indicator: true}
  - {name: n_rs, source: num, transform: robust_scale, missing_indicator: true, on_nan: fill}
  - {name: n_rs_keep, source: num2, transform: robust_scale, fill: 2.5, on_nan: keep}
  - {name: n_rs_mean, source: num2, transform: robust_scale, fill: mean, missing_indicator: true, on_nan: fill}
  - {name: n_rs_median, source: num2, transform: robust_scale, fill: median, on_nan: keep}
  - {name: n_rs_zero, source: num, transform: robust_scale, fill: 0, missing_indicator: true, on_nan: fill}
"""
HASHED_FEATURES = """
  - {name: h, source: user.id, transform: hash, buckets: 97}
  - {name: h_list, source: tags2, transform: hash, buckets: 13, max_len: 2}
  - {name: x, transform: cross, sources: [cat, user.segment], buckets: 50}
  - {name: x3, transform: cross, sources: [cat, user.id, flag], buckets: 1000000}
  - {name: cat_oov, source: cat, transform: vocabulary, num_oov_buckets: 5, top_k: 2}
  - {name: tags_oov, source: tags, transform: vocabulary, num_oov_buckets: 3, max_len: 2}
  - {name: q, source: query, transform: text, max_len: 4}
  - {name: cat_mi_oov, source: cat, transform: label_vocabulary, num_oov_buckets: 3, top_k: 3}
  - {name: tags2_mi_oov, source: tags2, transform: label_vocabulary, num_oov_buckets: 2, max_len: 2, top_k: 1}
  - {name: q_case, source: query, transform: text, max_len: 3, lowercase: false, num_oov_buckets: 3}
  - {name: q_ng, source: query, transform: ngrams, ngram_range: [1, 3], max_len: 5, num_oov_buckets: 2, top_k: 30}
  - {name: q_bow, source: query, transform: bag_of_words, ngram_range: [1, 2], separator: _, max_len: 3, top_k: 6}
  - {name: q_tfidf, source: query, transform: tfidf, max_len: 4, smooth: false, top_k: 8}
  - {name: q_tfidf2, source: query, transform: tfidf, ngram_range: [2, 2], max_len: 2, lowercase: false, min_frequency: 2}
"""
HASHED_SUPPORTED = serving.SERVING_MIN_FORMAT_VERSION is not None
LABEL = "label: {source: y, dtype: int64}\n"  # int64 classes: label_vocabulary ranks by them


def _config(hashed: bool) -> str:
    return LABEL + "features:" + BASE_FEATURES + (HASHED_FEATURES if hashed else "")


WORDS = ["red", "Blue", "BLUE", "café", "naïve", "x_y", "42", "σας", "İstanbul", "straße", "a-b", "ǅ"]


def _train_record(i: int) -> dict[str, Any]:
    r = np.random.default_rng(i)
    return {
        "y": i % 2,
        "num": None if i % 7 == 0 else float(r.uniform(-0.9, 8)),
        "num2": float(r.uniform(-0.5, 20)) if i % 5 else None,
        "num3": int(r.integers(-5, 15)),
        "nums": [float(r.uniform(-0.9, 3)) for _ in range(i % 5)] if i % 6 else None,
        "cat": ["a", "b", "c", "d", "é", "7"][i % 6] if i % 9 else 7,
        "tags": ["x", "y", "z", "w"][: i % 4],
        "tags2": ["p", None, "q"][: i % 3],
        "user": {"id": f"u{i % 13}", "segment": ["s1", "s2", None][i % 3]} if i % 8 else None,
        "flag": bool(i % 2),
        "ts": 1767225600000 + i * 3_600_123,
        "day": 20_000 + i,
        "secs": 1_700_000_000 + i * 7777,
        "blob": f"b{i}",
        "deep": {"a": {"b": ["k", "l", "m"][i % 3], "n": i}} if i % 4 else {"a": None},
        "query": " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 2 + i % 5)),
    }


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serving")
    (root / "in").mkdir()
    (root / "in" / "train.jsonl").write_text("".join(json.dumps(_train_record(i)) + "\n" for i in range(240)))
    (root / "features.yaml").write_text(_config(HASHED_SUPPORTED))
    out = root / "out"
    r = cli("convert", "--input", root / "in", "--config", root / "features.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture(scope="module")
def layer(output) -> serving.TransformLayer:
    return readers.transform_layer(str(output))


# ------------------------------------------------------------------ parity helpers

_TF = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}


def converter_examples(output: Path, records: list[Any]) -> tuple[dict[str, np.ndarray], np.ndarray, list]:
    """The converter's Examples for ``records`` (``--analysis-from`` semantics), parsed by TensorFlow."""
    applied = OutputAnalysis.load(output)
    vb = applied.vectorize(records)
    kept = np.flatnonzero(vb.keep)
    buf, lens = encode_examples(vb.columns, len(kept))
    specs = [f for f in applied.info.features if f.role != "label"]
    parsed = tf.io.parse_example(tf.constant(split_buffer(buf, lens), dtype=tf.string), {f.name: tf.io.FixedLenFeature(f.shape, _TF[f.dtype]) for f in specs})
    return {k: v.numpy() for k, v in parsed.items()}, kept, vb.rejections


def assert_same(name: str, expected: np.ndarray, got: np.ndarray, rows: Any) -> None:
    assert expected.shape == got.shape, (name, expected.shape, got.shape)
    if expected.dtype == np.float32:
        diff = expected.view(np.uint32) != got.view(np.uint32)
    else:
        diff = expected != got
    if diff.any():
        i = int(np.flatnonzero(diff.any(axis=tuple(range(1, diff.ndim))))[0])
        raise AssertionError(f"feature {name!r}, record {rows[i]!r}: converter {expected[i]!r}, layer {got[i]!r}")


def _has_surrogate(v: Any) -> bool:
    if isinstance(v, str):
        return any("\ud800" <= c <= "\udfff" for c in v)
    if isinstance(v, dict):
        return any(map(_has_surrogate, v.values()))
    return isinstance(v, list) and any(map(_has_surrogate, v))


def json_reader_refuses(record: Any) -> bool:
    """Whether the converter's JSON reader refuses ``record`` written as a JSON line for its strings
    (a lone surrogate; bytes, which JSON cannot hold, written as null). A Python string holding a
    surrogate pair's two code points counts too: no reader gives one (JSON's ``\\ud800\\udc00``
    reads as U+10000), and the layer, given that string, refuses its lone surrogates."""
    if _has_surrogate(record):
        return True
    line = json.dumps(record, default=lambda _: None).encode()
    return any("surrogate" in bad[2] for b in iter_json(io.BytesIO(line), "r.jsonl") for bad in b.bad)


def check_parity(output: Path, layer: serving.TransformLayer, records: list[Any]) -> None:
    """The layer rejects what the converter rejects (its vectorizer, or its reader: a lone surrogate)
    and maps every other record to the converter's features, bit for bit."""
    expected, kept, rejections = converter_examples(output, records)
    features, errors = layer.transform_records(records)
    refused = {i for i, r in enumerate(records) if json_reader_refuses(r)}
    conv_rejected = {r.index for r in rejections} | refused
    layer_rejected = {i for i, e in enumerate(errors) if e}
    missed = conv_rejected - layer_rejected
    assert not missed, [(records[i], [r.reason for r in rejections if r.index == i]) for i in sorted(missed)][:3]
    extra = sorted(layer_rejected - conv_rejected)
    for i in extra:
        assert any(why in errors[i] for why in SERVING_LIMITS), (records[i], errors[i])
    rows = [i for i in kept.tolist() if i not in layer_rejected]
    pick = np.array([np.flatnonzero(kept == i)[0] for i in rows], dtype=np.int64)
    assert set(expected) == set(features)
    for name, exp in expected.items():
        got = features[name][rows] if rows else features[name][:0]
        assert got.dtype == exp.dtype or (exp.dtype == object and got.dtype == object), (name, got.dtype, exp.dtype)
        assert_same(name, exp[pick] if rows else exp[:0], got, [records[i] for i in rows])


# ------------------------------------------------------------------ random records

BIG = [2**53 + 1, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, 10**400, -(10**400)]
EDGE_FLOATS = [0.0, -0.0, 5e-324, -5e-324, -1e-310, 1.1754943508222875e-38, 1.401298464324817e-45, -1e-40, 1.1754942106924411e-38, 3.4028234663852886e38, 3.4028235677973366e38,
               3.4028235677973362e38, -3.5e38, 1e308, math.inf, -math.inf, math.nan, -math.nan, -1.0, -0.9999999999999999, 0.5]
#: Around the float32 and double subnormal ranges, where TensorFlow's kernels flush to zero (st.floats seldom goes there).
TINY = st.one_of(st.floats(-1.2e-38, 1.2e-38), st.floats(-2.3e-308, 2.3e-308))
NUMBERS = st.one_of(st.floats(), st.sampled_from(EDGE_FLOATS), st.integers(-(2**64), 2**64), st.sampled_from(BIG),
                    st.integers(-3, 20).map(float), TINY)
STRINGS = st.one_of(st.text(max_size=12), st.text(st.characters(codec=None, categories=["Cs", "Mn", "Lu", "Ll", "Zs"]), max_size=4), st.sampled_from(["a", "b", "é", "7", "", "true", "x", "y", "nan", "inf"] + WORDS))
TS_STRINGS = st.one_of(st.sampled_from(["2026-01-01", "2026-01-01T10:11:12Z", "nope", "", "1767225600000", "2026-02-30",
                                         "2026-W01-1", "20260101T101112"]), st.deferred(lambda: iso_strings()))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS, st.binary(max_size=6))
NESTED = st.one_of(st.just({}), st.just({"a": 1}), st.just([]), st.just([1, "a"]))
ANY = st.one_of(SCALARS, NESTED)


def lists(items: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), st.lists(st.one_of(st.none(), items), max_size=6), items)


def _value(kind: str) -> st.SearchStrategy:
    return {
        "num": st.one_of(st.none(), st.booleans(), NUMBERS, NUMBERS, STRINGS, NESTED),
        "nums": st.one_of(lists(st.one_of(NUMBERS, NUMBERS, st.booleans(), STRINGS)), NESTED),
        "cat": ANY,
        "tags": st.one_of(lists(st.one_of(STRINGS, NUMBERS, st.booleans())), lists(ANY)),
        "ts": st.one_of(st.none(), st.integers(-(2**64), 2**64), st.sampled_from(BIG), st.floats(), st.sampled_from(EDGE_FLOATS),
                        TS_STRINGS, st.booleans(), NESTED),
        "text": st.one_of(st.none(), st.text(max_size=30), st.sampled_from(WORDS).map(lambda w: f" {w}, {w.upper()}!"), NUMBERS),
        "blob": st.one_of(st.none(), st.text(max_size=5), st.binary(max_size=5), NUMBERS, NESTED),
    }[kind]


FIELDS = {"num": "num", "num2": "num", "num3": "num", "nums": "nums", "cat": "cat", "tags": "tags", "tags2": "tags",
          "flag": "cat", "ts": "ts", "day": "ts", "secs": "ts", "blob": "blob", "query": "text"}


@st.composite
def records(draw) -> Any:
    if draw(st.integers(0, 30)) == 0:
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2)))
    r: dict[str, Any] = {}
    for name, kind in FIELDS.items():
        if draw(st.integers(0, 5)):  # absent sometimes
            r[name] = draw(_value(kind))
    user = draw(st.one_of(st.none(), st.just("not a record"), st.fixed_dictionaries(
        {}, optional={"id": ANY, "segment": st.one_of(st.none(), st.sampled_from(["s1", "s2", "s3"]), ANY)})))
    if draw(st.booleans()):
        r["user"] = user
    if draw(st.booleans()):  # nulls, non-records and absent keys at every depth of deep.a.b
        r["deep"] = draw(st.one_of(st.none(), ANY, st.fixed_dictionaries({}, optional={"a": st.one_of(
            st.none(), ANY, st.fixed_dictionaries({}, optional={"b": ANY, "n": st.one_of(NUMBERS, st.none())}))})))
    return r


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records(), min_size=1, max_size=12))
def test_parity_on_random_records(output, layer, recs):
    check_parity(output, layer, recs)


def test_parity_on_training_records(output, layer):
    check_parity(output, layer, [_train_record(i) for i in range(240)])


@pytest.mark.parametrize("name", transforms.names())
def test_the_parity_output_has_features_of_every_registered_transform(layer, name):
    """The property tests here run every transform the serving registry holds through the
    converter and the layer: a new one needs its features in BASE_FEATURES or HASHED_FEATURES."""
    assert any(f.transform == name for f in layer.config.features), name


@pytest.mark.parametrize("tags", [
    ["x", None, None, "y", ["nested"]],       # nulls take no slot: the nested item is 3rd of max_len 3 -> rejected
    ["x", None, "y", "z", ["nested"]],        # the nested item is past max_len -> dropped, not rejected
    [None, None, None, None, "x"],            # an item after a run of nulls is the row's first
    [["nested"], None],
])
def test_list_items_take_their_rank_among_the_non_null_ones(output, layer, tags):
    """A list item's slot, and whether a nested item is kept (rejected) or dropped, count only the
    non-null items before it, in rows of a batch whose other rows are of other lengths."""
    check_parity(output, layer, [{"tags": ["a"] * k} for k in range(5)] + [{"tags": tags}, {}, {"tags": tags[::-1]}])


def test_a_nested_item_past_the_kept_ones_of_a_wider_request_is_dropped(layer):
    """A client may send a list whole (``encode`` stops at the last item a feature keeps): a
    nested item past every feature's first max_len non-null items is dropped, as the
    converter drops it, and one within them is rejected."""
    s = layer.wire.by_path("tags")
    packed, j = layer.wire.positions()[s.len_name]

    def wider(items: list[Any], extra_kind: int) -> dict[str, np.ndarray]:
        x = layer.encode([{"tags": items}])
        x[s.input_name("term")] = np.concatenate([x[s.input_name("term")], [[b""]]], axis=1)
        x[s.kind_name] = np.concatenate([x[s.kind_name], [[extra_kind]]], axis=1).astype(np.int32)
        x[packed][0, j] += 1
        return x

    items = ["x", None, "y", "z"]  # tags keeps x, y, z (max_len 3)
    sent = wider(items, KIND_NESTED)
    features, errors = layer.transform(sent)
    expected, _ = layer.transform(layer.encode([{"tags": items}]))
    assert errors.numpy().tolist() == [b""]
    for name in ("tags", "tags_len", "tags_oov", "tags_oov_len"):
        assert np.array_equal(features[name].numpy(), expected[name].numpy()), name
    _, errors = layer.transform(wider(["x", None, "y"], KIND_NESTED))  # the nested item is the third kept
    assert errors.numpy()[0].decode().startswith("tags: expected a list of scalar values"), errors.numpy()


def _long_list(items: st.SearchStrategy) -> st.SearchStrategy:
    """A list running past every feature's max_len: scalars and nulls, then anything (nested values included)."""
    return st.tuples(st.lists(st.one_of(st.none(), items), min_size=2, max_size=7),
                     st.lists(ANY, min_size=1, max_size=3)).map(lambda t: t[0] + t[1])


LONG_LISTS = {"nums": _long_list(NUMBERS), "tags": _long_list(STRINGS), "tags2": _long_list(st.one_of(STRINGS, NUMBERS))}


@st.composite
def records_with_long_lists(draw) -> Any:
    # Half of them hold lists only: a random record is often rejected for another field first.
    r = draw(records()) if draw(st.booleans()) else {}
    if isinstance(r, dict):
        for name, strategy in LONG_LISTS.items():
            if draw(st.booleans()):
                r[name] = draw(strategy)
    return r


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records_with_long_lists(), min_size=1, max_size=12))
def test_parity_on_random_records_sent_with_their_lists_whole(output, layer, recs):
    """As ``test_parity_on_random_records``, with every list sent whole, as a REST client
    may write it: ``encode`` stops at the last item a feature keeps, so items past
    ``max_len`` (nulls, nested values, anything) reach the layer only this way."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_serving_wire, "_needed", lambda items, uses: len(items))
        check_parity(output, layer, recs)


ZERO_EDGES = """features:
  - {name: b, source: x, transform: bucketize, num_buckets: 4, on_nan: keep}
  - {name: c0, source: x, transform: clip, clip_min: 0, on_nan: keep}
  - {name: c1, source: x, transform: clip, clip_max: 0, on_nan: keep}
  - {name: c2, source: x, transform: clip, clip_min: -0.0, clip_max: 0.0, on_nan: keep}
  - {name: mm, source: x, transform: minmax, on_nan: keep}
  - {name: z, source: x, transform: zscore, on_nan: keep}
  - {name: l, source: x, transform: log1p, on_nan: keep}
  - {name: xs, source: xs, transform: identity, max_len: 2, on_nan: keep}
"""


def test_parity_on_subnormal_doubles_against_bounds_at_zero(tmp_path):
    """Bucket boundaries and clip bounds at +-0.0 meet doubles below the smallest normal:
    TensorFlow's kernels read those as zero of their sign, and so does the converter."""
    values = [0.0] * 50 + [-0.5] * 10 + [1.0] * 40
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"x": v, "xs": [v]}) + "\n" for v in values))
    (tmp_path / "c.yaml").write_text(ZERO_EDGES)
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    assert json.loads((out / "analysis.json").read_text())["stats"]["b"]["boundaries"][0] == 0.0
    tiny = [5e-324, -5e-324, 2.2e-308, -2.2e-308, 1e-310, -1e-310, 0.0, -0.0, 2.2250738585072014e-308]
    check_parity(out, readers.transform_layer(str(out)), [{"x": v, "xs": [v, -v]} for v in tiny])


TINY_CONSTANTS = """features:
  - {name: b, source: x, transform: bucketize, num_buckets: 4, on_nan: keep}
  - {name: mm, source: x, transform: minmax, on_nan: keep}
  - {name: z, source: x, transform: zscore, on_nan: keep}
  - {name: i, source: x, transform: identity, fill: mean, on_nan: keep}
  - {name: c, source: x, transform: clip, clip_min: -1.0e-310, clip_max: 1.0e-310, fill: 1.0e-310, on_nan: keep}
  - {name: c2, source: x, transform: clip, clip_min: 1.0e-310, fill: -1.0e-310, on_nan: keep}
  - {name: c3, source: x, transform: clip, clip_max: -1.0e-310, on_nan: keep}
  - {name: rs, source: x, transform: robust_scale, on_nan: keep}
  - {name: rs_mean, source: x, transform: robust_scale, fill: mean, on_nan: keep}
  - {name: rs_tiny, source: x, transform: robust_scale, fill: 1.0e-310, on_nan: keep}
"""


def test_parity_with_statistics_and_config_constants_below_the_smallest_normal_double(tmp_path):
    """Statistics (mean, min, max, boundaries, median, IQR) and config constants (fill, clip bounds) below
    the smallest normal double: both sides read them as zero of their sign, as TensorFlow's
    kernels read such a constant (a minmax over [-5e-324, 1e-310] is all zeros, not NaN)."""
    values = [5e-324] * 50 + [-5e-324] * 30 + [1e-310] * 20
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"x": v}) + "\n" for v in values) + '{"x": null}\n')
    (tmp_path / "c.yaml").write_text(TINY_CONSTANTS)
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    stats = json.loads((out / "analysis.json").read_text())["stats"]
    assert stats["b"]["boundaries"] == [-5e-324, 5e-324] and stats["mm"]["max"] == 1e-310  # recorded exactly
    check_parity(out, readers.transform_layer(str(out)),
                 [{"x": v} for v in (5e-324, -5e-324, 1e-310, 0.0, -0.0, 1.0, -1.0, None)])


LIST_FILLS = """features:
  - {name: zero, source: xs, transform: identity, max_len: 4, on_nan: keep}
  - {name: neg_zero, source: xs, transform: identity, max_len: 4, fill: -0.0, on_nan: keep}
  - {name: neg, source: xs, transform: identity, max_len: 4, fill: -2.5, on_nan: keep}
  - {name: mean, source: xs, transform: identity, max_len: 4, fill: mean, on_nan: keep}
  - {name: c, source: xs, transform: clip, clip_min: -1.0, max_len: 4, fill: -0.0, on_nan: keep}
  - {name: l, source: xs, transform: log1p, max_len: 4, fill: -0.0, on_nan: keep}
"""


def test_parity_on_null_list_items_and_the_slots_past_a_list_for_every_fill(tmp_path):
    """A null item inside a list takes the feature's fill (its sign too: -0.0), a slot past
    the list 0.0, whatever the fill."""
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"xs": [v, v / 2, None][: i % 4]}) + "\n"
                                               for i, v in enumerate([1.0, 2.0, 3.5, 8.0] * 5)))
    (tmp_path / "c.yaml").write_text(LIST_FILLS)
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    recs = [{"xs": xs} for xs in ([None], [None, None, None, None, None], [1.0, None], [], None, [-0.0, None, 0.0])]
    check_parity(out, readers.transform_layer(str(out)), recs)


SHARED_LENGTHS = """features:
  - {name: ad, source: "imp[].ad", transform: vocabulary, max_len: 3, length: false}
  - {name: ad_h, source: "imp[].ad", transform: hash, buckets: 50, max_len: 3, length: false}
  - {name: pos, source: "imp[].pos", transform: identity, max_len: 3, on_nan: fill}
  - {name: price, source: "imp[].price", transform: clip, clip_min: 0, max_len: 3, fill: -1, length_of: pos}
  - {name: lp, source: "imp[].price", transform: log1p, max_len: 3, on_nan: fill, length_of: pos}
  - {name: title, source: "imp[].title", transform: text, max_len: 4, length: false}
"""


def test_parity_with_lengths_left_out_and_shared(tmp_path):
    """``length: false`` and ``length_of`` (issue 47): one length column for a list of records, in the
    converter's Examples and the layer's features alike, over null items, items missing a field,
    empty, null and overlong lists."""
    train = [{"imp": [{"ad": f"a{(i + j) % 4}", "pos": j, "price": j * 1.5, "title": "red shoe" if j else "blue"}
                      for j in range(i % 5)]} for i in range(40)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    (tmp_path / "c.yaml").write_text(SHARED_LENGTHS)
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    info = readers.load_info(str(out))
    assert [f.name for f in info.features] == ["ad", "ad_h", "pos", "pos_len", "price", "lp", "title"]
    assert info.features[3].params["shared_by"] == ["price", "lp"] and info.features[4].params["length_of"] == "pos"
    layer = readers.transform_layer(str(out))
    recs = [{"imp": [{"ad": "a1", "pos": 1, "price": None}, None, {"pos": 2}, {"ad": None, "title": None}]},
            {"imp": []}, {"imp": None}, {}, {"imp": [{"ad": "zz", "pos": 9, "price": 3.0, "title": "new words here"}]},
            {"imp": [{"ad": "a2", "pos": k, "price": k - 1.5} for k in range(6)]},
            {"imp": [{"ad": ["nested"], "pos": 1}]}, {"imp": [{"pos": [1, 2]}]}, {"imp": [{"price": -5.0}]}]
    check_parity(out, layer, recs)
    features, errors = layer.transform_records(recs[:2])
    assert "price_len" not in features and features["pos_len"][:, 0].tolist() == [3, 0] and errors == ["", ""]
    shard = next(out.glob("train-*.tfrecord.gz"))
    first = next(iter(tf.data.TFRecordDataset(str(shard), compression_type="GZIP")))
    assert sorted(tf.train.Example.FromString(first.numpy()).features.feature) == sorted(f.name for f in info.features)
    packed = tmp_path / "packed"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", packed,
            "--splits", "train=1", "--no-progress", "--layout", "packed")
    assert r.exit_code == 0, r.output
    plain, pk = (next(iter(readers.eval_dataset(str(o / "train-*"), batch_size=64))) for o in (out, packed))
    assert set(pk) == set(plain) == {f.name for f in info.features}
    for name in plain:
        assert np.array_equal(plain[name].numpy(), pk[name].numpy()), name


def test_text_rows_in_every_part_of_a_batch_keep_their_tokens(output, layer):
    """The text of a batch is tokenized in row ranges: every row, in batches of every size
    around the number of ranges, gets its own tokens and truncation."""
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(i % 7)) for i in range(11)]
    for size in range(1, 11):
        check_parity(output, layer, [{"query": t} for t in texts[:size]])


def test_one_table_for_the_scalar_vocabularies_gives_each_ones_ids(output, layer, monkeypatch):
    """The single-valued vocabularies are looked up in one table when it stays small,
    each in its own otherwise: the same ids, terms shared by several included."""
    assert len(layer._shared) > 1
    monkeypatch.setattr(serving_ops, "_SHARED_MAX_IDS", 0)
    apart = readers.transform_layer(str(output))
    assert apart._shared == ()
    recs = [_train_record(i) for i in range(240)] + [{"cat": "never seen", "user": {"segment": "x"}}, {}]
    (a, errs_a), (b, errs_b) = layer.transform_records(recs), apart.transform_records(recs)
    assert errs_a == errs_b and a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _rest_tensors(body: str, signature: dict[str, tf.TensorSpec]) -> dict[str, np.ndarray]:
    """What TF Serving's REST API makes of ``{"instances": [...]}``: per input, the rows' values
    as an array of the signature's dtype; ``{"b64": ...}`` strings decoded, others as UTF-8."""
    import base64

    def text(v: Any) -> Any:
        if isinstance(v, list):
            return [text(x) for x in v]
        return base64.b64decode(v["b64"]) if isinstance(v, dict) else v.encode("utf-8")

    rows = json.loads(body)["instances"]
    out = {}
    for k, spec in signature.items():
        if spec.dtype == tf.string:
            vals = [text(r[k]) for r in rows]
            arr = np.empty((len(vals), len(vals[0])) if vals and isinstance(vals[0], list) else len(vals), dtype=object)
            arr[...] = vals if arr.ndim == 1 else [list(v) for v in vals]
            out[k] = arr
        else:
            out[k] = np.array([r[k] for r in rows], dtype=spec.dtype.as_numpy_dtype)
    return out


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records().filter(lambda r: isinstance(r, dict)), min_size=1, max_size=8))
def test_a_rest_request_body_carries_every_value_exactly(layer, recs):
    """+-inf, float edges, big integers, bytes and lone surrogates ({"b64": ...}) survive the JSON body."""
    try:
        inputs = layer.encode(recs)
    except ValueError:  # a value the wire cannot carry (reported by encode, tested above)
        return
    body = json.dumps({"instances": layer.instances(recs)})  # NaN/Infinity tokens, as TF Serving parses them
    via_rest = _rest_tensors(body, layer.input_signature)
    for k, v in inputs.items():
        got = via_rest[k]
        if v.dtype == np.float64:
            # JSON has one NaN token: a NaN's sign and payload bits do not travel (Avro can hold them).
            assert ((got.view(np.uint64) == v.view(np.uint64)) | (np.isnan(got) & np.isnan(v))).all(), k
        else:
            assert got.tolist() == v.tolist(), k


def test_every_feature_of_the_output_is_produced_with_its_dtype_and_shape(output, layer):
    info = readers.load_info(str(output))
    features, errors = layer.transform_records([_train_record(3), {}])
    assert errors == ["", ""]
    for spec in info.features:
        if spec.role == "label":
            assert spec.name not in features
            continue
        assert features[spec.name].shape == (2, *spec.shape), spec.name
        assert features[spec.name].dtype == {"float32": np.float32, "int64": np.int64, "string": object}[spec.dtype]


# ------------------------------------------------------------------ ISO 8601 timestamps


def _digits(n: int) -> st.SearchStrategy[str]:
    return st.integers(0, 10**n - 1).map(lambda v: str(v).zfill(n))


SPACES = st.sampled_from(["", " ", "\t", "\n", "\u3000", "\x1f", "\u2028", "\xa0", "\u200b"])


@st.composite
def iso_strings(draw) -> str:
    y = draw(st.one_of(_digits(4), st.sampled_from(["0000", "0001", "1969", "1970", "2000", "2100", "2024", "9999"])))
    date = f"{y}-{draw(st.one_of(_digits(2), st.sampled_from(['01', '02', '12', '13'])))}-{draw(st.one_of(_digits(2), st.sampled_from(['28', '29', '30', '31'])))}"
    if draw(st.booleans()):
        date = date.replace("-", "") if draw(st.integers(0, 9)) == 0 else date
        sep = draw(st.sampled_from(["T", " ", "T", "t", "x", "Z"]))
        parts = [draw(_digits(2)) for _ in range(draw(st.integers(1, 3)))]
        time = ":".join(parts) if draw(st.integers(0, 9)) else "".join(parts)
        if len(parts) == 3 and draw(st.booleans()):
            time += draw(st.sampled_from([".", ","])) + draw(st.text("0123456789", min_size=0, max_size=8))
        tz = draw(st.one_of(st.just(""), st.just("Z"), st.builds(lambda sg, h, m, form: sg + h + form.replace("M", m),
                                                             st.sampled_from(["+", "-"]), _digits(2), _digits(2),
                                                             st.sampled_from(["", "M", ":M", ":M:00", ":M:00.5"]))))
        date = f"{date}{sep}{time}{tz}"
    return draw(SPACES) + date + draw(SPACES)


def _converter_seconds(values: list[Any], unit: str = "ms") -> tuple[np.ndarray, np.ndarray, dict]:
    from convert.derive import epoch_seconds
    return epoch_seconds(values, unit)


#: Text whose bytes cover every class the tokenizer tells apart: each ASCII
#: character, multi-byte UTF-8 (all planes, combining marks, case-special
#: letters), lone surrogates, NUL.
TOKEN_TEXT = st.text(st.one_of(st.characters(max_codepoint=127), st.characters(codec=None),
                               st.sampled_from(["İ", "ß", "ſ", "ς", "\u0301", "\ud800", "😀", " ", "_", "\x00"])),
                     max_size=40)
#: Text whose only delimiter is " " (split on whitespace, no regex match).
PLAIN_TEXT = st.text(st.one_of(st.sampled_from("azAZ09_ "), st.characters(min_codepoint=128, codec=None)), max_size=40)


def test_the_layers_delimiters_are_the_converters():
    import re

    from convert.records import TEXT_DELIMITERS_RE

    assert (set(serving_ops._DELIMITER_BYTES)
            == {c for c in range(256) if re.fullmatch(TEXT_DELIMITERS_RE.encode(), bytes([c]))})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.lists(TOKEN_TEXT, max_size=30), st.lists(PLAIN_TEXT, max_size=30)), st.booleans())
def test_the_in_graph_tokenizer_gives_the_converters_tokens(texts, lowercase):
    from convert.records import tokenize

    b = tf.constant([t.encode("utf-8", "surrogatepass") for t in texts], tf.string)
    got = tf.RaggedTensor.from_sparse(serving_ops.text_tokens(tf.strings.lower(b) if lowercase else b)).to_list()
    for i, t in enumerate(texts):
        assert got[i] == [w.encode("utf-8", "surrogatepass") for w in tokenize(t, lowercase)], t


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(iso_strings(), st.text(max_size=30)), min_size=1, max_size=40))
def test_iso_8601_strings_parse_as_the_converter_parses_them(texts):
    secs, present, rejected = _converter_seconds(texts)
    kinds = tf.constant([4] * len(texts), tf.int32)
    got, valid, parsed = serving_ops.iso_seconds(tf.constant([t.encode("utf-8", "surrogatepass") for t in texts]),
                                              tf.equal(kinds, 4))
    got, valid, parsed = got.numpy(), valid.numpy(), parsed.numpy()
    for i, t in enumerate(texts):
        if valid[i]:
            assert present[i] and secs[i] == got[i], (t, secs[i], got[i], rejected.get(i))
        elif parsed[i]:
            assert i in rejected, (t, secs[i])


def test_supported_iso_forms_are_parsed():
    texts = ["2026-01-01", " 2026-01-01T10:11:12Z ", "2024-02-29 23:59:59.999999-05:30", "2026-01-01T10+05",
             "1969-12-31T23:59:59,5", "0001-01-01T00:00+00:99", "9999-12-31T23:59:59-23:59"]
    secs, present, _ = _converter_seconds(texts)
    got, valid, parsed = serving_ops.iso_seconds(tf.constant(texts), tf.ones([len(texts)], tf.bool))
    assert parsed.numpy().all() and valid.numpy().all() and present.all()
    np.testing.assert_array_equal(got.numpy(), secs)


# ------------------------------------------------------------------ rejections and refusals


@pytest.mark.parametrize(("record", "field"), [
    ({"num3": math.nan}, "num3"),                  # on_nan: error
    ({"num3": 1e39}, "num3"),                      # beyond float32
    ({"num2": "12"}, "num2"),                      # a string in a numeric field
    ({"num": -1.0}, "num"),                        # log1p of -1 (on_nan: keep still checks the domain)
    ({"cat": {"a": 1}}, "cat"),                    # a record where a single value belongs
    ({"tags": [["x"]]}, "tags"),                   # a nested list item
    ({"nums": ["1"]}, "nums"),                     # a string list item
    ({"ts": True}, "ts"),                          # a bool timestamp
    ({"ts": math.inf}, "ts"),                      # a non-finite timestamp
    ({"day": 2**62}, "day"),                       # days beyond int64 seconds
    ({"blob": 3}, "blob"),                         # a number where bytes belong
])
def test_values_the_converter_rejects_are_reported_per_row(output, layer, record, field):
    _, _, rejections = converter_examples(output, [record])
    assert rejections, record
    features, errors = layer.transform_records([{}, record])
    assert errors[0] == ""
    assert errors[1].startswith(f"{field}"), errors[1]


@pytest.mark.parametrize(("record", "first"), [
    ({"nums": ["x"], "deep": {"a": {"n": "s"}}}, "nums: a list item is not a number"),
    ({"num3": math.nan, "deep": {"a": {"n": "s"}}, "cat": [1]}, "num3: value is NaN"),
    ({"deep": {"a": {"n": "s", "b": [1]}}, "cat": [1]}, "cat: expected a scalar value"),
    ({"deep": {"a": {"n": "s", "b": [1]}}}, "deep.a.b: expected a scalar value"),
    ({"num": "s", "num2": -5.0}, "num: expected a number, found str"),
])
def test_a_record_rejected_twice_reports_the_first_reason_in_config_order(layer, record, first):
    """Single-valued numerics are computed together; their reasons still come in config order."""
    _, errors = layer.transform_records([{}, record])
    assert errors[0] == "" and errors[1].startswith(first), errors[1]


@pytest.mark.parametrize(("line", "where"), [
    (r'{"cat": "a\ud800"}', "cat"),                      # a source the layer reads
    (r'{"unused": ["x", "\udfff"]}', "unused[1]"),        # a field no feature reads: the line is still rejected
    (r'{"deep": {"a": {"n": "\ud800\ud800"}}}', "deep.a.n"),
])
def test_a_lone_surrogate_the_converter_rejects_is_rejected_by_the_layer(layer, line, where):
    """The converter's JSON reader rejects a line holding a lone surrogate; the layer, given the same
    record, rejects it too: serving never accepts what the converter rejects."""
    (batch,) = iter_json(io.BytesIO(line.encode() + b"\n"), "r.jsonl")
    assert not batch.records and "lone UTF-16 surrogate" in batch.bad[0][2]
    record = json.loads(line)
    _, errors = layer.transform_records([json.loads(r'{"cat": "a\ud83d\ude00"}'), record])  # a pair: one character
    assert errors[0] == "" and errors[1].startswith(f"{where}: a string holds a lone UTF-16 surrogate"), errors


def test_calling_the_layer_raises_on_a_rejected_record(layer):
    with pytest.raises(tf.errors.InvalidArgumentError, match="num3: value is NaN"):
        layer(layer.encode([{}, {"num3": math.nan}]))
    assert set(layer(layer.encode([{}]))) == {f.name for f in layer.features}
    # In a graph too (the check is a branch taken only for a batch with a rejected row).
    served = tf.function(layer, input_signature=[layer.input_signature])
    with pytest.raises(tf.errors.InvalidArgumentError, match="num3: value is NaN"):
        served(layer.encode([{}, {"num3": math.nan}]))
    assert set(served(layer.encode([{}]))) == {f.name for f in layer.features}


def test_encode_names_a_record_the_wire_cannot_carry(layer):
    with pytest.raises(ValueError, match=r"record 1: <record>: expected a record"):
        layer.encode([{}, ["not", "a", "record"]])
    with pytest.raises(ValueError, match="record 0: ts: the integer .* beyond int64"):
        layer.encode([{"ts": 2**64}])


def test_a_source_read_as_a_list_and_as_a_single_value_is_refused(tmp_path):
    (tmp_path / "in.jsonl").write_text('{"a": ["x"], "y": 1}\n')
    (tmp_path / "c.yaml").write_text("label: y\nfeatures:\n  - {name: a, transform: vocabulary, max_len: 2}\n"
                                     "  - {name: a1, source: a, transform: vocabulary}\n")
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "c.yaml", "--output", tmp_path / "o",
            "--splits", "train=1", "--no-progress", "--max-errors", "5")
    assert r.exit_code == 0, r.output
    with pytest.raises(readers.SpecError, match="source 'a' is read both as a list"):
        readers.transform_layer(str(tmp_path / "o"))


def _readme_request() -> dict[str, Any]:
    """The TF Serving request example of the docs' Serving page (docs/serving.md)."""
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    block = text.split("```json\n", 1)[1].split("```", 1)[0]
    return json.loads(block)


def test_the_readmes_request_example_is_what_instances_writes():
    """The documented wire: single-valued fields packed one column each (in column_names order), a list
    field as values, kinds and a column of lens; a request written from the README is encode's."""
    from convert.config import parse_config
    from readers._serving_wire import Wire, instances

    cfg = parse_config({"label": "y", "features": [
        {"name": "age", "transform": "zscore"}, {"name": "price", "transform": "identity"},
        {"name": "country", "transform": "vocabulary"}, {"name": "tags", "transform": "vocabulary", "max_len": 2}]})
    wire = Wire(cfg)
    assert wire.column_names() == {"kinds": ["age", "price", "country"], "numbers": ["age", "price"],
                                   "terms": ["country"], "lens": ["tags"]}
    assert wire.input_names() == ["kinds", "numbers", "terms", "lens", "tags", "tags__kind"]
    recs = [{"age": 43, "price": 9.5, "country": "US", "tags": ["vip", "promo"]},
            {"age": None, "price": 2.0, "country": "FR", "tags": None}]
    inputs, rejected = wire.encode(recs)
    assert not rejected and {k: v.shape for k, v in inputs.items()} == {
        "kinds": (2, 3), "numbers": (2, 2), "terms": (2, 1), "lens": (2, 1), "tags": (2, 2), "tags__kind": (2, 2)}
    assert _readme_request() == {"instances": instances(inputs)}


def test_a_list_field_named_like_a_packed_input_gets_its_own_name():
    from convert.config import parse_config
    from readers._serving_wire import Wire

    cfg = parse_config({"label": "y", "features": [
        {"name": "n", "source": "lens", "transform": "identity", "max_len": 2},
        {"name": "k", "source": "kinds", "transform": "vocabulary"}]})
    wire = Wire(cfg)
    assert wire.input_names() == ["kinds", "terms", "lens", "lens_2", "lens_2__kind"]
    inputs, _ = wire.encode([{"lens": [1.5], "kinds": "a"}])
    assert inputs["lens_2"].tolist() == [[1.5]] and inputs["lens"].tolist() == [[1]]
    assert inputs["terms"].tolist() == [[b"a"]] and inputs["kinds"].tolist() == [[4]]


@pytest.mark.skipif(not HASHED_SUPPORTED, reason="the converter has no serving format version yet")
def test_an_output_of_an_older_format_is_refused_with_what_to_do(output, tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    meta = json.loads((output / "dataset_info.json").read_text())
    meta["format_version"] = serving.SERVING_MIN_FORMAT_VERSION - 1
    (old / "dataset_info.json").write_text(json.dumps(meta))
    (old / "analysis.json").write_text((output / "analysis.json").read_text())
    with pytest.raises(readers.SpecError, match="re-convert with this recordprep to export a serving model"):
        readers.transform_layer(str(old))


# ------------------------------------------------------------------ TF-free application


def test_apply_analysis_is_what_analysis_from_writes(output, tmp_path):
    recs = [_train_record(i) for i in range(5)] + [{"num3": math.nan}]
    vb = apply_analysis(output, recs)
    assert [r.index for r in vb.rejections] == [5]
    assert vb.columns["n_z"][0] == "float32" and vb.columns["n_z"][1].shape == (5, 1)
    code = ("import sys, json; sys.modules['tensorflow'] = None\n"
            "from convert.apply import apply_analysis\n"
            f"vb = apply_analysis({str(output)!r}, [json.loads(l) for l in sys.stdin])\n"
            "print(json.dumps({k: (kind, v.tolist() if kind != 'string' else [x.decode() for x in v]) for k, (kind, v) in vb.columns.items()}))")
    run = subprocess.run([sys.executable, "-c", code], input="".join(json.dumps(r) + "\n" for r in recs[:5]),
                         capture_output=True, text=True, cwd=ROOT, check=True)
    cols = json.loads(run.stdout)
    for name, (kind, values) in vb.columns.items():
        assert cols[name][1] == (values.tolist() if kind != "string" else [x.decode() for x in values]), name


def test_apply_analysis_names_what_is_missing(output, tmp_path):
    from convert.spec import SpecError
    with pytest.raises(SpecError, match="no dataset_info.json; point at a completed recordprep output"):
        apply_analysis(tmp_path, [{}])
    (tmp_path / "dataset_info.json").write_text((output / "dataset_info.json").read_text())
    with pytest.raises(SpecError, match="no analysis.json"):
        apply_analysis(tmp_path, [{}])
    (tmp_path / "analysis.json").write_text('{"vocabularies": {}, "stats": {}}')
    with pytest.raises(SpecError, match="not the file its dataset_info.json was committed with"):
        apply_analysis(tmp_path, [{}])
    meta = json.loads((output / "dataset_info.json").read_text())
    del meta["analysis_sha256"]  # metadata from before the digests: the analysis is taken as it is
    (tmp_path / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match="no vocabulary for feature 'cat'"):
        apply_analysis(tmp_path, [{}])
    del meta["config"]
    (tmp_path / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(SpecError, match="holds no feature config"):
        apply_analysis(tmp_path, [{}])


def test_metadata_binds_the_analysis_and_vocabularies_of_its_run(output):
    import hashlib

    meta = json.loads((output / "dataset_info.json").read_text())
    digest = lambda p: "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert meta["analysis_sha256"] == digest(output / "analysis.json")
    assert meta["vocabularies"], "the fixture's config has vocabularies"
    for v in meta["vocabularies"].values():
        assert v["sha256"] == digest(output / v["file"])


def test_a_reader_never_pairs_one_runs_metadata_with_anothers_analysis(output, tmp_path, monkeypatch):
    """A conversion replacing the output writes the analysis, then the metadata: a reader
    between the two sees the old metadata and the new analysis. It reads both again."""
    from convert import apply
    from convert.apply import AnalysisReplacedError, read_output_analysis
    from convert.spec import SpecError

    monkeypatch.setattr(apply, "_CONSISTENT_READ_PAUSES_S", (0.0, 0.0))  # no waiting in the test

    other = tmp_path / "other"
    other.mkdir()
    records = [{**_train_record(i), "cat": f"new-{i % 7}"} for i in range(60)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "features.yaml").write_text(_config(HASHED_SUPPORTED))
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", tmp_path / "features.yaml",
            "--output", other, "--splits", "train=1", "--no-progress", "--overwrite")
    assert r.exit_code == 0, r.output
    old = {n: (output / n).read_bytes() for n in ("dataset_info.json", "analysis.json")}
    new = {n: (other / n).read_bytes() for n in ("dataset_info.json", "analysis.json")}
    assert old["analysis.json"] != new["analysis.json"]

    reads: list[str] = []

    def replaced_after_first_metadata_read(path: str) -> bytes:
        name = os.path.basename(path)
        reads.append(name)
        first_metadata = name == "dataset_info.json" and reads.count(name) == 1
        return old[name] if first_metadata else new[name]

    applied = read_output_analysis(replaced_after_first_metadata_read, "out", "out/dataset_info.json", os.path.join)
    assert reads == ["dataset_info.json", "analysis.json", "dataset_info.json", "analysis.json"]
    assert applied.analysis.vocabularies["cat"] == json.loads(new["analysis.json"])["vocabularies"]["cat"]

    def always_mixed(path: str) -> bytes:
        name = os.path.basename(path)
        reads.append(name)
        return old[name] if name == "dataset_info.json" else new[name]

    reads.clear()
    with pytest.raises(AnalysisReplacedError, match="replaced by another conversion while it was read"):
        read_output_analysis(always_mixed, "out", "out/dataset_info.json", os.path.join)
    assert reads.count("dataset_info.json") == 3  # the first read and one after each pause
    # transform_layer reads through the same function: a hand-edited analysis is refused.
    edited = tmp_path / "edited"
    shutil.copytree(output, edited)
    (edited / "analysis.json").write_bytes(new["analysis.json"])
    with pytest.raises(SpecError, match="not the file its dataset_info.json was committed with"):
        readers.transform_layer(str(edited))


# ------------------------------------------------------------------ export


def _model(info: readers.DatasetInfo) -> tf.keras.Model:
    inputs = readers.keras_inputs(info)
    parts = []
    for x in inputs.values():
        if x.dtype == "string":
            continue
        parts.append(tf.keras.layers.Flatten()(tf.keras.layers.Lambda(lambda t: tf.cast(t, tf.float32) * 1e-3)(x)))
    h = tf.keras.layers.Concatenate()(parts)
    out = tf.keras.layers.Dense(1, kernel_initializer="ones")(tf.keras.layers.Lambda(lambda t: tf.where(tf.math.is_finite(t), t, 0.0))(h))
    return tf.keras.Model(inputs=inputs, outputs=out)


def _site_packages() -> str:
    import numpy
    return str(Path(numpy.__file__).resolve().parents[1])


@pytest.mark.slow
def test_exported_model_predicts_from_a_rest_request_in_a_process_without_recordprep(output, layer, tmp_path):
    info = readers.load_info(str(output))
    model = _model(info)
    export = tmp_path / "export"
    readers.export_serving(model, layer, str(export))
    recs = [_train_record(i) for i in range(20)] + [{}, {"num3": math.nan}]
    # What the model predicts on the converter's Examples for the same records.
    expected, kept, _ = converter_examples(output, recs)
    want = model({k: tf.constant(v) for k, v in expected.items() if k in {t.name for t in model.inputs}}).numpy()
    body = json.dumps({"instances": layer.instances(recs)})
    script = (
        "import sys\nsys.path.append(sys.argv[1])\n"
        "import json, numpy as np\n"
        "try:\n    import convert\n    raise SystemExit('recordprep is importable')\nexcept ImportError:\n    pass\n"
        "import tensorflow as tf\n"
        "f = tf.saved_model.load(sys.argv[2]).signatures['serving_default']\n"
        "spec = f.structured_input_signature[1]\n"
        "rows = json.load(sys.stdin)['instances']\n"
        # TF Serving's REST API: per input, the instances' values as an array of the signature's dtype.
        "def arr(k):\n"
        "    dt = spec[k].dtype\n"
        "    if dt == tf.string:\n"
        "        return np.array([r[k] for r in rows], dtype=object)\n"
        "    return np.array([r[k] for r in rows], dtype=dt.as_numpy_dtype)\n"
        "out = f(**{k: tf.constant(arr(k)) for k in spec})\n"
        "print(json.dumps({k: v.numpy().tolist() if v.dtype != tf.string else [x.decode() for x in v.numpy()] for k, v in out.items()}))\n"
    )
    run = subprocess.run([sys.executable, "-I", "-S", "-c", script, _site_packages(), str(export)], input=body,
                         capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    errors = got["recordprep_error"]
    assert errors[-1].startswith("num3: value is NaN") and not any(errors[:-1])
    pred = np.array(got["outputs"], dtype=np.float32)[kept]
    np.testing.assert_array_equal(pred, want)


# ------------------------------------------------------------------ real data, end to end


def _shard_examples(out: Path, info: readers.DatasetInfo, split: str = "train") -> dict[str, np.ndarray]:
    files = [str(out / s.file) for s in info.split(split).shards]
    ds = tf.data.TFRecordDataset(files, compression_type=info.compression if info.compression != "NONE" else "")
    specs = {f.name: tf.io.FixedLenFeature(f.shape, _TF[f.dtype]) for f in info.features if f.role != "label"}
    rows = [tf.io.parse_example(tf.stack(list(b)), specs) for b in ds.batch(100000)]
    return {k: np.concatenate([r[k].numpy() for r in rows]) for k in specs} if rows else {}


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records(), min_size=20, max_size=80))
def test_parity_with_the_shards_of_an_analysis_from_run(output, layer, tmp_path_factory, random_records):
    """The real CLI converts random records with --analysis-from; the layer matches the shards' bytes."""
    tmp_path = tmp_path_factory.mktemp("analysis_from")
    recs: list[Any] = [_train_record(1000 + i) for i in range(20)]
    for r in random_records:
        if isinstance(r, dict):
            recs.append({**r, "y": 1})
    lines = []
    for r in recs:
        try:
            lines.append(json.dumps(r, allow_nan=True))
        except (TypeError, ValueError):  # bytes: not JSON
            continue
    # Epoch numbers that fit another unit refuse the whole run (the config check): not this test's subject.
    config = load_config(_cfg_file(tmp_path))
    lines = [line for line in lines if not unit_problems(config, [json.loads(line)])]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    recs = [json.loads(line) for line in lines]
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in.jsonl", "--config", _cfg_file(tmp_path), "--output", out,
            "--analysis-from", output, "--splits", "train=1", "--num-shards", "1", "--no-progress",
            "--max-error-fraction", "1", "--order", "input")  # shards compared record for record
    assert r.exit_code == 0, r.output
    rejected = {row["line"] - 1 for row in error_rows(out)}
    accepted = [i for i in range(len(recs)) if i not in rejected]
    shards = _shard_examples(out, readers.load_info(str(out)))
    features, errors = layer.transform_records(recs)
    assert all(errors[i] for i in rejected)
    rows = [j for j, i in enumerate(accepted) if not errors[i]]
    assert len(rows) >= len(accepted) - 5
    for name, exp in shards.items():
        got = features[name][[accepted[j] for j in rows]]
        assert_same(name, exp[rows], got, [recs[accepted[j]] for j in rows])


def _cfg_file(tmp_path: Path) -> Path:
    p = tmp_path / "features.yaml"
    p.write_text(_config(HASHED_SUPPORTED))
    return p


@pytest.mark.slow
@pytest.mark.skipif(not HASHED_SUPPORTED, reason="the demo's config hashes; the converter has no serving format version yet")
def test_demo_trains_exports_and_scores_raw_json_lines(tmp_path):
    """`make demo`'s last steps: examples/train.py --export, then examples/predict.py on raw JSON lines."""
    out = tmp_path / "out"
    r = cli("convert", "--input", EXAMPLES / "clicks-0.avro", "--config", ROOT / "examples" / "features.yaml",
            "--output", out, "--no-progress")
    assert r.exit_code == 0, r.output
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
    export = tmp_path / "model"
    run = subprocess.run([sys.executable, "examples/train.py", str(out), "--steps", "6", "--export", str(export)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    raw = (EXAMPLES / "clicks-1.jsonl").read_text().splitlines()[:3] + [json.dumps({"age": "x"})]
    (tmp_path / "raw.jsonl").write_text("\n".join(raw) + "\n")
    run = subprocess.run([sys.executable, "examples/predict.py", str(export), str(tmp_path / "raw.jsonl"),
                          "--request", str(tmp_path / "req.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 4 and all("-> outputs [" in line for line in lines[:3]), run.stdout
    assert "rejected: age: expected a number, found str" in lines[3]
    body = json.loads((tmp_path / "req.json").read_text())
    # A hand-written request finds a source's column in the export's recordprep_config.json.
    columns = json.loads((export / "assets.extra" / "recordprep_config.json").read_text())["columns"]
    assert len(body["instances"]) == 4 and body["instances"][3]["kinds"][columns["kinds"].index("age")] == 4


# ------------------------------------------------------------------ examples/data and ../shared/realdata


def _realdata_files() -> list[str]:
    readme = REALDATA / "README.md"
    if not readme.is_file():
        return []
    import re
    rows = re.findall(r"\|\s*(?:valid Avro|JSON records)\s*\|\s*`([^`]+)`", readme.read_text(encoding="utf-8"))
    return [r for r in rows if (REALDATA / r).is_file()]


def _records_of(path: Path, flags: list[str]) -> list[Any]:
    from _expected_values import json_lines, raw_avro_records
    if path.read_bytes()[:4] == b"Obj\x01":
        return raw_avro_records(path)
    if "--json-records-path" in flags:
        doc = json.loads(path.read_bytes().removeprefix(b"\xef\xbb\xbf"))
        return doc[flags[flags.index("--json-records-path") + 1]]
    return json_lines(path)


def _convert_and_check(path: Path, cfg: Path, tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", cfg, "-o", out, "--splits", "train=1", "--num-shards", "1",
            "--max-error-fraction", "1", "--no-progress", "--order", "input", *flags)
    if r.exit_code != 0:
        pytest.skip(f"{path.name} does not convert with its inferred config (tests/test_realdata_convert.py covers why)")
    info = readers.load_info(str(out))
    try:
        layer = readers.transform_layer(str(out))
    except readers.SpecError as e:  # refused, with a reason: what the layer promises instead of approximating
        assert "serving layer takes one shape per source" in str(e) or (
            not HASHED_SUPPORTED and "re-convert with this recordprep" in str(e)), e
        return
    recs = _records_of(path, flags)
    check_parity(out, layer, recs)
    # The shards hold the accepted records in input order (one file, one shard): the layer matches their bytes.
    shards = _shard_examples(out, info)
    features, errors = layer.transform_records(recs)
    rejected = {r.index for r in OutputAnalysis.load(out).vectorize(recs, label=True).rejections}  # as the run did
    accepted = [i for i in range(len(recs)) if i not in rejected]
    assert len(accepted) == len(next(iter(shards.values())))
    rows = [j for j, i in enumerate(accepted) if not errors[i]]
    for name, exp in shards.items():
        assert_same(name, exp[rows], features[name][[accepted[j] for j in rows]], [recs[accepted[j]] for j in rows])


@pytest.mark.slow
@pytest.mark.skipif(not HASHED_SUPPORTED, reason="the demo's config hashes; the converter has no serving format version yet")
@pytest.mark.parametrize("name", ["clicks-0.avro", "clicks-1.jsonl"])
def test_parity_on_examples_data(name, tmp_path):
    _convert_and_check(EXAMPLES / name, ROOT / "examples" / "features.yaml", tmp_path, [])


@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "README.md").is_file(), reason=f"{REALDATA} is absent (real AVRO/JSON files from other tools)")
@pytest.mark.parametrize("rel", _realdata_files() or ["absent"])
def test_parity_on_real_files(rel, tmp_path):
    path = REALDATA / rel
    flags = ["--json-records-path", "users"] if rel.endswith("sample_utf8_bom.json") else []
    r = cli("infer", "-i", path, *flags)
    if r.exit_code != 0:
        pytest.skip(f"recordprep infer cannot draft a config for {rel} (tests/test_realdata_convert.py covers why)")
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout.replace("allow_all_missing: false", "allow_all_missing: true"))
    _convert_and_check(path, cfg, tmp_path, flags)


# ------------------------------------------------------------------ recordprep export


def test_export_cli_refuses_a_missing_model_and_an_existing_directory(output, tmp_path):
    r = cli("export", output, tmp_path / "nope.keras", tmp_path / "exp")
    assert r.exit_code == 2 and "no such file" in r.output
    (tmp_path / "m.keras").write_bytes(b"not a model")
    (tmp_path / "exp").mkdir()
    r = cli("export", output, tmp_path / "m.keras", tmp_path / "exp")
    assert r.exit_code == 2 and "exists" in r.output
    r = cli("export", output, tmp_path / "m.keras", tmp_path / "exp2")
    assert r.exit_code == 1 and "cannot load the model" in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_export_cli_writes_a_saved_model_that_scores_raw_records(output, layer, tmp_path):
    info = readers.load_info(str(output))
    inputs = readers.keras_inputs(info, ["n_z", "n_log", "cat", "tags"])
    h = tf.keras.layers.Concatenate()([inputs["n_z"], inputs["n_log"],
                                       tf.keras.layers.Flatten()(tf.keras.layers.Embedding(64, 2)(inputs["cat"])),
                                       tf.keras.layers.Flatten()(tf.keras.layers.Embedding(64, 2)(inputs["tags"]))])
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(h))
    model.save(tmp_path / "m.keras")
    r = cli("export", output, tmp_path / "m.keras", tmp_path / "exp", seconds=600)
    assert r.exit_code == 0, r.output
    assert "serving_default inputs: " in r.output and "serve_examples input: examples (tf.train.Example features: num, num2" in r.output
    recs = [_train_record(i) for i in range(8)]
    serve = tf.saved_model.load(str(tmp_path / "exp")).signatures["serving_default"]
    got = serve(**{k: tf.constant(v) for k, v in layer.encode(recs).items()})
    features, _ = layer.transform_records(recs)
    want = model({k: tf.constant(features[k]) for k in ("n_z", "n_log", "cat", "tags")}).numpy()
    np.testing.assert_array_equal(got["outputs"].numpy(), want)


@pytest.mark.slow
@pytest.mark.skipif(not HASHED_SUPPORTED, reason="the bench config hashes; the converter has no serving format version yet")
def test_parity_on_the_bench_dataset(tmp_path):
    """The bench workload's schema and config (bench/features.yaml) on 3,000 of its records."""
    sys.path.insert(0, str(ROOT))
    from bench.make_data import records as bench_records

    path = tmp_path / "bench.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in bench_records(0, 3000)))
    _convert_and_check(path, ROOT / "bench" / "features.yaml", tmp_path, [])


# ------------------------------------------------------------------ hand-written wire inputs


def _cut(layer: serving.TransformLayer, path: str, record: dict[str, Any], width: int) -> dict[str, np.ndarray]:
    """``record`` encoded, then the list at ``path`` cut to ``width`` items with its ``lens`` unchanged."""
    s = layer.wire.by_path(path)
    x = layer.encode([record])
    for name in s.input_names():
        x[name] = x[name][:, :width]
    return x


@pytest.mark.parametrize("path, feature", [("nums", "n_list"), ("tags", "tags")])
def test_a_lens_wider_than_the_items_sent_is_reported_for_numeric_and_vocabulary_lists(layer, path, feature):
    items = [0.5, 1.5, 2.5] if path == "nums" else ["x", "y", "z"]
    _, errors = layer.transform(_cut(layer, path, {path: items}, 1))
    assert errors.numpy()[0].decode() == f"{path}: the list has more items than were sent (__len > width)", errors
    features, errors = layer.transform(_cut(layer, path, {path: items}, 3))  # whole: accepted
    assert errors.numpy().tolist() == [b""] and features[f"{feature}_len"].numpy().tolist() == [[3]]


def test_a_vocabulary_list_sent_up_to_its_last_kept_item_is_accepted(layer):
    """``encode`` stops at the max_len-th non-null item: the rest is not needed, so not reported."""
    x = layer.encode([{"tags": ["x", "y", "z", "w", "x"]}])
    s = layer.wire.by_path("tags")
    assert x[s.kind_name].shape[1] == 3 and x[layer.wire.positions()[s.len_name][0]].max() == 5
    _, errors = layer.transform(x)
    assert errors.numpy().tolist() == [b""]


@pytest.mark.parametrize("code", [-3, 8, 2**31 - 1])
@pytest.mark.parametrize("path", ["num", "cat"])
def test_an_invalid_kind_code_is_reported_as_such_not_as_null(layer, code, path):
    s = layer.wire.by_path(path)
    x = layer.encode([{path: 1.0 if path == "num" else "a"}])
    packed, j = layer.wire.positions()[s.kind_name]
    x[packed][0, j] = code
    _, errors = layer.transform(x)
    message = errors.numpy()[0].decode()
    assert message.startswith(f"{path}: invalid kind code {code} on the wire (expected 0..7"), message
    assert "found null" not in message


@pytest.mark.parametrize("path", ["nums", "tags"])
def test_an_invalid_kind_code_in_a_list_is_reported_as_such(layer, path):
    s = layer.wire.by_path(path)
    x = layer.encode([{path: [1.0, 2.0] if path == "nums" else ["x", "y"]}])
    x[s.kind_name][0, 1] = -3
    _, errors = layer.transform(x)
    assert errors.numpy()[0].decode().startswith(f"{path}: a list item has an invalid kind code on the wire"), errors
