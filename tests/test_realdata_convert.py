"""Every file in ../shared/realdata through the real CLI: `recordprep infer` then `recordprep convert`.

Files written by other tools (Java, C, JS, Go, Spark, Impala; see the table in
../shared/realdata/README.md), referenced in place. Each valid file either
converts (read back with ``readers.eval_dataset``: the record count is the
README's, every value is what the README's rules give) or stops with a clear
"unsupported"/"no records" message naming the file - never a traceback. Each
bad file fails with its name and byte offset, or, where it holds readable
records next to bad lines and the user tolerates errors, its bad lines land in
``errors/*.jsonl`` and the per-file counts add up.

The outcomes are documented in docs/feature-config.md ("Real-world files").
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _e2e import check_accounting, cli, error_rows
from _expected_values import (
    assert_columns_equal,
    expected_columns,
    expected_scaled_stats,
    expected_stats,
    expected_vocabulary,
    json_lines,
    raw_avro_records,
    read_split,
)

from convert.splits import Splits

REALDATA = Path(os.environ.get("RECORDPREP_REALDATA", Path(__file__).resolve().parents[2] / "shared" / "realdata"))
HAVE_REALDATA = (REALDATA / "README.md").is_file()
pytestmark = pytest.mark.skipif(not HAVE_REALDATA, reason=f"{REALDATA} is absent (real AVRO/JSON files from other tools; see docs/development.md)")

def _table() -> list[tuple[str, str, int]]:
    if not HAVE_REALDATA:
        return [("valid Avro", "absent", 0)]  # one placeholder, skipped
    rows = []
    for line in (REALDATA / "README.md").read_text(encoding="utf-8").splitlines():
        m = re.match(r"\|\s*(valid Avro|bad Avro|JSON records|JSON edge / bad)\s*\|\s*`([^`]+)`\s*\|\s*(\d+)\s*\|", line)
        if m:
            rows.append((m.group(1), m.group(2), int(m.group(3))))
    assert rows, f"no file table found in {REALDATA / 'README.md'}"
    return rows


TABLE = _table()

# ---- documented outcomes (docs/feature-config.md "Real-world files") -----------------------------

#: `recordprep infer` cannot draft a config: exit 1 with this in the message (plus the path).
INFER_STOPS = {
    "fastavro__fastavro/tests/avro-files/no-fields.avro": "unsupported input: no field",
    "fastavro__fastavro/tests/avro-files/testDataFileMeta.avro": "no records found",
    "duckdb__duckdb/data/json/empty.ndjson": "no records found",
    "duckdb__duckdb/data/json/empty_array.json": "no records found",
    "duckdb__duckdb/data/json/multiple_objects_per_line.ndjson": "Extra data",
    "duckdb__duckdb/data/json/malformed/array_comma_malformed.json": "not valid JSON",
}
#: extra `infer`/`convert` flags a file needs (documented in the infer message).
FLAGS = {"duckdb__duckdb/data/json/sample_utf8_bom.json": ["--json-records-path", "users"]}
#: Inferred features with no value in the file's training split (set in few records): the draft marks
#: them `allow_all_missing: true`, so convert takes it as it is.
ALL_MISSING_IN_TRAIN = {"apache__arrow-rs/arrow-json/test/data/nested_with_nulls.json": ["a"]}
#: JSON files with lines that are not records: rejected lines (line numbers) when tolerated.
BAD_LINES = {
    "duckdb__duckdb/data/json/trailing_content.ndjson": [2],
    "duckdb__duckdb/data/json/unterminated_quotes.ndjson": [3],
    "duckdb__duckdb/data/json/multiple_objects_per_line.ndjson": [1],
}
#: bad Avro: byte offset the error names (block or header).
AVRO_ERROR_AT = {
    "apache__avro/lang/c/tests/avro-1237-bad-union-discriminant.avro": 83,
    "apache__avro/lang/c/tests/avro-1238-truncated.avro": 83,
    "apache__avro/lang/js/test/dat/person-10.no-codec.avro": 494,
    "apache__avro/share/test/data/test.avro12": 0,
    "linkedin__goavro/fixtures/bad-header.avro": 0,
    "linkedin__goavro/fixtures/blockSizeExceedsMaxBlockSize.avro": 50,
    "linkedin__goavro/fixtures/syncMarkerMismatch.avro": 50,
    "linkedin__goavro/fixtures/temp0.avro": 0,
}
#: files whose sample holds no vectorizable field at all; any config then converts them.
# `x` is in none of the files: these tests are about reading them.
MINIMAL_CONFIG = "features:\n  - {name: x, transform: identity, allow_all_missing: true}\n"


def records_of(path: Path, flags: list[str]) -> list:
    if path.read_bytes()[:4] == b"Obj\x01":
        return raw_avro_records(path)
    if "--json-records-path" in flags:
        doc = json.loads(path.read_bytes().removeprefix(b"\xef\xbb\xbf"))
        for k in flags[flags.index("--json-records-path") + 1].split("."):
            doc = doc[k]
        return doc
    return json_lines(path)


def check_values(out: Path, records: list, splits=("train", "eval")) -> None:
    """Read every split back and compare with the README's rules, record by record."""
    info = json.loads((out / "dataset_info.json").read_text())
    analysis = json.loads((out / "analysis.json").read_text())
    assign = Splits(tuple(splits), (0.9, 0.1)[: len(splits)] if len(splits) == 2 else (1.0,)).assign(records)
    by_split = {s: [r for r, k in zip(records, assign.tolist(), strict=True) if k == i] for i, s in enumerate(splits)}
    for f in info["features"]:
        p = f["params"]
        if f["transform"] in ("vocabulary", "text"):
            want = expected_vocabulary(by_split[splits[0]], f["source"], f["transform"], p)
            assert analysis["vocabularies"][f["name"]] == want, f["name"]
        if "stats" in p and p["stats"] is not None:
            if f["transform"] in ("timestamp", "count"):  # scaled from their base values' statistics
                want = expected_scaled_stats(by_split[splits[0]], f)
            else:
                want = expected_stats(by_split[splits[0]], f["source"], bool(p.get("max_len")))
            for k in ("mean", "std"):
                assert p["stats"][k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), (f["name"], k)
    for s in splits:
        assert info["splits"][s]["num_records"] == len(by_split[s]), s
        if not by_split[s]:
            continue
        want = expected_columns(by_split[s], info["features"], analysis["vocabularies"])
        assert_columns_equal(read_split(out, s), want, f"{out.name}/{s}")


