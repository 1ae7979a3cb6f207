"""Values at the edges, each through the real job (CLI -> Beam -> shards -> readers), each with a clear outcome.

Policies (docs/feature-config.md "Values at the edges"):
- NaN, +-inf and numbers beyond float32's range (|x| > 3.4e38, incl. integers
  beyond it): numeric features follow ``on_nan`` - ``error`` (default: the
  record goes to the error output), ``fill`` (like a null) or ``keep`` (written
  as NaN/+-inf). Statistics ignore them. Float labels must be finite.
  Categorical features treat them as terms ("nan", "inf").
- Integers beyond int64 stay exact as vocabulary/hash terms, become floats for
  numeric features, and are rejected as int64 labels.
- Huge strings, empty arrays and all-null columns convert.
- Deep nesting: dotted sources reach any depth; JSON nested past ~1000 levels
  is a malformed line; rejected records are cut at 100 levels in the error output.
- Not-UTF-8 text: a JSON line with invalid UTF-8 or a lone surrogate escape is
  a malformed line (error output); an Avro string that is not UTF-8 makes the
  file unreadable (the Avro spec requires UTF-8): the run fails naming the
  file, the block's byte offset and the record.
- A split that ends up empty: the run succeeds, warns, and readers refuse the
  empty split with a message saying so.
- A written float32 below the smallest normal (a subnormal) is zero of its sign.
"""

from __future__ import annotations

import json
import math

import fastavro
import numpy as np
import pytest
from _e2e import check_accounting, cli, error_rows
from _expected_values import read_split

pytestmark = pytest.mark.slow


def _jsonl(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def _cfg(path, features, label=None):
    body = (f"label: {label}\n" if label else "") + "features:\n" + "".join(f"  - {f}\n" for f in features)
    path.write_text(body)
    return path


def _convert(tmp_path, inp, cfg, *extra, name="out"):
    out = tmp_path / name
    # --no-shuffle: the checks compare values with the input line by line
    r = cli("convert", "-i", inp, "-c", cfg, "-o", out, "--splits", "all=1", "--no-shuffle", *extra)
    return r, out


NUMS = ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e39}', '{"x": 1e400}',
        '{"x": 123456789012345678901234567890123456789012}', '{"x": 2.0}', '{"x": 4.0}', '{"x": null}']
NONFINITE = 6  # the first six lines


def test_nan_inf_and_beyond_float32_default_is_error_output(tmp_path):
    inp = _jsonl(tmp_path / "n.jsonl", NUMS)
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: zscore}"])
    r, out = _convert(tmp_path, inp, cfg)
    assert r.exit_code == 1 and f"{NONFINITE} of 9 records were rejected" in r.output, r.output
    assert "--max-errors 6" in r.output
    r, out = _convert(tmp_path, inp, cfg, "--max-errors", NONFINITE)
    assert r.exit_code == 0, r.output
    counts = check_accounting(out, ("all",))
    assert counts["errors"] == NONFINITE and counts["written"]["all"] == 3
    rows = error_rows(out)
    assert [row["line"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert all(row["field"] == "x" and "NaN or infinite" in row["reason"] and "on_nan" in row["reason"] for row in rows)
    info = json.loads((out / "dataset_info.json").read_text())
    stats = info["statistics"]["x"]
    assert stats["count"] == 2 and stats["mean"] == 3.0 and stats["missing"] == 1  # non-finite never reach statistics
    got = read_split(out, "all")["x"][:, 0]
    np.testing.assert_allclose(got, [-1.0, 1.0, 0.0])  # null filled with the mean


def test_on_nan_fill_and_keep(tmp_path):
    inp = _jsonl(tmp_path / "n.jsonl", NUMS)
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: identity, on_nan: fill, fill: -1, missing_indicator: true}",
                                     "{name: k, source: x, transform: identity, on_nan: keep}"])
    r, out = _convert(tmp_path, inp, cfg)
    assert r.exit_code == 0, r.output
    cols = read_split(out, "all")
    np.testing.assert_array_equal(cols["x"][:, 0], [-1, -1, -1, -1, -1, -1, 2, 4, -1])
    np.testing.assert_array_equal(cols["x_missing"][:, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1])  # only null is "missing"
    k = cols["k"][:, 0]
    assert math.isnan(k[0]) and k[1] == np.inf and k[2] == -np.inf and k[3] == np.inf and k[4] == np.inf
    assert k[5] == np.inf and k[6] == 2 and k[7] == 4 and k[8] == 0  # keep: the float32 value, null -> fill 0


