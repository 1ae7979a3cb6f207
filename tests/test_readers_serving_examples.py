"""The ``serve_examples`` signature: serialized ``tf.train.Example`` protos of raw
records map to exactly the converter's features.

Records are drawn from what an Example carries (integers, float32 floats,
UTF-8 strings, lists without nulls, nested records flattened to their paths)
and compared, through ``readers._serving_examples.to_example``, with the
converter's Examples of the same records (``tests/test_readers_serving``'s
parity machinery): features equal bit for bit, rejections agree except for the
documented limits.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_readers_serving import (
    EXAMPLES,
    HASHED_SUPPORTED,
    REALDATA,
    ROOT,
    SERVING_LIMITS,
    TS_STRINGS,
    WORDS,
    _config,
    _realdata_files,
    _records_of,
    _train_record,
    assert_same,
    cli,
    converter_examples,
)

import readers
from readers import transforms
from readers._serving_examples import ExampleDecoder, to_example, transform_examples

#: Layer errors allowed on records the converter accepts: the documented serving limits, and a
#: float whose term (Python's repr) the graph cannot compute.
EXAMPLE_LIMITS = (*SERVING_LIMITS, "a non-integral float or bytes that are not UTF-8 where a term is read")
#: Sources read as a term (vocabulary, hash, cross): a bool there travels as "true"/"false".
TERM_FIELDS = ("cat", "tags", "tags2", "flag", "user", "deep")


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    """The output of ``tests/test_readers_serving``: every transform and option."""
    root = tmp_path_factory.mktemp("serving_examples")
    (root / "in").mkdir()
    (root / "in" / "train.jsonl").write_text("".join(json.dumps(_train_record(i)) + "\n" for i in range(240)))
    (root / "features.yaml").write_text(_config(HASHED_SUPPORTED))
    r = cli("convert", "--input", root / "in", "--config", root / "features.yaml", "--output", root / "out",
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    return root / "out"


@pytest.fixture(scope="module")
def layer(output) -> readers.TransformLayer:
    return readers.transform_layer(str(output))


@pytest.mark.parametrize("name", transforms.names())
def test_the_example_parity_output_has_features_of_every_registered_transform(layer, name):
    """The Example parity tests run every transform of the serving registry."""
    assert any(f.transform == name for f in layer.config.features), name


def _keys(layer: readers.TransformLayer) -> list[str]:
    return list(ExampleDecoder(layer.config, layer.wire).keys.values())


def check_example_parity(output: Path, layer: readers.TransformLayer, records: list[Any]) -> None:
    """The converter's features of ``records`` equal ``serve_examples``' of their Examples, bit for bit."""
    expected, kept, rejections = converter_examples(output, records)
    keys = _keys(layer)
    features, errors = transform_examples(layer, tf.constant([to_example(r, keys) for r in records], tf.string))
    errors = [e.decode("utf-8") for e in errors.numpy().tolist()]
    conv_rejected = {r.index for r in rejections}
    layer_rejected = {i for i, e in enumerate(errors) if e}
    missed = conv_rejected - layer_rejected
    assert not missed, [(records[i], [r.reason for r in rejections if r.index == i]) for i in sorted(missed)][:3]
    for i in sorted(layer_rejected - conv_rejected):
        assert any(why in errors[i] for why in EXAMPLE_LIMITS), (records[i], errors[i])
    rows = [i for i in kept.tolist() if i not in layer_rejected]
    pick = np.array([np.flatnonzero(kept == i)[0] for i in rows], dtype=np.int64)
    assert set(expected) == set(features)
    for name, exp in expected.items():
        got = features[name].numpy()[rows] if rows else features[name].numpy()[:0]
        assert_same(name, exp[pick] if rows else exp[:0], got, [records[i] for i in rows])


def as_example_record(v: Any, term: bool = False) -> Any:
    """``v`` as an Example carries it: floats rounded to float32, bools as 0/1 or, where a
    term is read, "true"/"false"; a list's nulls dropped."""
    if isinstance(v, bool):
        return ("true" if v else "false") if term else int(v)
    if isinstance(v, float):
        return float(np.float32(v))
    if isinstance(v, dict):
        return {k: as_example_record(x, term or k in TERM_FIELDS) for k, x in v.items()}
    if isinstance(v, list):
        return [as_example_record(x, term) for x in v if x is not None]
    return v


