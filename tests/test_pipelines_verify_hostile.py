"""An output's metadata, analysis and vocabularies that disagree are refused, not trusted:
``verify`` reports them, ``--analysis-from`` refuses them before any work (exit 2), and the
readers and the serving layer refuse them where they load the metadata. A shard listed twice
or in two splits would be read twice (or evaluate on training records); an analysis whose
digest or feature spec differs from the metadata would scale or number features otherwise
than the shards were written."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from _pipelines_data import CONFIG, make_records, write_dataset
from typer.testing import CliRunner

import pipelines.cli.verify as verify_mod
from convert.apply import OutputAnalysis, content_digest
from convert.spec import SpecError
from pipelines.cli import app

runner = CliRunner()


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A completed output (two shards per split) and the data and config it came from."""
    root = tmp_path_factory.mktemp("verify")
    data = write_dataset(root / "d", make_records(120))
    cfg = root / "cfg.yaml"
    cfg.write_text(CONFIG)
    out = root / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(cfg), "-o", str(out), "--num-shards", "2"])
    assert r.exit_code == 0, r.output
    return {"out": out, "data": data, "config": cfg}


def _copy(made, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(made["out"], out)
    return out


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _verify(out: Path):
    return runner.invoke(app, ["verify", str(out)])


def _shard_twice(info):
    info["splits"]["train"]["shards"].append(dict(info["splits"]["train"]["shards"][0]))


def _shard_in_both(info):
    info["splits"]["eval"]["shards"] = [dict(s) for s in info["splits"]["train"]["shards"]]


@pytest.mark.parametrize(("edit", "words"), [
    (_shard_twice, ["twice in split 'train'"]),
    (_shard_in_both, ["in split 'train' and in split 'eval'", "evaluation on training records"]),
])
def test_a_shard_listed_twice_is_refused_by_verify_inspect_and_the_readers(made, tmp_path, edit, words):
    import readers

    out = _copy(made, tmp_path)
    _edit_json(out / "dataset_info.json", edit)
    for command in (["verify", str(out)], ["inspect", str(out)]):
        r = runner.invoke(app, command)
        assert r.exit_code == 1 and all(w in r.output for w in words), r.output
        assert "Traceback" not in r.output
    with pytest.raises(SpecError, match="listed"):
        readers.load_info(str(out))
    with pytest.raises(SpecError, match="listed"):
        readers.eval_dataset(str(out / "eval-*"), batch_size=4)
    with pytest.raises(SpecError, match="listed"):
        OutputAnalysis.load(out)  # what the serving layer loads


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d.pop("analysis_sha256"), ["no analysis_sha256", "edited"]),
    (lambda d: d["vocabularies"]["color"].pop("sha256"), ["no vocabularies.color.sha256", "vocab/color.txt"]),
    (lambda d: d["vocabularies"].pop("tags"), ["'tags'", "vocab/tags.txt", "does not list"]),
])
def test_verify_reports_a_removed_digest(made, tmp_path, edit, words):
    out = _copy(made, tmp_path)
    _edit_json(out / "dataset_info.json", edit)
    r = _verify(out)
    assert r.exit_code == 1 and all(w in r.output for w in words), r.output


def _set_vocab_size(info, size: int = 3):
    next(f for f in info["features"] if f["name"] == "color")["params"]["vocab_size"] = size


def test_a_vocab_size_its_vocabulary_does_not_give_is_refused_by_every_reader(made, tmp_path):
    import readers

    out = _copy(made, tmp_path)
    _edit_json(out / "dataset_info.json", _set_vocab_size)
    words = "vocab_size 3 is not what its vocabulary vocab/color.txt holds"
    r = _verify(out)
    assert r.exit_code == 1 and words in r.output, r.output
    with pytest.raises(SpecError, match=words):
        readers.load_info(str(out))
    with pytest.raises(SpecError, match=words):
        OutputAnalysis.load(out)


def test_an_analysis_contradicting_the_metadatas_vocab_size_is_refused(made, tmp_path):
    out = _copy(made, tmp_path)
    # the metadata edited consistently with itself (size and term count), not with the analysis
    _edit_json(out / "dataset_info.json", lambda d: (_set_vocab_size(d), d["vocabularies"]["color"].update(terms=1)))
    r = _verify(out)
    assert r.exit_code == 1 and "'color'" in r.output and "vocab_size is 3" in r.output, r.output
    with pytest.raises(SpecError, match="contradicts"):
        OutputAnalysis.load(out)  # the serving layer's load (readers.transform_layer)
    r = runner.invoke(app, ["convert", "-i", str(made["data"]["avro"]), "-c", str(made["config"]),
                            "-o", str(tmp_path / "new"), "--analysis-from", str(out)])
    assert r.exit_code == 2 and "vocab_size" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "new").exists()