# ---- valid files: infer, convert, read back ------------------------------------------

VALID = [(f, n) for kind, f, n in TABLE if kind in ("valid Avro", "JSON records", "JSON edge / bad") and f not in AVRO_ERROR_AT]


@pytest.mark.slow
@pytest.mark.parametrize("rel,count", VALID, ids=[f for f, _ in VALID])
def test_valid_file_infers_and_converts(rel, count, tmp_path):
    path = REALDATA / rel
    flags = FLAGS.get(rel, [])
    r = cli("infer", "-i", path, *flags)
    if rel in INFER_STOPS:
        assert r.exit_code == 1, r.output
        assert INFER_STOPS[rel] in r.output and str(path) in r.output, r.output
        return
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    assert yaml.safe_load(r.stdout)["features"], r.stdout

    out = tmp_path / "out"
    bad_lines = BAD_LINES.get(rel, [])
    args = ["convert", "-i", path, "-c", cfg, "-o", out, *flags, "--no-shuffle"]  # check_values: record by record
    if rel in ALL_MISSING_IN_TRAIN:  # the draft marks them: convert takes it as it is
        drafted = {f["name"]: f for f in yaml.safe_load(cfg.read_text())["features"]}
        assert all(drafted[name].get("allow_all_missing") for name in ALL_MISSING_IN_TRAIN[rel]), drafted
    r = cli(*args)
    if bad_lines:  # rejected lines fail the run by default, saying where they are and what tolerates them
        assert r.exit_code == 1, r.output
        assert "--max-errors" in r.output and str(out / "errors") in r.output, r.output
        assert not (out / "dataset_info.json").exists()
        r = cli(*args, "--max-errors", len(bad_lines))
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    assert sum(counts["written"].values()) == count, counts
    assert counts["errors"] == len(bad_lines)
    assert counts["per_file"][str(path)]["read"] == count + len(bad_lines)
    if bad_lines:
        rows = error_rows(out)
        assert [row["line"] for row in rows] == bad_lines
        for row in rows:
            assert row["file"] == str(path) and row["field"] == "<record>" and "malformed JSON" in row["reason"]
            assert isinstance(row["record"], str) and row["record"]
    check_values(out, records_of(path, flags))


@pytest.mark.slow
def test_files_without_records_convert_to_empty_output(tmp_path):
    """0-record files (header-only Avro, empty JSON, []) convert; readers refuse the empty splits clearly."""
    import readers

    cfg = tmp_path / "f.yaml"
    cfg.write_text(MINIMAL_CONFIG)
    files = [REALDATA / f for f, n in VALID if n == 0 and f not in BAD_LINES and "malformed" not in f]
    assert len(files) >= 3
    out = tmp_path / "out"
    r = cli("convert", *[a for f in files for a in ("-i", f)], "-c", cfg, "-o", out)
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    assert counts["read"] == 0 and set(counts["per_file"]) == {str(f) for f in files}
    with pytest.raises(readers.ShardSelectionError, match="no records"):
        readers.eval_dataset(str(out), 8, split="train")


