"""What an exported SavedModel does with requests no client of ``encode`` or
``to_example`` writes: a request of the wrong shape fails naming the input, a
malformed Example or an oversized record is rejected in its own row (the other
rows' features unchanged, bit for bit), a request over the export's byte bound
fails before any work. Every test calls a real export's signatures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from _e2e import cli

import readers
from pipelines.cli import serving as serving_cli
from readers import _serving_limits
from readers._serving_examples import MALFORMED, example_keys, to_example

CONFIG = """label: {source: y, dtype: float32}
features:
  - {name: age, transform: zscore, missing_indicator: true}
  - {name: country, transform: vocabulary}
  - {name: tags, transform: vocabulary, max_len: 3}
  - {name: nums, transform: identity, max_len: 2}
  - {name: q, source: query, transform: text, max_len: 4}
  - {name: blob, transform: bytes}
"""
MAX_RECORD = 4096
MAX_REQUEST = 64 * 1024


def _record(i: int) -> dict[str, Any]:
    return {"y": float(i % 2), "age": 20 + i % 37, "country": ["US", "FR", "DE"][i % 3],
            "tags": ["a", "b", "c", "d"][: i % 5], "nums": [i * 0.5, -i][: i % 3],
            "query": f"red fox {i} jumps", "blob": f"b{i}"}


class _Features(tf.Module):
    """A model whose outputs are its inputs: the export returns the features themselves."""

    def __call__(self, features: dict[str, tf.Tensor], training: bool = False) -> dict[str, tf.Tensor]:
        return dict(features)


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("serving_requests")
    (root / "in").mkdir()
    (root / "in" / "train.jsonl").write_text("".join(json.dumps(_record(i)) + "\n" for i in range(60)))
    (root / "features.yaml").write_text(CONFIG)
    r = cli("convert", "--input", root / "in", "--config", root / "features.yaml", "--output", root / "out",
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    return root / "out"


@pytest.fixture(scope="module")
def layer(output) -> readers.TransformLayer:
    return readers.transform_layer(str(output))


@pytest.fixture(scope="module")
def export(output, layer, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("serving_requests_export") / "1"
    readers.export_serving(_Features(), layer, str(path), max_request_bytes=MAX_REQUEST, max_record_bytes=MAX_RECORD)
    return path


@pytest.fixture(scope="module")
def signatures(export) -> Any:
    return tf.saved_model.load(str(export)).signatures


def _packed(signatures: Any, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()}).items()}


def _examples(signatures: Any, serialized: list[bytes]) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in signatures["serve_examples"](examples=tf.constant(serialized, tf.string)).items()}


def _assert_rows_identical(got: dict[str, np.ndarray], rows: list[int], want: dict[str, np.ndarray]) -> None:
    """``got``'s ``rows`` hold ``want``'s outputs, as bytes (float32 bits, -0.0 and NaN included)."""
    assert set(got) == set(want)
    for k, v in want.items():
        g = got[k][rows]
        assert g.dtype == v.dtype and g.shape == v.shape, k
        if v.dtype == object:
            assert g.tolist() == v.tolist(), k
        else:
            assert g.tobytes() == v.tobytes(), k


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (lengths below 128)."""
    assert len(payload) < 128
    return bytes([field << 3 | 2, len(payload)]) + payload


#: Serialized bytes protobuf cannot parse as an Example, failing at each level of its decoding.
MALFORMED_EXAMPLES = {
    "bad tag": b"\xff\xff",
    "cut short": to_example(_record(1), ["age", "country"])[:-1],
    "length past the end": b"\x0a\x05abc",
    "bad Features": _ld(1, b"\x0a\x05ab"),
    "bad Feature": _ld(1, _ld(1, _ld(1, b"age") + _ld(2, b"\x1a\x05\x0a"))),
    "bad Int64List": _ld(1, _ld(1, _ld(1, b"age") + _ld(2, _ld(3, b"\x0a\x02\x96")))),
}


@pytest.mark.parametrize("how", list(MALFORMED_EXAMPLES))
def test_a_malformed_example_is_rejected_in_its_row_and_the_other_rows_are_unchanged(signatures, layer, how):
    keys = list(example_keys(layer.config, layer.wire).values())
    good = [to_example(_record(i), keys) for i in range(6)] + [b""]  # b"": an Example with every field absent
    want = _examples(signatures, good)
    assert not any(want["recordprep_error"])
    bad = MALFORMED_EXAMPLES[how]
    got = _examples(signatures, [bad, *good[:3], bad, *good[3:], bad])
    errors = got["recordprep_error"].tolist()
    assert errors[0] == errors[4] == errors[-1] == MALFORMED.encode()
    _assert_rows_identical(got, [1, 2, 3, 5, 6, 7, 8], want)


def test_a_batch_of_malformed_examples_only_is_rejected_row_by_row(signatures):
    got = _examples(signatures, list(MALFORMED_EXAMPLES.values()))
    assert got["recordprep_error"].tolist() == [MALFORMED.encode()] * len(MALFORMED_EXAMPLES)