def test_analysis_from_refuses_an_analysis_the_metadata_was_not_committed_with(made, tmp_path):
    out = _copy(made, tmp_path)
    # a sound analysis on its own (std doubled), but not the one the metadata's digest names
    _edit_json(out / "analysis.json", lambda a: a["stats"]["x"].update(std=a["stats"]["x"]["std"] * 2))
    args = ["convert", "-i", str(made["data"]["avro"]), "-c", str(made["config"]), "-o", str(tmp_path / "new"),
            "--analysis-from", str(out)]
    for extra in (["--dry-run"], []):
        r = runner.invoke(app, [*args, *extra])
        assert r.exit_code == 2 and "committed with" in r.output and "Traceback" not in r.output, r.output
    assert not (tmp_path / "new").exists()


def test_a_mean_outside_min_max_is_refused_by_analysis_from_verify_and_the_readers(made, tmp_path):
    import readers

    def huge_mean(stats):
        stats["x"]["mean"] = -5.5e28

    out = _copy(made, tmp_path)
    _edit_json(out / "analysis.json", lambda a: huge_mean(a["stats"]))
    r = _verify(out)
    assert r.exit_code == 1 and "'mean' -5.5e+28 is outside" in r.output, r.output
    alone = tmp_path / "alone"  # an analysis file on its own: its content is still checked
    alone.mkdir()
    shutil.copy(out / "analysis.json", alone / "analysis.json")
    r = runner.invoke(app, ["convert", "-i", str(made["data"]["avro"]), "-c", str(made["config"]),
                            "-o", str(tmp_path / "new"), "--analysis-from", str(alone)])
    assert r.exit_code == 2 and "'mean' -5.5e+28 is outside" in r.output, r.output
    # the same statistics in the metadata's feature params: every reader of the metadata refuses them
    _edit_json(out / "dataset_info.json",
               lambda d: huge_mean({"x": next(f for f in d["features"] if f["name"] == "x")["params"]["stats"]}))
    with pytest.raises(SpecError, match="'mean' -5.5e\\+28 is outside"):
        readers.load_info(str(out))


def test_verify_hashes_vocabularies_in_blocks(made, tmp_path, monkeypatch):
    """A vocabulary may be larger than memory: verify never reads one whole."""
    out = _copy(made, tmp_path)
    vocab = out / "vocab" / "color.txt"
    vocab.write_bytes(vocab.read_bytes() + b"extra\n" * 50)
    whole = verify_mod.read_file

    def no_vocabulary_whole(path: str):
        assert "/vocab/" not in path, f"{path} read whole"
        return whole(path)

    monkeypatch.setattr(verify_mod, "read_file", no_vocabulary_whole)
    monkeypatch.setattr(verify_mod, "_HASH_BLOCK", 7)
    report = verify_mod.verify_output(str(out))
    assert [p for p in report.problems if "color.txt" in p and "sha256 differs" in p], report.problems
    assert content_digest(vocab.read_bytes()) not in json.dumps(report.problems)


def test_inspect_reads_a_directory_whose_name_has_glob_characters(made, tmp_path):
    parent = tmp_path / "parent"
    shutil.copytree(made["out"], parent)  # another dataset in the parent directory
    shutil.copytree(made["out"], parent / "ds[1]")
    _edit_json(parent / "ds[1]" / "dataset_info.json",  # still adding up: read = written + errors
               lambda d: d["counts"].update(read=4242, errors=4242 - sum(d["counts"]["written"].values())))
    for path in (parent / "ds[1]", f"{parent / 'ds[1]'}/", parent / "ds[1]" / "train-*"):
        r = runner.invoke(app, ["inspect", str(path), "-n", "1"])
        assert r.exit_code == 0, r.output
        assert f"dataset: {parent / 'ds[1]'}\n" in r.output and "records read 4242" in r.output, r.output
    r = runner.invoke(app, ["inspect", str(parent / "train-*"), "-n", "1"])  # a pattern still names its directory
    assert r.exit_code == 0 and f"dataset: {parent}\n" in r.output, r.output