@pytest.mark.slow
def test_json_edge_files_together_keep_per_file_counts(tmp_path):
    """Several files with bad lines in one run: per-file counts in dataset_info.json add up."""
    rels = ["duckdb__duckdb/data/json/trailing_content.ndjson", "duckdb__duckdb/data/json/unterminated_quotes.ndjson",
            "duckdb__duckdb/data/json/duplicate_key.ndjson", "duckdb__duckdb/data/json/example_rn.ndjson",
            "duckdb__duckdb/data/json/multiple_objects_per_line.ndjson"]
    cfg = tmp_path / "f.yaml"
    cfg.write_text("features:\n  - {name: id, transform: hash, buckets: 64}\n  - {name: name, transform: vocabulary}\n"
                   "  - {name: a, transform: identity, missing_indicator: true}\n")
    out = tmp_path / "out"
    r = cli("convert", *[a for f in rels for a in ("-i", REALDATA / f)], "-c", cfg, "-o", out, "--max-error-fraction", "0.2")
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    readme = {f: n for _, f, n in TABLE}
    for rel in rels:
        c = counts["per_file"][str(REALDATA / rel)]
        assert c["errors"] == len(BAD_LINES.get(rel, [])), (rel, c)
        assert c["train"] + c["eval"] == readme[rel], (rel, c)
    rows = error_rows(out)
    assert sorted((Path(r["file"]).name, r["line"]) for r in rows) == [
        ("multiple_objects_per_line.ndjson", 1), ("trailing_content.ndjson", 2), ("unterminated_quotes.ndjson", 3)]
    for row in rows:
        assert {"file", "byte_offset", "line", "field", "reason", "record"} <= set(row)


def test_pretty_printed_json_document_is_read_from_its_one_list_of_records():
    """One JSON document holding one list of records: infer drafts from that list and names
    the --json-records-path convert needs (the draft's header says it too)."""
    r = cli("infer", "-i", REALDATA / "duckdb__duckdb/data/json/sample_utf8_bom.json")
    assert r.exit_code == 0, r.output
    assert "pass --json-records-path users to convert" in r.stderr and "--json-records-path users" in r.stdout
    assert yaml.safe_load(r.stdout)["features"]


def test_infer_reads_avro_logical_types_raw():
    r = cli("infer", "-i", REALDATA / "apache__arrow-testing/data/avro/timestamp_logical_types.avro",
            "-i", REALDATA / "apache__arrow-testing/data/avro/duration_uuid.avro",
            "-i", REALDATA / "apache__arrow-testing/data/avro/fixed256_decimal.avro")
    assert r.exit_code == 0, r.output
    feats = {f["name"]: f for f in yaml.safe_load(r.stdout)["features"]}
    assert {k: feats["ts_nanos"][k] for k in ("transform", "unit", "parts")} == {"transform": "timestamp", "unit": "ns", "parts": ["hour", "day_of_week"]}
    assert feats["local_ts_millis"]["transform"] == "timestamp" and feats["local_ts_millis"]["unit"] == "ms"
    assert feats["uuid_field"]["transform"] == "hash"
    assert feats["value"]["transform"] == "bytes" and "decimal(76,10)" in r.stdout
    assert feats["duration_field"]["transform"] == "bytes"


def test_infer_fills_values_beyond_float32():
    """avro-1279-codec.avro holds DBL_MAX: the draft fills it (on_nan: fill) instead of failing the run."""
    r = cli("infer", "-i", REALDATA / "apache__avro/lang/c/tests/avro-1279-codec.avro")
    feats = {f["name"]: f for f in yaml.safe_load(r.stdout)["features"]}
    assert feats["doubleField"].get("on_nan") == "fill"
    assert "on_nan" not in feats["floatField"]  # FLT_MAX itself is finite in float32


# ---- bad files ------------------------------------------------------------------------

BAD_AVRO = [f for kind, f, _ in TABLE if kind == "bad Avro"]