# ------------------------------------------------------------------ random records an Example carries

F32 = st.floats(width=32)
INTS = st.integers(-(2**63), 2**63 - 1)
NUMBERS = st.one_of(F32, INTS, st.integers(-3, 20), st.integers(-3, 20).map(float),
                    st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1.0, 0.5, 3.4028234663852886e38]))
STRINGS = st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=10),
                    st.sampled_from(["a", "b", "é", "7", "", "true", "x", "y", "nan", "inf", *WORDS]))
SCALARS = st.one_of(NUMBERS, STRINGS)


def several(items: st.SearchStrategy) -> st.SearchStrategy:
    """A list where a single value belongs: two or more values (one value is the value itself)."""
    return st.lists(items, min_size=2, max_size=3)


def listed(items: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(st.none(), st.lists(items, max_size=6), items)


VALUES = {
    "num": st.one_of(st.none(), NUMBERS, NUMBERS, STRINGS, several(NUMBERS)),
    "nums": st.one_of(listed(NUMBERS), listed(STRINGS)),
    "cat": st.one_of(st.none(), SCALARS, several(STRINGS)),
    "tags": st.one_of(listed(STRINGS), listed(NUMBERS)),
    "ts": st.one_of(st.none(), INTS, F32, TS_STRINGS, several(INTS)),
    "text": st.one_of(st.none(), STRINGS, st.sampled_from(WORDS).map(lambda w: f" {w}, {w.upper()}!"), NUMBERS),
    "blob": st.one_of(st.none(), STRINGS, NUMBERS),
}
FIELDS = {"num": "num", "num2": "num", "num3": "num", "nums": "nums", "cat": "cat", "tags": "tags", "tags2": "tags",
          "flag": "cat", "ts": "ts", "day": "ts", "secs": "ts", "blob": "blob", "query": "text"}


@st.composite
def records(draw) -> dict[str, Any]:
    r: dict[str, Any] = {}
    for name, kind in FIELDS.items():
        if draw(st.integers(0, 5)):
            r[name] = draw(VALUES[kind])
    if draw(st.booleans()):
        r["user"] = draw(st.one_of(st.none(), st.fixed_dictionaries(
            {}, optional={"id": VALUES["cat"], "segment": st.one_of(st.sampled_from(["s1", "s2", "s3"]), VALUES["cat"])})))
    if draw(st.booleans()):
        r["deep"] = draw(st.one_of(st.none(), st.fixed_dictionaries({}, optional={"a": st.one_of(st.none(), st.fixed_dictionaries(
            {}, optional={"b": VALUES["cat"], "n": st.one_of(NUMBERS, st.none())}))})))
    return r


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(records(), min_size=1, max_size=12))
def test_example_parity_on_random_records(output, layer, recs):
    check_example_parity(output, layer, recs)


def test_example_parity_on_training_records(output, layer):
    check_example_parity(output, layer, [as_example_record(_train_record(i)) for i in range(240)])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["clicks-0.avro", "clicks-1.jsonl"])
def test_example_parity_on_examples_data(name, tmp_path):
    from _expected_values import json_lines, raw_avro_records
    out = tmp_path / "out"
    r = cli("convert", "-i", EXAMPLES / name, "-c", ROOT / "examples" / "features.yaml", "-o", out, "--splits", "train=1",
            "--num-shards", "1", "--max-error-fraction", "1", "--no-progress")
    assert r.exit_code == 0, r.output
    path = EXAMPLES / name
    recs = raw_avro_records(path) if path.suffix == ".avro" else json_lines(path)
    check_example_parity(out, readers.transform_layer(str(out)), [as_example_record(x) for x in recs])


# ------------------------------------------------------------------ the mapping, row by row


def _example(**features: tf.train.Feature) -> bytes:
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _ints(*v: int) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))


def _floats(*v: float) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=v))


def _bytes(*v: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=v))


def test_one_key_holds_an_integer_in_one_row_and_a_float_in_the_next(layer):
    """Unlike ``tf.io.parse_example`` (one dtype per key, a batch error otherwise), each row's list type is its kind."""
    got, errors = transform_examples(layer, tf.constant([_example(num3=_ints(4)), _example(num3=_floats(4.0)), _example()]))
    want, _ = layer.transform_records([{"num3": 4}, {"num3": 4.0}, {}])
    assert errors.numpy().tolist() == [b"", b"", b""]
    for name in ("n_clip", "n_clip_missing", "n_id_mean"):
        np.testing.assert_array_equal(got[name].numpy(), want[name])


