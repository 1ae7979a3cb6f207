"""Class-name labels (``label: {source: F, transform: vocabulary}``), through the CLI.

The classes are the label values of the training split, most frequent first
(ties by name); class id = position (0..K-1, Keras' sparse categorical
convention). They are stored like feature vocabularies (``vocab/<label>.txt``,
the analysis) and in the label's metadata entry (``DatasetInfo.label_classes``);
a record of another split whose class the training split never had, and a
null label, go to the error output with the reason.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import fastavro
import numpy as np
import pytest
from _e2e import check_accounting, cli, error_rows
from _pipelines_data import by_shard
from hypothesis import given, settings
from hypothesis import strategies as st

import readers
from convert.analysis import Analyzer
from convert.config import ConfigError, parse_config
from convert.prepare import Preparer
from convert.records import term
from convert.splits import Splits
from convert.vectorize import Vectorizer

SPLITS = "train=0.7,eval=0.3"
SCHEMA = {"type": "record", "name": "P", "fields": [
    {"name": "id", "type": "long"}, {"name": "x", "type": "double"},
    {"name": "gender", "type": ["null", "string"]}, {"name": "grade", "type": "long"}, {"name": "flag", "type": "boolean"},
]}
CONFIG = "label: {source: gender, transform: vocabulary}\nfeatures:\n  - {name: x, transform: zscore}\n"


def _records(n: int = 200) -> list[dict]:
    """Classes M > F > N in frequency; "rare" only in eval records; one null label."""
    recs = [{"id": i, "x": float(i % 17), "gender": "MMMMFFFN"[i % 8], "grade": i % 3, "flag": i % 4 == 0}
            for i in range(n)]
    split = Splits.parse(SPLITS, "id").assign(recs)
    evals = [i for i in range(n) if split[i] == 1]
    for i in evals[:3]:
        recs[i]["gender"] = "rare"
    recs[evals[3]]["gender"] = None
    return recs


def _train_classes(recs: list[dict], field: str) -> list[str]:
    split = Splits.parse(SPLITS, "id").assign(recs)
    counts = Counter(str(r[field]).lower() if isinstance(r[field], bool) else str(r[field])
                     for r, s in zip(recs, split, strict=True) if s == 0 and r[field] is not None)
    return sorted(counts, key=lambda c: (-counts[c], c))


def _write(tmp_path: Path, recs: list[dict], fmt: str) -> Path:
    if fmt == "avro":
        path = tmp_path / "d.avro"
        with open(path, "wb") as f:
            fastavro.writer(f, SCHEMA, recs)
    else:
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _convert(tmp_path: Path, data: Path, config: str = CONFIG, *extra: str, out: str = "out"):
    cfg = tmp_path / f"{out}.yaml"
    cfg.write_text(config)
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / out, "--splits", SPLITS, "--split-key", "id",
            "--num-shards", "1", "--max-error-fraction", "0.5", *extra)
    return r, tmp_path / out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("sl")
    recs = _records()
    data = _write(root, recs, "json")
    r, out = _convert(root, data)
    assert r.exit_code == 0, r.output
    return {"root": root, "recs": recs, "data": data, "out": out}


def _shard_labels(out: Path, split: str) -> list[int]:
    import tensorflow as tf

    info = readers.load_info(str(out))
    files = [str(out / s.file) for s in info.split(split).shards]
    ds = tf.data.TFRecordDataset(files, compression_type="" if info.compression == "NONE" else info.compression)
    spec = {info.label_key: tf.io.FixedLenFeature([1], tf.int64)}
    return [int(tf.io.parse_single_example(raw, spec)[info.label_key][0]) for raw in ds]


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_classes_are_stored_and_the_shards_hold_their_ids(tmp_path, fmt):
    recs = _records()
    r, out = _convert(tmp_path, _write(tmp_path, recs, fmt))
    assert r.exit_code == 0, r.output
    classes = _train_classes(recs, "gender")
    assert classes == ["M", "F", "N"]  # by training frequency
    info = readers.load_info(str(out))
    assert info.label_classes == tuple(classes)
    assert info.feature("gender").dtype == "int64" and info.feature("gender").params["vocabulary_file"] == "vocab/gender.txt"
    assert (out / "vocab" / "gender.txt").read_text().splitlines() == classes
    meta = json.loads((out / "dataset_info.json").read_text())
    assert meta["vocabularies"]["gender"] == {
        "file": "vocab/gender.txt", "terms": 3,
        "sha256": "sha256:" + hashlib.sha256((out / "vocab" / "gender.txt").read_bytes()).hexdigest()}
    assert json.loads((out / "analysis.json").read_text())["vocabularies"]["gender"] == classes
    # Each record's id is its class's position.
    split = Splits.parse(SPLITS, "id").assign(recs)
    for s, name in enumerate(("train", "eval")):
        want = [classes.index(rec["gender"]) for rec, sp in zip(recs, split, strict=True)
                if sp == s and rec["gender"] in classes]
        assert Counter(_shard_labels(out, name)) == Counter(want)
    # The eval records of a class training never had, and the null label, are rejected with the reason.
    counts = check_accounting(out)
    rows = error_rows(out)
    assert counts["errors"] == len(rows) == 4
    unseen = [e for e in rows if "does not occur in the training split" in e["reason"]]
    assert len(unseen) == 3 and all(e["field"] == "gender" and e["record"]["gender"] == "rare" for e in unseen)
    assert "label class 'rare'" in unseen[0]["reason"]
    [null] = [e for e in rows if e not in unseen]
    assert "found missing (null)" in null["reason"]


@pytest.mark.parametrize("field, classes", [("grade", None), ("flag", ["false", "true"])])
def test_integer_and_boolean_sources_take_their_term_as_class_name(tmp_path, field, classes):
    recs = _records()
    r, out = _convert(tmp_path, _write(tmp_path, recs, "avro"),
                      f"label: {{source: {field}, transform: vocabulary}}\nfeatures:\n  - {{name: x, transform: zscore}}\n")
    assert r.exit_code == 0, r.output
    want = _train_classes(recs, field)
    assert sorted(want) == (classes or ["0", "1", "2"])
    assert readers.load_info(str(out)).label_classes == tuple(want)
    assert check_accounting(out)["errors"] == 0


def test_analysis_from_reuses_the_classes_and_checks_the_label(converted, tmp_path):
    c = converted
    r, out = _convert(tmp_path, c["data"], CONFIG, "--analysis-from", str(c["out"]))
    assert r.exit_code == 0, r.output
    assert readers.load_info(str(out)).label_classes == readers.load_info(str(c["out"])).label_classes
    for shard in sorted(c["out"].glob("*.tfrecord*")):
        assert by_shard(out, shard.name).read_bytes() == shard.read_bytes(), shard.name
    # A class the reused analysis lacks is rejected in the training split too (the reused classes are fixed).
    recs = [{**rec, "gender": "new"} if rec["id"] < 5 else rec for rec in c["recs"]]
    r, out2 = _convert(tmp_path, _write(tmp_path, recs, "avro"), CONFIG, "--analysis-from", str(c["out"]), out="out2")
    assert r.exit_code == 0, r.output
    assert sum("label class 'new'" in e["reason"] for e in error_rows(out2)) == 5
    # Another label source, or a numeric label over the analysis of a vocabulary one: refused before the run.
    other = "label: {source: grade, name: gender, transform: vocabulary}\nfeatures:\n  - {name: x, transform: zscore}\n"
    r, _ = _convert(tmp_path, c["data"], other, "--analysis-from", str(c["out"]), out="out3")
    assert r.exit_code == 2 and "label 'gender' (vocabulary): no classes computed for it" in r.output, r.output
    assert "'source': 'gender'" in r.output


def test_a_numeric_label_analysis_has_no_classes_for_a_vocabulary_label(converted, tmp_path):
    numeric = "label: {source: grade, dtype: int64}\nfeatures:\n  - {name: x, transform: zscore}\n"
    r, base = _convert(tmp_path, converted["data"], numeric, out="numeric")
    assert r.exit_code == 0, r.output
    assert readers.load_info(str(base)).label_classes is None
    vocab = "label: {source: grade, transform: vocabulary}\nfeatures:\n  - {name: x, transform: zscore}\n"
    r, _ = _convert(tmp_path, converted["data"], vocab, "--analysis-from", str(base), out="again")
    assert r.exit_code == 2 and "label 'grade' (vocabulary): no classes computed" in r.output, r.output


def test_infer_drafts_a_vocabulary_label_that_converts(converted, tmp_path):
    r = cli("infer", "-i", converted["data"], "--label", "gender")
    assert r.exit_code == 0, r.output
    assert "label: {source: gender, transform: vocabulary}" in r.stdout
    assert "is null or absent in 1 of 200 sampled records" in r.stdout  # the null label is warned about
    r2 = cli("infer", "-i", converted["data"], "--label", "grade")
    assert "label: {source: grade, dtype: int64}" in r2.stdout  # few integer values stay class ids
    cfg = tmp_path / "drafted.yaml"
    cfg.write_text(r.stdout)
    r = cli("convert", "-i", converted["data"], "-c", cfg, "-o", tmp_path / "o", "--splits", SPLITS, "--split-key", "id",
            "--max-error-fraction", "0.5")
    assert r.exit_code == 0, r.output
    assert readers.load_info(str(tmp_path / "o")).label_classes == ("M", "F", "N")


def test_dry_run_accepts_a_string_label_and_refuses_a_record_field(tmp_path):
    data = _write(tmp_path, _records(20), "avro")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "o", "--dry-run")
    assert r.exit_code == 0, r.output
    cfg.write_text("label: {source: gender, dtype: int64}\nfeatures:\n  - {name: x, transform: zscore}\n")
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "o", "--dry-run")
    assert r.exit_code == 2 and "transform: vocabulary" in r.output, r.output


@pytest.mark.parametrize("classes, words", [
    (["M", 3, "N"], "classes[1] 3 must be a string"),
    (["M", "M", "N"], "repeat a name"),
    (["M", "F"], "is not the 2 classes listed"),
    ("MFN", "must be a list of 1..100000 class names"),
])
def test_a_tampered_class_list_is_refused(converted, tmp_path, classes, words):
    meta = json.loads((converted["out"] / "dataset_info.json").read_text())
    for f in meta["features"]:
        if f["role"] == "label":
            f["params"]["classes"] = classes
            if words.startswith("is not"):
                f["params"]["vocab_size"] = 3
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(readers.SpecError, match=words.replace("[", r"\[").replace(".", r"\.")):
        readers.load_info(str(bad))


def test_a_tampered_vocabulary_file_name_is_refused(converted, tmp_path):
    meta = json.loads((converted["out"] / "dataset_info.json").read_text())
    [lab] = [f for f in meta["features"] if f["role"] == "label"]
    lab["params"]["vocabulary_file"] = "../../etc/passwd"
    (tmp_path / "dataset_info.json").write_text(json.dumps(meta))
    with pytest.raises(readers.SpecError, match="vocabulary_file"):
        readers.load_info(str(tmp_path))


@pytest.mark.slow
def test_the_serving_export_returns_the_class_names(converted, tmp_path):
    import tensorflow as tf

    from readers import serving

    info = readers.load_info(str(converted["out"]))
    inputs = readers.keras_inputs(info)
    probs = tf.keras.layers.Dense(len(info.label_classes), activation="softmax")(inputs["x"])
    model = tf.keras.Model(inputs, probs)
    export = tmp_path / "export"
    readers.export_serving(model, str(converted["out"]), str(export))
    recs = [{"x": 1.0}, {"x": 5.0}, {"x": 2.0}]
    wire_inputs, rejected = serving.wire_of_export(str(export)).encode(recs)
    assert not rejected
    out = tf.saved_model.load(str(export)).signatures["serving_default"](
        **{k: tf.constant(v) for k, v in wire_inputs.items()})
    classes = out[serving.CLASSES_OUTPUT].numpy()
    assert classes.shape == (3, 3) and [c.decode() for c in classes[1]] == list(info.label_classes)
    assert out["outputs"].shape == (3, 3)
    best = classes[np.arange(3), np.argmax(out["outputs"].numpy(), axis=1)]
    assert all(b.decode() in info.label_classes for b in best)


# ------------------------------------------------------------------ the two analysis paths agree

_LABEL_VALUES = st.one_of(st.sampled_from(["a", "b", "", "caf\u00e9"]), st.text(max_size=3), st.integers(-3, 3),
                          st.booleans(), st.none(), st.floats(allow_nan=True), st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.lists(_LABEL_VALUES, min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_the_pipelines_analysis_and_the_reference_path_give_the_same_classes(values, seed):
    config = parse_config({"label": {"source": "y", "transform": "vocabulary"},
                           "features": [{"name": "x", "transform": "zscore"}]})
    recs = [{"x": 1.0, "y": v} for v in values]
    train = np.random.default_rng(seed).random(len(recs)) < 0.7
    ok = [isinstance(v, str | int) or (isinstance(v, float) and v.is_integer()) for v in values]
    counts = Counter(term(v) for v, t, k in zip(values, train, ok, strict=True) if t and k)
    if not counts:  # no class in training: the analysis says so
        with pytest.raises(ConfigError, match="no record of the training split has a class"):
            _reference(config, recs, train).result()
        return
    ref = _reference(config, recs, train).result()
    fast = Analyzer(config)
    fast.add_prepared(Preparer(config).prepare(recs, analyze=True), train)
    classes = sorted(counts, key=lambda c: (-counts[c], c))
    assert ref.vocabularies["y"] == fast.result().vocabularies["y"] == classes
    vb = Vectorizer(config, ref).vectorize(recs)
    kept = [term(v) for v, k in zip(values, ok, strict=True) if k and term(v) in classes]
    assert vb.columns["y"][1][:, 0].tolist() == [classes.index(t) for t in kept]
    assert {r.index for r in vb.rejections} == {i for i, (v, k) in enumerate(zip(values, ok, strict=True))
                                                  if not k or term(v) not in classes}


def _reference(config, recs, train) -> Analyzer:
    a = Analyzer(config)
    a.add_records([r for r, t in zip(recs, train, strict=True) if t])
    return a


def test_a_label_field_null_in_every_training_record_fails_the_run_saying_so(tmp_path):
    recs = [{**r, "gender": None} for r in _records(40)]
    r, out = _convert(tmp_path, _write(tmp_path, recs, "json"), CONFIG, "--max-error-fraction", "1")
    assert r.exit_code == 2 and "no record of the training split has a class in 'gender'" in r.output, r.output
    assert not (out / "dataset_info.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_the_predict_example_prints_probabilities_and_the_class_of_avro_and_json_records(converted, tmp_path, fmt):
    """examples/predict.py shows the model's probabilities and the best class name, not recordprep_classes."""
    import subprocess
    import sys

    import tensorflow as tf

    info = readers.load_info(str(converted["out"]))
    inputs = readers.keras_inputs(info)
    probs = tf.keras.layers.Dense(len(info.label_classes), activation="softmax")(inputs["x"])
    export = tmp_path / "export"
    readers.export_serving(tf.keras.Model(inputs, probs), str(converted["out"]), str(export))
    data = _write(tmp_path, converted["recs"][:4], fmt)
    root = Path(__file__).resolve().parents[1]
    run = subprocess.run([sys.executable, "examples/predict.py", str(export), str(data), "-n", "3"], cwd=root,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert len(lines) == 3, run.stdout
    for line in lines:
        shown = line.split(" -> ", 1)[1]
        best, values = shown.split(" (outputs ", 1)
        p = json.loads(values.rstrip(")"))
        assert best in info.label_classes and len(p) == len(info.label_classes) and abs(sum(p) - 1) < 1e-5, line
        assert best == info.label_classes[int(np.argmax(p))]
    assert "recordprep_classes" not in run.stdout
