"""convert.infer: drafted configs stay within what the config accepts, read
what a field is (instants, identifiers, the label's kind) and say what the user
must know before converting with them."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from pathlib import Path

import _record_strategies
import pytest
import yaml
from _e2e import check_accounting, cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from convert.config import TRANSFORM_TABLE, LabelConfig, load_config, parse_config
from convert.infer import LABEL_MAX_CLASSES, infer_config, render_yaml
from convert.spec import MAX_FEATURE_SIZE
from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "data"
REALDATA = Path(os.environ.get("RECORDPREP_REALDATA", ROOT.parent / "shared" / "realdata"))

LONG = MAX_FEATURE_SIZE * 4


def _records(n: int = 5) -> list[dict]:
    return [{"nums": list(range(LONG)), "tags": [f"t{i % 7}" for i in range(LONG)],
             "body": " ".join(f"w{i}_{j}" for j in range(LONG)), "short": [1, 2, 3]} for i in range(n)]


def test_suggested_max_len_is_capped_and_the_comment_says_so(tmp_path):
    config, drafts = infer_config(_records())
    by = {d.path: d for d in drafts}
    for path in ("nums", "tags", "body"):
        assert by[path].entry["max_len"] == MAX_FEATURE_SIZE, by[path]
        assert f"capped at the limit {MAX_FEATURE_SIZE}" in by[path].comment and f"{LONG}" in by[path].comment
    assert by["short"].entry["max_len"] == 3 and "capped" not in by["short"].comment
    draft = tmp_path / "draft.yaml"
    draft.write_text(render_yaml(config, drafts))
    assert {f.name: f.max_len for f in load_config(draft).features}["body"] == MAX_FEATURE_SIZE


def test_infer_cli_draft_of_long_lists_loads_back(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(3)))
    r = CliRunner().invoke(app, ["infer", "-i", str(data)])
    assert r.exit_code == 0, r.output
    yaml_text = r.stdout
    assert f"max_len: {MAX_FEATURE_SIZE}" in yaml_text and "capped" in yaml_text
    draft = tmp_path / "draft.yaml"
    draft.write_text(yaml_text)
    assert all(f.max_len is None or f.max_len <= MAX_FEATURE_SIZE for f in load_config(draft).features)


# ------------------------------------------------------------- what a field is


def _draft(records: list[dict], label: str | None = None) -> tuple[dict, dict]:
    """(features by name, the config mapping), after checking the draft loads."""
    config, drafts = infer_config(records, label=label)
    text = render_yaml(config, drafts)
    parse_config(yaml.safe_load(text), source="draft")
    return {f["name"]: f for f in config["features"]}, config


def test_iso_8601_strings_are_timestamps():
    base = dt.datetime(2024, 3, 1, 8, 30, tzinfo=dt.UTC)
    records = [{"at": (base + dt.timedelta(hours=7 * i)).isoformat().replace("+00:00", "Z"),
                "local": (base + dt.timedelta(minutes=13 * i)).strftime("%Y-%m-%dT%H:%M:%S"),
                "offset": (base + dt.timedelta(days=i)).astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat(),
                "day": (base + dt.timedelta(days=i)).date().isoformat() if i % 5 else None,
                "almost": f"2024-03-{i % 28 + 1:02d} or so"} for i in range(40)]
    feats, _ = _draft(records)
    for name in ("at", "local", "offset"):
        assert feats[name] == {"name": name, "transform": "timestamp", "parts": ["hour", "day_of_week"]}, feats[name]
    assert feats["day"] == {"name": "day", "transform": "timestamp", "parts": ["day_of_week", "month"],
                            "missing_indicator": True, "allow_all_missing": True}  # null in part of the sample
    assert feats["almost"]["transform"] != "timestamp"


def test_a_string_that_only_looks_like_a_date_keeps_the_field_out_of_timestamp():
    records = [{"d": f"2024-01-{i + 1:02d}"} for i in range(20)] + [{"d": "2024-02-30"}]  # no such day
    feats, _ = _draft(records)
    assert feats["d"]["transform"] != "timestamp"


@pytest.mark.parametrize("field", ["id", "user_id", "userId", "sessionUUID", "request_guid"])
def test_identifier_names_are_hashed(field):
    records = [{field: 10_000 + 7 * (i % 150), "n": i % 2} for i in range(300)]  # each id in two records
    feats, _ = _draft(records)
    assert feats[field]["transform"] == "hash" and feats[field]["buckets"] >= 150, feats[field]
    strings, _ = _draft([{field: f"u{i * 31 % 997 % 120}"} for i in range(300)])
    assert strings[field]["transform"] == "hash", strings[field]


@pytest.mark.parametrize("values", [
    [10_000 + 7 * i for i in range(300)], [f"req-{i * 31 % 997}" for i in range(300)],
])
def test_identifiers_of_the_record_itself_are_left_out_saying_why(values):
    """A distinct value per record (request_id, event_id): a hashed feature of it is noise."""
    records = [{"request_id": v, "n": i % 3, "event": f"e{i % 9}"} for i, v in enumerate(values)]
    config, drafts = infer_config(records)
    assert "request_id" not in {f["name"] for f in config["features"]}
    why = next(d.comment for d in drafts if d.path == "request_id")
    assert "300 distinct values in 300 records, nearly one per record: left out" in why
    assert "  # skipped request_id: identifier" in render_yaml(config, drafts)
    few, _ = _draft(records[:12])  # too few records to tell an id of the record from a category
    assert few["request_id"]["transform"] in ("hash", "vocabulary")


def test_nested_id_and_few_valued_ids():
    records = [{"user": {"id": f"u{i % 80}"}, "category_id": i % 6, "valid": 1000 + i, "paid": i * 3} for i in range(200)]
    feats, _ = _draft(records)
    assert feats["user_id"]["transform"] == "hash" and feats["user_id"]["source"] == "user.id"
    assert feats["category_id"]["transform"] == "vocabulary"  # a code with few values
    assert feats["valid"]["transform"] == "zscore" and feats["paid"]["transform"] == "zscore"  # not *_id names


def test_card_numbers_are_hashed_whether_integers_or_digit_strings():
    rng = random.Random(5)
    cards = [rng.randrange(4000_0000_0000_0000, 4999_9999_9999_9999) for _ in range(180)]
    cards += cards[:20]  # some cards in two records
    records = [{"cc": c, "card": " ".join(f"{c:016d}"[k:k + 4] for k in range(0, 16, 4)), "phone": f"+1-555-{c % 10**7:07d}",
                "amount": c % 100_000, "zip": f"{c % 40:05d}"} for c in cards]
    feats, _ = _draft(records)
    for name in ("cc", "card", "phone"):
        assert feats[name]["transform"] == "hash", feats[name]
    assert feats["amount"]["transform"] == "zscore"
    assert feats["zip"]["transform"] == "vocabulary"  # digits, but few values
    once, _ = _draft(records[:180])  # one card per record: left out
    assert not {"cc", "card", "phone"} & set(once) and once["amount"]["transform"] == "zscore"


def test_epoch_integers_of_a_time_named_field_are_timestamps_in_their_unit():
    start = 1_700_000_000
    records = [{"ts": (start + 61 * i) * 1000, "created_at": start + 3600 * i, "eventTime": (start + i) * 10**6,
                "count": start + i, "time": -619524000000 + i} for i in range(50)]
    feats, _ = _draft(records)
    assert {k: feats["ts"][k] for k in ("transform", "unit")} == {"transform": "timestamp", "unit": "ms"}
    assert feats["created_at"]["unit"] == "s" and feats["eventTime"]["unit"] == "us"
    assert feats["count"]["transform"] == "zscore"  # epoch-like values, but not a time's name
    assert feats["time"]["transform"] == "zscore"  # a time's name, values of 1950: not drafted as an instant


def test_header_lists_every_transform_with_its_description():
    config, drafts = infer_config([{"x": 1.5}, {"x": 2.5}])
    header = [line for line in render_yaml(config, drafts).splitlines() if line.startswith("#")]
    for name, info in TRANSFORM_TABLE.items():
        assert any(line.split()[1:2] == [name] and info.summary in line for line in header), (name, header)


def test_field_names_with_line_breaks_stay_in_their_comment():
    config, drafts = infer_config([{"a\nb": i * 1.5, "c\r\n: x": [i]} for i in range(3)])
    loaded = parse_config(yaml.safe_load(render_yaml(config, drafts)))
    assert {f.source for f in loaded.features} == {"a\nb", "c\r\n: x"}


# ------------------------------------------------------------------------ labels


@pytest.mark.parametrize("values, dtype", [
    ([0, 1, 1, 0, 2], "int64"), ([True, False, True], "int64"),
    (list(range(LABEL_MAX_CLASSES + 1)), "float32"), ([0.5, 1.5, 2.0], "float32"), ([1, 2.5, 3], "float32"),
])
def test_label_kind_comes_from_the_data(values, dtype):
    _, config = _draft([{"x": i, "target": v} for i, v in enumerate(values)], label="target")
    assert config["label"] == {"source": "target", "dtype": dtype}


def test_label_name_that_is_no_config_name_is_renamed_and_loads():
    _, config = _draft([{"x": i, "my label": i % 2} for i in range(4)], label="my label")
    assert config["label"] == {"source": "my label", "name": "my_label", "dtype": "int64"}


def test_string_label_is_drafted_as_a_vocabulary_label_and_loads(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"x": i, "gender": ["F", "M"][i % 2]}) + "\n" for i in range(10)))
    r = CliRunner().invoke(app, ["infer", "-i", str(data), "--label", "gender"])
    assert r.exit_code == 0, r.output
    assert "not supported" not in r.output
    draft = yaml.safe_load(r.stdout)
    assert draft["label"] == {"source": "gender", "transform": "vocabulary"}
    assert [f["name"] for f in draft["features"]] == ["x"]  # not a feature too
    assert "gender: strings (2 distinct: F, M): class names" in r.stdout
    cfg = tmp_path / "f.yaml"
    cfg.write_text(r.stdout)
    assert load_config(cfg).label == LabelConfig(source="gender", name="gender", transform="vocabulary")


def test_label_null_in_part_of_the_sample_warns_in_the_draft_and_on_stderr(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"x": i, **({"y": i % 2} if i % 4 else {"y": None})}) + "\n" for i in range(12))
                    + json.dumps({"x": 99}) + "\n")
    r = CliRunner().invoke(app, ["infer", "-i", str(data), "--label", "y"])
    assert r.exit_code == 0, r.output
    want = "label 'y' is null or absent in 4 of 13 sampled records"
    assert want in r.stderr and f"# warning: {want}" in r.stdout
    assert yaml.safe_load(r.stdout)["label"] == {"source": "y", "dtype": "int64"}
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(json.dumps({"x": i, "y": i % 2}) + "\n" for i in range(12)))
    r = CliRunner().invoke(app, ["infer", "-i", str(clean), "--label", "y"])
    assert r.exit_code == 0 and "warning" not in r.stderr and "# warning" not in r.stdout, r.output


def test_unknown_label_field_exits_2_with_a_suggestion(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"salary": i, "age": i}) + "\n" for i in range(5)))
    r = CliRunner().invoke(app, ["infer", "-i", str(data), "--label", "salry"])
    assert r.exit_code == 2 and "did you mean 'salary'?" in r.output, r.output


def test_label_named_field_holding_strings_is_not_picked_as_a_float_label():
    _, config = _draft([{"x": i, "class": ["cat", "dog"][i % 2]} for i in range(6)])
    assert config["label"] is None  # before: {source: class, dtype: float32}, every record then rejected


# ------------------------------------------------------ drafts load and convert


def test_drafts_of_the_examples_load_and_convert(tmp_path):
    for pattern in ("*.avro", "*.jsonl"):
        r = cli("infer", "-i", str(EXAMPLES / pattern))
        assert r.exit_code == 0, r.output
        cfg = tmp_path / f"features-{pattern[2:]}.yaml"
        cfg.write_text(r.stdout)
        config = load_config(cfg)
        by = {f.name: f for f in config.features}
        assert by["ts"].transform == "timestamp" and by["user_id"].transform == "hash"
        assert "event_id" not in by  # one per record: left out
        # no --label: none chosen; the candidate is named, and kept out of the features
        assert config.label is None and "clicked" not in {f.source for f in config.features}
        assert "rerun with --label clicked" in r.stdout and "rerun with --label clicked" in r.stderr
    r = cli("infer", "-i", str(EXAMPLES / "*.avro"), "--label", "clicked")  # the README's tour
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output
    (tmp_path / "features-avro.yaml").write_text(r.stdout)
    assert load_config(tmp_path / "features-avro.yaml").label.source == "clicked"
    out = tmp_path / "out"
    r = cli("convert", "-i", str(EXAMPLES / "*.avro"), "-c", str(tmp_path / "features-avro.yaml"), "-o", str(out))
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    assert {f["name"]: f["transform"] for f in info["features"]}["ts"] == "timestamp"
    assert sum(s["num_records"] for s in info["splits"].values()) == 4000  # 4 files of 1000 records


@pytest.mark.skipif(not (REALDATA / "README.md").is_file(), reason=f"{REALDATA} is absent (real files from other tools)")
def test_drafts_of_every_real_world_file_load(tmp_path):
    """Every file `infer` drafts a config for (test_realdata_convert.py converts them too)."""
    drafted = 0
    for i, path in enumerate(sorted(p for p in REALDATA.rglob("*")
                                    if p.is_file() and p.suffix in (".avro", ".json", ".ndjson", ".jsonl"))):
        r = cli("infer", "-i", str(path))
        if r.exit_code != 0:
            assert r.exit_code == 1 and str(path) in r.output, r.output  # a clear "cannot draft", never a crash
            continue
        cfg = tmp_path / f"draft-{i}.yaml"
        cfg.write_text(r.stdout)
        assert load_config(cfg).features, path
        drafted += 1
    assert drafted >= 20


@pytest.mark.parametrize("text", ["", "\n", "  \n\n"])
def test_an_empty_config_is_named_empty(tmp_path, text):
    """`infer ... > features.yaml` leaves an empty file when infer fails; convert says so."""
    cfg = tmp_path / "features.yaml"
    cfg.write_text(text)
    r = cli("convert", "-i", str(EXAMPLES / "*.avro"), "-c", str(cfg), "-o", str(tmp_path / "out"))
    assert r.exit_code == 2, r.output
    assert f"{cfg}: the config file is empty" in r.output and "NoneType" not in r.output
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------ the draft converts the data it was drafted from


def _rejections(records: list, schema=None) -> dict:
    """Records the converter rejects under the draft of ``records`` (the label aside: see the warnings)."""
    from convert.prepare import Preparer

    config, drafts = infer_config(records, schema)
    if not config["features"]:  # infer refuses the input ("unsupported input: no field ...")
        return {}
    loaded = parse_config(yaml.safe_load(render_yaml(config, drafts)))
    # A label's rejection names its source field (the label is renamed when a feature takes its name).
    label = {loaded.label.name, loaded.label.source} if loaded.label else set()
    if schema is not None:  # what convert's config check says before a run
        from convert.check import avro_problems

        problems = avro_problems(loaded, schema)
        assert not problems, problems
    bad = Preparer(loaded).prepare(records, analyze=True).bad
    return {i: (r.field, r.reason) for i, r in bad.items() if r.field not in label}


_NESTED = st.dictionaries(_record_strategies._KEYS, _record_strategies.json_values, max_size=6)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_NESTED, min_size=1, max_size=20))
def test_the_draft_of_random_nested_json_takes_every_record(records):
    assert _rejections(records) == {}


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(_record_strategies.avro_cases())
def test_the_draft_of_random_avro_takes_every_record(case):
    assert _rejections(case.records, case.schema) == {}


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(_record_strategies.wide_nested_cases())
def test_the_draft_of_lists_of_records_of_records_and_variants_passes_the_check_and_takes_every_record(case):
    assert _rejections(case.records, case.schema) == {}


def test_infer_then_convert_takes_every_record_of_nested_json(tmp_path):
    """Lists of free text, values that are a scalar here and a list there, and a field
    under a list of records set in one record only: the draft converts as it is."""
    rng = random.Random(39)
    words = [f"w{i}" for i in range(200)]
    rows = []
    for i in range(40):
        rows.append({"clicked": i % 2, "notes": [" ".join(rng.sample(words, 5)) for _ in range(1 + i % 3)],
                     "v": [i, f"s{i}", [i, i + 1]][i % 3], "r": [{"c": {"d": 1.5}}] if i == 37 else [{"c": {}}]})
    data = tmp_path / "nested.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("infer", "-i", data)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    out = tmp_path / "out"
    r = cli("convert", "-i", data, "-c", cfg, "-o", out)
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    assert sum(counts["written"].values()) == 40 and counts["errors"] == 0, counts


def test_json_lines_of_arrays_under_a_header_row_are_records(tmp_path):
    """A table export (first line the column names, then one array per row): every
    byte range reads the header, the names become fields, a short row is a bad line."""
    import io

    from convert.formats.jsonl import iter_json

    rows = [[i, f"c{i % 3}", i / 7, i % 2] for i in range(30)]
    data = ("\r\n".join(json.dumps(r) for r in [["id", "country", "score", "clicked"], *rows]) + "\n").encode()
    for cut in range(1, len(data), 7):
        got = [r for s, e in ((0, cut), (cut, None)) for b in iter_json(io.BytesIO(data), "t.jsonl", s, e) for r in b.records]
        assert got == [dict(zip(["id", "country", "score", "clicked"], r, strict=True)) for r in rows], cut
    bad = [b.bad for b in iter_json(io.BytesIO(b'["a", "b"]\n[1]\n[1, 2]\n'), "t.jsonl")]
    assert bad[0][0][1] == 2 and "expected an array of 2 values (the header row's columns), found 1 values" in bad[0][0][2]

    path = tmp_path / "export.jsonl"
    path.write_bytes(data)
    r = cli("infer", "-i", path)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    assert {f.source for f in load_config(cfg).features} >= {"country", "score"}
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sum(check_accounting(tmp_path / "out")["written"].values()) == 30


def test_a_field_past_the_config_checks_sample_does_not_stop_the_draft(tmp_path):
    """infer samples 2,000 records, convert's config check 1,000: a field that first
    appears past the check's sample is marked allow_all_missing, not 'in none of the 1000'."""
    rows = [{"clicked": i % 2, "x": i % 17, **({"late": f"c{i % 5}"} if i >= 1100 else {})} for i in range(1500)]
    data = tmp_path / "late.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = cli("infer", "-i", data)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    assert {f.name: f.allow_all_missing for f in load_config(cfg).features}["late"]
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sum(check_accounting(tmp_path / "out")["written"].values()) == 1500


