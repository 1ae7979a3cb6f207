"""convert.vectorize: Analyzer statistics/vocabularies and the Vectorizer's columns, exact values.

Id layout checked here: 0 = missing/padding, 1..num_oov_buckets = OOV, then
vocabulary terms by descending frequency (ties by term); hash ids are 1..buckets.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from farmhash import Fingerprint64

from convert.analysis import Analysis, Analyzer
from convert.config import parse_config
from convert.prepare import Preparer
from convert.records import stable_hash, term, tokenize
from convert.vectorize import Vectorizer

E = math.e


def cfg(*features, label=None):
    raw = {"features": list(features)}
    if label is not None:
        raw["label"] = label
    return parse_config(raw)


def analyze(config, records) -> Analysis:
    a = Analyzer(config)
    a.add_records(records)
    return a.result()


def run(config, records, train=None):
    """Analyze ``train`` (default: the same records), then vectorize ``records``."""
    analysis = analyze(config, records if train is None else train)
    return Vectorizer(config, analysis).vectorize(records), analysis


def col(vb, name):
    return vb.columns[name][1]


def rejected(vb) -> dict[int, tuple[str, str]]:
    return {r.index: (r.field, r.reason) for r in vb.rejections}


def fingerprint(s: str) -> int:
    """The documented stable hash: FarmHash Fingerprint64 of the UTF-8 term (TensorFlow's
    to_hash_bucket_fast; tests/test_convert_serving_parity.py checks the two agree)."""
    return Fingerprint64(s.encode("utf-8"))


# ------------------------------------------------------------- numerics


def test_identity_values_fill_and_missing_indicator_distinguish_zero_from_null():
    c = cfg({"name": "x", "transform": "identity", "missing_indicator": True})
    vb, _ = run(c, [{"x": 1}, {"x": 2.5}, {"x": 0}, {"x": None}, {}, {"x": -3}])
    assert vb.columns["x"][0] == "float32" and col(vb, "x").dtype == np.float32
    np.testing.assert_array_equal(col(vb, "x"), np.array([[1], [2.5], [0], [0], [0], [-3]], np.float32))
    np.testing.assert_array_equal(col(vb, "x_missing"), [[0], [0], [0], [1], [1], [0]])
    assert col(vb, "x_missing").dtype == np.int64
    assert vb.keep.all() and vb.rejections == []


def test_identity_explicit_fill_value():
    c = cfg({"name": "x", "transform": "identity", "fill": -1})
    vb, _ = run(c, [{"x": 4}, {}])
    np.testing.assert_array_equal(col(vb, "x"), [[4], [-1]])


def test_zscore_uses_analyzer_mean_and_std_and_fill_mean_becomes_zero():
    c = cfg({"name": "x", "transform": "zscore"})
    records = [{"x": 1}, {"x": 2}, {"x": 3}, {"x": 4}, {"x": None}]
    vb, analysis = run(c, records)
    st = analysis.stats["x"]
    assert st["count"] == 4 and st["missing"] == 1 and st["min"] == 1 and st["max"] == 4
    assert st["mean"] == pytest.approx(2.5) and st["std"] == pytest.approx(math.sqrt(1.25))
    std = math.sqrt(1.25)
    want = [[(1 - 2.5) / std], [(2 - 2.5) / std], [(3 - 2.5) / std], [(4 - 2.5) / std], [0.0]]
    np.testing.assert_allclose(col(vb, "x"), np.array(want, np.float32), rtol=1e-6)
    assert col(vb, "x")[4, 0] == 0.0


def test_zscore_constant_feature_does_not_divide_by_zero():
    c = cfg({"name": "x", "transform": "zscore"})
    vb, _ = run(c, [{"x": 3}, {"x": 3}], train=[{"x": 3}, {"x": 3}])
    np.testing.assert_array_equal(col(vb, "x"), [[0], [0]])
    vb, _ = run(c, [{"x": 5}], train=[{"x": 3}])
    np.testing.assert_array_equal(col(vb, "x"), [[2]])


def test_minmax_scales_to_unit_range_with_training_min_max():
    c = cfg({"name": "x", "transform": "minmax"})
    train = [{"x": 0}, {"x": 5}, {"x": 10}, {"x": None}]
    vb, _ = run(c, train + [{"x": 20}], train=train)
    np.testing.assert_allclose(col(vb, "x"), [[0], [0.5], [1], [0.5], [2]])  # fill mean=5 -> 0.5; unseen 20 -> 2


def test_log1p_values_and_rejects_values_at_or_below_minus_one_naming_field():
    c = cfg({"name": "inc", "source": "money.income", "transform": "log1p"})
    recs = [{"money": {"income": 0}}, {"money": {"income": E - 1}}, {"money": {}}, {"money": {"income": -1}},
            {"money": {"income": -2.5}}, {"money": {"income": 99}}]
    vb, _ = run(c, recs)
    assert vb.keep.tolist() == [True, True, True, False, False, True]
    np.testing.assert_allclose(col(vb, "inc"), np.array([[0], [1], [0], [math.log(100)]], np.float32), rtol=1e-6)
    rej = rejected(vb)
    assert set(rej) == {3, 4}
    for field, reason in rej.values():
        assert field == "money.income" and "log1p" in reason and "-1" in reason


def test_clip_bounds():
    c = cfg({"name": "x", "transform": "clip", "clip_min": 0, "clip_max": 1},
            {"name": "y", "transform": "clip", "clip_max": 2})
    vb, _ = run(c, [{"x": -5, "y": -5}, {"x": 0.5, "y": 3}, {"x": 7, "y": 2}])
    np.testing.assert_array_equal(col(vb, "x"), [[0], [0.5], [1]])
    np.testing.assert_array_equal(col(vb, "y"), [[-5], [2], [2]])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_on_nan_error_fill_keep(bad):
    recs = [{"x": 1.0}, {"x": bad}, {"x": 2.0}]
    vb, _ = run(cfg({"name": "x", "transform": "identity"}), recs)  # default on_nan: error
    assert vb.keep.tolist() == [True, False, True]
    field, reason = rejected(vb)[1]
    assert field == "x" and "NaN or infinite" in reason and "on_nan" in reason
    np.testing.assert_array_equal(col(vb, "x"), [[1], [2]])

    vb, _ = run(cfg({"name": "x", "transform": "identity", "on_nan": "fill", "fill": 7}), recs)
    np.testing.assert_array_equal(col(vb, "x"), [[1], [7], [2]])
    assert vb.keep.all()

    vb, _ = run(cfg({"name": "x", "transform": "identity", "on_nan": "keep"}), recs)
    got = col(vb, "x")[1, 0]
    assert vb.keep.all() and (math.isnan(got) if math.isnan(bad) else got == bad)


def test_on_nan_fill_with_mean_ignores_nan_in_statistics():
    c = cfg({"name": "x", "transform": "zscore", "on_nan": "fill"})
    vb, analysis = run(c, [{"x": 1.0}, {"x": float("nan")}, {"x": 3.0}])
    assert analysis.stats["x"]["count"] == 2 and analysis.stats["x"]["mean"] == 2.0
    np.testing.assert_allclose(col(vb, "x"), [[-1], [0], [1]])


def test_numeric_list_padded_truncated_with_len():
    c = cfg({"name": "v", "transform": "identity", "max_len": 3})
    recs = [{"v": [1, 2]}, {"v": [1, 2, 3, 4]}, {"v": []}, {"v": None}, {"v": [None, 5]}, {"v": 9}, {}]
    vb, _ = run(c, recs)
    np.testing.assert_array_equal(col(vb, "v"), [[1, 2, 0], [1, 2, 3], [0, 0, 0], [0, 0, 0], [0, 5, 0], [9, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(col(vb, "v_len"), [[2], [3], [0], [0], [2], [1], [0]])
    assert col(vb, "v").shape == (7, 3) and col(vb, "v_len").shape == (7, 1)


def test_numeric_list_log1p_and_clip_per_element_padding_stays_zero():
    c = cfg({"name": "v", "transform": "log1p", "max_len": 3, "fill": 0},
            {"name": "w", "transform": "clip", "clip_min": 1, "max_len": 2})
    vb, _ = run(c, [{"v": [0, E - 1], "w": [0]}, {"v": [-3], "w": [5, 6]}])
    assert vb.keep.tolist() == [True, False]
    np.testing.assert_allclose(col(vb, "v"), [[0, 1, 0]], rtol=1e-6)
    np.testing.assert_array_equal(col(vb, "w"), [[1, 0]])  # the padding is not clipped up to 1
    assert rejected(vb)[1][0] == "v"


def test_numeric_list_with_string_element_rejected_with_position():
    c = cfg({"name": "v", "transform": "identity", "max_len": 3})
    vb, _ = run(c, [{"v": [1, "2"]}, {"v": [3]}])
    assert rejected(vb)[0][0] == "v[1]" and "expected a number" in rejected(vb)[0][1]
    np.testing.assert_array_equal(col(vb, "v"), [[3, 0, 0]])


def test_string_where_number_belongs_rejected_with_field_and_what_to_do():
    c = cfg({"name": "age", "source": "user.age", "transform": "zscore"})
    recs = [{"user": {"age": 30}}, {"user": {"age": "31"}}, {"user": {"age": 32}}, {"user": {"age": b"x"}}]
    vb, _ = run(c, recs)
    assert vb.keep.tolist() == [True, False, True, False]
    field, reason = rejected(vb)[1]
    assert field == "user.age"
    assert "expected a number" in reason and "'31'" in reason and "vocabulary" in reason and "fix the data" in reason
    np.testing.assert_allclose(col(vb, "age"), [[-1], [1]])  # stats come from numbers only: mean 31, std 1


@pytest.mark.parametrize("value", [[5], [], {"a": 1}])
def test_list_or_dict_in_scalar_numeric_rejected_whatever_the_batch(value):
    """A 1-record batch must not accept ``[5]`` as 5 when a larger batch rejects it."""
    c = cfg({"name": "x", "transform": "identity"})
    vb, _ = run(c, [{"x": value}])
    assert vb.keep.tolist() == [False] and rejected(vb)[0][0] == "x"
    vb, _ = run(c, [{"x": value}, {"x": 1}])
    assert vb.keep.tolist() == [False, True]


def test_bools_are_numbers_zero_and_one():
    vb, _ = run(cfg({"name": "x", "transform": "identity"}), [{"x": True}, {"x": False}, {"x": 2}])
    np.testing.assert_array_equal(col(vb, "x"), [[1], [0], [2]])


@pytest.mark.parametrize("max_len", [None, 2])
def test_integers_beyond_float_range_do_not_crash(max_len):
    """JSON keeps integers exact; one too large for a float64 is infinite, so on_nan decides."""
    huge = 10**400
    feat = {"name": "x", "transform": "identity"}
    if max_len:
        feat["max_len"] = max_len
    one = (lambda v: [v]) if max_len else (lambda v: v)
    recs = [{"x": one(1)}, {"x": one(huge)}, {"x": one(-huge)}, {"x": one(2**70)}]
    vb, analysis = run(cfg(feat), recs)
    assert vb.keep.tolist() == [True, False, False, True]
    assert "infinite" in rejected(vb)[1][1]
    assert col(vb, "x")[1, 0] == np.float32(2.0**70)
    vb, _ = run(cfg({**feat, "on_nan": "fill"}), recs)
    assert vb.keep.all()


def test_integers_beyond_float_range_in_analyzer_are_skipped():
    c = cfg({"name": "x", "transform": "zscore"})
    analysis = analyze(c, [{"x": 1}, {"x": 10**400}, {"x": 3}])
    assert analysis.stats["x"]["count"] == 2 and analysis.stats["x"]["mean"] == 2


# ------------------------------------------------------------- vocabulary


COLORS = [{"c": "red"}, {"c": "blue"}, {"c": "red"}, {"c": "green"}, {"c": "green"}, {"c": "red"},
          {"c": "blue"}, {"c": ""}, {"c": None}, {}]


def test_vocabulary_ids_by_descending_frequency_then_term():
    c = cfg({"name": "c", "transform": "vocabulary"})
    vb, analysis = run(c, COLORS + [{"c": "purple"}], train=COLORS)
    assert analysis.vocabularies["c"] == ["red", "blue", "green", ""]
    # 0 missing, 1 OOV, then red=2, blue=3, green=4, ""=5
    assert col(vb, "c")[:, 0].tolist() == [2, 3, 2, 4, 4, 2, 3, 5, 0, 0, 1]
    assert vb.columns["c"][0] == "int64"


def test_vocabulary_top_k_and_min_frequency():
    vb, analysis = run(cfg({"name": "c", "transform": "vocabulary", "top_k": 2}), COLORS)
    assert analysis.vocabularies["c"] == ["red", "blue"]
    assert col(vb, "c")[:, 0].tolist() == [2, 3, 2, 1, 1, 2, 3, 1, 0, 0]
    _, analysis = run(cfg({"name": "c", "transform": "vocabulary", "min_frequency": 2}), COLORS)
    assert analysis.vocabularies["c"] == ["red", "blue", "green"]
    _, analysis = run(cfg({"name": "c", "transform": "vocabulary", "min_frequency": 3}), COLORS)
    assert analysis.vocabularies["c"] == ["red"]


def test_vocabulary_orders_by_count_then_term_with_many_ties():
    import random

    rng = random.Random(7)
    words = [f"w{rng.randrange(10**6)}" for _ in range(3000)] + ["", "Z", "a", "\u00e9", "\U0001f600"]
    recs = [{"c": w} for w in words for _ in range(rng.choice([1, 1, 1, 2, 2, 3, 9]))]
    counts = Counter(r["c"] for r in recs)
    for top_k, min_frequency in ((None, 1), (50, 1), (None, 2)):
        extra = {"top_k": top_k} if top_k else {}
        _, analysis = run(cfg({"name": "c", "transform": "vocabulary", "min_frequency": min_frequency, **extra}), recs)
        want = sorted((t for t, n in counts.items() if n >= min_frequency), key=lambda t: (-counts[t], t))
        assert analysis.vocabularies["c"] == want[:top_k]


def test_vocabulary_several_oov_buckets_are_stable_hashes():
    c = cfg({"name": "c", "transform": "vocabulary", "num_oov_buckets": 3})
    unseen = ["zebra", "yak", "xerus", "wolf", "\u00e9l\u00e9phant"]
    vb, _ = run(c, COLORS[:3] + [{"c": u} for u in unseen], train=COLORS)
    ids = col(vb, "c")[:, 0].tolist()
    assert ids[:3] == [4, 5, 4]  # terms start after the 3 OOV ids
    assert ids[3:] == [1 + fingerprint(u) % 3 for u in unseen]
    assert all(1 <= i <= 3 for i in ids[3:])


def test_empty_string_null_zero_false_and_their_strings_get_distinct_ids():
    c = cfg({"name": "v", "transform": "vocabulary"})
    recs = [{"v": ""}, {"v": None}, {"v": 0}, {"v": False}, {"v": "0"}, {"v": 0.0}, {"v": "false"}]
    vb, analysis = run(c, recs)
    ids = col(vb, "v")[:, 0].tolist()
    assert ids[1] == 0
    assert len({ids[0], ids[1], ids[2], ids[3]}) == 4 and 1 not in ids[:4]  # "", null, 0, False
    # documented canonical terms: numbers and their decimal strings share a term, like bools and "true"/"false"
    assert ids[2] == ids[4] == ids[5] and ids[3] == ids[6]
    assert term(0.0) == "0" and term(False) == "false" and term(b"\xff") == "\\xff"


def test_multi_valued_vocabulary_padded_with_len_nulls_dropped():
    c = cfg({"name": "tags", "transform": "vocabulary", "max_len": 3})
    recs = [{"tags": ["a", "b"]}, {"tags": ["b", None, "c", "b"]}, {"tags": []}, {"tags": None},
            {"tags": "a"}, {"tags": ["zz", "b", "c", "a"]}]
    vb, analysis = run(c, recs, train=recs[:5])
    # counts: b 3, a 2, c 1 -> b=2, a=3, c=4; a lone value is a one-element list
    assert analysis.vocabularies["tags"] == ["b", "a", "c"]
    np.testing.assert_array_equal(col(vb, "tags"), [[3, 2, 0], [2, 4, 2], [0, 0, 0], [0, 0, 0], [3, 0, 0], [1, 2, 4]])
    np.testing.assert_array_equal(col(vb, "tags_len"), [[2], [3], [0], [0], [1], [3]])


def test_multi_valued_vocabulary_nested_values_rejected():
    c = cfg({"name": "tags", "transform": "vocabulary", "max_len": 2})
    vb, _ = run(c, [{"tags": ["a", {"x": 1}]}, {"tags": ["a"]}])
    assert vb.keep.tolist() == [False, True] and rejected(vb)[0][0] == "tags"


def test_scalar_vocabulary_list_or_dict_rejected_and_not_counted_as_terms():
    c = cfg({"name": "c", "transform": "vocabulary"})
    recs = [{"c": ["a", "b"]}, {"c": {"k": 1}}, {"c": "x"}]
    vb, analysis = run(c, recs)
    assert analysis.vocabularies["c"] == ["x"]
    assert vb.keep.tolist() == [False, False, True]
    assert "max_len" in rejected(vb)[0][1]


def test_text_tokenized_lowercased_padded_with_len():
    c = cfg({"name": "t", "transform": "text", "max_len": 4})
    recs = [{"t": "Hello, hello WORLD!"}, {"t": "world of Worlds"}, {"t": ""}, {"t": None},
            {"t": "a b c d e f"}, {"t": "caf\u00e9 HELLO"}]
    vb, analysis = run(c, recs, train=recs[:4])
    # counts: hello 2, world 2, of 1, worlds 1 -> hello=2, world=3, of=4, worlds=5
    assert analysis.vocabularies["t"] == ["hello", "world", "of", "worlds"]
    np.testing.assert_array_equal(col(vb, "t"), [[2, 2, 3, 0], [3, 4, 5, 0], [0, 0, 0, 0], [0, 0, 0, 0],
                                                 [1, 1, 1, 1], [1, 2, 0, 0]])
    np.testing.assert_array_equal(col(vb, "t_len"), [[3], [3], [0], [0], [4], [2]])
    assert tokenize("caf\u00e9 HELLO") == ["caf\u00e9", "hello"]
    # only A-Z is lowercased; every non-ASCII character is a token character, every other ASCII one a delimiter
    assert tokenize("\u0130STANBUL Stra\u00dfe \u03a3\u0391\u03a3 x\x00y \u00e9-e\u00a0f\u3000G") == [
        "\u0130stanbul", "stra\u00dfe", "\u03a3\u0391\u03a3", "x", "y", "\u00e9", "e\u00a0f\u3000g"]


def test_text_case_kept_when_lowercase_false_and_non_string_rejected():
    c = cfg({"name": "t", "transform": "text", "max_len": 2, "lowercase": False})
    vb, analysis = run(c, [{"t": "Hi hi"}, {"t": 5}])
    assert analysis.vocabularies["t"] == ["Hi", "hi"]
    assert vb.keep.tolist() == [True, False]
    assert "string" in rejected(vb)[1][1]


# ----------------------------------------------------------------- hash


def test_hash_ids_are_farmhash_fingerprints_in_one_to_buckets():
    c = cfg({"name": "u", "transform": "hash", "buckets": 10})
    values = ["alice", "bob", "", 0, False, 12, 1.0, "\u65e5\u672c", b"\x00\xff"]
    vb, _ = run(c, [{"u": v} for v in values] + [{"u": None}])
    ids = col(vb, "u")[:, 0].tolist()
    assert ids == [1 + fingerprint(term(v)) % 10 for v in values] + [0]
    # pinned: tf.strings.to_hash_bucket_fast("alice", 10) + 1 == 8 in TensorFlow 2.21
    assert stable_hash("alice") == fingerprint("alice") == 10125359828081617157 and ids[0] == 8
    many, _ = run(c, [{"u": f"user{i}"} for i in range(2000)])
    assert set(col(many, "u")[:, 0].tolist()) == set(range(1, 11))


def test_hash_and_vocabulary_ids_same_in_another_process_with_other_hash_seed():
    code = (
        "from convert.config import parse_config\n"
        "from convert.analysis import Analyzer\n"
        "from convert.vectorize import Vectorizer\n"
        "c = parse_config({'features': [{'name': 'u', 'transform': 'hash', 'buckets': 1000},"
        " {'name': 'v', 'transform': 'vocabulary', 'num_oov_buckets': 7}]})\n"
        "recs = [{'u': f'x{i}', 'v': f'y{i % 13}'} for i in range(50)]\n"
        "a = Analyzer(c); a.add_records(recs[:20])\n"
        "vb = Vectorizer(c, a.result()).vectorize(recs)\n"
        "print(vb.columns['u'][1][:, 0].tolist(), vb.columns['v'][1][:, 0].tolist())\n"
    )
    root = Path(__file__).resolve().parents[1]
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                           env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}).stdout
            for seed in ("1", "987")}
    assert len(outs) == 1


# ------------------------------------------------------------ bytes, label


def test_bytes_passthrough():
    c = cfg({"name": "b", "transform": "bytes"})
    vb, _ = run(c, [{"b": b"\x00\xff"}, {"b": "\u00e9"}, {"b": None}, {"b": b""}, {"b": 5}, {"b": bytearray(b"z")}])
    assert vb.columns["b"][0] == "string"
    assert col(vb, "b") == [b"\x00\xff", "\u00e9".encode(), b"", b"", b"z"]
    assert rejected(vb)[4][0] == "b"


def test_label_int64_accepts_integers_and_rejects_missing_or_bad():
    c = cfg({"name": "x", "transform": "identity"}, label={"source": "y"})
    recs = [{"y": 1}, {"y": True}, {"y": 2.0}, {"y": None}, {}, {"y": "1"}, {"y": 1.5}, {"y": 2**70},
            {"y": 1e300}, {"y": -(2**63)}, {"y": float("nan")}]
    vb, _ = run(c, recs)
    assert vb.keep.tolist() == [True, True, True, False, False, False, False, False, False, True, False]
    np.testing.assert_array_equal(col(vb, "y"), [[1], [1], [2], [-(2**63)]])
    assert col(vb, "y").dtype == np.int64
    rej = rejected(vb)
    assert rej[3][0] == "y" and "missing" in rej[3][1] and "float32" in rej[3][1]
    assert "'1'" in rej[5][1]


def test_label_float32_accepts_finite_numbers_only():
    c = cfg({"name": "x", "transform": "identity"}, label={"source": "t.y", "dtype": "float32", "name": "target"})
    recs = [{"t": {"y": 0.5}}, {"t": {"y": 3}}, {"t": {"y": None}}, {"t": {"y": float("inf")}},
            {"t": {"y": "0.5"}}, {"t": {"y": True}}, {"t": {"y": 10**400}}, {"t": {"y": 1e300}}, {"t": {"y": 2**70}}]
    vb, _ = run(c, recs)
    assert vb.keep.tolist() == [True, True, False, False, False, False, False, False, True]
    assert vb.columns["target"][0] == "float32"
    np.testing.assert_array_equal(col(vb, "target"), np.array([[0.5], [3], [2.0**70]], np.float32))
    assert {f for f, _ in rejected(vb).values()} == {"t.y"}
    assert "missing" in rejected(vb)[2][1]


# ------------------------------------------------------ records and masks


def test_non_dict_record_rejected():
    c = cfg({"name": "x", "transform": "identity"}, {"name": "c", "transform": "vocabulary"})
    vb, _ = run(c, [{"x": 1, "c": "a"}, [1, 2], "str", None, 5])
    assert vb.keep.tolist() == [True, False, False, False, False]
    for i in range(1, 5):
        field, reason = rejected(vb)[i]
        assert field == "<record>" and "expected a record" in reason


def test_rejected_rows_removed_from_every_column():
    c = cfg({"name": "x", "transform": "identity", "missing_indicator": True},
            {"name": "tags", "transform": "vocabulary", "max_len": 2},
            {"name": "b", "transform": "bytes"},
            {"name": "h", "transform": "hash", "buckets": 5},
            label={"source": "y"})
    recs = [{"x": 1, "tags": ["a"], "b": b"r0", "h": "p", "y": 0},
            {"x": "bad", "tags": ["a"], "b": b"r1", "h": "p", "y": 1},
            {"x": 3, "tags": ["a", "a"], "b": b"r2", "h": "q", "y": 2},
            {"x": 4, "tags": [], "b": b"r3", "h": "p", "y": None},
            {"x": None, "tags": None, "b": None, "h": None, "y": 4}]
    vb, _ = run(c, recs)
    assert vb.keep.tolist() == [True, False, True, False, True]
    assert [r.index for r in vb.rejections] == [1, 3]
    for name, (_kind, v) in vb.columns.items():
        assert len(v) == 3, name
    assert col(vb, "b") == [b"r0", b"r2", b""]
    np.testing.assert_array_equal(col(vb, "y"), [[0], [2], [4]])
    np.testing.assert_array_equal(col(vb, "x"), [[1], [3], [0]])
    np.testing.assert_array_equal(col(vb, "x_missing"), [[0], [0], [1]])
    np.testing.assert_array_equal(col(vb, "tags_len"), [[1], [2], [0]])


def test_one_rejection_per_record_first_reason_kept():
    c = cfg({"name": "x", "transform": "identity"}, {"name": "z", "transform": "identity"}, label={"source": "y"})
    vb, _ = run(c, [{"x": "a", "z": "b"}])
    assert len(vb.rejections) == 1 and vb.rejections[0].field == "x"


def test_empty_batch():
    c = cfg({"name": "x", "transform": "zscore"}, {"name": "t", "transform": "text", "max_len": 3},
            {"name": "b", "transform": "bytes"}, label={"source": "y"})
    vb = Vectorizer(c, analyze(c, [{"x": 1, "t": "a", "y": 1}])).vectorize([])
    assert vb.keep.shape == (0,) and vb.rejections == []
    assert col(vb, "x").shape == (0, 1) and col(vb, "t").shape == (0, 3) and col(vb, "b") == []


def test_feature_specs_match_columns_and_config_output_names():
    c = cfg({"name": "x", "transform": "zscore", "missing_indicator": True},
            {"name": "tags", "transform": "vocabulary", "max_len": 4, "num_oov_buckets": 2},
            {"name": "t", "transform": "text", "max_len": 3},
            {"name": "h", "transform": "hash", "buckets": 9},
            {"name": "b", "transform": "bytes"},
            label={"source": "y", "dtype": "float32"})
    recs = [{"x": 1.0, "tags": ["a", "b"], "t": "hi there", "h": "k", "b": b"z", "y": 0.5},
            {"x": 2.0, "tags": ["a"], "t": "hi", "h": "j", "b": b"", "y": 1.5}]
    vec = Vectorizer(c, analyze(c, recs))
    specs = {s.name: s for s in vec.feature_specs()}
    assert list(specs) == c.output_names
    vb = vec.vectorize(recs)
    assert set(vb.columns) == set(specs)
    for name, (kind, v) in vb.columns.items():
        assert specs[name].dtype == kind
        if kind != "string":
            assert v.shape == (2, *specs[name].shape), name
    assert specs["tags"].params["vocab_size"] == 1 + 2 + 2  # pad, 2 OOV, a, b
    assert specs["tags"].params["oov_ids"] == [1, 2]
    assert specs["h"].params["vocab_size"] == 10
    assert specs["x"].params["stats"]["mean"] == 1.5
    assert specs["x_missing"].role == "aux" and specs["tags_len"].role == "aux" and specs["y"].role == "label"
    assert int(col(vb, "tags").max()) < specs["tags"].params["vocab_size"]


def test_vectorizer_needs_vocabulary_from_analysis():
    c = cfg({"name": "c", "transform": "vocabulary"})
    with pytest.raises(ValueError, match="'c'"):
        Vectorizer(c, Analysis(vocabularies={}, stats={}))


# --------------------------------------------------------------- analyzer


ANALYZE_CFG = dict(features=[
    {"name": "x", "transform": "zscore"},
    {"name": "v", "transform": "identity", "max_len": 3, "fill": "mean"},
    {"name": "c", "transform": "vocabulary"},
    {"name": "tags", "transform": "vocabulary", "max_len": 2},
    {"name": "t", "transform": "text", "max_len": 3},
])


def _analyzer_records(n: int = 200) -> list[dict]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        out.append({
            "x": None if i % 9 == 0 else float(rng.normal(10, 3)),
            "v": [float(a) for a in rng.integers(0, 5, size=int(rng.integers(0, 4)))],
            "c": str(rng.choice(["a", "b", "c", "d"])) if i % 5 else None,
            "tags": [str(t) for t in rng.choice(["p", "q", "r"], size=int(rng.integers(0, 3)))],
            "t": " ".join(rng.choice(["Cat", "dog", "bird"], size=int(rng.integers(0, 4)))),
        })
    return out


def test_analyzer_merge_of_halves_equals_analyzer_over_all():
    c = parse_config(ANALYZE_CFG)
    recs = _analyzer_records()
    whole = analyze(c, recs)
    a, b = Analyzer(c), Analyzer(c)
    a.add_records(recs[:77])
    b.add_records(recs[77:])
    merged = a.merge(b).result()
    assert merged.vocabularies == whole.vocabularies
    for name, st in whole.stats.items():
        for k, v in st.items():
            assert merged.stats[name][k] == pytest.approx(v, rel=1e-12, abs=1e-12), (name, k)
    # merging an empty analyzer changes nothing, in either direction
    assert Analyzer(c).merge(a).result().to_json() == a.result().to_json()


def test_analyzer_batches_equal_one_pass():
    c = parse_config(ANALYZE_CFG)
    recs = _analyzer_records()
    a = Analyzer(c)
    for s in range(0, len(recs), 13):
        a.add_records(recs[s:s + 13])
    whole = analyze(c, recs)
    assert a.result().vocabularies == whole.vocabularies
    assert a.result().stats["x"]["mean"] == pytest.approx(whole.stats["x"]["mean"])
    assert a.result().stats["x"]["std"] == pytest.approx(whole.stats["x"]["std"])


def test_analyzer_pickles_and_keeps_accumulating():
    """Beam ships accumulators between workers: pickle, unpickle, add more, merge."""
    c = parse_config(ANALYZE_CFG | {"features": ANALYZE_CFG["features"] + [
        {"name": "n", "source": "deep.er.x", "transform": "minmax"}]})
    recs = [dict(r, deep={"er": {"x": i}}) for i, r in enumerate(_analyzer_records())]
    a = Analyzer(c)
    a.add_records(recs[:100])
    a2 = pickle.loads(pickle.dumps(a))
    a2.add_records(recs[100:])  # getters rebuilt after unpickling
    b = pickle.loads(pickle.dumps(Analyzer(c)))
    b.merge(a2)
    whole = analyze(c, recs)
    assert b.result().vocabularies == whole.vocabularies
    assert b.result().stats["n"]["max"] == 199
    assert b.result().to_json()["stats"]["x"]["count"] == whole.stats["x"]["count"]


def test_analysis_json_round_trip_gives_same_vectors():
    c = parse_config(ANALYZE_CFG)
    recs = _analyzer_records(50)
    analysis = analyze(c, recs)
    import json

    again = Analysis.from_json(json.loads(json.dumps(analysis.to_json())))
    v1 = Vectorizer(c, analysis).vectorize(recs)
    v2 = Vectorizer(c, again).vectorize(recs)
    for k in v1.columns:
        np.testing.assert_array_equal(v1.columns[k][1], v2.columns[k][1])


def test_analyzer_counts_missing_and_ignores_non_numbers():
    c = cfg({"name": "x", "transform": "zscore"})
    analysis = analyze(c, [{"x": 1}, {"x": "2"}, {"x": None}, {}, {"x": float("nan")}, {"x": 3}, "notadict"])
    st = analysis.stats["x"]
    assert st["count"] == 2 and st["missing"] == 3 and st["mean"] == 2
    empty = analyze(c, [])
    assert empty.stats["x"] == {"count": 0, "missing": 0, "mean": 0.0, "std": 0.0, "min": None, "max": None}


# ------------------------------------------- prepare / finish (the pipeline's path)


PREP_CFG = {
    "label": {"source": "y", "dtype": "int64"},
    "features": [
        {"name": "a", "transform": "zscore", "missing_indicator": True},
        {"name": "b", "transform": "log1p", "on_nan": "fill"},
        {"name": "c", "source": "u.c", "transform": "minmax"},
        {"name": "v", "transform": "identity", "max_len": 3, "fill": "mean"},
        {"name": "w", "transform": "clip", "clip_min": 0, "max_len": 2},
        {"name": "s", "transform": "vocabulary", "top_k": 4},
        {"name": "o", "transform": "vocabulary", "num_oov_buckets": 3},
        {"name": "l", "transform": "vocabulary", "max_len": 2},
        {"name": "t", "transform": "text", "max_len": 3},
        {"name": "h", "transform": "hash", "buckets": 7},
        {"name": "n", "source": "u.n", "transform": "hash", "buckets": 5},
    ],
}
ODD_VALUES = [None, "x", 3, 2.5, True, b"b", [1, "a", None], {"k": 1}, float("nan"), 10**400, -7]


def _clean_records(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["Red", "blue", "green", "caf\u00e9", ""]
    out = []
    for i in range(n):
        out.append({
            "a": None if i % 5 == 0 else int(rng.integers(-3, 50)),
            "b": float(rng.uniform(0, 9)), "u": {"c": float(rng.normal()), "n": int(rng.integers(0, 9))},
            "v": None if i % 7 == 0 else [float(x) for x in rng.normal(size=int(rng.integers(0, 5)))],
            "w": [int(x) for x in rng.integers(-2, 3, size=int(rng.integers(0, 4)))],
            "s": None if i % 6 == 0 else str(rng.choice(words)), "o": str(rng.choice(words)),
            "l": [str(x) for x in rng.choice(words, size=int(rng.integers(0, 4)))],
            "t": " ".join(str(x) for x in rng.choice(words, size=int(rng.integers(0, 6)))),
            "h": f"id{int(rng.integers(0, 30))}", "y": i % 2,
        })
    return out


def _odd_records() -> list:
    """One record per (field, odd value): every column leaves its fast path."""
    out: list = ["notadict", None]
    for name in ("a", "b", "v", "w", "s", "o", "l", "t", "h", "y"):
        for v in ODD_VALUES:
            out.append({**_clean_records(1)[0], name: v})
            out.append({**_clean_records(1)[0], name: [v, "z"]})
    for v in ODD_VALUES:
        out.append({**_clean_records(1)[0], "u": {"c": v, "n": v}})
    out.append({**_clean_records(1)[0], "u": 5})
    return out


def _assert_same_batch(x, y):
    assert [(r.index, r.field, r.reason) for r in x.rejections] == [(r.index, r.field, r.reason) for r in y.rejections]
    np.testing.assert_array_equal(x.keep, y.keep)
    assert list(x.columns) == list(y.columns)
    for k, (kind, v) in x.columns.items():
        assert y.columns[k][0] == kind
        if kind == "string":
            assert v == y.columns[k][1]
        else:
            assert v.dtype == y.columns[k][1].dtype
            np.testing.assert_array_equal(v, y.columns[k][1])


def test_add_prepared_equals_record_by_record_analysis_on_any_values():
    c = parse_config(PREP_CFG)
    recs = _clean_records(60) + _odd_records()
    rows = np.arange(len(recs)) % 3 != 1  # the "training" rows
    for batch in (recs[:60], recs):  # fast paths only, then every per-value path
        mask = rows[: len(batch)]
        ref = Analyzer(c)
        ref.add_records([r for r, m in zip(batch, mask, strict=True) if m])
        fast = Analyzer(c)
        fast.add_prepared(Vectorizer(c, ref.result()).prepare(batch, analyze=True), mask)
        assert fast.result().to_json() == ref.result().to_json()


def test_fast_paths_and_per_value_paths_give_the_same_columns():
    """A batch with one odd value in a column takes that column's per-value
    path; the clean rows must come out exactly as in an all-clean batch."""
    c = parse_config(PREP_CFG)
    clean = _clean_records(60)
    analysis = analyze(c, clean)
    vec = Vectorizer(c, analysis)
    alone = vec.vectorize(clean)
    for odd in _odd_records():
        mixed = vec.vectorize(clean + [odd])
        assert mixed.keep[:60].all()
        for k, (kind, v) in alone.columns.items():
            got = mixed.columns[k][1][:60]
            if kind == "string":
                assert got == v
            else:
                np.testing.assert_array_equal(got, v, err_msg=f"{k} with {odd!r}")


def test_prepared_batch_pickles_and_finishes_like_vectorize():
    c = parse_config(PREP_CFG)
    recs = _clean_records(40) + _odd_records()
    vec = Vectorizer(c, analyze(c, recs))
    pb = vec.prepare(recs, analyze=True)
    assert pb.analysis is not None
    pb.analysis = None  # what the pipeline stores
    again = pickle.loads(pickle.dumps(pb, protocol=pickle.HIGHEST_PROTOCOL))
    _assert_same_batch(vec.finish(again), vec.vectorize(recs))
    with pytest.raises(ValueError, match="analyze=True"):
        Analyzer(c).add_prepared(again, np.ones(again.rows, dtype=bool))


def test_hash_in_bulk_equals_stable_hash():
    c = cfg({"name": "h", "transform": "hash", "buckets": 1000})
    vals = ["", "a", "caf\u00e9", "\U0001f600", "x" * 300, None]
    vb, _ = run(c, [{"h": v} for v in vals])
    assert col(vb, "h")[:, 0].tolist() == [1 + stable_hash(v) % 1000 for v in vals[:-1]] + [0]
    ints = [0, -5, 2**63 - 1, 12345678901]
    vb, _ = run(c, [{"h": v} for v in ints])
    assert col(vb, "h")[:, 0].tolist() == [1 + stable_hash(str(v)) % 1000 for v in ints]


def test_text_column_at_once_tokenizes_each_row_as_alone():
    """Texts are lowercased and tokenized as one string per batch (NUL between
    rows); every row must get exactly the tokens of ``tokenize(row)``."""
    texts = ["\u039f\u0394\u039f\u03a3", "\u03a3", "\u0391\u03a3'", "'\u03a3\u03b1 x", "\u0130stanbul", "stra\u00dfe \ufb01",
             "", None, "a\u0301\u03a3", "A b  C", "x\x00y"]  # final sigma, case-ignorables, İ, a NUL inside a text
    c = cfg({"name": "t", "transform": "text", "max_len": 6, "top_k": 100})
    recs = [{"t": t} for t in texts]
    vb, analysis = run(c, recs)
    want = Counter(tok for t in texts if t is not None for tok in tokenize(t))
    assert analysis.vocabularies["t"] == sorted(want, key=lambda t: (-want[t], t))
    vec = Vectorizer(c, analysis)
    for i, t in enumerate(texts):
        alone = vec.vectorize([{"t": t}])
        np.testing.assert_array_equal(col(vb, "t")[i], col(alone, "t")[0], err_msg=repr(t))
    no_nul = [{"t": t} for t in texts if t != "x\x00y"]  # the one-string path (no NUL in any text)
    whole = vec.vectorize(no_nul)
    for i, r in enumerate(no_nul):
        np.testing.assert_array_equal(col(whole, "t")[i], col(vec.vectorize([r]), "t")[0])
        ids = [vec._vocab_ids["t"][tok] for tok in tokenize(r["t"] or "")][:6]
        assert col(whole, "t")[i, : len(ids)].tolist() == ids


def test_ascii_column_tokens_equal_the_regexs_for_every_ascii_character():
    """An all-ASCII column is tokenized by translate + split instead of the
    regex: every ASCII character, in every position, splits or joins tokens
    exactly as ``tokenize`` does."""
    texts = []
    for c in map(chr, range(1, 128)):
        texts += [f"a{c}b", f"{c}{c}Xy{c}", f"_{c}9 {c}", c]
    texts += ["", None, "What's up?  IT'S 9:30\tnow\r\n", "a_b-c.d/e"]
    for lowercase in (True, False):
        c = cfg({"name": "t", "transform": "text", "max_len": 8, "top_k": 10_000, "lowercase": lowercase})
        vb, analysis = run(c, [{"t": t} for t in texts])
        want = Counter(tok for t in texts if t is not None for tok in tokenize(t, lowercase))
        assert analysis.vocabularies["t"] == sorted(want, key=lambda t: (-want[t], t))
        ids = Vectorizer(c, analysis)._vocab_ids["t"]
        for i, t in enumerate(texts):
            toks = [ids[tok] for tok in tokenize(t or "", lowercase)][:8]
            assert col(vb, "t")[i].tolist() == toks + [0] * (8 - len(toks)), repr(t)


def test_unit_term_indexes_carry_over_batches_and_give_the_same_result():
    """Preparer(unit_terms=True), as the pipeline runs it: term indexes carry
    over a unit's batches; analysis and columns equal batch-by-batch ones."""
    c = parse_config(PREP_CFG)
    recs = _clean_records(90, seed=4) + _odd_records() + _clean_records(30, seed=5)
    chunks = [recs[i:i + 17] for i in range(0, len(recs), 17)]
    masks = [np.arange(len(ch)) % 4 != 0 for ch in chunks]
    ref = Analyzer(c)
    for ch, m in zip(chunks, masks, strict=True):
        ref.add_records([r for r, k in zip(ch, m, strict=True) if k])
    unit = Preparer(c, unit_terms=True)
    got = Analyzer(c)
    prepared = []
    for ch, m in zip(chunks, masks, strict=True):
        pb = unit.prepare(ch, analyze=True)
        got.add_prepared(pb, m)
        pb.analysis = None
        prepared.append(pickle.loads(pickle.dumps(pb)))
    assert got.result().to_json() == ref.result().to_json()
    assert prepared[-1].parts[5].first > 0  # later batches index on from earlier ones
    vec = Vectorizer(c, ref.result())
    for ch, pb in zip(chunks, prepared, strict=True):
        _assert_same_batch(vec.finish(pb), Vectorizer(c, ref.result()).vectorize(ch))
    with pytest.raises(ValueError, match="out of order"):
        vec.finish(prepared[2])  # the batch after prepared[1], not after the last
    a = Analyzer(c)
    a.add_prepared(Preparer(c, unit_terms=True).prepare(chunks[0], analyze=True), masks[0])
    with pytest.raises(ValueError, match="out of order"):  # a batch of another unit's indexes
        a.add_prepared(unit.prepare(chunks[1], analyze=True), masks[1])


