"""The math of the keyed analyzers (issue 47): ``label_vocabulary``'s mutual information and
its mergeable, partitioned counts, ``zscore_per_key``'s per-key moments and scaling, and
``cyclical``'s calendar slots, checked against independent references."""

from __future__ import annotations

import datetime as dt
import math
import random
from collections import Counter

import numpy as np
import pytest

from convert.term_counts import partition_of
from convert.transforms import cyclical as cyc
from convert.transforms import label_vocabulary as lv
from convert.transforms import zscore_per_key as zk

# ------------------------------------------------------------------ label_vocabulary


def test_recommended_min_diff_from_avg_is_tft_s() -> None:
    assert [lv.recommended_min_diff_from_avg(n) for n in (0, 10_000, 505_000, 1_000_000, 10**9)] == [2, 2, 13, 25, 25]


def test_plain_score_is_the_present_half_of_the_indicator_s_mutual_information() -> None:
    # No class at the clip bounds and no min_diff: sum_j n_ij log2(n n_ij / (x_i y_j)).
    per, classes = [30, 10], [400, 600]
    n, x = sum(classes), sum(per)
    want = sum(nij * math.log2(n * nij / (x * yj)) for nij, yj in zip(per, classes, strict=True))
    assert lv.term_score(per, classes, False, 0.0) == pytest.approx(want, rel=1e-12)


def test_a_class_the_term_never_has_counts_at_the_clip_bound() -> None:
    per, classes = [20, 0], [50, 50]
    m0, m1 = (1 - 1e-6) * 20, 1e-6 * 20
    want = lv.partial_mi(m0, 20, 50, 100) + lv.partial_mi(m1, 20, 50, 100)
    assert lv.term_score(per, classes, False, 0.0) == want
    assert want > 0


def test_constant_term_scores_zero_and_min_diff_drops_near_average_cells() -> None:
    assert lv.term_score([50, 50], [50, 50], True, 0.0) == 0.0
    # x_i y_j / n = 10 for both classes, observed 11 and 9: |diff| = 1 < 2 leaves both out.
    assert lv.term_score([11, 9], [100, 100], False, 2.0) == 0.0
    assert lv.term_score([11, 9], [100, 100], False, 0.5) != 0.0


def _emi_reference(n: int, x: int, y: int) -> float:
    """The hypergeometric expectation of k log2(n k / (x y)), with exact probabilities."""
    total = math.comb(n, y)
    out = 0.0
    for k in range(max(0, x + y - n), min(x, y) + 1):
        if k:
            p = math.comb(x, k) * math.comb(n - x, y - k) / total
            out += p * k * math.log2(n * k / (x * y))
    return out


@pytest.mark.parametrize(("n", "x", "y"), [(20, 5, 8), (100, 30, 50), (300, 1, 150), (500, 499, 10), (60, 60, 60)])
def test_expected_mutual_information_is_the_hypergeometric_expectation(n: int, x: int, y: int) -> None:
    assert lv.partial_emi(n, x, y) == pytest.approx(_emi_reference(n, x, y), rel=1e-9, abs=1e-12)


def test_adjusted_is_plain_less_the_expected_information() -> None:
    per, classes = [25, 5], [100, 200]
    plain = lv.term_score(per, classes, False, 0.0)
    emi = lv.partial_emi(300, 30, 100) + lv.partial_emi(300, 30, 200)
    assert lv.term_score(per, classes, True, 0.0) == plain - emi


def _records(seed: int, n: int) -> tuple[list[str | None], list[str | None]]:
    rng = random.Random(seed)
    terms = [None if rng.random() < 0.1 else f"t{min(int(rng.expovariate(0.15)), 40)}" for _ in range(n)]
    classes = [None if rng.random() < 0.02 else str(int(t is not None and int(t[1:]) % 3 == 0 and rng.random() < 0.7))
               for t in terms]
    return terms, classes