# ------------------------------------------------------ names, lists of records, vocabularies, labels


def test_any_unicode_field_name_round_trips_through_the_draft():
    """Emoji (outside the BMP), quotes, backslashes, a lone surrogate from JSON's \\ud83e: each
    source loads back as the field's own name, so convert finds the field."""
    from convert.config import render_path
    from convert.prepare import Preparer

    keys = ["\U0001f986", 'a"b\\c', "straße", "\ud83e", "yes", "x\u2028y", "\ufeffbom"]
    records = [{k: i * 1.5 + j for j, k in enumerate(keys)} for i in range(5)]
    config, drafts = infer_config(records)
    loaded = parse_config(yaml.safe_load(render_yaml(config, drafts)))
    assert {f.source for f in loaded.features} == {render_path((k,)) for k in keys}
    assert not Preparer(loaded).prepare(records, analyze=True).bad


def test_many_fields_with_one_sanitized_name_get_distinct_names():
    records = [{f"a{c}b": 1.5 * i for c in "-./ :+*"} | {"a_b_len": i, "a_b": i} for i in range(3)]
    config, drafts = infer_config(records)
    loaded = parse_config(yaml.safe_load(render_yaml(config, drafts)))  # no clash with a_b's derived names
    assert len({f.name for f in loaded.features}) == len(records[0])