def test_unit_term_index_starts_afresh_beyond_its_cap(monkeypatch):
    """Very high-cardinality features: the unit's index restarts (first index
    0) instead of growing without bound; results stay the same."""
    monkeypatch.setattr(Preparer, "MAX_UNIT_TERMS", 3)
    c = parse_config(PREP_CFG)
    recs = _clean_records(80, seed=6)
    chunks = [recs[i:i + 10] for i in range(0, len(recs), 10)]
    ref = Analyzer(c)
    for ch in chunks:  # statistics merge per batch, like the prepared path
        ref.add_records(ch)
    unit, got, prepared = Preparer(c, unit_terms=True), Analyzer(c), []
    for ch in chunks:
        pb = unit.prepare(ch, analyze=True)
        got.add_prepared(pb, np.ones(len(ch), dtype=bool))
        prepared.append(pb)
    assert got.result().to_json() == ref.result().to_json()
    firsts = [pb.parts[8].first for pb in prepared]  # feature "t" (text): restarts at 0
    assert firsts.count(0) > 1 and max(len(ix) for ix in unit._index.values()) <= 3 + 60
    vec = Vectorizer(c, ref.result())
    for ch, pb in zip(chunks, prepared, strict=True):
        _assert_same_batch(vec.finish(pb), vec.vectorize(ch))