def _ranked(acc: lv.LabelTermCounts, **kw) -> list[tuple[str, float]]:
    order = lv.class_order(acc.classes, None)
    return lv.rank_terms(acc.by_class, acc.classes, order, adjusted=kw.get("adjusted", True),
                         min_diff_from_avg=kw.get("min_diff"), min_frequency=kw.get("min_frequency", 1),
                         top_k=kw.get("top_k"))


def test_counts_merge_in_any_order_and_codes_count_as_values() -> None:
    terms, classes = _records(0, 3000)
    whole = lv.LabelTermCounts()
    whole.add(terms, classes)
    parts = []
    for lo in range(0, 3000, 700):
        part = lv.LabelTermCounts()
        vocab = sorted({t for t in terms[lo:lo + 700] if t is not None})
        codes = np.array([-1 if t is None else vocab.index(t) for t in terms[lo:lo + 700]])
        part.add_codes(vocab, codes, classes[lo:lo + 700])
        parts.append(part)
    for order in (parts, parts[::-1], parts[1:] + parts[:1]):
        merged = lv.LabelTermCounts()
        for p in order:
            merged.merge(p)
        assert merged.classes == whole.classes
        assert merged.by_class == whole.by_class
        assert _ranked(merged) == _ranked(whole)
    assert sum(whole.classes.values()) == sum(c is not None for c in classes)


def test_partitioned_ranking_equals_the_whole_one() -> None:
    terms, classes = _records(1, 5000)
    acc = lv.LabelTermCounts()
    acc.add(terms, classes)
    for kw in ({"top_k": 7}, {"top_k": None, "min_frequency": 30}, {"adjusted": False, "top_k": 5, "min_diff": 0.0}):
        whole = _ranked(acc, **kw)
        lists = []
        for p in range(4):
            part = lv.LabelTermCounts()
            part.classes = acc.classes
            part.add_arrays({c: ([t for t in ts if partition_of(t, 4) == p],
                                 np.array([k for t, k in zip(ts, cs.tolist(), strict=True) if partition_of(t, 4) == p]))
                             for c, (ts, cs) in acc.arrays().items()})
            lists.append(_ranked(part, **kw))
        assert lv.merge_ranked(lists, kw.get("top_k")) == whole
        scores = [s for _, s in whole]
        assert scores == sorted(scores, reverse=True)


def test_ties_go_by_term_and_min_frequency_counts_records() -> None:
    acc = lv.LabelTermCounts()
    acc.add(["b", "a", "c", "c"] * 5 + ["z"] * 10, ["1", "1", "0", "1"] * 5 + ["0"] * 10)
    ranked = _ranked(acc, min_diff=0.0)
    a, b = next(s for t, s in ranked if t == "a"), next(s for t, s in ranked if t == "b")
    assert a == b and [t for t, _ in ranked].index("a") < [t for t, _ in ranked].index("b")
    assert [t for t, _ in _ranked(acc, min_frequency=10)] == sorted(["c", "z"], key=lambda t: -dict(ranked)[t])


def test_a_list_counts_each_occurrence_with_its_record_s_class() -> None:
    """As TF Transform's ``reduce_batch_weighted_cooccurrences`` counts a SparseTensor of terms:
    every item with its record's label (a repeat too); the classes count records, not items."""
    acc = lv.LabelTermCounts()
    acc.add([["a", "a", "b"], ["a"], None, []], ["1", "0", "0", "1"])
    assert acc.by_class == {"1": Counter({"a": 2, "b": 1}), "0": Counter({"a": 1})}
    assert acc.classes == Counter({"1": 2, "0": 2})
    codes = lv.LabelTermCounts()
    codes.add_codes(["a", "b"], np.array([0, 0, 1, 0]), ["1", "0", "0", "1"], row_of=np.array([0, 0, 0, 1]))
    assert codes.by_class == acc.by_class and codes.classes == acc.classes