def test_subnormal_results_are_written_as_zero_of_their_sign(tmp_path):
    """A written float32 below the smallest normal is zero of its sign (TensorFlow's kernels
    flush subnormals, so the serving layer computes zero there); the smallest normal stays."""
    tiny = float(np.finfo(np.float32).tiny)
    values = [1e-45, -1e-45, 1e-40, -3e-39, tiny, -tiny, 5e-324, 1.0]
    inp = _jsonl(tmp_path / "n.jsonl", [{"x": v, "xs": [v, v]} for v in values])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: identity}", "{name: c, source: x, transform: clip, clip_min: -1}",
                                     "{name: xs, transform: identity, max_len: 2}"])
    r, out = _convert(tmp_path, inp, cfg)
    assert r.exit_code == 0, r.output
    cols = read_split(out, "all")
    want = np.array([0.0, -0.0, 0.0, -0.0, tiny, -tiny, 0.0, 1.0], dtype=np.float32)
    for got in (cols["x"][:, 0], cols["c"][:, 0], cols["xs"][:, 0], cols["xs"][:, 1]):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))  # the bits: -0.0 too


def test_avro_nan_and_inf_doubles_and_float_label(tmp_path):
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "double"}, {"name": "y", "type": "float"}]}
    recs = [{"x": float("nan"), "y": 1.0}, {"x": float("inf"), "y": 0.0}, {"x": 2.0, "y": float("nan")},
            {"x": 1.0, "y": 1.0}, {"x": 3.0, "y": 0.5}]
    with open(tmp_path / "d.avro", "wb") as f:
        fastavro.writer(f, schema, recs)
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: minmax, on_nan: fill, fill: 0}"], label="{source: y, dtype: float32}")
    r, out = _convert(tmp_path, tmp_path / "d.avro", cfg, "--max-errors", 1)
    assert r.exit_code == 0, r.output
    rows = error_rows(out)
    assert len(rows) == 1 and rows[0]["field"] == "y" and "finite" in rows[0]["reason"] and rows[0]["record_in_block"] == 2
    assert rows[0]["record"] == {"x": 2.0, "y": "nan"}
    cols = read_split(out, "all")
    # minmax over the finite x (min 1, max 3); NaN/inf are filled with 0 before scaling
    np.testing.assert_array_equal(cols["x"][:, 0], [-0.5, -0.5, 0.0, 1.0])
    np.testing.assert_array_equal(cols["y"][:, 0], [1.0, 0.0, 1.0, 0.5])


def test_nan_is_a_category_for_categorical_features(tmp_path):
    inp = _jsonl(tmp_path / "n.jsonl", ['{"c": NaN}', '{"c": NaN}', '{"c": "a"}', '{"c": Infinity}'])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: c, transform: vocabulary}"])
    r, out = _convert(tmp_path, inp, cfg)
    assert r.exit_code == 0, r.output
    assert (out / "vocab" / "c.txt").read_text().splitlines() == ["nan", "a", "inf"]
    np.testing.assert_array_equal(read_split(out, "all")["c"][:, 0], [2, 2, 3, 4])


def test_integers_beyond_int64(tmp_path):
    big = 2**64 + 1
    inp = _jsonl(tmp_path / "n.jsonl", [f'{{"n": {big}, "y": 1}}', f'{{"n": {big}, "y": {big}}}', '{"n": 7, "y": 0}'])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: v, source: n, transform: vocabulary}", "{name: h, source: n, transform: hash, buckets: 1000}",
                                     "{name: num, source: n, transform: identity}"], label="{source: y, dtype: int64}")
    r, out = _convert(tmp_path, inp, cfg, "--max-errors", 1)
    assert r.exit_code == 0, r.output
    rows = error_rows(out)
    assert len(rows) == 1 and rows[0]["line"] == 2 and rows[0]["field"] == "y" and "integer" in rows[0]["reason"]
    assert rows[0]["record"]["y"] == big  # exact in the error output
    assert (out / "vocab" / "v.txt").read_text().splitlines() == [str(big), "7"]  # exact terms
    cols = read_split(out, "all")
    np.testing.assert_array_equal(cols["v"][:, 0], [2, 3])
    np.testing.assert_allclose(cols["num"][:, 0], [float(big), 7.0])


def test_huge_strings(tmp_path):
    huge = "word " * 1_000_000  # 5 MB
    inp = _jsonl(tmp_path / "n.jsonl", [{"s": huge, "b": huge}, {"s": "short text", "b": "x"}])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: t, source: s, transform: text, max_len: 4}", "{name: h, source: s, transform: hash, buckets: 8}",
                                     "{name: b, transform: bytes}", "{name: v, source: s, transform: vocabulary}"])
    r, out = _convert(tmp_path, inp, cfg)
    assert r.exit_code == 0, r.output
    cols = read_split(out, "all")
    assert cols["t_len"][:, 0].tolist() == [4, 2]
    assert len(cols["b"][0, 0]) == len(huge) and cols["b"][1, 0] == b"x"
    assert cols["h"][0, 0] != 0  # hash ids start at 1: 0 is the missing value's
    # one occurrence each, so ties by term: "short text" (id 2) before "word ..." (id 3), after the OOV id 1
    assert cols["v"][:, 0].tolist() == [3, 2]