def test_a_count_of_a_list_absent_from_part_of_the_sample_allows_all_missing():
    records = [{"x": i % 7, **({"m": [[i, 1], [2]]} if i % 7 == 0 else {})} for i in range(20)]
    feats, _ = _draft(records)
    assert feats["m_count"]["transform"] == "count" and feats["m_count"]["allow_all_missing"] is True


def _tweets(n: int, media_in: set[int], salt: int = 0) -> list[dict]:
    return [{"id": 10**17 + i, "source": f"client{salt}", "text": f"tweet {i} about {['cats', 'dogs', 'birds'][i % 3]} and more words",
             "lang": ["en", "de"][i % 2], "retweet_count": i * 3 % 11,
             "user": {"screen_name": f"u{i % 4}", "followers_count": 100 + i},
             "entities": {"hashtags": [{"text": f"h{i % 3}"}] if i % 2 else [],
                          **({"media": [{"type": "photo", "media_url": f"http://x/{i}.jpg"}]} if i in media_in else {})}}
            for i in range(n)]


def test_tweets_whose_training_split_lacks_a_list_of_records_convert_from_their_draft(tmp_path):
    """A JSON array of 20 tweets, entities.media in eval records only: the draft converts as it is."""
    from convert.splits import Splits

    splits = Splits(("train", "eval"), (0.9, 0.1))
    for k in range(400):  # the split is by content: find a media tweet that lands in eval
        media = {k % 20}
        tweets = _tweets(20, media, k // 20)
        assign = splits.assign(tweets).tolist()
        if all(assign[i] == 1 for i in media):
            break
    else:
        pytest.fail("no tweets with media in eval only")
    data = tmp_path / "tweets.json"
    data.write_text(json.dumps(tweets, indent=1))
    r = cli("infer", "-i", data)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sum(check_accounting(tmp_path / "out")["written"].values()) == 20


def test_one_json_document_with_one_list_of_records_is_read_from_it(tmp_path):
    """{"statuses": [...], "search_metadata": {...}}: infer reads the list and names the flag
    convert needs; a document with two lists of records is refused, naming both."""
    doc = {"statuses": _tweets(20, {3}), "search_metadata": {"count": 20, "query": "cats"}}
    data = tmp_path / "search.json"
    data.write_text(json.dumps(doc, indent=2))
    r = cli("infer", "-i", data)
    assert r.exit_code == 0, r.output
    assert "--json-records-path statuses" in r.stderr and "--json-records-path statuses" in r.stdout
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "out", "--json-records-path", "statuses")
    assert r.exit_code == 0, r.output
    assert sum(check_accounting(tmp_path / "out")["written"].values()) == 20
    two = tmp_path / "two.json"
    two.write_text(json.dumps({**doc, "more": {"users": [{"a": 1}]}}, indent=2))
    r = cli("infer", "-i", two)
    assert r.exit_code == 1 and "--json-records-path more.users (lists of records in it: more.users, statuses)" in r.output