def test_a_term_outnumbering_the_records_is_refused_as_tft_refuses_it() -> None:
    acc = lv.LabelTermCounts()
    acc.add([["a", "a", "a"], ["b"]], ["1", "0"])
    with pytest.raises(lv.TermOutnumbersRecords, match="term 'a' occurs 3 times in the 2 training records"):
        _ranked(acc)


def _list_config(**kw):
    from convert.config import parse_config

    return parse_config({"label": {"source": "y", "dtype": "int64"},
                         "features": [{"name": "t", "source": "tags", "transform": "label_vocabulary", "max_len": 3,
                                       "min_diff_from_avg": 0, **kw}]})


def _list_records(null_item: bool) -> list[dict]:
    """n = 4 records, 2 of each class: "a" twice in class 1; "b" once in each; "c" once in class 0
    (and a record without a label, rejected). A null item (left out) takes the preparer's raw values path."""
    return [{"tags": ["a", "b"], "y": 1}, {"tags": ["a"], "y": 1}, {"tags": ["b", *([None] * null_item), "c"], "y": 0},
            {"tags": [], "y": 0}, {"tags": ["a"], "y": None}]


def _pm(m: float, x: float, y: float, n: float) -> float:
    return m * (math.log2(m) + math.log2(n) - math.log2(x) - math.log2(y))


@pytest.mark.parametrize("path", ["records", "prepared", "prepared-raw"])
@pytest.mark.parametrize("kind", ["plain", "adjusted"])
def test_a_list_s_ranking_by_hand(path: str, kind: str) -> None:
    """The list feature's scores, worked out by hand (TF Transform's formula, ``min_diff_from_avg: 0``):
    a = 2e-6 log2(2e-6) + 2(1 - 1e-6) (1 + log2(1 - 1e-6)) ~ 2, b = 0 (even), c ~ 1; the expected
    information of a term of x = 2 is 1/3 a class (hypergeometric: P(k=2) = 1/6, 2 log2 2),
    of x = 1 it is 1/2 a class; ids in rank order after 0 (missing) and 1 (OOV), lists padded."""
    from convert.analysis import Analyzer
    from convert.prepare import Preparer
    from convert.vectorize import Vectorizer

    eps = 1e-6
    plain = {"a": _pm(2 * eps, 2, 2, 4) + _pm(2 * (1 - eps), 2, 2, 4), "b": 0.0,
             "c": _pm(1 - eps, 1, 2, 4) + _pm(eps, 1, 2, 4)}
    assert plain["a"] == pytest.approx(2.0, abs=1e-4) and plain["c"] == pytest.approx(1.0, abs=1e-4)
    want = plain if kind == "plain" else {"a": plain["a"] - 2 / 3, "b": -2 / 3, "c": plain["c"] - 1}
    config = _list_config(mutual_information=kind)
    an, records = Analyzer(config), _list_records(null_item=path != "prepared")
    if path == "records":
        an.add_records(records[:4])
    else:
        batch = Preparer(config).prepare(records, analyze=True)
        assert list(batch.bad) == [4]
        assert type(batch.analysis["t"]).__name__ == ("RawValues" if path == "prepared-raw" else "TermRows")
        an.add_prepared(batch, np.array([True] * 4 + [False]))
        an.flush()
    f, acc = config.features[0], an.ranked["t"]
    got = dict(lv.TRANSFORM.rank(f, acc, acc.classes, an.label_ids()))
    assert got == pytest.approx(want, rel=1e-9, abs=1e-9)
    result = an.result()
    assert result.vocabularies["t"] == ["a", "c", "b"]
    vb = Vectorizer(config, result).vectorize(records[:4])
    assert vb.columns["t"][1].tolist() == [[2, 4, 0], [2, 0, 0], [4, 3, 0], [0, 0, 0]]
    assert vb.columns["t_len"][1].ravel().tolist() == [2, 1, 2, 0]