def test_deeply_nested_records(tmp_path):
    def nest(d, leaf):
        for _ in range(d):
            leaf = {"a": leaf}
        return leaf

    lines = [{"n": nest(30, 5), "y": 1},  # a dotted source 30 levels deep
             '{"n": ' + '{"a":' * 5000 + "1" + "}" * 5000 + "}",  # past the JSON parser's depth: malformed line
             {"n": nest(300, 1)},  # parses, but the source ends on a record: rejected, cut in the error output
             {"n": nest(30, 7)}]
    inp = _jsonl(tmp_path / "n.jsonl", lines)
    cfg = _cfg(tmp_path / "c.yaml", ["{name: deep, source: " + ".".join(["n"] + ["a"] * 30) + ", transform: identity}",
                                     "{name: h, source: " + ".".join(["n"] + ["a"] * 30) + ", transform: hash, buckets: 4}"])
    r, out = _convert(tmp_path, inp, cfg, "--max-errors", 2)
    assert r.exit_code == 0, r.output
    rows = error_rows(out)
    assert [row["line"] for row in rows] == [2, 3]
    assert "nested too deeply" in rows[0]["reason"]
    assert "expected a number" in rows[1]["reason"] or "scalar" in rows[1]["reason"]
    assert "nested deeper than 100 levels" in json.dumps(rows[1]["record"])
    np.testing.assert_array_equal(read_split(out, "all")["deep"][:, 0], [5.0, 7.0])


def test_non_utf8_and_lone_surrogates_in_json(tmp_path):
    inp = tmp_path / "n.jsonl"
    inp.write_bytes(b'{"s": "ok"}\n{"s": "caf\xe9"}\n{"s": "\\ud800 lone"}\n{"s": "\\ud83d\\ude00 pair"}\n')
    cfg = _cfg(tmp_path / "c.yaml", ["{name: s, transform: vocabulary}"])
    r, out = _convert(tmp_path, inp, cfg, "--max-errors", 2)
    assert r.exit_code == 0, r.output
    rows = error_rows(out)
    assert [row["line"] for row in rows] == [2, 3]
    assert "utf-8" in rows[0]["reason"].lower() and "surrogate" in rows[1]["reason"]
    assert (out / "vocab" / "s.txt").read_text(encoding="utf-8").splitlines() == ["ok", "\U0001f600 pair"]


def _varint(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def test_non_utf8_avro_string_fails_naming_file_block_and_record(tmp_path):
    """fastavro cannot write such a file: build the container by hand (null codec, one block)."""
    schema = {"type": "record", "name": "R", "fields": [{"name": "s", "type": "string"}]}
    meta = {b"avro.schema": json.dumps(schema).encode(), b"avro.codec": b"null"}
    sync = bytes(range(16))
    header = b"Obj\x01" + _varint(len(meta)) + b"".join(_varint(len(k)) + k + _varint(len(v)) + v for k, v in meta.items()) + _varint(0) + sync
    recs = [_varint(2) + b"ok", _varint(2) + b"\xff\xfe", _varint(1) + b"b"]
    data = b"".join(recs)
    path = tmp_path / "bad.avro"
    path.write_bytes(header + _varint(len(recs)) + _varint(len(data)) + data + sync)
    cfg = _cfg(tmp_path / "c.yaml", ["{name: s, transform: vocabulary}"])
    r, out = _convert(tmp_path, path, cfg, "--max-errors", 10)
    assert r.exit_code == 1, r.output
    assert f"cannot read input {path} at byte {len(header)}" in r.output and "record 1" in r.output
    assert "UnicodeDecodeError" in r.output and not (out / "dataset_info.json").exists()


def test_empty_arrays_and_all_null_columns(tmp_path):
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "xs", "type": {"type": "array", "items": "double"}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "z", "type": ["null", "double"], "default": None},
        {"name": "c", "type": ["null", "string"], "default": None},
        {"name": "t", "type": ["null", "string"], "default": None},
        {"name": "h", "type": ["null", "long"], "default": None},
    ]}
    recs = [{"xs": [], "tags": []}, {"xs": [1.0], "tags": []}, {"xs": [], "tags": ["a"]}]
    with open(tmp_path / "d.avro", "wb") as f:
        fastavro.writer(f, schema, recs)
    cfg = _cfg(tmp_path / "c.yaml", [
        "{name: xs, transform: identity, max_len: 2}", "{name: tags, transform: vocabulary, max_len: 2}",
        "{name: z, transform: zscore, missing_indicator: true, allow_all_missing: true}",
        "{name: mm, source: z, transform: minmax, allow_all_missing: true}",
        "{name: c, transform: vocabulary, allow_all_missing: true}",
        "{name: t, transform: text, max_len: 3, allow_all_missing: true}",
        "{name: h, transform: hash, buckets: 9, allow_all_missing: true}"])
    r, out = _convert(tmp_path, tmp_path / "d.avro", cfg)
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["statistics"]["z"]["count"] == 0 and info["statistics"]["z"]["missing"] == 3
    assert info["vocabularies"]["c"]["terms"] == 0
    cols = read_split(out, "all")
    np.testing.assert_array_equal(cols["xs"], [[0, 0], [1, 0], [0, 0]])
    np.testing.assert_array_equal(cols["xs_len"][:, 0], [0, 1, 0])
    np.testing.assert_array_equal(cols["tags"], [[0, 0], [0, 0], [2, 0]])
    for k in ("z", "mm", "c", "h", "t_len"):
        assert not cols[k].any() and np.isfinite(cols[k]).all(), k  # all-null: zeros, never NaN
    np.testing.assert_array_equal(cols["z_missing"][:, 0], [1, 1, 1])