def test_one_list_of_records_gives_one_length_feature():
    records = [{"impressions": [{"ad": f"a{(i + j) % 5}", "pos": j, "cost": j * 0.5} for j in range(i % 4 + 1)], "n": i}
               for i in range(30)]
    config, drafts = infer_config(records)
    names = {f["name"] for f in config["features"]}
    assert "impressions_count" not in names and {"impressions_ad", "impressions_pos", "impressions_cost"} <= names
    why = next(d.comment for d in drafts if d.path == "impressions")
    # the first numeric item field's: a numeric list counts every item, null ones too
    assert "its length is the <name>_len of impressions[].cost's feature" in why
    outputs = parse_config(yaml.safe_load(render_yaml(config, drafts))).output_names
    assert [n for n in outputs if n.endswith("_len")] == ["impressions_cost_len"], outputs
    feats = {f["name"]: f for f in config["features"]}
    assert feats["impressions_pos"]["length_of"] == "impressions_cost" and feats["impressions_ad"]["length"] is False


def test_a_list_of_records_with_only_fields_of_ids_gives_one_length_feature():
    """Without a numeric item field: the first never-null field of ids keeps its <name>_len; when
    every one may be null (its list then drops those items), the list's count is the length."""
    whole = [{"imp": [{"ad": f"a{j}", "site": None if j % 2 else "s"} for j in range(i % 3 + 1)]} for i in range(30)]
    feats, config = _draft(whole)
    outputs = parse_config(config).output_names
    assert [n for n in outputs if n.endswith("_len") or n.endswith("_count")] == ["imp_ad_len"], outputs
    assert feats["imp_site"]["length"] is False and "imp_count" not in feats
    holes = [{"imp": [{"ad": None if (i + j) % 4 == 0 else f"a{j}"} for j in range(i % 3 + 1)]} for i in range(30)]
    feats, config = _draft(holes)
    outputs = parse_config(config).output_names
    assert [n for n in outputs if n.endswith("_len") or n.endswith("_count")] == ["imp_count"], outputs
    assert feats["imp_ad"]["length"] is False