@pytest.mark.slow
@pytest.mark.parametrize("rel", BAD_AVRO)
def test_bad_avro_fails_naming_file_and_offset(rel, tmp_path):
    path = REALDATA / rel
    offset = AVRO_ERROR_AT.get(rel)
    where = f"{path} at byte {offset}" if offset is not None else str(path)
    r = cli("infer", "-i", path)
    assert r.exit_code == 1 and where in r.output, r.output
    cfg = tmp_path / "f.yaml"
    cfg.write_text(MINIMAL_CONFIG)
    out = tmp_path / "out"
    for tolerance in ([], ["--max-error-fraction", "1"]):
        # An unreadable file fails the run even when bad records are tolerated:
        # what it holds past the damage is unknown, so nothing can be accounted for.
        r = cli("convert", "-i", path, "-c", cfg, "-o", out, *tolerance)
        assert r.exit_code == 1, r.output
        assert f"cannot read input {where}" in r.output, r.output
        assert not (out / "dataset_info.json").exists()


def test_bad_avro_among_good_files_fails_the_run(tmp_path):
    cfg = tmp_path / "f.yaml"
    cfg.write_text(MINIMAL_CONFIG)
    bad = REALDATA / "apache__avro/lang/c/tests/avro-1238-truncated.avro"
    r = cli("convert", "-i", REALDATA / "apache__avro/share/test/data/weather.avro", "-i", bad,
            "-c", cfg, "-o", tmp_path / "out", "--max-errors", "100")
    assert r.exit_code == 1 and f"{bad} at byte 83" in r.output, r.output
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_malformed_json_document_fails_naming_file(tmp_path):
    cfg = tmp_path / "f.yaml"
    cfg.write_text(MINIMAL_CONFIG)
    path = REALDATA / "duckdb__duckdb/data/json/malformed/array_comma_malformed.json"
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out", "--max-error-fraction", "1")
    assert r.exit_code == 1 and str(path) in r.output and "not valid JSON" in r.output, r.output


_MEMORY_PROBE = """
import sys
from pipelines.cli import app
try:
    app(sys.argv[1:], standalone_mode=True)
except SystemExit as e:
    code = e.code
# VmHWM, this process's own peak: ru_maxrss would also count the forking parent's (the test session's) peak
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1]
print(f"maxrss_kb={hwm}", file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.slow
@pytest.mark.parametrize("command", ["convert", "infer"])
def test_block_claiming_2gib_allocates_nothing_like_it(command, tmp_path):
    """A real `recordprep` process under a 1.5 GiB address-space limit: the 2 GiB block is refused, not read."""
    import resource

    path = REALDATA / "linkedin__goavro/fixtures/blockSizeExceedsMaxBlockSize.avro"
    cfg = tmp_path / "f.yaml"
    cfg.write_text(MINIMAL_CONFIG)
    args = ["convert", "-i", str(path), "-c", str(cfg), "-o", str(tmp_path / "out")] if command == "convert" else ["infer", "-i", str(path)]
    limit = 1536 * 1024 * 1024

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    p = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, *args], capture_output=True, text=True, timeout=180,
                       preexec_fn=cap, cwd=Path(__file__).resolve().parents[1])
    assert p.returncode == 1, p.stderr[-2000:]
    assert f"{path} at byte 50" in p.stderr and "2147483648" in p.stderr, p.stderr[-2000:]
    assert "MemoryError" not in p.stderr and "Traceback" not in p.stderr
    rss_kb = int(re.search(r"maxrss_kb=(\d+)", p.stderr).group(1))
    assert rss_kb < 1024 * 1024, f"peak RSS {rss_kb / 1024:.0f} MB"


# ---- real nested JSON Lines (cwida/RealNest): the draft converts every record as it is --------

REALNEST = sorted((REALDATA / "cwida__RealNest").rglob("*.jsonl")) if HAVE_REALDATA else []


def test_drafts_of_real_nested_json_take_every_record():
    """infer's draft of each file, applied to all of its records by the converter's own preparer: no rejection."""
    import orjson

    from convert.config import parse_config
    from convert.infer import infer_config, render_yaml
    from convert.prepare import Preparer

    assert REALNEST, f"no JSON Lines under {REALDATA / 'cwida__RealNest'}"
    for path in REALNEST:
        records = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        config, drafts = infer_config(records[:2000])
        loaded = parse_config(yaml.safe_load(render_yaml(config, drafts)))
        bad = Preparer(loaded).prepare(records, analyze=True).bad
        assert not bad, (path, sorted({(r.field, r.reason[:120]) for r in bad.values()})[:5])


@pytest.mark.slow
@pytest.mark.parametrize("path", REALNEST, ids=[p.parent.name for p in REALNEST])
def test_real_nested_json_infers_and_converts(path, tmp_path):
    r = cli("infer", "-i", path)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", cfg, "-o", out)
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    assert counts["errors"] == 0 and sum(counts["written"].values()) == counts["read"] == 1024, counts