def _stats_of(d):
    return next(f["params"]["stats"] for f in d["features"] if "count" in f["params"].get("stats", {}))


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d, v: d["counts"].update(read=v), "counts.read"),
    (lambda d, v: d["counts"].update(errors=v), "counts.errors"),
    (lambda d, v: d["counts"]["written"].update(train=v), "counts.written.train"),
    (lambda d, v: next(iter(d["counts"]["per_file"].values())).update(eval=v), "counts.per_file["),
    (lambda d, v: d["splits"]["train"].update(num_records=v), "splits.train.num_records"),
    (lambda d, v: d["splits"]["eval"].update(num_bytes=v), "splits.eval.num_bytes"),
    (lambda d, v: d["splits"]["eval"]["shards"][0].update(num_records=v), "shard 0: num_records"),
    (lambda d, v: d["errors"].update(count=v), "errors.count"),
    (lambda d, v: d["vocabularies"]["color"].update(terms=v), "vocabularies.color.terms"),
    (lambda d, v: _stats_of(d).update(count=v), "'count' must be a non-negative integer"),
    (lambda d, v: next(iter(d["statistics"].values())).update(missing=v), "statistics: stats of"),
], ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("value", [math.nan, math.inf, -3, 7.0, True], ids=["nan", "inf", "negative", "float", "bool"])
def test_a_count_that_is_not_an_exact_non_negative_integer_is_refused_everywhere(made, tmp_path, edit, field, value):
    """NaN, infinity, a negative number, a float or a bool counts no records: ``inspect``,
    ``verify``, ``report`` and the readers refuse the metadata naming the field, not show it."""
    import readers

    out = _copy(made, tmp_path)
    _edit_json(out / "dataset_info.json", lambda d: edit(d, value))  # json writes NaN and Infinity as such
    for command in ("inspect", "verify", "report"):
        r = runner.invoke(app, [command, str(out)])
        assert r.exit_code == 1 and field in r.output and "Traceback" not in r.output, (command, r.output)
        assert "integer" in r.output, r.output
    with pytest.raises(SpecError, match=re.escape(field)):
        readers.load_info(str(out))
    with pytest.raises(SpecError, match=re.escape(field)):
        readers.eval_dataset(str(out / "eval-*"), batch_size=4)


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d["splits"]["train"].update(num_records=d["splits"]["train"]["num_records"] + 1),
     "splits.train.num_records is"),
    (lambda d: d["counts"].update(read=d["counts"]["read"] + 1), "counts.read is"),
])
def test_counts_that_do_not_add_up_are_refused(made, tmp_path, edit, words):
    import readers

    out = _copy(made, tmp_path)
    _edit_json(out / "dataset_info.json", edit)
    for command in ("inspect", "verify", "report"):
        r = runner.invoke(app, [command, str(out)])
        assert r.exit_code == 1 and words in r.output and "edited or damaged" in r.output, (command, r.output)
    with pytest.raises(SpecError, match=words):
        readers.load_info(str(out))


# ------------------------------------------------------------------ stats.json


def _fs(stats, name, split="train"):
    return stats["features"][name]["splits"][split]


def _stats_cmds(out: Path) -> list:
    return [runner.invoke(app, [command, str(out)]) for command in ("report", "verify")]