def test_rejected_rows_get_the_layers_reason_and_the_others_convert(layer):
    rows = [_example(num3=_bytes(b"seven")), _example(num=_floats(math.nan), num3=_ints(1)), _example(cat=_floats(2.5)),
            _example(cat=_bytes(b"\xff")), _example(num3=_ints(1, 2)), _example(cat=_floats(7.0), tags=_ints(1, 2, 3, 4))]
    _, errors = transform_examples(layer, tf.constant(rows))
    errors = [e.decode() for e in errors.numpy().tolist()]
    layer_errors = layer.transform_records([{"num3": "seven"}, {"num": math.nan, "num3": 1}, {}, {}, {"num3": [1, 2]}, {}])[1]
    assert errors[0] == layer_errors[0] and errors[0].startswith("num3: expected a number")
    assert errors[1] == layer_errors[1]
    assert errors[2].startswith("cat: a non-integral float") and errors[3].startswith("cat: a non-integral float")
    assert errors[4] == layer_errors[4] and errors[4].startswith("num3: expected a number, found nested")
    assert errors[5] == ""


def test_a_repeated_key_reads_its_last_value_as_protobuf_maps_merge(layer):
    entry = tf.train.Features(feature={"num3": _ints(3)}).SerializeToString()
    twice = tf.train.Features(feature={"num3": _ints(9)}).SerializeToString()
    merged = tf.train.Example.FromString(b"\x0a" + bytes([len(entry + twice)]) + entry + twice)
    assert merged.features.feature["num3"].int64_list.value == [9]
    got, _ = transform_examples(layer, tf.constant([b"\x0a" + bytes([len(entry + twice)]) + entry + twice]))
    want, _ = layer.transform_records([{"num3": 9}])
    np.testing.assert_array_equal(got["n_id_mean"].numpy(), want["n_id_mean"])


def test_to_example_names_what_cannot_travel():
    with pytest.raises(ValueError, match="tags: a null or nested item"):
        to_example({"tags": ["a", None]}, ["tags"])
    with pytest.raises(ValueError, match="cat: one Example feature holds one type"):
        to_example({"cat": ["a", 1]}, ["cat"])


def test_export_has_both_signatures_and_they_agree(output, layer, tmp_path):
    from test_readers_serving import _model
    info = readers.load_info(str(output))
    export = tmp_path / "export"
    readers.export_serving(_model(info), layer, str(export))
    loaded = tf.saved_model.load(str(export))
    by_examples = loaded.signatures["serve_examples"]
    assert list(by_examples.structured_input_signature[1]) == ["examples"]
    recs = [as_example_record(_train_record(i)) for i in range(8)] + [{"num3": "x"}]
    keys = _keys(layer)
    got = by_examples(examples=tf.constant([to_example(r, keys) for r in recs]))
    want = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in layer.encode(recs).items()})
    assert set(got) == set(want) == {"outputs", "recordprep_error"}
    np.testing.assert_array_equal(got["outputs"].numpy(), want["outputs"].numpy())
    assert got["recordprep_error"].numpy().tolist() == want["recordprep_error"].numpy().tolist()
    assert got["recordprep_error"].numpy()[-1].startswith(b"num3: expected a number")
    assert json.loads((export / "assets.extra" / "recordprep_config.json").read_text())["example_keys"] == keys