def test_split_that_ends_up_empty(tmp_path):
    import readers

    inp = _jsonl(tmp_path / "n.jsonl", [{"x": 1.0}])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: identity}"])
    out = tmp_path / "out"
    r = cli("convert", "-i", inp, "-c", cfg, "-o", out, "--splits", "train=0.5,eval=0.5")
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    empty = [s for s, sp in info["splits"].items() if sp["num_records"] == 0]
    assert len(empty) == 1
    assert f"split {empty[0]!r} is empty" in r.output
    with pytest.raises(readers.ShardSelectionError, match="no records"):
        readers.eval_dataset(str(out), 4, split=empty[0])
    r = cli("verify", out)
    assert r.exit_code == 0, r.output


def test_zero_weight_split_is_empty_and_first_split_analyzed(tmp_path):
    inp = _jsonl(tmp_path / "n.jsonl", [{"x": float(i), "c": "a" if i % 2 else "b"} for i in range(20)])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: zscore}", "{name: c, transform: vocabulary}"])
    out = tmp_path / "out"
    r = cli("convert", "-i", inp, "-c", cfg, "-o", out, "--splits", "train=1,eval=0")
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    assert counts["written"] == {"train": 20, "eval": 0}
    assert "split 'eval' is empty" in r.output


def test_damaged_gzip_input_fails_naming_the_file(tmp_path):
    """Found by the property tests: a JSON file starting with gzip's magic bytes but holding no gzip stream."""
    import gzip

    inp = tmp_path / "in.jsonl.gz"
    data = gzip.compress(b"".join(b'{"x": %d}\n' % (i * 7919 % 100003) for i in range(5000)))
    inp.write_bytes(data[: len(data) // 2])  # cut inside the deflate stream
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: identity}"])
    r, out = _convert(tmp_path, inp, cfg, "--max-error-fraction", "1")
    assert r.exit_code == 1 and f"cannot read input {inp}" in r.output and "gzip" in r.output, r.output
    assert not (out / "dataset_info.json").exists()


def test_block_claiming_huge_count_of_empty_records_is_refused(tmp_path):
    """Records with no fields encode to 0 bytes: a corrupt count of 2**40 would decode into an endless list."""
    import io

    buf = io.BytesIO()
    fastavro.writer(buf, {"type": "record", "name": "Empty", "fields": []}, [{}, {}, {}], codec="null")
    data = buf.getvalue()
    block = next(iter(fastavro.block_reader(io.BytesIO(data))))
    assert data[block.offset] == _varint(3)[0]
    path = tmp_path / "bomb.avro"
    path.write_bytes(data[: block.offset] + _varint(2**40) + data[block.offset + 1:])
    cfg = _cfg(tmp_path / "c.yaml", ["{name: x, transform: identity, allow_all_missing: true}"])  # records have no fields
    r, out = _convert(tmp_path, path, cfg, "--max-error-fraction", "1")
    assert r.exit_code == 1 and f"{path} at byte {block.offset}" in r.output and str(2**40) in r.output, r.output
    path.write_bytes(data)  # the real count converts: three empty records
    r, out = _convert(tmp_path, path, cfg, name="ok")
    assert r.exit_code == 0 and check_accounting(out, ("all",))["read"] == 3, r.output
