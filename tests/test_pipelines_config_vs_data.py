"""The config checked against the data, through the CLI: a misspelled path, a
type the transform cannot take, a feature missing in every training record,
and a run whose every record is rejected each fail with a message that says
what to fix, before anything is written where that is possible."""

from __future__ import annotations

import json
from pathlib import Path

import fastavro
import pytest
from _e2e import cli

USER = {"type": "record", "name": "User", "fields": [
    {"name": "country", "type": "string"},
    {"name": "age", "type": ["null", "long"]},
]}
SCHEMA = {"type": "record", "name": "Row", "namespace": "t", "fields": [
    {"name": "country", "type": ["null", "string"]},
    {"name": "city", "type": "string"},
    {"name": "income", "type": ["null", "double"]},
    {"name": "nothing", "type": ["null", "string"], "default": None},
    {"name": "user", "type": ["null", USER]},
    {"name": "salary", "type": ["null", "long"]},
]}


def _records(n: int = 60) -> list[dict]:
    return [{"country": ["fr", "de", "us"][i % 3], "city": f"c{i % 7}", "income": float(i), "nothing": None,
             "user": {"country": "fr", "age": i}, "salary": None if i % 5 == 0 else i} for i in range(n)]


def _write(root: Path, records: list[dict], kind: str, name: str = "part-0", schema: dict = SCHEMA) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "avro":
        path = root / f"{name}.avro"
        with open(path, "wb") as f:
            fastavro.writer(f, schema, records)
    else:
        path = root / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _config(tmp_path: Path, text: str) -> Path:
    cfg = tmp_path / "features.yaml"
    cfg.write_text(text)
    return cfg


def _convert(inp: Path, cfg: Path, out: Path, *extra):
    return cli("convert", "-i", inp, "-c", cfg, "-o", out, "--max-error-fraction", "0.5", *extra)


GOOD = "label: salary\nfeatures:\n  - {name: country, transform: vocabulary}\n  - {name: income, transform: zscore}\n"


@pytest.fixture(params=["avro", "json"])
def kind(request):
    return request.param