def test_a_record_over_max_record_bytes_is_rejected_alone_in_both_signatures(signatures, layer):
    keys = list(example_keys(layer.config, layer.wire).values())
    recs = [_record(i) for i in range(4)]
    big = {**_record(9), "query": "word " * (MAX_RECORD // 5 + 1)}
    got = _examples(signatures, [to_example(r, keys) for r in recs[:2] + [big] + recs[2:]])
    error = got["recordprep_error"][2].decode()
    assert error.startswith("examples: the serialized Example has ") and f"max_record_bytes ({MAX_RECORD})" in error
    _assert_rows_identical(got, [0, 1, 3, 4], _examples(signatures, [to_example(r, keys) for r in recs]))
    got = _packed(signatures, layer.encode(recs[:2] + [big] + recs[2:]))
    error = got["recordprep_error"][2].decode()
    assert error.startswith("<record>: its strings have ") and f"max_record_bytes ({MAX_RECORD})" in error
    _assert_rows_identical(got, [0, 1, 3, 4], _packed(signatures, layer.encode(recs)))


def test_a_request_over_max_request_bytes_fails_before_any_work(signatures, layer):
    keys = list(example_keys(layer.config, layer.wire).values())
    rows = [{**_record(i), "query": "word " * 500} for i in range(MAX_REQUEST // 2500 + 1)]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"the request holds \d+ bytes of inputs, over the max_request_bytes of this export \({MAX_REQUEST}\)"):
        _examples(signatures, [to_example(r, keys) for r in rows])
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"the request holds \d+ bytes of inputs, over the max_request_bytes of this export \({MAX_REQUEST}\)"):
        _packed(signatures, layer.encode(rows))
    half = len(rows) // 2  # under the bound: accepted
    assert not any(_examples(signatures, [to_example(r, keys) for r in rows[:half]])["recordprep_error"])


def _one_row_numbers(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    x["numbers"] = x["numbers"][:1]
    return "input `numbers` holds a different number of rows than input `kinds`"


def _negative_lens(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    j = [s.path for s in layer.wire.columns["lens"]].index("tags")
    x["lens"][1, j] = -2
    return f"input `lens` column {j} \\(source `tags`\\) holds a length below -1"


def _narrow_kinds(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    x["kinds"] = x["kinds"][:, :-1]
    return f"input `kinds` must have {len(layer.wire.columns['kinds'])} columns"


def _wide_terms(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    x["terms"] = np.concatenate([x["terms"], x["terms"][:, :1]], axis=1)
    return f"input `terms` must have {len(layer.wire.columns['terms'])} columns"


def _narrow_list_kinds(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    x["tags__kind"] = x["tags__kind"][:, :1]
    return "input `tags__kind` is not as wide as input `tags`: the inputs of list source `tags`"


def _wide_list_values(x: dict[str, np.ndarray], layer: readers.TransformLayer) -> str:
    x["nums"] = np.concatenate([x["nums"], x["nums"]], axis=1)
    return "input `nums__kind` is not as wide as input `nums`"


@pytest.mark.parametrize("broken", [_one_row_numbers, _negative_lens, _narrow_kinds, _wide_terms, _narrow_list_kinds,
                                    _wide_list_values])
def test_a_request_of_the_wrong_shape_fails_naming_the_input(signatures, layer, broken):
    x = layer.encode([_record(i) for i in range(3, 6)])
    assert not any(_packed(signatures, x)["recordprep_error"])
    message = broken(x, layer)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        _packed(signatures, x)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        layer.transform(x)


def test_a_null_list_length_is_still_minus_one(signatures, layer):
    x = layer.encode([{"tags": None, "nums": None}, {}])
    assert x["lens"].tolist() == [[-1, -1], [-1, -1]]
    got = _packed(signatures, x)
    assert not any(got["recordprep_error"]) and got["tags_len"].tolist() == [[0], [0]]


def test_the_export_lists_its_limits(export):
    config = json.loads((export / "assets.extra" / "recordprep_config.json").read_text())
    assert config["limits"] == {"max_request_bytes": MAX_REQUEST, "max_record_bytes": MAX_RECORD}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_request_bytes": 0}, "max_request_bytes must be a positive number of bytes"),
    ({"max_record_bytes": -1}, "max_record_bytes must be a positive number of bytes"),
    ({"max_request_bytes": 10, "max_record_bytes": 11}, "max_record_bytes \\(11\\) is over max_request_bytes"),
])
def test_export_refuses_limits_that_are_not_byte_counts(layer, tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        readers.export_serving(_Features(), layer, str(tmp_path / "x"), **kwargs)
    assert not (tmp_path / "x").exists()


def test_export_cli_states_and_checks_its_limits(output, tmp_path):
    assert serving_cli.DEFAULT_MAX_REQUEST_MB * 2**20 == _serving_limits.DEFAULT_MAX_REQUEST_BYTES
    assert serving_cli.DEFAULT_MAX_RECORD_MB * 2**20 == _serving_limits.DEFAULT_MAX_RECORD_BYTES
    r = cli("export", "--help")
    assert r.exit_code == 0 and "--max-request-mb" in r.output and "--max-record-mb" in r.output
    model = tmp_path / "m.keras"
    model.write_bytes(b"not read")
    r = cli("export", output, model, tmp_path / "e", "--max-request-mb", "0")
    assert r.exit_code == 2 and "--max-request-mb must be > 0" in r.output
    r = cli("export", output, model, tmp_path / "e", "--max-request-mb", "1", "--max-record-mb", "2")
    assert r.exit_code == 2 and "--max-record-mb (2) is over --max-request-mb (1)" in r.output
    assert not (tmp_path / "e").exists()