def test_a_list_repeating_a_term_past_the_records_is_refused_naming_the_feature() -> None:
    from convert.analysis import Analyzer

    an = Analyzer(_list_config())
    an.add_records([{"tags": ["a", "a", "a"], "y": 1}, {"tags": ["b"], "y": 0}])
    with pytest.raises(lv.TermOutnumbersRecords, match="feature 't' \\(label_vocabulary\\): term 'a' occurs 3 times"):
        an.result()


def test_class_order_and_label_kind() -> None:
    assert lv.class_order(["10", "-1", "2"], None) == ["-1", "2", "10"]
    assert lv.class_order(["x", "y"], {"y": 0, "x": 1}) == ["y", "x"]

    class Lab:
        def __init__(self, dtype: str, transform: str | None = None):
            self.name, self.dtype, self.transform = "y", dtype, transform

    assert lv.label_kind_problem("city", Lab("int64")) is None
    assert lv.label_kind_problem("city", Lab("int64", "vocabulary")) is None
    assert "float32, not a class" in lv.label_kind_problem("city", Lab("float32"))
    assert "no label" in lv.label_kind_problem("city", None)


# ------------------------------------------------------------------ zscore_per_key


def _moments(keys: list[str | None], x: np.ndarray, present: np.ndarray) -> zk.KeyedMoments:
    acc = zk.KeyedMoments()
    acc.add(keys, x, present)
    return acc


def test_per_key_moments_merge_and_match_numpy() -> None:
    rng = np.random.default_rng(0)
    keys = [None if rng.random() < 0.05 else f"k{int(rng.integers(0, 6))}" for _ in range(4000)]
    x = rng.lognormal(3.0, 1.0, 4000)
    present = rng.random(4000) > 0.1
    whole = _moments(keys, x, present).finish()
    merged = zk.KeyedMoments()
    for lo in range(0, 4000, 900):
        merged.merge(_moments(keys[lo:lo + 900], x[lo:lo + 900], present[lo:lo + 900]))
    got = merged.finish()
    assert got["keys"] == whole["keys"] == sorted({k for k in keys if k is not None})
    for i, k in enumerate(got["keys"]):
        vals = x[[j for j, kk in enumerate(keys) if kk == k and present[j]]]
        assert got["count"][i] == whole["count"][i] == vals.size
        assert got["mean"][i] == pytest.approx(vals.mean(), rel=1e-12)
        assert got["std"][i] == pytest.approx(vals.std(), rel=1e-9)
        assert (got["min"][i], got["max"][i]) == (vals.min(), vals.max())
    assert zk.per_key_problems("price", got) == []
    # Same order of merges, same bits.
    again = zk.KeyedMoments()
    for lo in range(0, 4000, 900):
        again.merge(_moments(keys[lo:lo + 900], x[lo:lo + 900], present[lo:lo + 900]))
    assert again.finish() == got


def test_moments_pickle_and_bad_per_key_stats_are_named() -> None:
    import pickle

    acc = _moments(["a", "b", "a"], np.array([1.0, 2.0, 3.0]), np.ones(3, bool))
    back = pickle.loads(pickle.dumps(acc))
    back.merge(_moments(["c"], np.array([5.0]), np.ones(1, bool)))
    assert back.finish()["keys"] == ["a", "b", "c"]
    bad = {"keys": ["a", "a"], "count": [1, 1], "mean": [0.0, 0.0], "std": [0.0, 0.0], "min": [0, 0], "max": [0, 0]}
    assert "distinct strings" in zk.per_key_problems("price", bad)[0]
    bad = {**acc.finish(), "std": [-1.0, 0.0]}
    assert "negative" in zk.per_key_problems("price", bad)[0]