def test_infer_then_convert_writes_one_length_feature_for_a_list_of_records(tmp_path):
    """Issue 47: a list of records of three item fields (ids, positions, prices; prices null in
    some items) converts from its draft, every record, with one length column for the list."""
    rows = [{"user": f"u{i % 3}", "impressions": [{"id": f"x{(i + j) % 5}", "pos": j + 1, "price": None if j == 1 else j * 1.5}
                                                  for j in range(i % 4)]} for i in range(40)]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = CliRunner().invoke(app, ["infer", "-i", str(src)])
    assert r.exit_code == 0, r.output
    (tmp_path / "f.yaml").write_text(r.stdout)
    out = tmp_path / "out"
    r = cli("convert", "-i", src, "-c", tmp_path / "f.yaml", "-o", out, "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    lengths = [f for f in info["features"] if f["transform"] in ("length", "count")]
    assert [f["name"] for f in lengths] == ["impressions_pos_len"], [f["name"] for f in info["features"]]
    assert lengths[0]["params"]["shared_by"] == ["impressions_price"]
    counts = check_accounting(out, ("train",))
    assert counts["errors"] == 0 and counts["written"]["train"] == 40, counts


def test_top_k_comes_from_the_sample_with_its_estimated_coverage():
    rng = random.Random(3)
    common = [{"city": f"c{rng.randrange(130)}"} for _ in range(2000)]  # 130 values, each seen often
    feats, _ = _draft(common)
    assert feats["city"]["top_k"] == 130
    config, drafts = infer_config(common)
    assert "top_k 130: the sample's 130 distinct values; estimated coverage 100%" in drafts[0].comment
    assert not drafts[0].warnings
    rare = [{"city": f"c{i % 300}" if i % 5 else f"r{i}"} for i in range(1200)]  # a fifth seen once
    config, drafts = infer_config(rare)
    assert config["features"][0]["top_k"] == 480 and "estimated coverage 80%" in drafts[0].comment
    assert "an estimated 20% of new values will be out of vocabulary" in drafts[0].warnings[0]
    assert "  # warning: city: an estimated 20%" in render_yaml(config, drafts)


@pytest.mark.parametrize("field", ["y", "label", "clicked"])
def test_no_label_is_chosen_without_label_the_candidate_is_named(field):
    config, drafts = infer_config([{"x": i * 1.5, field: i * 0.25} for i in range(30)])
    assert config["label"] is None and field not in {f.get("source", f["name"]) for f in config["features"]}
    text = render_yaml(config, drafts)
    assert f"# label: none drafted: none without --label; {field!r} looks like one" in text
    assert f"rerun with --label {field}" in text
    parse_config(yaml.safe_load(text))


def test_a_timestamp_whose_values_are_in_another_unit_than_declared_takes_the_values_unit():
    schema = {"type": "record", "name": "r", "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}}]}
    config, drafts = infer_config([{"t": 1608822900000000000 + i} for i in range(5)], schema)
    assert config["features"][0]["unit"] == "ns" and "values are epoch ns" in drafts[0].comment
    config, _ = infer_config([{"t": 1608822900000000 + i} for i in range(5)], schema)
    assert config["features"][0]["unit"] == "us"


def test_records_inside_lists_and_variant_like_structs_of_parquet_convert_from_their_draft(tmp_path):
    """hits[].eventInfo is a record inside each item (not countable); a Spark VARIANT is a
    struct of two binaries: the draft of such a Parquet file converts it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    info = pa.struct([("category", pa.string()), ("value", pa.int64())])
    variant = pa.struct([("metadata", pa.binary()), ("value", pa.binary())])
    hit = pa.struct([("hitNumber", pa.int64()), ("eventInfo", info), ("v", variant),
                     ("product", pa.list_(pa.struct([("sku", pa.string()), ("price", pa.float64())])))])
    rows = [{"visit": i % 9, "v": {"metadata": b"\x01\x00", "value": bytes([i % 7])},
             "hits": [{"hitNumber": j, "eventInfo": None if (i + j) % 3 else {"category": f"c{j}", "value": i},
                       "v": {"metadata": b"\x01", "value": b"\x0c"}, "product": [{"sku": f"s{k}", "price": k * 1.5} for k in range(j)]}
                      for j in range(i % 4)]} for i in range(60)]
    schema = pa.schema([("visit", pa.int64()), ("v", variant), ("hits", pa.list_(hit))])
    data = tmp_path / "ga.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), data)
    r = cli("infer", "-i", data)
    assert r.exit_code == 0, r.output
    assert "hits[].eventInfo: a record inside each item of a list" in r.stdout
    cfg = tmp_path / "features.yaml"
    cfg.write_text(r.stdout)
    r = cli("convert", "-i", data, "-c", cfg, "-o", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert sum(check_accounting(tmp_path / "out")["written"].values()) == 60


# ------------------------------------------------------------ label paths

_LABEL_SCHEMA = {"type": "record", "name": "R", "fields": [
    {"name": "x", "type": "double"}, {"name": "y", "type": {"type": "array", "items": "long"}},
    {"name": "n", "type": {"type": "record", "name": "N", "fields": [{"name": "a", "type": "long"}]}}]}


def _label_data(tmp_path: Path, kind: str) -> Path:
    records = [{"x": float(i % 7), "y": [i % 2, i % 3], "n": {"a": i % 4}} for i in range(40)]
    if kind == "json":
        path = tmp_path / "d.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        import fastavro
        path = tmp_path / "d.avro"
        with open(path, "wb") as f:
            fastavro.writer(f, _LABEL_SCHEMA, records)
    return path


@pytest.mark.parametrize("kind", ["json", "avro"])
def test_label_path_the_converter_takes_is_drafted_and_converts(tmp_path, kind):
    """``--label y[0]`` is a source path convert reads (an index), not a field name: drafted,
    its list left out of the features (it holds the label), and the draft converts."""
    data = _label_data(tmp_path, kind)
    r = CliRunner().invoke(app, ["infer", "-i", str(data), "--label", "y[0]"])
    assert r.exit_code == 0, r.output
    draft = yaml.safe_load(r.stdout)
    assert draft["label"] == {"source": "y[0]", "name": "y_0", "dtype": "int64"}
    assert "y" not in {f.get("source", f["name"]) for f in draft["features"]}
    assert "skipped y: holds the label 'y[0]'" in r.stdout
    cfg = tmp_path / "f.yaml"
    cfg.write_text(r.stdout)
    assert load_config(cfg).label == LabelConfig(source="y[0]", name="y_0", dtype="int64")
    out = tmp_path / "out"
    r = cli("convert", "-i", str(data), "-c", str(cfg), "-o", str(out))
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["label_key"] == "y_0" and info["config"]["label"]["source"] == "y[0]"


@pytest.mark.parametrize("kind", ["json", "avro"])
@pytest.mark.parametrize("label, close", [("yy[0]", "'y[]'"), ("n.b", "'n.a'")])
def test_label_path_that_does_not_exist_exits_2_naming_it_and_close_fields(tmp_path, kind, label, close):
    r = CliRunner().invoke(app, ["infer", "-i", str(_label_data(tmp_path, kind)), "--label", label])
    assert r.exit_code == 2 and f"--label {label!r}" in r.output and f"did you mean {close}?" in r.output, r.output


def test_label_path_through_a_list_exits_2_saying_what_to_write(tmp_path):
    r = CliRunner().invoke(app, ["infer", "-i", str(_label_data(tmp_path, "json")), "--label", "y[]"])
    assert r.exit_code == 2 and "one value per record" in r.output and "'y[0]'" in r.output, r.output


@pytest.mark.parametrize(("kind", "where"), [("json", "a list in 40 of 40 sampled records"),
                                             ("avro", "an array of long in the Avro schema")])
def test_label_that_is_a_list_exits_2_alike_for_json_and_avro_suggesting_one_item(tmp_path, kind, where):
    """``--label y`` where ``y`` is a list: convert would reject every record, so infer says so
    for JSON Lines as for Avro (it used to draft JSON without a label), naming the label and
    the item to read instead."""
    r = CliRunner().invoke(app, ["infer", "-i", str(_label_data(tmp_path, kind)), "--label", "y"])
    assert r.exit_code == 2, r.output
    assert (f"--label 'y': the label 'y' holds {where}; a label is one value per record: read one item, "
            f"e.g. 'y[0]'") in r.output, r.output
    assert not r.stdout.startswith("#"), "no draft"


def test_label_that_is_a_json_object_exits_2_suggesting_a_field(tmp_path):
    r = CliRunner().invoke(app, ["infer", "-i", str(_label_data(tmp_path, "json")), "--label", "n"])
    assert r.exit_code == 2 and "the label 'n' holds an object" in r.output and "e.g. 'n.a'" in r.output, r.output