@pytest.mark.parametrize(("edit", "field"), [
    (lambda d, v: d["splits"]["train"].update(records=v), "split 'train': 'records'"),
    (lambda d, v: d["splits"]["eval"].update(bytes=v), "split 'eval': 'bytes'"),
    (lambda d, v: d["rejections"].update(count=v), "rejections: 'count'"),
    (lambda d, v: d["files"][0].update(read=v), "files[0]: 'read'"),
    (lambda d, v: d["files"][0]["written"].update(eval=v), "files[0]: the 'written' counts"),
    (lambda d, v: _fs(d, "x").update(rows=v), "feature 'x', split 'train': 'rows'"),
    (lambda d, v: _fs(d, "x", "eval").update(missing=v), "feature 'x', split 'eval': 'missing'"),
    (lambda d, v: _fs(d, "x")["before"].update(count=v), "feature 'x', split 'train': 'before': stats of 'x': 'count'"),
    (lambda d, v: _fs(d, "x")["before"]["pos"][1].__setitem__(-1, v), "feature 'x', split 'train': 'before': the 'pos' counts"),
    (lambda d, v: _fs(d, "y")["after"].update(zero=v), "feature 'y', split 'train': 'after': 'zero'"),
    (lambda d, v: _fs(d, "color").update(items=v), "feature 'color', split 'train': 'items'"),
    (lambda d, v: _fs(d, "color")["terms"][0].__setitem__(1, v), "feature 'color', split 'train': the terms' counts"),
    (lambda d, v: _fs(d, "text").update(distinct=v), "feature 'text', split 'train': 'distinct'"),
    (lambda d, v: _fs(d, "tags")["lengths"].__setitem__(0, v), "feature 'tags', split 'train': 'lengths'"),
    (lambda d, v: _fs(d, "user_name").update(used_buckets=v), "feature 'user_name', split 'train': 'used_buckets'"),
], ids=lambda x: x if isinstance(x, str) else "")
@pytest.mark.parametrize("value", [math.nan, math.inf, -3, 7.0, True], ids=["nan", "inf", "negative", "float", "bool"])
def test_a_stats_count_that_is_not_an_exact_non_negative_integer_is_refused(made, tmp_path, edit, field, value):
    """``stats.json``'s counts are checked where it is loaded: ``report`` refuses it and ``verify``
    reports it, naming the file, the feature and split, and the field."""
    out = _copy(made, tmp_path)
    _edit_json(out / "stats.json", lambda d: edit(d, value))
    for r in _stats_cmds(out):
        assert r.exit_code == 1 and "Traceback" not in r.output, r.output
        text = " ".join(r.output.split())  # rich wraps long lines
        assert f"{out / 'stats.json'}: {field}" in text and "integer" in text, text
        assert "re-run the conversion" in text, text


def _shift_split(d, by: int = 1):
    """A split's records and every feature's rows on it, moved together: consistent in itself."""
    d["splits"]["train"]["records"] += by
    for feat in d["features"].values():
        feat["splits"]["train"]["rows"] += by
        if "lengths" in feat["splits"]["train"]:
            feat["splits"]["train"]["lengths"][0] += by


def _one_more_rejection(d):
    """One more rejected record, in a group of its own: consistent in itself, not with the metadata."""
    d["rejections"]["count"] += 1
    d["rejections"]["groups"].append({"field": "x", "reason": "r", "count": 1, "examples": []})


@pytest.mark.parametrize(("edit", "words"), [
    (lambda d: d["splits"]["train"].update(records=d["splits"]["train"]["records"] + 1),
     "feature 'id', split 'train': 'rows' is"),
    (_shift_split, "split 'train': 'records' is"),
    (lambda d: d["rejections"].update(count=d["rejections"]["count"] + 1), "rejections: its groups hold"),
    (lambda d: d["files"][0].update(read=d["files"][0]["read"] + 1), "files[0]: 'read' is"),
    (lambda d: _fs(d, "x")["before"].update(count=_fs(d, "x")["before"]["count"] + 1), "its histogram holds"),
    (lambda d: _fs(d, "tags")["lengths"].append(1), "'lengths' count"),
    (lambda d: _fs(d, "color").update(missing=_fs(d, "color")["rows"] + 1), "is more than 'rows'"),
    (lambda d: _fs(d, "user_name").update(used_buckets=65), "is more than 'buckets'"),
    (lambda d: _fs(d, "color").update(items=0), "more than 'items'"),
    (_one_more_rejection, "rejections: 'count' is"),
])
def test_stats_counts_that_do_not_add_up_are_refused(made, tmp_path, edit, words):
    """Sums that must agree: within ``stats.json`` (a feature's rows and its split's records, a
    sketch's histogram and its count, a file's read and its rejected plus written) and against
    ``dataset_info.json`` (each split's records, bytes and shards, the records rejected)."""
    out = _copy(made, tmp_path)
    _edit_json(out / "stats.json", edit)
    for r in _stats_cmds(out):
        text = " ".join(r.output.split())
        assert r.exit_code == 1 and words in text and "edited or damaged" in text, text
        assert str(out / "stats.json") in text, text


def test_an_intact_stats_file_passes_report_and_verify(made):
    for r in _stats_cmds(made["out"]):
        assert r.exit_code == 0, r.output
