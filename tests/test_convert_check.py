"""convert.check through its public functions: Avro schemas (named types, unions,
maps, arrays, recursion), JSON samples, and what a failed run reports."""

from __future__ import annotations

import io
import json

import fastavro
import numpy as np
import pytest

from convert.check import (
    DataMismatchError,
    SampleLimits,
    all_missing_message,
    avro_problems,
    check_inputs,
    common_rejection,
    sample_paths,
    sample_problems,
)
from convert.config import ConfigError, parse_config

ADDRESS = {"type": "record", "name": "Address", "namespace": "geo", "fields": [{"name": "city", "type": "string"}]}
SCHEMA = {"type": "record", "name": "Row", "namespace": "t", "fields": [
    {"name": "home", "type": ["null", ADDRESS]},
    {"name": "work", "type": ["null", "geo.Address"]},  # a reference to a named type
    {"name": "attrs", "type": {"type": "map", "values": "long"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "events", "type": {"type": "array", "items": {"type": "record", "name": "Ev", "fields": [{"name": "k", "type": "string"}]}}},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    {"name": "blob", "type": {"type": "fixed", "name": "F4", "size": 4}},
    {"name": "mixed", "type": ["null", "string", "long"]},
    {"name": "never", "type": "null"},
    {"name": "next", "type": ["null", "t.Row"]},  # recursive
    {"name": "y", "type": "int"},
]}


def _cfg(*features: str, label: str | None = "y") -> object:
    text = {"features": [json.loads(f) for f in features]}
    if label:
        text["label"] = label
    return parse_config(text)


def _problems(*features: str, label: str | None = "y") -> list[str]:
    return avro_problems(_cfg(*features, label=label), SCHEMA)


def test_paths_through_nullable_records_named_references_maps_and_recursion_are_found():
    assert _problems(
        '{"name": "home_city", "source": "home.city", "transform": "vocabulary"}',
        '{"name": "work_city", "source": "work.city", "transform": "hash", "buckets": 8}',
        '{"name": "color", "source": "attrs.color", "transform": "zscore"}',
        '{"name": "tags", "transform": "vocabulary", "max_len": 4}',
        '{"name": "ts", "transform": "timestamp"}',
        '{"name": "kind", "transform": "vocabulary"}',
        '{"name": "blob", "transform": "bytes"}',
        '{"name": "mixed", "transform": "zscore"}',
        '{"name": "deep", "source": "next.next.home.city", "transform": "vocabulary"}',
        '{"name": "c", "transform": "cross", "sources": ["home.city", "kind"], "buckets": 8}',
    ) == []


@pytest.mark.parametrize("feature,expected", [
    ('{"name": "home_cty", "source": "home.cty", "transform": "vocabulary"}', "did you mean 'home.city'"),
    ('{"name": "tag", "transform": "vocabulary", "max_len": 2}', "did you mean 'tags'"),
    ('{"name": "k", "source": "events.k", "transform": "vocabulary"}', "'events' is an array of a record (k), a path cannot go into it"),
    ('{"name": "t", "source": "tags.x", "transform": "vocabulary"}', "'tags' is an array of string"),
    ('{"name": "tags", "transform": "vocabulary"}', "set max_len"),
    ('{"name": "tags", "transform": "zscore"}', "transform 'zscore' takes one value per record"),
    ('{"name": "kind", "transform": "zscore"}', "use a categorical transform"),
    ('{"name": "home", "transform": "vocabulary"}', "e.g. home.city"),
    ('{"name": "attrs", "transform": "hash", "buckets": 3}', "is a map in the schema"),
    ('{"name": "ts", "transform": "text", "max_len": 3}', "needs strings"),
    ('{"name": "ts", "transform": "bytes"}', "needs bytes or strings"),
    ('{"name": "never", "transform": "identity"}', "always null in the schema"),
])
def test_a_path_or_type_the_schema_cannot_give_is_named(feature, expected):
    problems = _problems(feature)
    assert len(problems) == 1 and expected in problems[0], problems


def test_allow_all_missing_tolerates_absence_but_not_a_wrong_type():
    assert _problems('{"name": "gone", "transform": "zscore", "allow_all_missing": true}',
                     '{"name": "never", "transform": "identity", "allow_all_missing": true}') == []
    assert "use a categorical" in _problems('{"name": "kind", "transform": "zscore", "allow_all_missing": true}')[0]


def test_label_path_and_type_are_checked():
    assert "the label reads 'yy': no field 'yy' in the schema; did you mean 'y'?" in _problems(
        '{"name": "kind", "transform": "vocabulary"}', label="yy")[0]
    assert "the label needs integers" in _problems('{"name": "y", "transform": "identity"}', label="kind")[0]


def test_json_sample_paths_count_nulls_and_nested_objects_and_go_into_lists_with_brackets():
    recs = [{"a": None, "u": {"b": 1, "c": {"d": None}}, "l": [{"x": 1}]}, "not a record"]
    assert sample_paths(recs) == {"a", "u", "u.b", "u.c", "u.c.d", "l", "l[]", "l[].x"}
    cfg = _cfg('{"name": "a", "transform": "zscore"}', '{"name": "ub", "source": "u.bb", "transform": "zscore"}',
               '{"name": "lx", "source": "l.x", "transform": "zscore"}', label=None)
    problems = sample_problems(cfg, sample_paths(recs), 2)
    assert len(problems) == 2
    assert "'u.bb', which none of the 2 sampled records has; did you mean 'u.b'?" in problems[0]
    assert "'l.x'" in problems[1] and "did you mean 'l[].x'" in problems[1]


def _avro_bytes(schema, records) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, schema, records)
    return buf.getvalue()


