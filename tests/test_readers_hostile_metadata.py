"""Tampered or careless ``dataset_info.json``: names, shapes and types are checked on load, so no
reader, staging copy, ``inspect``, ``verify`` or ``wait`` reads or writes outside the output,
allocates what a shape asks for, or ends in a traceback; ``wait`` never hangs or spins."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import _readers_fixtures as fx
import pytest
from _metadata_strategies import (
    hostile_names,
    metadata_target,
    metadata_texts,
    nested_names,
    plain_names,
    relative_names,
)
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

import readers
from convert.spec import (
    MAX_FEATURE_SIZE,
    METADATA_FILENAME,
    DatasetInfo,
    SpecError,
    check_name,
    name_problem,
)
from pipelines.cli import app
from readers import StagingError
from readers.info import select_shards
from stores import staging as _staging
from stores.hdfs import parse_hdfs_url

runner = CliRunner()


def _tamper(root: Path, change) -> None:
    meta = root / METADATA_FILENAME
    doc = json.loads(meta.read_text())
    change(doc)
    meta.write_text(json.dumps(doc))


def _set_shard(doc, name, split="train", index=0):
    doc["splits"][split]["shards"][index]["file"] = name


@pytest.fixture
def out(tmp_path):
    return fx.write_output(tmp_path / "data" / "out")


# ---------------------------------------------------------------- the name rule


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_names)
def test_every_hostile_name_is_refused(name):
    with pytest.raises(SpecError, match="must be a plain file name"):
        check_name(name, "dataset_info.json: vocabulary 'x'")
    with pytest.raises(SpecError):
        check_name(name, "shard", plain=True)


@settings(max_examples=300)
@given(relative_names)
def test_every_normalized_relative_name_is_accepted(name):
    assert check_name(name, "vocabulary") == name
    assert name_problem(name) is None


@settings(max_examples=200)
@given(plain_names, nested_names)
def test_shards_must_be_plain_names(plain, nested):
    assert check_name(plain, "shard", plain=True) == plain
    with pytest.raises(SpecError, match="contains '/'"):
        check_name(nested, "shard", plain=True)


def test_the_error_names_the_entry_and_the_rule():
    doc = json.loads(DatasetInfo(format_version=1, features=fx.FEATURES, label_key="label",
                                 compression="NONE", splits={}).dumps())
    doc["splits"] = {"train": {"shards": [{"file": f"t{i}", "num_records": 1, "num_bytes": 1} for i in range(3)]
                               + [{"file": "../../x.sh", "num_records": 1, "num_bytes": 1}]}}
    with pytest.raises(SpecError) as err:
        DatasetInfo.from_json(doc)
    assert str(err.value) == (
        "dataset_info.json: split 'train' shard 3: file '../../x.sh' must be a plain file name inside "
        "the output; it has a '..' component")


@pytest.mark.parametrize("slot, entry", [
    (lambda d, v: d.__setitem__("vocabularies", {"tags": {"file": v, "terms": 3}}), "vocabulary 'tags'"),
    (lambda d, v: d.__setitem__("errors", {"count": 1, "files": [{"file": v, "count": 1}]}), "errors.files[0]"),
    (lambda d, v: d.__setitem__("analysis_file", v), "analysis_file"),
    (lambda d, v: d["features"][3]["params"].__setitem__("vocabulary_file", v), "vocabulary_file"),
])
@pytest.mark.parametrize("name", ["../../x.sh", "/etc/passwd", "gs://other/x", "a\\b", "a\x00b"])
def test_every_listed_file_is_checked(out, slot, entry, name):
    _tamper(out.root, lambda d: slot(d, name))
    with pytest.raises(SpecError, match=re.escape(entry)):
        readers.load_info(str(out.root))


def test_what_the_converter_lists_is_accepted(out):
    def listed(d):
        d["vocabularies"] = {"tags": {"file": "vocab/tags.txt", "terms": 3}, "a.b/c-d": {"file": "vocab/a.b/c-d.txt"}}
        d["errors"] = {"count": 2, "files": [{"file": "errors/errors-00000-of-00001.jsonl", "count": 2}]}
        d["analysis_file"] = "analysis.json"

    _tamper(out.root, listed)
    assert readers.load_info(str(out.root)).extra["analysis_file"] == "analysis.json"


# ---------------------------------------------------------------- local readers and verify


@pytest.mark.parametrize("escape", ["../outside.tfrecord", "ABS"])
def test_readers_refuse_shards_outside_the_output(out, escape):
    outside = out.root.parent / "outside.tfrecord"
    outside.write_bytes(out.shard_path("train", 0).read_bytes())  # readable records, were read before
    name = str(outside) if escape == "ABS" else escape
    _tamper(out.root, lambda d: _set_shard(d, name))
    for call in (lambda: readers.load_info(str(out.root)),
                 lambda: select_shards(str(out.root / "train-*")),
                 lambda: readers.train_dataset(str(out.root / "train-*"), 4, num_epochs=1),
                 lambda: readers.eval_dataset(str(out.root), 4, split="train")):
        with pytest.raises(SpecError, match=r"split 'train' shard 0: file .*outside\.tfrecord"):
            call()


@pytest.mark.parametrize("name", ["../outside.tfrecord", "/etc/shadow"])
def test_verify_refuses_shards_outside_the_output(out, name):
    (out.root.parent / "outside.tfrecord").write_bytes(out.shard_path("train", 0).read_bytes())
    _tamper(out.root, lambda d: _set_shard(d, name))
    r = runner.invoke(app, ["verify", str(out.root)])
    assert r.exit_code == 1, r.output
    assert "OK" not in r.output and "must be a plain file name inside the output" in r.output
    assert "bytes on disk" not in r.output and "Traceback" not in r.output


# ---------------------------------------------------------------- shapes, sizes, types


@pytest.mark.parametrize("shape, match", [
    ([10**9], "holds 1000000000 values per record"),
    ([MAX_FEATURE_SIZE, 2], "more than the 65536"),
    ([0], "integers >= 1"),
    ([-1], "integers >= 1"),
    (["4"], "integers >= 1"),
    ([True], "integers >= 1"),
    ([1.0], "integers >= 1"),
    ("8", "must be a list"),
    ([1] * 9, "at most 8"),
    (None, "must be a list"),
])
def test_tampered_shapes_are_refused_before_any_allocation(out, shape, match):
    _tamper(out.root, lambda d: d["features"][1].__setitem__("shape", shape))
    with pytest.raises(SpecError, match=match) as err:
        readers.train_dataset(str(out.root / "train-*"), 512, num_epochs=1)
    assert "features[1]" in str(err.value) and "'vec'" in str(err.value)


def test_the_largest_vocab_size_the_config_allows_still_loads(out):
    from convert.config import MAX_HASH_BUCKETS, MAX_OOV_BUCKETS, MAX_TOP_K

    largest = max(MAX_HASH_BUCKETS + 1, MAX_TOP_K + 1 + MAX_OOV_BUCKETS)
    _tamper(out.root, lambda d: d["features"][3]["params"].__setitem__("vocab_size", largest))
    assert readers.load_info(str(out.root)).feature("ids").params["vocab_size"] == largest


def test_the_largest_allowed_shape_still_loads(out):
    _tamper(out.root, lambda d: d["features"][1].__setitem__("shape", [MAX_FEATURE_SIZE // 4, 4]))
    assert readers.load_info(str(out.root)).feature("vec").size == MAX_FEATURE_SIZE


@pytest.mark.parametrize("change, match", [
    (lambda d: d["splits"]["train"]["shards"][0].__setitem__("num_records", -5), "num_records must be a non-negative integer"),
    (lambda d: d["splits"]["train"]["shards"][0].__setitem__("num_bytes", "12"), "num_bytes must be a non-negative integer"),
    (lambda d: d["splits"]["train"]["shards"][0].__setitem__("num_records", 1.5), "num_records"),
    (lambda d: d["features"][3]["params"].__setitem__("vocab_size", 10**17), "vocab_size 100000000000000000"),
    (lambda d: d["features"][3]["params"].__setitem__("vocab_size", 1.5), "vocab_size 1.5"),
    (lambda d: d["features"][3]["params"].__setitem__("vocab_size", 0), "vocab_size 0"),
    (lambda d: d.__setitem__("splits", [{"train": []}]), "'splits' must be an object"),
    (lambda d: d.__setitem__("features", {"a": 1}), "'features' must be a list"),
    (lambda d: d["features"].append(d["features"][0]), "feature 'num' is listed twice"),
    (lambda d: d["features"][0].__setitem__("params", []), "params must be an object"),
    (lambda d: d["features"][0].__setitem__("name", 3), "feature name 3"),
    (lambda d: d["features"][0].pop("dtype"), "has no dtype"),
    (lambda d: d["features"][0].__setitem__("default", "x"), "default 'x' must be null, one float32 value"),
    (lambda d: d["features"][1].__setitem__("default", [0.0] * 3), "flat list of 4"),
    (lambda d: d["features"][4].__setitem__("default", {"a": 1}), "one string value"),
    (lambda d: d.__setitem__("label_key", ["x"]), "label_key"),
    (lambda d: d["splits"]["train"].__setitem__("shards", "x"), "'shards' list"),
    (lambda d: d.__setitem__("config", json.loads("[" * 200 + "]" * 200)), "nested too deeply"),
])
def test_malformed_fields_are_spec_errors(out, change, match):
    _tamper(out.root, change)
    with pytest.raises(SpecError, match=match):
        readers.load_info(str(out.root))


def test_too_many_features_or_shards(out, monkeypatch):
    from convert import spec

    monkeypatch.setattr(spec, "MAX_FEATURES", 5)
    with pytest.raises(SpecError, match="6 features, more than the 5"):
        readers.load_info(str(out.root))
    monkeypatch.setattr(spec, "MAX_FEATURES", 100)
    monkeypatch.setattr(spec, "MAX_SHARDS", 3)
    with pytest.raises(SpecError, match="split 'train': 4 shards, more than MAX_SHARDS"):
        readers.load_info(str(out.root))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(metadata_texts())
def test_any_mutated_metadata_loads_or_is_a_spec_error(text):
    metadata_target(text)


# ---------------------------------------------------------------- clear errors in the CLI


def test_metadata_that_is_a_directory_splits_a_list_or_deep(out, tmp_path):
    meta = out.root / METADATA_FILENAME
    cases = {
        "directory": None,
        "splits list": json.dumps({**json.loads(meta.read_text()), "splits": []}),
        "deep": '{"format_version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "deep below the parser's limit": '{"format_version": 1, "x": ' + "[" * 500 + "]" * 500 + "}",
    }
    for what, text in cases.items():
        if meta.is_dir():
            meta.rmdir()
        if text is None:
            meta.unlink()
            meta.mkdir()
        else:
            meta.write_text(text)
        with pytest.raises(SpecError, match="directory|'splits' must be an object|nested too deeply"):
            readers.load_info(str(out.root))
        for cmd in (["inspect", str(out.root)], ["verify", str(out.root)]):
            r = runner.invoke(app, cmd)
            assert r.exit_code == 1, (what, cmd, r.output)
            assert "Traceback" not in r.output, (what, cmd, r.output)
            assert r.exception is None or isinstance(r.exception, SystemExit), (what, cmd, r.exception)
            assert str(meta) in r.output, (what, cmd, r.output)


@pytest.mark.parametrize("content", [b"garbage, not gzip at all", b"\x1f\x8b\x08\x00broken gzip"])
def test_inspect_names_a_shard_that_is_not_what_the_metadata_says(tmp_path, content):
    o = fx.write_output(tmp_path / "out", compression="GZIP")
    shard = o.shard_path("train", 0)
    shard.write_bytes(content)
    r = runner.invoke(app, ["inspect", str(o.root), "-n", "2"])
    assert r.exit_code == 1, r.output
    assert str(shard) in r.output and "recordprep verify" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


def test_inspect_of_an_uncompressed_shard_holding_garbage(tmp_path):
    o = fx.write_output(tmp_path / "out")
    o.shard_path("train", 0).write_bytes(b"\x05" * 64)
    r = runner.invoke(app, ["inspect", str(o.root)])
    assert r.exit_code == 1 and str(o.shard_path("train", 0)) in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


# ---------------------------------------------------------------- wait


@pytest.mark.parametrize("args, match", [
    (["--timeout", "nan"], "--timeout must be a finite number"),
    (["--timeout", "inf"], "--timeout must be a finite number"),
    (["--timeout", "-1"], "--timeout must be a finite number"),
    (["--poll", "0"], "--poll must be a finite number of seconds >= 0.01"),
    (["--poll", "-1"], "--poll must be"),
    (["--poll", "nan"], "--poll must be"),
])
def test_wait_refuses_arguments_that_would_hang_or_spin(tmp_path, args, match):
    r = runner.invoke(app, ["wait", str(tmp_path), *args])
    assert r.exit_code == 2 and match in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


@pytest.mark.parametrize("timeout, poll", [(math.nan, 1.0), (math.inf, 1.0), (1.0, math.nan), (1.0, 0.0),
                                           (1.0, -1.0), (-1.0, 1.0), (1.0, math.inf)])
def test_wait_for_dataset_refuses_them_too(tmp_path, timeout, poll):
    with pytest.raises(ValueError, match="must be a finite number"):
        readers.wait_for_dataset(str(tmp_path), timeout=timeout, poll=poll)


@pytest.mark.parametrize("content", [b"", b"garbage", b"[1, 2]", b'{"reason": ' + b"[" * 50_000])
def test_wait_reports_an_unreadable_failure_report_as_a_failure(tmp_path, content):
    (tmp_path / "_FAILURE.json").write_bytes(content)
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "5"])
    assert r.exit_code == 1 and "failed: unreadable failure report" in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    with pytest.raises(readers.DatasetFailedError, match="unreadable failure report"):
        readers.wait_for_dataset(str(tmp_path), timeout=5, poll=0.05)


@pytest.mark.parametrize("content", ["garbage", "[]", '{"format_version": 1}', "{"])
def test_wait_does_not_call_garbage_metadata_complete(tmp_path, content):
    (tmp_path / METADATA_FILENAME).write_text(content)
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "0.3", "--poll", "0.05"])
    assert r.exit_code == 1 and "is complete" not in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    if content in ("garbage", "{"):  # not JSON (yet): may be a file being replaced, polled until the deadline
        assert "still incomplete after 0.3 s" in r.output and "not valid JSON yet" in r.output
    else:  # JSON but not recordprep metadata: waiting will not help
        assert "is not a complete recordprep output" in r.output


def test_wait_on_a_directory_in_place_of_the_metadata(tmp_path):
    (tmp_path / METADATA_FILENAME).mkdir()
    r = runner.invoke(app, ["wait", str(tmp_path), "--timeout", "5", "--poll", "0.05"])
    assert r.exit_code == 1 and "is a directory" in r.output, r.output
    with pytest.raises(SpecError, match="is a directory"):
        readers.wait_for_dataset(str(tmp_path), timeout=5, poll=0.05)


@pytest.mark.parametrize("where", ["output", "parent"])
def test_wait_on_a_path_that_is_a_file_fails_at_once(tmp_path, where):
    blocker = tmp_path / "out"
    blocker.write_text("not a directory")
    target = blocker if where == "output" else blocker / "day1"
    r = runner.invoke(app, ["wait", str(target), "--timeout", "5", "--poll", "0.05"])
    assert r.exit_code == 1 and f"{blocker} is a file, not a directory" in r.output, r.output  # not the timeout
    assert r.exception is None or isinstance(r.exception, SystemExit)
    with pytest.raises(SpecError, match="is a file, not a directory"):  # (the timeout: a TimeoutError)
        readers.wait_for_dataset(str(target), timeout=5, poll=0.05)


def test_wait_on_an_output_that_becomes_a_file_fails_at_its_next_check(tmp_path):
    import threading

    target = tmp_path / "out"
    target.mkdir()

    def replace() -> None:
        time.sleep(0.3)
        target.rmdir()
        target.write_text("not a directory")

    threading.Thread(target=replace).start()
    with pytest.raises(SpecError, match="is a file, not a directory"):  # (the timeout: a TimeoutError)
        readers.wait_for_dataset(str(target), timeout=10, poll=0.05)


def test_wait_still_accepts_a_real_output(out):
    r = runner.invoke(app, ["wait", str(out.root), "--timeout", "1"])
    assert r.exit_code == 0 and "is complete" in r.output, r.output


def test_the_wait_command_runs_without_tensorflow(out):
    """It shares readers' loop, which imports no TensorFlow: conversion hosts do not have it."""
    code = f"""
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow is blocked in this test")
sys.meta_path.insert(0, _Block())
from typer.testing import CliRunner
from pipelines.cli import app
r = CliRunner().invoke(app, ["wait", {str(out.root)!r}, "--timeout", "1", "--poll", "0.05"])
assert "tensorflow" not in sys.modules
print(r.exit_code, r.output)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("0 ") and "is complete" in p.stdout, p.stdout + p.stderr


# ---------------------------------------------------------------- HDFS staging


class FakeHdfs:
    """An HdfsClient over a local directory standing in for the HDFS namespace."""

    description = "fake HDFS"

    def __init__(self, namespace: Path) -> None:
        self.namespace = namespace
        self.downloads: list[str] = []

    def _local(self, url: str) -> Path:
        return self.namespace / parse_hdfs_url(url)[2].lstrip("/")

    def stat(self, url):
        p = self._local(url)
        return (p.stat().st_size, p.stat().st_mtime) if p.is_file() else None

    def read(self, url):
        p = self._local(url)
        return p.read_bytes() if p.is_file() else None

    def download(self, url, dest):
        self.downloads.append(str(dest))
        dest.write_bytes(self._local(url).read_bytes())
        return dest.stat().st_size


@pytest.fixture
def fake_hdfs(tmp_path, monkeypatch):
    namespace = tmp_path / "namespace"
    o = fx.write_output(namespace / "data" / "out")
    client = FakeHdfs(namespace)
    monkeypatch.setattr(_staging, "client_for", lambda url: client)
    cache = tmp_path / "home" / "cache"
    monkeypatch.setenv("RECORDPREP_HDFS_CACHE", str(cache))
    # What a hostile metadata would ask for: files that exist on "HDFS" next to the output.
    (namespace / "x.sh").write_text("#!/bin/sh\necho owned\n")
    (namespace / "data" / "x.sh").write_text("#!/bin/sh\necho owned\n")
    return o, client, cache, tmp_path


def _files_outside(root: Path, cache: Path, namespace: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and cache not in p.parents and namespace not in p.parents]


@pytest.mark.parametrize("name", ["../../x.sh", "../x.sh", "ABS"])
def test_hdfs_staging_never_writes_outside_its_cache(fake_hdfs, name):
    o, client, cache, tmp_path = fake_hdfs
    if name == "ABS":
        name = str(tmp_path / "abs" / "path.sh")
    url = "hdfs://namenode:8020/data/out"
    _tamper(o.root, lambda d: _set_shard(d, name))
    with pytest.raises(SpecError, match="must be a plain file name inside the output"):
        readers.train_dataset(url + "/train-*", 4, num_epochs=1)
    # Defence in depth: staging checks the names it is given, whoever calls it.
    with pytest.raises(StagingError, match="must be a plain file name"):
        _staging.stage(url, [o.info.splits["train"].shards[1].file, name], b"{}", cache_root=cache)
    assert client.downloads == []
    assert _files_outside(tmp_path, cache, tmp_path / "namespace") == []


def test_hdfs_staging_refuses_a_symlink_out_of_the_cache(fake_hdfs):
    o, client, cache, tmp_path = fake_hdfs
    url = "hdfs://namenode:8020/data/out"
    local = _staging.local_path_for(url, cache)
    local.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (local / "vocab").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(StagingError, match="outside the staging directory"):
        _staging.stage(url, ["vocab/tags.txt"], b"{}", cache_root=cache)
    assert client.downloads == [] and not list((tmp_path / "elsewhere").iterdir())


def test_hdfs_url_with_dotdot_stays_in_the_cache(tmp_path):
    local = _staging.local_path_for("hdfs://nn:8020/a/../../../../etc", tmp_path / "cache")
    assert local == tmp_path / "cache" / "nn_8020" / "etc"


def test_s3_url_with_dotdot_stays_in_the_cache(tmp_path, monkeypatch):
    local = _staging.local_path_for("s3://bucket/a/../../../../etc", tmp_path / "cache")
    assert local == tmp_path / "cache" / "bucket" / "etc"
    monkeypatch.delenv("RECORDPREP_S3_CACHE", raising=False)
    assert _staging.default_cache_root("s3://b/x").parts[-2:] == ("recordprep", "s3")
    monkeypatch.setenv("RECORDPREP_S3_CACHE", str(tmp_path / "s3cache"))
    assert _staging.default_cache_root("s3://b/x") == tmp_path / "s3cache"


def test_hdfs_staging_of_valid_shards_still_works(fake_hdfs):
    o, client, cache, _ = fake_hdfs
    ds = readers.train_dataset("hdfs://namenode:8020/data/out/train-*", 8, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == o.all_ids("train")
    assert len(client.downloads) == 4 and all(str(cache) in d for d in client.downloads)
