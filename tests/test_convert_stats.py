"""convert.stats: the per-split statistics a conversion stores beside its shards (stats.json)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from _pipelines_data import make_records, write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from convert.stats import STATS_FILENAME, ValueSketch, load_stats, reason_group
from convert.term_counts import top_counted
from pipelines.cli import app

runner = CliRunner()


# ----------------------------------------------------------------- sketches


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False), min_size=1, max_size=300),
       st.integers(0, 300))
def test_sketch_merge_equals_one_pass_and_quantiles_are_close(values, cut):
    x = np.array(values, dtype=np.float64)
    whole = ValueSketch()
    whole.add(x)
    a, b = ValueSketch(), ValueSketch()
    a.add(x[:cut])
    b.add(x[cut:])
    a.merge(b)
    assert a.count == whole.count == x.size
    assert a.min == x.min() and a.max == x.max()
    assert a.mean == pytest.approx(x.mean(), rel=1e-9, abs=1e-9 * max(1.0, np.abs(x).max()))
    assert a.buckets()[1].tolist() == whole.buckets()[1].tolist()
    srt = np.sort(x)
    for q, got in zip((0.1, 0.5, 0.9), a.quantiles([0.1, 0.5, 0.9]), strict=True):
        # the value at the rank the quantile names, within one bucket (1/64 relative)
        want = srt[int(np.ceil(q * x.size)) - 1]
        assert abs(got - want) <= abs(want) / 64 + 1e-30


def test_sketch_histogram_counts_every_value_and_skips_nonfinite():
    s = ValueSketch()
    s.add(np.array([-2.0, -1.0, 0.0, 0.0, 1.0, 2.0, 3.0, np.nan, np.inf]))
    assert s.count == 7 and s.nonfinite == 2 and s.zero == 2
    assert s.histogram([-2.0, 0.0, 3.0]) == [2, 5]
    assert sum(s.histogram(np.linspace(-2, 3, 11))) == 7
    back = ValueSketch.from_json(json.loads(json.dumps(s.to_json())))
    assert back.histogram([-2.0, 0.0, 3.0]) == [2, 5] and back.std == pytest.approx(s.std)


def test_packed_term_counts_read_back_exactly():
    from convert.stats import _Terms

    for c in (Counter({"a": 3, "é": 2, "\ud800": 1, "": 4, "x\x00y": 5}), Counter({"a": 3, "é": 2, "\ud800": 1, "": 4}),
              Counter({"": 1}), Counter()):
        assert _Terms(list(c), np.array(list(c.values()), dtype=np.int64)).as_dict() == dict(c)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=300), st.integers(1, 2**63 - 1), max_size=40))
def test_packed_term_counts_read_back_exactly_whatever_their_lengths_and_counts(d):
    import pickle

    from convert.stats import _Terms

    assert pickle.loads(pickle.dumps(_Terms(list(d), np.array(list(d.values()), dtype=np.int64)))).as_dict() == d


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["a", "b", "é", "", "x\x00y", *map(str, range(40))]),
                                st.integers(1, 2**40), max_size=30), max_size=8),
       st.integers(1, 45))
def test_term_counts_summed_in_numpy_equal_a_counter_and_the_top_terms_a_full_sort(chunks, top):
    """Chunks added, merged and pickled (a unit's trip to the commit) sum as a Counter does;
    the top terms are those of sorting every term by count, then term."""
    import pickle

    from convert import stats

    want: Counter = Counter()
    merged = stats.TermCounts()
    for i, d in enumerate(chunks):
        want.update(d)
        one = stats.TermCounts()
        one.add(list(d), np.array(list(d.values()), dtype=np.int64))
        if i % 2:  # as the commit step gets a unit's: merged without unpacking it for good (it holds every unit)
            one = pickle.loads(pickle.dumps(one))
            merged.merge(one)
            assert one._empty()
        else:
            merged.merge(one)
    assert merged.as_dict() == dict(want)
    terms, counts = merged.summed()
    assert top_counted(terms, counts, top) == [[t, c] for t, c in sorted(want.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]


def test_a_units_term_counts_travel_in_less_room_than_the_terms_themselves():
    """A text feature's unit holds tens of thousands of distinct terms, mostly seen
    a few times: what the commit step receives must not cost several times the
    terms (a length and a count of 8 bytes each per term did)."""
    import pickle

    from convert.stats import _Terms

    c = Counter({f"word{i}": 1 + 1000 // (i + 1) for i in range(30_000)})
    term_bytes = sum(len(t) for t in c)
    assert len(pickle.dumps(_Terms(list(c), np.array(list(c.values()))))) < term_bytes


def test_a_sketch_maps_through_a_transform():
    s = ValueSketch()
    s.add(np.array([1.0, 2.0, 3.0, 4.0]))
    z = s.mapped(lambda v: (v - 2.5) / 2)
    assert z.count == 4 and z.mean == pytest.approx(0.0, abs=0.02) and z.min == pytest.approx(-0.75, rel=0.02)


def test_reasons_that_differ_only_in_quoted_values_share_a_group():
    a = reason_group("expected a number, found str 'abc'; use a categorical transform")
    b = reason_group("expected a number, found str 'x y'; use a categorical transform")
    assert a == b and "abc" not in a
    assert reason_group("label must be an integer, found float 1.5") == reason_group("label must be an integer, found float 22.25")


def test_a_newer_or_foreign_document_is_refused():
    with pytest.raises(ValueError, match="upgrade recordprep"):
        load_stats({"version": 99, "features": {}})
    with pytest.raises(ValueError, match="not a recordprep statistics document"):
        load_stats([1, 2])


# ------------------------------------------------------- through the CLI


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """JSON input with a malformed line and a record without label, tolerated; 2 units."""
    root = tmp_path_factory.mktemp("stats")
    records = make_records(300)
    data = write_dataset(root / "in", records, bad_json_lines=True)
    out = root / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out),
                            "--num-shards", "2", "--max-errors", "5", "--no-progress"])
    assert r.exit_code == 0, r.output
    return out, records


def test_stats_file_is_listed_and_counts_agree_with_the_metadata(converted):
    out, _ = converted
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["stats_file"] == STATS_FILENAME
    doc = load_stats(json.loads((out / STATS_FILENAME).read_text()))
    for s, sp in info["splits"].items():
        assert doc["splits"][s]["records"] == sum(sh["num_records"] for sh in sp["shards"])
        assert doc["splits"][s]["bytes"] == sum(sh["num_bytes"] for sh in sp["shards"])
        for feat in doc["features"].values():
            assert feat["splits"][s]["rows"] == doc["splits"][s]["records"]
    per_file = info["counts"]["per_file"]
    assert {f["path"]: f["rejected"] for f in doc["files"]} == {p: c["errors"] for p, c in per_file.items()}
    assert doc["rejections"]["count"] == info["counts"]["errors"] == 2


def test_every_split_is_counted_from_the_records_written(converted):
    """Summed over the splits, each statistic equals what the written records hold."""
    out, records = converted
    doc = json.loads((out / STATS_FILENAME).read_text())
    feats = doc["features"]
    both = list(doc["splits"])
    assert len(both) == 2 and all(doc["splits"][s]["records"] > 0 for s in both)

    def total(name, key):
        return sum(feats[name]["splits"][s][key] for s in both)

    assert total("x", "missing") == sum(r["x"] is None for r in records)
    train_after = feats["x"]["splits"]["train"]["after"]  # zscore of the training split: mean 0, std 1
    assert train_after["mean"] == pytest.approx(0.0, abs=0.02) and train_after["std"] == pytest.approx(1.0, abs=0.02)
    assert sum(feats["x"]["splits"][s]["before"]["count"] for s in both) == sum(r["x"] is not None for r in records)
    xs = [r["x"] for r in records if r["x"] is not None]
    assert min(feats["x"]["splits"][s]["before"]["min"] for s in both) == min(xs)
    assert max(feats["x"]["splits"][s]["before"]["max"] for s in both) == max(xs)
    colors = Counter(r["color"] for r in records if r["color"] is not None)
    got: Counter = Counter()
    for s in both:
        got.update(dict(feats["color"]["splits"][s]["terms"]))
    assert got == colors
    assert total("color", "missing") == sum(r["color"] is None for r in records)
    lengths = np.zeros(3, dtype=int)
    for s in both:
        ls = feats["tags"]["splits"][s]["lengths"]
        lengths[: len(ls)] += ls
    assert lengths.tolist() == np.bincount([min(len(r["tags"]), 2) for r in records], minlength=3).tolist()
    assert total("user_name", "missing") == 0 and total("user_name", "items") == len(records)
    labels: Counter = Counter()
    for s in both:
        sk = feats["y"]["splits"][s]["after"]
        labels[1] += round(sk["mean"] * sk["count"])
    assert labels[1] == sum(r["y"] for r in records)
    # the eval split's terms of the training vocabulary are not OOV; its rows are its own
    assert feats["color"]["splits"]["eval"]["oov"] == 0


def test_rejected_records_are_grouped_by_field_and_reason_with_examples(converted):
    out, _ = converted
    groups = json.loads((out / STATS_FILENAME).read_text())["rejections"]["groups"]
    assert sum(g["count"] for g in groups) == 2
    fields = {g["field"] for g in groups}
    assert "y" in fields and "<record>" in fields
    for g in groups:
        assert g["examples"] and g["examples"][0]["file"].endswith(".jsonl") and g["examples"][0]["reason"]


def test_overwrite_removes_the_stats_file_and_a_foreign_one_is_refused(tmp_path):
    data = write_dataset(tmp_path / "in", make_records(40))
    out = tmp_path / "out"
    out.mkdir()
    (out / STATS_FILENAME).write_text("{}")  # someone's file, under the name a conversion writes
    args = ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out), "--no-progress"]
    r = runner.invoke(app, args)
    assert r.exit_code != 0 and STATS_FILENAME in r.output
    (out / STATS_FILENAME).unlink()
    assert runner.invoke(app, args).exit_code == 0
    assert (out / STATS_FILENAME).exists()
    r = runner.invoke(app, [*args, "--overwrite", "--splits", "train=0.5,eval=0.5"])
    assert r.exit_code == 0, r.output
    assert json.loads((out / STATS_FILENAME).read_text())["splits"]["eval"]["records"] > 0


@pytest.mark.parametrize("name", ["../stats.json", "/etc/passwd", "gs://b/stats.json", "a\\b.json", ""])
def test_a_stats_file_outside_the_output_is_refused_when_the_metadata_loads(converted, name):
    from convert.spec import DatasetInfo, SpecError

    out, _ = converted
    meta = json.loads((out / "dataset_info.json").read_text())
    meta["stats_file"] = name
    with pytest.raises(SpecError, match="stats_file"):
        DatasetInfo.loads(json.dumps(meta))


def _comparable(doc: dict) -> dict:
    """A stats document without what legitimately differs between equal conversions:
    float rounding of the moments (merged in another order) and the input file names."""

    def walk(v):
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in ("m2", "file", "path")}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return round(v, 9) if isinstance(v, float) else v

    return walk({"features": doc["features"], "groups": [(g["field"], g["reason"], g["count"]) for g in doc["rejections"]["groups"]]})


def test_the_same_records_give_the_same_statistics_whatever_the_reader_and_the_work_units(tmp_path):
    """Avro (column fast paths) and JSON (per-record dicts) inputs, one unit or three: one document."""
    data = write_dataset(tmp_path / "in", make_records(300, seed=5))
    docs = []
    for inputs, shards in ((data["avro"], "1"), (data["avro"], "3"), (data["json"], "2")):
        out = tmp_path / f"o{len(docs)}"
        r = runner.invoke(app, ["convert", "-i", str(inputs), "-c", str(data["config"]), "-o", str(out),
                                "--num-shards", shards, "--no-progress"])
        assert r.exit_code == 0, r.output
        docs.append(_comparable(json.loads((out / STATS_FILENAME).read_text())))
    assert docs[0] == docs[1] == docs[2]


def _unit_stats(tmp_path, n_units: int) -> tuple[object, list[tuple[int, object]]]:
    """The config and each work unit's statistics, as the convert step emits them (JSON input
    with a malformed line and a record without label, so rejection groups too)."""
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.utils.windowed_value import WindowedValue

    from convert.analysis import Analyzer
    from convert.config import load_config
    from pipelines.analyze import AnalysisValue
    from pipelines.convert_pass import STATS_TAG, _ConvertUnit
    from pipelines.options import ConvertOptions
    from pipelines.plan import discover, plan_units

    records = make_records(400, seed=11)
    data = write_dataset(tmp_path / "in", records, bad_json_lines=True)
    config = load_config(str(data["config"]))
    files = discover([str(data["json"])])
    opts = ConvertOptions(inputs=(str(data["json"]),), config=str(data["config"]), output=str(tmp_path / "o"),
                          order="input", max_errors=10)
    a = Analyzer(config)
    a.add_records([r for r in records if r.get("y") is not None])
    analysis = AnalysisValue(a.result().to_json())
    fn = _ConvertUnit(config, opts, n_units)
    fn.start_bundle()
    out = []
    for unit in plan_units(files, n_units):
        out += list(fn.process(unit, analysis))
    out += [wv for wv in fn.finish_bundle()]
    tagged = [o.value for o in out if isinstance(o, TaggedOutput) and o.tag == STATS_TAG]
    return config, [(t.value if isinstance(t, WindowedValue) else t)[1] for t in tagged]


def test_units_statistics_merged_in_any_order_and_grouping_give_the_unit_order_document(tmp_path):
    """``StatsMerger`` (the lifted combine: units arrive in any order, grouped by worker, each
    group's merger pickled on its way to the commit) gives, byte for byte, the document of
    merging every unit's accumulator in unit order."""
    import pickle
    import random

    from convert.stats import StatsAccumulator, StatsMerger

    config, units = _unit_stats(tmp_path, 5)
    assert len(units) == 5 and sum(acc.rejected for _, acc in units) == 2
    names = ["train", "eval"]
    want = StatsAccumulator(config, names)
    for _, acc in sorted(pickle.loads(pickle.dumps(units)), key=lambda ua: ua[0]):
        want.merge(acc)
    want_doc = json.dumps(want.to_json())
    before = pickle.dumps(units)
    rng = random.Random(3)
    for _ in range(6):
        order = rng.sample(units, len(units))
        cut = rng.randint(0, len(order))
        groups = []
        for part in (order[:cut], order[cut:]):
            m = StatsMerger(config, names)
            for u, acc in part:
                m.add(u, acc)
            groups.append(pickle.loads(pickle.dumps(m)))  # across the combine's shuffle
        rng.shuffle(groups)
        groups[0].merge(groups[1])
        assert json.dumps(groups[0].result().to_json()) == want_doc
    assert pickle.dumps(units) == before  # the units' accumulators were read, not changed
    m, other = StatsMerger(config, names), StatsMerger(config, names)
    m.add(*units[0])
    with pytest.raises(ValueError, match="unit 0's statistics were added twice"):
        m.add(*units[0])
    other.add(*units[0])
    with pytest.raises(ValueError, match="unit 0's statistics were added twice"):
        m.merge(other)


@pytest.mark.parametrize("buckets", [1, 7, 9, 1000, 1 << 20])
def test_used_buckets_bitmap_is_the_set_of_ids_whichever_path_marks_them(buckets: int) -> None:
    """``_UsedBuckets.add`` marks a batch through a mask of every bucket (many ids per bucket) or by
    sorting the ids (few): either way bit ``id - 1``, most significant first, as ``np.packbits``."""
    from convert.stats import _UsedBuckets

    rng = np.random.default_rng(buckets)
    used, want = _UsedBuckets(buckets), np.zeros(buckets, dtype=bool)
    for n in (1, 3, 200, 5000):  # few ids per bucket, then many
        ids = rng.integers(1, buckets + 1, n)
        used.add(ids)
        want[ids - 1] = True
    assert used.bits is not None and used.bits.tobytes() == np.packbits(want).tobytes()
    assert used.count() == int(want.sum())