def test_check_inputs_reads_every_avro_header_and_reports_each_schema():
    small = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    renamed = {"type": "record", "name": "R", "fields": [{"name": "xx", "type": "long"}]}
    files = {"a.avro": _avro_bytes(small, [{"x": 1}]), "b.avro": _avro_bytes(small, [{"x": 2}]),
             "c.avro": _avro_bytes(renamed, [{"xx": 3}]), "d.jsonl": b'{"x": 1}\n{"x": null}\n',
             "bad.avro": b"Obj\x01 truncated"}
    opened: list[str] = []

    def open_file(path):
        opened.append(path)
        return io.BytesIO(files[path])

    cfg = _cfg('{"name": "x", "transform": "zscore"}', label=None)
    with pytest.raises(DataMismatchError) as e:
        check_inputs(cfg, sorted(files), open_file)
    msg = str(e.value)
    assert isinstance(e.value, ConfigError)
    assert "in the Avro schema of c.avro:" in msg and "did you mean 'xx'" in msg
    assert "a.avro" not in msg and "bad.avro" not in msg  # a file the run will report itself
    assert set(opened) >= set(files)
    done = check_inputs(cfg, ["a.avro", "b.avro", "d.jsonl"], open_file)
    assert done.describe() == "2 Avro schema(s) (1 distinct); 2 records sampled from 1 JSON file(s)"


def test_json_sampling_is_bounded_and_reads_on_only_for_unseen_paths():
    def lines(key, n):
        return b"".join(b'{"%s": %d}\n' % (key.encode(), i) for i in range(n))

    files = {f"{i}.jsonl": lines("a", 50) for i in range(6)}
    files["6.jsonl"] = lines("b", 50)
    opened: list[str] = []

    def open_file(path):
        opened.append(path)
        return io.BytesIO(files[path])

    limits = SampleLimits(records=10, bytes=1 << 20, files=2, max_files=10)
    only_a = _cfg('{"name": "a", "transform": "zscore"}', label=None)
    got = check_inputs(only_a, sorted(files), open_file, limits=limits)
    assert got.json_files == 2 and got.json_records == 20
    both = _cfg('{"name": "a", "transform": "zscore"}', '{"name": "b", "transform": "zscore"}', label=None)
    assert check_inputs(both, sorted(files), open_file, limits=limits).json_files == 7
    with pytest.raises(DataMismatchError, match="'b', which none of the 30 sampled records"):
        check_inputs(both, sorted(files), open_file, limits=SampleLimits(records=10, files=2, max_files=3))


def test_common_rejection_names_the_shared_field_and_reason():
    rows = [{"field": "salry", "reason": "label missing", "record": {"age": 1, "salary": 2}}] * 3
    assert common_rejection(rows) == "field 'salry' (label missing); the records' fields are: age, salary"
    varied = [{**rows[0], "reason": f"found {i}"} for i in range(3)]
    assert common_rejection(varied) == "field 'salry' (the first: found 0); the records' fields are: age, salary"
    assert common_rejection([rows[0], {**rows[0], "field": "age"}]) is None
    assert common_rejection([]) is None
    assert common_rejection([{"field": "<record>", "reason": "malformed JSON", "record": "{"}]) == "field '<record>' (malformed JSON)"


def test_all_missing_message_exempts_allowed_features_and_empty_training_splits():
    cfg = _cfg('{"name": "a", "transform": "zscore"}', '{"name": "b", "transform": "hash", "buckets": 4, "allow_all_missing": true}',
               '{"name": "c", "transform": "cross", "sources": ["a", "z"], "buckets": 4}', label=None)
    msg = all_missing_message(cfg, {"a": 0, "b": 0, "c": 0}, 10)
    assert msg is not None and "feature 'a' (source 'a')" in msg and "feature 'c' (source 'a', 'z')" in msg
    assert "'b'" not in msg and "every one of the 10 training records" in msg
    assert all_missing_message(cfg, {"a": 1, "b": 0, "c": 5}, 10) is None
    assert all_missing_message(cfg, {"a": 0, "b": 0, "c": 0}, 0) is None


