"""convert.splits: deterministic split assignment from record content."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from convert.splits import SplitError, Splits


def _records(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "user": f"u{rng.randint(0, 300)}", "x": rng.random(), "tags": ["a", "b"][: i % 3],
             "nested": {"k": i % 5, "s": "\u00e9"}} for i in range(n)]


def test_same_records_same_split_every_call_and_independent_of_batching_and_order():
    s = Splits.parse("train=0.8,eval=0.1,test=0.1")
    recs = _records(2000)
    whole = s.assign(recs)
    assert whole.dtype == np.uint8 and whole.shape == (2000,)
    np.testing.assert_array_equal(s.assign(recs), whole)
    # in batches of any size
    pieces = np.concatenate([s.assign(recs[i:i + 37]) for i in range(0, len(recs), 37)])
    np.testing.assert_array_equal(pieces, whole)
    # shuffled: each record keeps its split
    order = list(range(len(recs)))
    random.Random(5).shuffle(order)
    shuffled = s.assign([recs[i] for i in order])
    np.testing.assert_array_equal(shuffled, whole[order])
    # one at a time
    assert [int(s.assign([r])[0]) for r in recs[:50]] == whole[:50].tolist()


def test_split_ignores_dict_key_order():
    """An Avro record and the same JSON record with keys in another order land in the same split."""
    s = Splits()
    a = [{"id": i, "v": {"p": 1, "q": [i]}} for i in range(300)]
    b = [{"v": {"q": [i], "p": 1}, "id": i} for i in range(300)]
    np.testing.assert_array_equal(s.assign(a), s.assign(b))


def test_split_is_stable_across_processes_and_hash_seeds():
    code = ("from convert.splits import Splits\n"
            "recs = [{'id': i, 'b': bytes([i % 256]), 'big': 2**70 + i} for i in range(200)]\n"
            "print(Splits.parse('a=1,b=1,c=1').assign(recs).tolist(),"
            " Splits.parse('a=1,b=1', key='id').assign(recs).tolist())\n")
    root = Path(__file__).resolve().parents[1]
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root,
                           env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}).stdout
            for seed in ("0", "4242")}
    assert len(outs) == 1


def test_split_key_keeps_all_records_of_a_key_together():
    s = Splits.parse("train=0.5,eval=0.5", key="user")
    recs = _records(3000)
    idx = s.assign(recs)
    by_user: dict[str, set[int]] = {}
    for r, i in zip(recs, idx.tolist(), strict=True):
        by_user.setdefault(r["user"], set()).add(i)
    assert all(len(v) == 1 for v in by_user.values())
    assert {next(iter(v)) for v in by_user.values()} == {0, 1}  # both splits used


def test_split_key_dotted_path_int_and_string_forms_agree():
    s = Splits.parse("train=0.5,eval=0.5", key="meta.uid")
    as_int = s.assign([{"meta": {"uid": i}, "x": 1} for i in range(200)])
    as_str = s.assign([{"meta": {"uid": str(i)}, "x": 2} for i in range(200)])
    np.testing.assert_array_equal(as_int, as_str)  # the key's canonical term, like vocabulary terms


def test_split_key_with_object_value_ignores_its_key_order():
    s = Splits.parse("train=0.5,eval=0.5", key="who")
    a = s.assign([{"who": {"org": i, "team": i % 3}} for i in range(300)])
    b = s.assign([{"who": {"team": i % 3, "org": i}} for i in range(300)])
    np.testing.assert_array_equal(a, b)
    assert set(a.tolist()) == {0, 1}


def test_split_key_missing_or_null_all_in_one_split():
    s = Splits.parse("train=0.5,eval=0.5", key="user")
    idx = s.assign([{"user": None, "i": i} for i in range(50)] + [{"i": i} for i in range(50)] + ["notadict"])
    assert len(set(idx.tolist())) == 1


def test_weights_roughly_respected_on_10k_records():
    s = Splits.parse("train=0.7,eval=0.2,test=0.1")
    idx = s.assign([{"i": i} for i in range(10_000)])
    frac = np.bincount(idx, minlength=3) / 10_000
    np.testing.assert_allclose(frac, [0.7, 0.2, 0.1], atol=0.03)


def test_weights_are_normalized_and_zero_weight_split_gets_nothing():
    idx = Splits.parse("a=3,b=0,c=1").assign([{"i": i} for i in range(4000)])
    counts = np.bincount(idx, minlength=3)
    assert counts[1] == 0
    assert abs(counts[0] / 4000 - 0.75) < 0.05


def test_single_split_gets_everything():
    s = Splits.parse("all=1")
    assert s.assign([{"i": i} for i in range(10)]).tolist() == [0] * 10
    assert s.assign([]).shape == (0,)


def test_empty_batch():
    assert Splits().assign([]).shape == (0,)


def test_bytes_and_ints_beyond_64_bits_do_not_crash_and_are_deterministic():
    s = Splits.parse("train=0.5,eval=0.5")
    recs = [{"b": bytes([i % 256]) * 3, "big": 2**64 + i, "neg": -(2**100) - i, "f": float("nan"),
             "raw": bytearray(b"\xff\x00")} for i in range(500)]
    idx = s.assign(recs)
    np.testing.assert_array_equal(idx, s.assign(recs))
    assert set(idx.tolist()) == {0, 1}
    keyed = Splits.parse("train=0.5,eval=0.5", key="big")
    np.testing.assert_array_equal(keyed.assign(recs), keyed.assign(list(reversed(recs)))[::-1])
    by_bytes = Splits.parse("train=0.5,eval=0.5", key="b")
    assert by_bytes.assign(recs).shape == (500,)


def test_records_of_other_types_do_not_crash():
    s = Splits()
    idx = s.assign([[1, 2], "text", 5, None, {"k": {1: "int key"}}, {"deep": [[[[1]]]]}])
    assert idx.shape == (6,)


@pytest.mark.parametrize("text, words", [
    ("train", ["name=weight", "'train'"]),
    ("train=abc,eval=0.1", ["'abc'", "'train'", "number"]),
    ("train=0.9,train=0.1", ["repeat"]),
    ("train=-1,eval=2", [">= 0"]),
    ("train=0,eval=0", ["sum"]),
    ("train=nan,eval=1", ["finite"]),
    ("train=inf,eval=1", ["finite"]),
    ("train=1e308,eval=1e308", ["sum overflows", "train=1e+308,eval=1e+308"]),
    (",".join(f"s{i}=1" for i in range(257)), ["257 splits", "256"]),
    ("=0.5,eval=0.5", ["identifier"]),
    ("tr ain=0.5,eval=0.5", ["identifier"]),
    ("train-1=0.5,eval=0.5", ["identifier"]),
    ("", ["name=weight"]),
])
def test_parse_errors(text, words):
    with pytest.raises(SplitError) as ei:
        Splits.parse(text)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_huge_weights_are_a_usage_error_on_the_command_line(tmp_path):
    """Weights that each fit a float but whose sum overflows used to send every record to the last split."""
    from typer.testing import CliRunner

    from pipelines.cli import app

    (tmp_path / "d.jsonl").write_text('{"x": 1}\n')
    (tmp_path / "c.yaml").write_text("features:\n  - {name: x, transform: identity}\n")
    r = CliRunner().invoke(app, ["convert", "-i", str(tmp_path / "d.jsonl"), "-c", str(tmp_path / "c.yaml"),
                                 "-o", str(tmp_path / "out"), "--splits", "train=1e308,eval=1e308"])
    assert r.exit_code == 2 and "--splits" in r.output and "overflows" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_large_finite_weights_are_normalized():
    np.testing.assert_allclose(Splits.parse("train=9e307,eval=1e307").bounds, [0.9, 1.0])


def test_parse_valid():
    s = Splits.parse(" train = 0.9 , eval=0.1", key="user_id")
    assert s.names == ("train", "eval") and s.weights == (0.9, 0.1) and s.key == "user_id"
    np.testing.assert_allclose(s.bounds, [0.9, 1.0])
    assert Splits() == Splits.parse("train=0.9,eval=0.1")


def _columns(records: list[dict]):
    from convert.column_records import ColumnRecords

    keys = list(records[0])
    return ColumnRecords({k: [r[k] for r in records] for k in keys}, len(records))


@pytest.mark.parametrize("case", ["plain", "nested_first_key", "pattern_in_strings", "bytes_and_floats", "one"])
def test_column_batches_get_the_splits_of_their_records(case):
    """Batches from the Avro fast path (``ColumnRecords``) are hashed from one
    orjson call cut into records; every record keeps the split of its dict."""
    from convert.splits import _canonical_batch

    recs = _records(500, seed=7)
    if case == "nested_first_key":  # a nested object whose first key is the record's: the cut would be wrong
        recs = [{"a": i, "z": [{"a": 1, "b": 2}] * (2 * (i % 2))} for i in range(300)]
    elif case == "pattern_in_strings":
        recs = [{"id": i, "s": '",{"id":' + ',{"id":' * (i % 3), "t": "},{"} for i in range(300)]
    elif case == "bytes_and_floats":
        recs = [{"b": bytes([i % 256]) * 3, "f": float(i) / 7, "n": None, "neg": -0.0, "m": {"y": 1, "x": [True]}}
                for i in range(300)]
    elif case == "one":
        recs = recs[:1]
    s = Splits.parse("train=0.5,eval=0.3,test=0.2")
    np.testing.assert_array_equal(s.assign(_columns(recs)), s.assign(recs))
    batch = _canonical_batch(_columns(recs))
    if case in ("nested_first_key", "one"):
        assert batch is None  # per record instead
    else:
        import orjson

        from convert.splits import _SORTED, _default
        assert batch == [orjson.dumps(r, option=_SORTED, default=_default) for r in recs]


@pytest.mark.parametrize("case", ["plain", "ragged_keys", "missing_first_key", "nested_first_key", "pattern_in_strings",
                                  "big_int", "not_all_dicts", "empty_dicts", "other_key_types"])
def test_dict_batches_hashed_in_one_call_are_their_records_bytes_or_go_per_record(case):
    """JSON batches (dicts, fields may differ per record) take the one-call cut only
    when every record has the batch's smallest key; the splits never change."""
    import orjson

    from convert.records import digest8
    from convert.splits import _SORTED, _canonical, _canonical_batch, _default

    recs: list = _records(300, seed=3)
    if case == "ragged_keys":  # extra and missing fields, all with the smallest key "a"
        recs = [{"a": i, **({"b": [i]} if i % 2 else {}), **({"zz": {"q": None}} if i % 3 else {})} for i in range(300)]
    elif case == "missing_first_key":  # one record lacks "a" while a nested {"a":...} would even out the count
        recs = [{"a": i, "b": 1} for i in range(300)]
        recs[5] = {"b": 2}
        recs[9] = {"a": 9, "b": [0, {"a": 1}]}
    elif case == "nested_first_key":
        recs = [{"a": i, "z": [{"a": 1, "b": 2}] * (2 * (i % 2))} for i in range(300)]  # the second one follows a comma
    elif case == "pattern_in_strings":
        recs = [{"id": i, "s": '",{"id":' * (i % 3)} for i in range(300)]
    elif case == "big_int":
        recs = [{"a": 2**70 + i} for i in range(300)]
    elif case == "not_all_dicts":
        recs = [{"a": 1}, [1, 2], {"a": 2}]
    elif case == "empty_dicts":
        recs = [{}, {}, {}]
    elif case == "other_key_types":
        recs = [{1: "x", "a": 2}, {1: "y", "a": 3}]
    s = Splits.parse("train=0.5,eval=0.3,test=0.2")
    per_record = [_canonical(r) for r in recs]
    batch = _canonical_batch(recs)
    if case in ("plain", "ragged_keys", "pattern_in_strings"):
        assert batch == [orjson.dumps(r, option=_SORTED, default=_default) for r in recs] == per_record
    else:
        assert batch is None  # per record instead
    want = (np.frombuffer(b"".join(map(digest8, per_record)), dtype="<u8") >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    np.testing.assert_array_equal(s.assign(recs), np.minimum(np.searchsorted(s.bounds, want, side="right"), 2))


@pytest.mark.parametrize("key", ["uid", "user.id", "user.id.deep", "absent", "absent.x"])
def test_column_batches_split_by_key_as_their_records(key):
    """``--split-key`` on a column batch reads the key's column (no dicts built)
    and gives every record the split of its dict, also when the path meets a
    null, a non-record value, or a field the batch does not have."""
    users = [{"id": 3}, None, {"id": "x"}, {"id": {"deep": 1.5}}, 7, {"other": 1}]
    recs = [{"uid": i % 11, "user": users[i % len(users)]} for i in range(300)]
    s = Splits.parse("train=0.5,eval=0.3,test=0.2", key=key)
    np.testing.assert_array_equal(s.assign(_columns(recs)), s.assign(recs))
    if key == "user.id":
        assert len(set(s.assign(recs).tolist())) > 1  # the key really varies the split
