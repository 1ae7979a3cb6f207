"""Nothing a config names lands outside the output: feature and label names become
Example keys and file names (``vocab/<name>.txt``), so for any name a config
may hold, every file a conversion writes is under its output directory, and a
name that could leave it is a config error before anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from _e2e import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

_PART = st.from_regex(r"[A-Za-z0-9_.\-]{1,10}", fullmatch=True).filter(lambda p: p not in (".", ".."))
#: Names the config accepts: a letter or _ first, then parts joined by '/'.
VALID = st.builds(lambda head, parts: "/".join([head + parts[0], *parts[1:]]),
                  st.sampled_from("aZ_"), st.lists(_PART, min_size=1, max_size=4))
#: Names that would leave vocab/ or the output, or are no file name at all.
HOSTILE = ["a/../../../x", "a/../../x", "x/..", "a/./b", "a//b", "a/", "/etc/x", "../x", "..", ".",
           "a\\..\\..\\x", "a\x00b", "a:b", "gs://bucket/x", "x" * 201]

RECORDS = [{"term": f"t{i % 5}", "y": i % 2} for i in range(40)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("in")
    (root / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return root / "d.jsonl"


def _files_under(root: Path) -> set[Path]:
    return {Path(d, f).resolve() for d, _, fs in os.walk(root) for f in fs}


def _config(dirpath: Path, name: str) -> Path:
    cfg = dirpath / "features.yaml"
    cfg.write_text(json.dumps({"label": {"source": "y", "dtype": "int64"},
                               "features": [{"name": name, "source": "term", "transform": "vocabulary"}]}))
    return cfg


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=VALID)
def test_every_file_of_a_conversion_is_inside_its_output(data, tmp_path_factory, name):
    work = tmp_path_factory.mktemp("w")
    cfg = _config(work, name)
    out = work / "nested" / "out"
    before = _files_under(work.parent)
    r = cli("convert", "-i", data, "-c", cfg, "-o", out, "--workers", "1", "--no-progress", "--splits", "train=1")
    assert r.exit_code == 0, r.output
    written = _files_under(work.parent) - before
    assert (out / "vocab" / f"{name}.txt").resolve() in written, r.output
    outside = sorted(str(p) for p in written if out.resolve() not in p.parents)
    assert not outside, outside


@pytest.mark.parametrize("as_label", [False, True], ids=["feature", "label"])
@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_could_leave_the_output_is_a_config_error(data, tmp_path_factory, name, as_label):
    work = tmp_path_factory.mktemp("w")
    cfg = work / "features.yaml"
    features = [{"name": "term", "transform": "vocabulary"}]
    label = {"source": "y", "dtype": "int64"}
    if as_label:
        label["name"] = name
    else:
        features.append({"name": name, "source": "term", "transform": "vocabulary"})
    cfg.write_text(json.dumps({"label": label, "features": features}))
    before = _files_under(work.parent)
    r = cli("convert", "-i", data, "-c", cfg, "-o", work / "out", "--workers", "1", "--no-progress")
    assert r.exit_code == 2, r.output
    assert _files_under(work.parent) == before