def test_shared_and_left_out_lengths_are_not_written_but_counted():
    """``length_of`` and ``length: false`` leave their ``<name>_len`` out of the columns (the
    statistics still read them, as ``unwritten``); a record the shared length would misstate is
    never written silently (the config check refuses such configs; this guards the invariant)."""
    c = cfg({"name": "pos", "source": "imp[].pos", "transform": "identity", "max_len": 3},
            {"name": "price", "source": "imp[].price", "transform": "identity", "max_len": 3, "length_of": "pos"},
            {"name": "ad", "source": "imp[].ad", "transform": "hash", "buckets": 9, "max_len": 3, "length": False})
    recs = [{"imp": [{"pos": 1, "price": None, "ad": "a"}, None, {"ad": None}]}, {"imp": []}, {"imp": [{"pos": 2}] * 5}]
    vb, _ = run(c, recs)
    assert set(vb.columns) == {"pos", "pos_len", "price", "ad"}
    assert col(vb, "pos_len")[:, 0].tolist() == [3, 0, 3] and vb.unwritten["price_len"][1][:, 0].tolist() == [3, 0, 3]
    assert vb.unwritten["ad_len"][1][:, 0].tolist() == [1, 0, 0] == np.count_nonzero(col(vb, "ad"), axis=1).tolist()
    unchecked = dataclasses.replace(c, features=(c.features[0], dataclasses.replace(c.features[1], source="other[]")))
    with pytest.raises(ValueError, match=r"feature 'price' \(length_of: 'pos'\): record 0 of the batch has 1 values, 'pos' 3"):
        Vectorizer(unchecked, analyze(unchecked, recs)).vectorize(
            [{"imp": [{"pos": 1}] * 3, "other": [1.0]}])