def test_scaling_per_key_falls_back_to_global_and_fills_with_the_key_mean() -> None:
    per_key = {"keys": ["a", "b"], "count": [2, 1], "mean": [10.0, 5.0], "std": [2.0, 0.0], "min": [8, 5], "max": [12, 5]}
    table = zk.KeyTable.of(per_key, {"mean": 7.0, "std": 4.0})
    rows = table.lookup(["a", "b", "zz", None, "a"])
    assert rows.tolist() == [0, 1, 2, 2, 0]
    x = np.array([12.0, 9.0, 15.0, 3.0, 0.0])
    present = np.array([True, True, True, True, False])
    out = zk.scale_per_key(x, present, rows, table, "mean")
    assert out.dtype == np.float32 and out.shape == (5, 1)
    assert out[:, 0].tolist() == [1.0, 4.0, 2.0, -1.0, 0.0]  # b: std 0 divides by 1; the missing value: 0
    assert zk.scale_per_key(x, present, rows, table, 2.0)[4, 0] == np.float32(-4.0)


# ------------------------------------------------------------------ cyclical

EDGES = np.array([0, -1, 59, 3599, 3600, 86_399, 86_400, -86_400, -86_401,
                  951_782_400, 951_868_799, 951_868_800,  # 2000-02-29 (leap century)
                  4_107_542_399, 4_107_542_400,  # 2100-02-28 23:59:59 / 2100-03-01 (not leap)
                  1_704_067_199, 1_704_067_200,  # 2023-12-31 23:59:59 / 2024-01-01
                  1_735_603_200,  # 2024-12-31 (day 366)
                  -62_135_596_800, 253_402_300_799,  # 0001-01-01, 9999-12-31 23:59:59
                  -(2**62), 2**62], dtype=np.int64)


def _expected(secs: int, part: str) -> tuple[int, int]:
    d = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=secs)
    leap = d.year % 4 == 0 and (d.year % 100 != 0 or d.year % 400 == 0)
    month_days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][d.month - 1]
    return {"hour": (d.hour, 24), "day_of_week": (d.weekday(), 7), "month": (d.month - 1, 12),
            "day_of_month": (d.day - 1, month_days),
            "day_of_year": (d.timetuple().tm_yday - 1, 366 if leap else 365)}[part]


@pytest.mark.parametrize("part", list(cyc.PARTS))
def test_slots_are_the_calendar_s_positions(part: str) -> None:
    rng = np.random.default_rng(7)
    secs = np.concatenate([EDGES[np.abs(EDGES) < 2**40], rng.integers(-62_135_596_800, 253_402_300_800, 3000)])
    slots = cyc.part_slots(secs, part)
    for s, got in zip(secs.tolist(), slots.tolist(), strict=True):
        pos, period = _expected(s, part)
        assert got == cyc.slot_offsets(part)[period] + pos, (s, part)


