"""Property tests: random Avro schemas and records round-trip to the documented vectorized values;
random JSON never crashes the converter.

Most examples run the record -> features -> Example path without Beam
(``convert.sources`` -> ``Analyzer`` -> ``Vectorizer`` -> ``encode_examples``
-> TensorFlow's parser); a few run the whole job through the CLI and read the
shards back with ``readers.eval_dataset``. Expected values come from
``_expected_values`` (the README's rules, written independently).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os

import numpy as np
import pytest
import yaml
from _e2e import check_accounting, cli, error_rows
from _expected_values import (
    assert_columns_equal,
    expected_columns,
    expected_stats,
    expected_vocabulary,
    raw_avro_records,
    read_split,
)
from _record_strategies import JSON_CONFIG, avro_bytes, avro_cases, json_documents, json_line
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from convert.analysis import Analyzer
from convert.config import parse_config
from convert.example import encode_examples
from convert.sources import InputFileError, iter_avro, iter_json
from convert.vectorize import Vectorizer

FAST = settings(max_examples=int(os.environ.get("RECORDPREP_PROPERTY_EXAMPLES", "40")), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# Whole-job examples cost about a second each: a few, and no shrinking (a failure prints its input).
FEW = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck),
               phases=(Phase.explicit, Phase.reuse, Phase.generate))


def parse_examples(buf: np.ndarray, lens: np.ndarray, specs: list[dict]) -> dict[str, np.ndarray]:
    import tensorflow as tf

    starts = np.cumsum(lens) - lens
    raw = bytes(buf)
    serialized = [raw[s:s + n] for s, n in zip(starts.tolist(), lens.tolist(), strict=True)]
    dtypes = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}
    spec = {f["name"]: tf.io.FixedLenFeature(f["shape"], dtypes[f["dtype"]]) for f in specs}
    return {k: v.numpy() for k, v in tf.io.parse_example(tf.constant(serialized, dtype=tf.string), spec).items()}


def record_path(config: dict, records: list) -> tuple:
    """Analyze (one split), vectorize, encode, parse with TensorFlow: (vector batch, spec dicts, analysis, columns)."""
    cfg = parse_config(config)
    analyzer = Analyzer(cfg)
    analyzer.add_records(records)
    analysis = analyzer.result()
    vec = Vectorizer(cfg, analysis)
    vb = vec.vectorize(records)
    specs = [dict(dataclasses.asdict(s), shape=list(s.shape)) for s in vec.feature_specs()]
    rows = int(vb.keep.sum())
    buf, lens = encode_examples(vb.columns, rows)
    assert len(lens) == rows
    cols = parse_examples(buf, lens, specs) if rows else {}
    return vb, specs, analysis, cols


def check_against_reference(records, specs, vocabularies, stats, cols, where):
    for f in specs:
        p = f["params"]
        if f["transform"] in ("vocabulary", "text"):
            assert vocabularies[f["name"]] == expected_vocabulary(records, f["source"], f["transform"], p), f["name"]
        if p.get("stats") is not None:
            want = expected_stats(records, f["source"], bool(p.get("max_len")))
            got = stats[f["name"]]
            scale = max([abs(want["min"] or 0.0), abs(want["max"] or 0.0), 1.0])
            assert got["count"] == want["count"], f["name"]
            assert got["mean"] == pytest.approx(want["mean"], rel=1e-9, abs=scale * 1e-12), f["name"]
            assert got["std"] == pytest.approx(want["std"], rel=1e-6, abs=scale * 1e-6), f["name"]
    assert_columns_equal(cols, expected_columns(records, specs, vocabularies), where)


# ----------------------------------------------------------------- Avro


@FAST
@given(avro_cases())
def test_random_avro_schema_and_records_vectorize_as_documented(case):
    data = avro_bytes(case)
    path = "mem.avro"
    got = [r for b in iter_avro(io.BytesIO(data), path, batch_size=7) for r in b.records]
    raw = raw_avro_records_from_bytes(data)
    assert got == raw  # logical types raw, every block, in order
    vb, specs, analysis, cols = record_path(case.config, got)
    assert vb.rejections == [], vb.rejections[:3]
    check_against_reference(got, specs, analysis.vocabularies, analysis.stats, cols, "record path")


def raw_avro_records_from_bytes(data: bytes) -> list:
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".avro") as f:
        f.write(data)
        f.flush()
        return raw_avro_records(f.name)


def _allow_all_missing(config: dict) -> dict:
    """Random columns may be null in every record: ``config`` with every feature
    allowed to be (the all-missing check has its own tests)."""
    return {**config, "features": [{**f, "allow_all_missing": True} for f in config["features"]]}


def _json_values(data: bytes) -> list:
    """The JSON values of ``data``'s lines (a whole document's elements), skipping lines that are not JSON."""
    text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8", "replace")
    try:
        doc = json.loads(text)
        return doc if isinstance(doc, list) else [doc]
    except ValueError:
        pass
    out = []
    for line in text.split("\n"):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@pytest.mark.slow
@FEW
@given(case=avro_cases(max_records=40))
def test_random_avro_through_the_job(case, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prop")
    data = avro_bytes(case, sync_interval=64)
    # two files (the second a copy under another name: per-file counts), several blocks each
    for k in range(2):
        (tmp / f"part-{k}.avro").write_bytes(data)
    cfg = tmp / "features.yaml"
    cfg.write_text(yaml.safe_dump(_allow_all_missing(case.config)))
    out = tmp / "out"
    r = cli("convert", "-i", tmp / "*.avro", "-c", cfg, "-o", out, "--splits", "all=1", "--num-shards", "2",
            "--batch-size", "5", "--no-shuffle")  # compared record for record with the input
    assert r.exit_code == 0, r.output
    counts = check_accounting(out, ("all",))
    assert counts["read"] == 2 * len(case.records) and counts["errors"] == 0
    records = raw_avro_records(tmp / "part-0.avro") * 2
    info = json.loads((out / "dataset_info.json").read_text())
    analysis = json.loads((out / "analysis.json").read_text())
    # each unit's shard keeps input order; units follow the files' order
    check_against_reference(records, info["features"], analysis["vocabularies"], analysis["stats"],
                            read_split(out, "all"), "job")


# ----------------------------------------------------------------- JSON


def _lines_with_garbage(draw_docs, garbage):
    lines = [json_line(d) for d in draw_docs]
    for i, g in garbage:
        lines.insert(min(i, len(lines)), g)
    return b"\n".join(lines) + b"\n"


json_files = st.builds(
    _lines_with_garbage,
    st.lists(json_documents, min_size=1, max_size=12),
    st.lists(st.tuples(st.integers(0, 12), st.binary(max_size=30).filter(lambda b: b"\n" not in b and b"\r" not in b)), max_size=3),
)


def _is_json_lines(data: bytes) -> bool:
    """Every non-blank line (a UTF-8 BOM allowed first) is one JSON value."""
    try:
        text = data.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
        for line in text.split("\n"):
            if line.strip(" \t\r\x0b\x0c"):
                json.loads(line)
    except ValueError:
        return False
    return True


@FAST
@given(json_files)
@example(b"\x1f\x8b\n{}\n")  # gzip's magic, then not gzip: InputFileError naming the file
def test_random_json_never_crashes_the_record_path(data):
    lines = [x for x in data.split(b"\n") if x.strip(b" \t\r\x0b\x0c")]
    try:
        batches = list(iter_json(io.BytesIO(data), "mem.jsonl", batch_size=5))
    except InputFileError as e:
        # A line-1 "[" makes the file one JSON document (all or nothing); any other
        # input that is not JSON Lines (gzip's magic, then not gzip) may fail the file.
        assert "mem.jsonl" in str(e), e
        assert data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"[") or not _is_json_lines(data), e
        return
    records = [r for b in batches for r in b.records]
    bad = [x for b in batches for x in b.bad]
    if not data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):  # JSON Lines: objects, or bad lines
        assert len(records) + len(bad) <= len(lines)
        assert all(isinstance(r, dict) for r in records)
    for off, line_no, reason, raw in bad:
        assert reason and isinstance(raw, str) and line_no >= 1 and off >= 0
    if not records:
        return
    vb, specs, _, cols = record_path(JSON_CONFIG, records)
    assert int(vb.keep.sum()) + len(vb.rejections) == len(records)
    assert len({r.index for r in vb.rejections}) == len(vb.rejections)
    for rej in vb.rejections:
        assert rej.field and rej.reason
        if not isinstance(records[rej.index], dict):  # an array element that is not an object
            assert rej.field == "<record>"
        json.dumps({"field": rej.field, "reason": rej.reason}, ensure_ascii=False).encode()  # the error output can hold it
    kept = [r for r, k in zip(records, vb.keep.tolist(), strict=True) if k]
    if kept:
        assert cols["y"][:, 0].tolist() == [int(r["y"]) for r in kept]
        for name in ("x", "xl", "idc", "nums"):
            assert np.isfinite(cols[name]).all(), name  # only on_nan: keep may write NaN/inf
        assert (cols["uid"] >= 0).all() and (cols["uid"] <= 16).all()


@pytest.mark.slow
@FEW
@given(data=json_files)
def test_random_json_through_the_job(data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pj")
    (tmp / "in.jsonl").write_bytes(data)
    cfg = tmp / "features.yaml"
    cfg.write_text(yaml.safe_dump(_allow_all_missing(JSON_CONFIG)))
    out = tmp / "out"
    r = cli("convert", "-i", tmp / "in.jsonl", "-c", cfg, "-o", out, "--max-error-fraction", "1")
    if r.exit_code == 2:  # no record has the label's field: refused before the run
        assert "the label reads 'y', which none of the" in r.output, r.output
        assert not any(isinstance(x, dict) and "y" in x for x in _json_values(data)), r.output
        return
    if r.exit_code == 1:  # only a whole-document (or gzip-looking) file can be unreadable
        assert "cannot read input" in r.output and str(tmp / "in.jsonl") in r.output, r.output
        return
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    rows = error_rows(out) if counts["errors"] else []
    assert len(rows) == counts["errors"]
    for row in rows:
        assert row["file"] == str(tmp / "in.jsonl") and row["reason"] and row["field"] and "record" in row


NUMBERS = st.one_of(st.none(), st.floats(), st.integers(), st.integers(-(10**400), 10**400),
                    st.sampled_from([3.4028234663852886e38, 3.4028235e38, -3.5e38, 2**128, 1e-45]))


@FAST
@given(st.lists(NUMBERS, min_size=1, max_size=30), st.sampled_from(["error", "fill", "keep"]),
       st.sampled_from(["identity", "zscore", "minmax", "clip"]))
def test_non_finite_policy_holds_for_any_number(values, on_nan, transform):
    """NaN, +-inf and |x| > float32 max follow on_nan; statistics never see them; output is finite unless 'keep'."""
    feat = {"name": "x", "transform": transform, "on_nan": on_nan, "missing_indicator": True}
    if transform == "clip":
        feat.update(clip_min=-5.0, clip_max=5.0)
    records = [{"x": v} for v in values]
    vb, specs, analysis, cols = record_path({"features": [feat]}, records)
    f32_max = float(np.finfo(np.float32).max)

    def nonfinite(v):
        try:
            return v is not None and not abs(float(v)) <= f32_max
        except OverflowError:
            return True

    bad = [nonfinite(v) for v in values]
    rejected = {r.index for r in vb.rejections}
    assert rejected == ({i for i, b in enumerate(bad) if b} if on_nan == "error" else set())
    for r in vb.rejections:
        assert r.field == "x" and "on_nan" in r.reason
    if transform in ("zscore", "minmax"):
        assert analysis.stats["x"]["count"] == sum(1 for v, b in zip(values, bad, strict=True) if v is not None and not b)
    if not cols:
        return
    kept = [(v, b) for i, (v, b) in enumerate(zip(values, bad, strict=True)) if i not in rejected]
    x = cols["x"][:, 0]
    if on_nan != "keep" or transform != "identity":  # scaling may bring a kept value back into range
        assert on_nan == "keep" or np.isfinite(x).all()
    else:
        def cast_nonfinite(v):  # keep writes the float32 cast: just above float32 max it rounds down to it
            try:
                with np.errstate(over="ignore"):
                    return v is not None and not np.isfinite(np.float32(float(v)))
            except OverflowError:
                return True

        assert [not np.isfinite(a) for a in x.tolist()] == [cast_nonfinite(v) for v, _ in kept]
    assert cols["x_missing"][:, 0].tolist() == [int(v is None) for v, _ in kept]
    check_against_reference([{"x": v} for v, _ in kept], specs, analysis.vocabularies, analysis.stats, cols, "on_nan")