def test_the_docs_rest_example_holds_the_records_it_names():
    """docs/serving.md's serve_examples request: its base64 Examples are those of the records it shows."""
    import base64
    import re
    text = (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
    sent = re.findall(r'"examples": \{"b64": "([^"]+)"\}', text)
    records = [{"age": 43, "price": 9.5, "country": "US", "tags": ["vip", "promo"]}, {"price": 2.0, "country": "FR"}]
    assert "`{\"age\": 43, \"price\": 9.5, \"country\": \"US\", \"tags\": [\"vip\", \"promo\"]}`" in text
    parse = tf.train.Example.FromString  # a map's serialized order is not fixed: compare the messages
    assert [parse(base64.b64decode(b)) for b in sent] == [parse(to_example(r, ["age", "price", "country", "tags"]))
                                                          for r in records]


# ------------------------------------------------------------------ real files from other tools


def _travels_exactly(record: Any, keys: dict[str, bool]) -> bool:
    """Whether ``to_example(record)`` says what the record holds at each key (``{key: read as a list}``):
    no bool or bytes (an Example has neither), floats float32 can hold, no one-item or empty list where a
    single value is read (an Example's one value is the value), and what ``to_example`` takes at all."""
    from convert.config import is_multi_path
    from convert.records import getter
    if not isinstance(record, dict):
        return False
    for key, is_list in keys.items():
        v = getter(key)(record)
        items = list(v) if isinstance(v, list | tuple) else [] if v is None else [v]
        if isinstance(v, list | tuple) and len(v) < 2 and not is_list and not is_multi_path(key):
            return False
        floats = any(isinstance(x, float) for x in items)
        for x in items:
            if isinstance(x, bool | bytes | bytearray):
                return False
            if floats and isinstance(x, int | float) and not (x != x or float(np.float32(x)) == x):
                return False
    try:
        to_example(record, list(keys))
    except (ValueError, TypeError, UnicodeEncodeError):
        return False
    return True


def _float32(v: Any) -> Any:
    """``v`` with its floats rounded to float32, as a client with a float64 field sends them (``float_list``)."""
    if isinstance(v, float):
        with np.errstate(over="ignore"):
            return float(np.float32(v))
    if isinstance(v, dict):
        return {k: _float32(x) for k, x in v.items()}
    return [_float32(x) for x in v] if isinstance(v, list) else v


@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "README.md").is_file(), reason=f"{REALDATA} is absent (real AVRO/JSON files from other tools)")
@pytest.mark.parametrize("rel", _realdata_files() or ["absent"])
def test_example_parity_on_real_files(rel, tmp_path):
    """The records of real files (floats rounded to float32) whose Example says what they hold map to the
    converter's features, bit for bit."""
    path = REALDATA / rel
    flags = ["--json-records-path", "users"] if rel.endswith("sample_utf8_bom.json") else []
    r = cli("infer", "-i", path, *flags)
    if r.exit_code != 0:
        pytest.skip(f"recordprep infer cannot draft a config for {rel} (tests/test_realdata_convert.py covers why)")
    (tmp_path / "features.yaml").write_text(r.stdout.replace("allow_all_missing: false", "allow_all_missing: true"))
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", tmp_path / "features.yaml", "-o", out, "--splits", "train=1", "--num-shards", "1",
            "--max-error-fraction", "1", "--no-progress", *flags)
    if r.exit_code != 0:
        pytest.skip(f"{rel} does not convert with its inferred config (tests/test_realdata_convert.py covers why)")
    try:
        layer = readers.transform_layer(str(out))
    except readers.SpecError as e:  # refused with a reason (tests/test_readers_serving.py checks which)
        pytest.skip(str(e))
    decoder = ExampleDecoder(layer.config, layer.wire)
    keys = {key: layer.wire.by_path(p).is_list for p, key in decoder.keys.items()}
    recs = [x for x in map(_float32, _records_of(path, flags)) if _travels_exactly(x, keys)]
    if not recs:
        pytest.skip(f"no record of {rel} travels exactly in a tf.train.Example (bools, bytes, nested or null items)")
    check_example_parity(out, layer, recs)


def test_paths_through_lists_take_each_items_values(tmp_path):
    """``items[].name`` (a text: the strings joined) and ``items[].price`` (a list) read their values from
    the feature keyed by the path, as the converter walks the records."""
    recs = [{"items": [{"name": f"red box {i}", "price": float(i) + 0.5}, {"name": "Blue", "price": i}][: i % 3]}
            for i in range(40)] + [{"items": None}, {}]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "features.yaml").write_text(
        "features:\n  - {name: names, source: 'items[].name', transform: text, max_len: 4}\n"
        "  - {name: prices, source: 'items[].price', transform: identity, max_len: 3, missing_indicator: true}\n")
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in", "--config", tmp_path / "features.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    layer = readers.transform_layer(str(out))
    assert _keys(layer) == ["items[].name", "items[].price"]
    check_example_parity(out, layer, recs + [{"items": [{"name": "x", "price": 1}] * 5}])