@pytest.mark.parametrize("dry_run", [False, True])
def test_misspelled_feature_source_fails_before_writing(kind, dry_run, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    cfg = _config(tmp_path, GOOD.replace("{name: country,", "{name: contry,"))
    out = tmp_path / "out"
    r = _convert(inp, cfg, out, *(["--dry-run"] if dry_run else []))
    assert r.exit_code == 2, r.output
    assert str(inp) in r.output and "feature 'contry'" in r.output and "did you mean 'country'" in r.output, r.output
    assert not out.exists()


def test_misspelled_split_key_fails_before_writing(kind, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    out = tmp_path / "out"
    r = _convert(inp, _config(tmp_path, GOOD), out, "--split-key", "cty")
    assert r.exit_code == 2, r.output
    assert "--split-key reads 'cty'" in r.output and "did you mean 'city'" in r.output, r.output
    assert not out.exists()
    assert _convert(inp, _config(tmp_path, GOOD), out, "--split-key", "city").exit_code == 0


def test_misspelled_nested_source_suggests_the_nested_path(kind, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    cfg = _config(tmp_path, GOOD + "  - {name: uc, source: user.contry, transform: hash, buckets: 8}\n")
    r = _convert(inp, cfg, tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert "'user.contry'" in r.output and "did you mean 'user.country'" in r.output, r.output


def test_misspelled_cross_source_fails(kind, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    cfg = _config(tmp_path, GOOD + "  - {name: cc, transform: cross, sources: [country, ctiy], buckets: 16}\n")
    r = _convert(inp, cfg, tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert "feature 'cc' (cross source)" in r.output and "'ctiy'" in r.output and "did you mean 'city'" in r.output, r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_misspelled_label_fails_before_writing(kind, dry_run, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    cfg = _config(tmp_path, GOOD.replace("label: salary", "label: salry"))
    r = _convert(inp, cfg, tmp_path / "out", *(["--dry-run"] if dry_run else []))
    assert r.exit_code == 2, r.output
    assert "the label reads 'salry'" in r.output and "did you mean 'salary'" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_dry_run_says_what_the_config_was_checked_against(kind, tmp_path):
    inp = _write(tmp_path / "in", _records(), kind)
    r = _convert(inp, _config(tmp_path, GOOD), tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    want = "1 Avro schema(s)" if kind == "avro" else "60 records sampled from 1 JSON file(s)"
    assert f"config checked against: {want}" in r.output, r.output


def test_avro_type_the_transform_cannot_take_fails(tmp_path):
    inp = _write(tmp_path / "in", _records(), "avro")
    cfg = _config(tmp_path, GOOD + "  - {name: city, transform: zscore}\n  - {name: user, transform: vocabulary}\n")
    r = _convert(inp, cfg, tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert "feature 'city' reads 'city', which is string in the schema, but transform 'zscore' needs numbers" in r.output
    assert "use a categorical transform" in r.output
    assert "feature 'user'" in r.output and "a record (country, age)" in r.output and "e.g. user.country" in r.output, r.output


def test_avro_field_missing_in_one_of_several_files_names_that_file(tmp_path):
    first = _write(tmp_path / "in", _records(), "avro", "part-0")
    old = {**SCHEMA, "fields": [f for f in SCHEMA["fields"] if f["name"] != "income"]}
    second = _write(tmp_path / "in", [{k: v for k, v in r.items() if k != "income"} for r in _records()], "avro", "part-1", old)
    r = _convert(tmp_path / "in", _config(tmp_path, GOOD), tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert f"the Avro schema of {second}" in r.output and "feature 'income'" in r.output, r.output
    assert str(first) not in r.output


def test_json_path_found_in_a_later_file_is_not_a_mismatch(tmp_path):
    """Fields vary between JSON files: files past the first few are sampled while a path is unseen."""
    recs = _records(20)
    for i in range(5):
        rows = recs if i == 4 else [{k: v for k, v in r.items() if k != "income"} for r in recs]
        _write(tmp_path / "in", rows, "json", f"part-{i}")
    cfg = _config(tmp_path, GOOD.replace("{name: income, transform: zscore}", "{name: income, transform: zscore, fill: 0}"))
    r = cli("convert", "-i", tmp_path / "in", "-c", cfg, "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "records sampled from 5 JSON file(s)" in r.output, r.output


@pytest.mark.parametrize("allowed", [False, True])
def test_feature_missing_in_every_training_record_fails_unless_allowed(kind, allowed, tmp_path):
    """`nothing` is in the schema and in every JSON record, always null: the schema and sample
    checks pass, the run finds no value and fails (through _FAILURE.json) unless allowed."""
    inp = _write(tmp_path / "in", _records(), kind)
    extra = ", allow_all_missing: true" if allowed else ""
    cfg = _config(tmp_path, GOOD + f"  - {{name: nothing, transform: vocabulary{extra}}}\n"
                                   f"  - {{name: nothing_h, source: nothing, transform: hash, buckets: 8{extra}}}\n")
    out = tmp_path / "out"
    r = _convert(inp, cfg, out)
    if allowed:
        assert r.exit_code == 0, r.output
        assert (out / "dataset_info.json").exists()
        return
    assert r.exit_code == 1, r.output
    for name in ("nothing", "nothing_h"):
        assert f"feature {name!r} (source 'nothing')" in r.output, r.output
    assert "missing (null, absent or empty) in every one of the" in r.output and "allow_all_missing: true" in r.output
    assert not (out / "dataset_info.json").exists()
    assert not list(out.glob("train-*"))
    assert "allow_all_missing" in json.loads((out / "_FAILURE.json").read_text())["reason"]


def test_numeric_feature_without_statistics_missing_everywhere_fails(tmp_path):
    """identity/log1p keep no statistics: their values are still counted."""
    recs = [{**r, "income": None} for r in _records()]
    inp = _write(tmp_path / "in", recs, "json")
    cfg = _config(tmp_path, GOOD.replace("{name: income, transform: zscore}", "{name: income, transform: log1p}"))
    r = _convert(inp, cfg, tmp_path / "out")
    assert r.exit_code == 1, r.output
    assert "feature 'income' (source 'income')" in r.output, r.output


def test_every_record_rejected_says_what_they_share_and_never_suggests_tolerating(kind, tmp_path):
    recs = [{**r, "salary": None} for r in _records()]
    inp = _write(tmp_path / "in", recs, kind)
    out = tmp_path / "out"
    r = cli("convert", "-i", inp, "-c", _config(tmp_path, GOOD), "-o", out)
    assert r.exit_code == 1, r.output
    assert "all 60 records were rejected, every one for field 'salary' (label must be" in r.output, r.output
    assert "the records' fields are: country, city, income, nothing, user, salary" in r.output, r.output
    assert "--max-error-fraction" not in r.output and "--max-errors" not in r.output
    assert "records were rejected" in json.loads((out / "_FAILURE.json").read_text())["reason"]


def test_some_records_rejected_still_suggest_the_tolerance(tmp_path):
    recs = [{**r, "salary": i} for i, r in enumerate(_records())]
    recs[3]["salary"] = "many"
    inp = _write(tmp_path / "in", recs, "json")
    r = cli("convert", "-i", inp, "-c", _config(tmp_path, GOOD), "-o", tmp_path / "out")
    assert r.exit_code == 1, r.output
    assert "1 of 60 records were rejected" in r.output and "--max-errors 1" in r.output, r.output


@pytest.mark.slow
def test_inputs_on_gcs_are_checked_before_the_run(remote_stack, tmp_path):
    """Headers and samples of gs:// inputs are read through the emulator (a small read buffer)."""
    up = tmp_path / "up"
    _write(up, _records(), "avro", "part-0")
    _write(up, _records(), "json", "part-1")
    gs_in = remote_stack.upload_dir(up, "check/in")
    cfg = _config(tmp_path, GOOD.replace("{name: country,", "{name: contry,"))
    r = cli("convert", "-i", f"{gs_in}/*", "-c", cfg, "-o", f"gs://{remote_stack.bucket}/check/out", "--dry-run")
    assert r.exit_code == 2, r.output
    assert f"the Avro schema of {gs_in}/part-0.avro" in r.output and f"sampled from {gs_in}/part-1.jsonl" in r.output
    assert r.output.count("did you mean 'country'") == 2, r.output


@pytest.mark.parametrize("allowed", [False, True])
def test_min_frequency_above_every_count_fails_unless_allowed(allowed, tmp_path):
    """country takes 3 values 16 times each in the 48 records kept (a null label rejects the others):
    min_frequency 21 would keep no term (every id OOV)."""
    inp = _write(tmp_path / "in", _records(), "json")
    extra = ", allow_all_missing: true" if allowed else ""
    cfg = _config(tmp_path, GOOD + f"  - {{name: rare, source: country, transform: vocabulary, min_frequency: 21{extra}}}\n"
                                   f"  - {{name: words, source: city, transform: text, max_len: 2, min_frequency: 20{extra}}}\n")
    out = tmp_path / "out"
    r = _convert(inp, cfg, out, "--splits", "train=1")
    if allowed:
        assert r.exit_code == 0, r.output
        assert json.loads((out / "dataset_info.json").read_text())
        assert (out / "vocab" / "rare.txt").read_text() == ""
        return
    assert r.exit_code == 2, r.output
    assert ("feature 'rare' (source 'country'): no term of the training split occurs min_frequency (21) times "
            "or more") in r.output, r.output
    assert "feature 'words' (source 'city'): no term of the training split occurs min_frequency" in r.output
    assert "Lower min_frequency" in r.output
    assert not (out / "dataset_info.json").exists()
    assert not list(out.glob("train-*"))


TS_SCHEMA = {"type": "record", "name": "Ev", "fields": [
    {"name": "salary", "type": ["null", "long"]}, {"name": "country", "type": "string"}, {"name": "income", "type": "double"},
    {"name": "ts", "type": ["null", "long"]}]}


@pytest.mark.parametrize("unit, factor, fits", [("s", 10**9, False), ("ms", 10**6, False), ("days", 1000, False),
                                                 ("ns", 10**9, True), ("s", 1, True)])
def test_epoch_numbers_that_do_not_fit_the_unit_are_refused_before_the_run(kind, unit, factor, fits, tmp_path):
    """1767225600 s is 2026-01-01: times 10**9 it is nanoseconds, implausible (year 56 billion) as seconds."""
    recs = [{"salary": i, "country": "fr", "income": float(i), "ts": None if i == 0 else (1_767_225_600 + i) * factor}
            for i in range(20)]
    inp = _write(tmp_path / "in", recs, kind, schema=TS_SCHEMA)
    cfg = _config(tmp_path, GOOD + f"  - {{name: ts, transform: timestamp, unit: {unit}}}\n")
    out = tmp_path / "out"
    r = _convert(inp, cfg, out)
    if fits:
        assert r.exit_code == 0, r.output
        return
    looks = {"s": "ns", "ms": "us", "days": "ms"}[unit]
    assert r.exit_code == 2, r.output
    assert f"in the records sampled from {inp}:" in r.output, r.output
    assert f"feature 'ts' reads 'ts': {(1_767_225_600 + 1) * factor} read as epoch {unit!r} is the year " in r.output
    assert f"it looks like epoch {looks!r} (the year 2026): set unit: {looks}" in r.output
    assert "Fix each source path" not in r.output
    assert not out.exists() or not any(out.iterdir())


def test_a_far_off_sentinel_is_not_a_unit_mismatch(tmp_path):
    recs = [{"salary": i, "country": "fr", "income": 1.0, "ts": 253_402_300_799 if i % 2 else 1_767_225_600} for i in range(10)]
    inp = _write(tmp_path / "in", recs, "json")
    cfg = _config(tmp_path, GOOD + "  - {name: ts, transform: timestamp, unit: s}\n")
    r = _convert(inp, cfg, tmp_path / "out")
    assert r.exit_code == 0, r.output