@pytest.mark.parametrize("part", list(cyc.PARTS))
def test_table_holds_the_float64_angle_rounded_once(part: str) -> None:
    sin, cos = cyc.part_table(part)
    offsets = cyc.slot_offsets(part)
    for period, at in offsets.items():
        for k in (0, 1, period // 4, period - 1):
            a = 2.0 * math.pi * k / period
            assert sin[at + k] == np.float32(math.sin(a)) and cos[at + k] == np.float32(math.cos(a))
    slots = cyc.part_slots(EDGES, part)
    assert slots.min() >= 0 and slots.max() < sin.size  # any int64 day count lands in the table


def test_columns_are_float32_sin_cos_and_zero_where_missing() -> None:
    secs = np.array([0, 6 * 3600, 12 * 3600], dtype=np.int64)
    cols = cyc.cyclical_columns("ts", secs, np.array([True, True, False]), ["hour"])
    assert list(cols) == cyc.output_names("ts", ["hour"]) == ["ts_hour_sin", "ts_hour_cos"]
    sin, cos = cols["ts_hour_sin"][1][:, 0], cols["ts_hour_cos"][1][:, 0]
    assert sin.dtype == np.float32 and sin.tolist() == [0.0, 1.0, 0.0]
    assert cos[0] == 1.0 and abs(cos[1]) < 1e-7 and cos[2] == 0.0


# ------------------------------------------------------------------ config checks


@pytest.mark.parametrize(("raw", "says"), [
    ({"features": [{"name": "ts", "transform": "cyclical", "parts": ["minute"]}]},
     "'parts' must be a list of distinct hour, day_of_week, day_of_month, day_of_year, month"),
    ({"features": [{"name": "ts", "transform": "timestamp", "parts": ["day_of_year"]}]},
     "'parts' must be a list of distinct hour, day_of_week, month"),
    ({"features": [{"name": "p", "transform": "zscore_per_key"}]}, "transform 'zscore_per_key' needs 'key'"),
    ({"features": [{"name": "p", "transform": "zscore_per_key", "key": "tags[]"}]}, "takes one value per record"),
    ({"label": "y", "features": [{"name": "p", "transform": "zscore_per_key", "key": "y"}]},
     "its key 'y' is the label's source 'y'"),
    ({"features": [{"name": "c", "transform": "label_vocabulary"}]}, "the config has no label"),
    ({"label": {"source": "y", "dtype": "float32"}, "features": [{"name": "c", "transform": "label_vocabulary"}]},
     "label 'y' is float32, not a class"),
    ({"label": "y", "features": [{"name": "c", "transform": "label_vocabulary", "mutual_information": "ami"}]},
     "'mutual_information' must be one of adjusted, plain"),
    ({"label": "y", "features": [{"name": "c", "transform": "label_vocabulary", "min_diff_from_avg": -1}]},
     "'min_diff_from_avg' must be a number >= 0"),
    ({"label": "y", "features": [{"name": "c", "source": "tags[]", "transform": "label_vocabulary"}]},
     "gives a list per record ([] or [keys]): set max_len"),
    ({"label": "y", "features": [{"name": "c", "transform": "label_vocabulary", "max_len": 3, "length_of": "d"}]},
     "does not take 'length_of'"),
])
def test_keyed_options_are_checked_naming_the_feature_and_what_is_allowed(raw, says):
    from convert.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as e:
        parse_config(raw, source="cfg.yaml")
    assert says in str(e.value) and "cfg.yaml: feature" in str(e.value), str(e.value)


def test_keyed_options_load_and_old_configs_keep_their_hash():
    from convert.config import parse_config

    cfg = parse_config({"label": "y", "features": [
        {"name": "c", "transform": "label_vocabulary", "top_k": 5, "mutual_information": "plain", "min_diff_from_avg": 0},
        {"name": "p", "transform": "zscore_per_key", "key": "country"},
        {"name": "t", "transform": "cyclical", "unit": "s", "parts": ["day_of_year"]}]})
    assert parse_config(cfg.to_json()) == cfg
    assert cfg.features[0].mutual_information == "plain" and cfg.features[1].fill == "mean"
    assert cfg.output_names == ["c", "p", "t_day_of_year_sin", "t_day_of_year_cos", "y"]
    plain = parse_config({"features": [{"name": "b", "transform": "zscore"}]}).to_json()["features"][0]
    assert not {"key", "mutual_information", "min_diff_from_avg"} & set(plain)  # unset: not in the hashed JSON


def test_a_key_is_checked_against_the_schema_before_the_run():
    """A misspelled ``key`` would put every record in the global group: the Avro check names it."""
    from convert.check import avro_problems
    from convert.config import parse_config

    schema = {"type": "record", "name": "r", "fields": [
        {"name": "price", "type": "double"}, {"name": "country", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}}]}

    def problems(key: str) -> list[str]:
        cfg = parse_config({"features": [{"name": "p", "source": "price", "transform": "zscore_per_key", "key": key}]})
        return avro_problems(cfg, schema)

    assert problems("country") == []
    assert problems("contry") == ["feature 'p' (key) reads 'contry': no field 'contry' in the schema; "
                                  "did you mean 'country'?"]
    [tags] = problems("tags")
    assert "but a key needs single values" in tags