# The training split's value counts (Analyzer.present) decide the all-missing
# check: the pipeline's count (prepared batches) and the record-by-record one
# must agree on which features had no value at all.
_COUNT_CFG = {"features": [
    {"name": "i", "transform": "identity"}, {"name": "z", "transform": "zscore"},
    {"name": "lg", "source": "nl", "transform": "log1p", "max_len": 2}, {"name": "bk", "source": "z", "transform": "bucketize"},
    {"name": "v", "transform": "vocabulary"}, {"name": "vl", "transform": "vocabulary", "max_len": 2},
    {"name": "t", "transform": "text", "max_len": 3}, {"name": "h", "transform": "hash", "buckets": 7},
    {"name": "hl", "source": "vl", "transform": "hash", "buckets": 7, "max_len": 2}, {"name": "b", "source": "v", "transform": "bytes"},
    {"name": "ts", "transform": "timestamp"}, {"name": "x", "transform": "cross", "sources": ["v", "h"], "buckets": 5},
]}


def _field(values):
    from hypothesis import strategies as st

    return st.one_of(st.just("<absent>"), st.none(), values)


def _records_strategy():
    from hypothesis import strategies as st

    word = st.sampled_from(["", " ", "a", "b c", "-"])
    item_lists = st.lists(st.one_of(st.none(), word), max_size=2)
    return st.lists(st.fixed_dictionaries({
        "i": _field(st.integers(-5, 5)), "z": _field(st.floats(-1e3, 1e3)),
        "nl": _field(st.lists(st.one_of(st.none(), st.floats(0, 9)), max_size=2)),
        "v": _field(word), "vl": _field(item_lists), "t": _field(word), "h": _field(st.integers(0, 3)),
        "ts": _field(st.integers(0, 10**12)),
    }).map(lambda r: {k: v for k, v in r.items() if v != "<absent>"}), max_size=12)


def test_pipeline_and_record_by_record_counts_agree_on_features_without_values():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from convert.analysis import Analyzer
    from convert.prepare import Preparer

    config = parse_config(_COUNT_CFG)

    @settings(max_examples=150, deadline=None)
    @given(_records_strategy(), st.randoms(use_true_random=False))
    def check(records, rnd):
        pb = Preparer(config).prepare(records, analyze=True)
        rows = np.array([rnd.random() < 0.7 and i not in pb.bad for i in range(len(records))], dtype=bool)
        fast = Analyzer(config)
        fast.add_prepared(pb, rows)
        ref = Analyzer(config)
        ref.add_records([r for r, keep in zip(records, rows.tolist(), strict=True) if keep])
        for f in config.features:
            assert (fast.present[f.name] == 0) == (ref.present[f.name] == 0), (f.name, fast.present, ref.present)

    check()


def test_many_problems_are_listed_up_to_a_limit_and_counted():
    small = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    cfg = _cfg(*[json.dumps({"name": f"f{i}", "transform": "zscore"}) for i in range(25)], label=None)

    with pytest.raises(DataMismatchError) as e:
        check_inputs(cfg, ["a.avro"], lambda p: io.BytesIO(_avro_bytes(small, [{"x": 1}])))
    msg = str(e.value)
    assert msg.count("    - feature 'f") == 20 and "... and 5 more" in msg and "allow_all_missing" in msg
    with pytest.raises(DataMismatchError) as e:
        check_inputs(_cfg('{"name": "x", "transform": "zscore"}', label="yy"), ["a.avro"],
                      lambda p: io.BytesIO(_avro_bytes(small, [{"x": 1}])))
    assert "the label reads 'yy'" in str(e.value) and "allow_all_missing" not in str(e.value)


def test_schema_check_accepts_every_random_case_the_vectorizer_converts():
    """The random Avro cases of tests/_record_strategies.py convert without a rejection
    (test_property_roundtrip.py); the schema check must find nothing wrong with them."""
    from _record_strategies import avro_cases
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(avro_cases())
    def check(case):
        assert avro_problems(parse_config(case.config), case.schema) == []

    check()


def test_a_type_the_schema_does_not_define_is_left_to_the_run():
    schema = {"type": "record", "name": "R", "fields": [{"name": "ext", "type": ["null", "other.Thing"]}]}
    cfg = _cfg('{"name": "e", "source": "ext", "transform": "zscore"}',
               '{"name": "ea", "source": "ext.a", "transform": "vocabulary"}', label=None)
    assert avro_problems(cfg, schema) == []
