"""A vocabulary without ``top_k`` larger than ``--max-vocabulary-terms`` is refused once the analysis
has counted it, before any shard is written, naming the feature, its count, ``top_k`` and ``hash``
(``pipelines.analyze.check_vocabulary_sizes``); on the one-combine path (one unit) and the partitioned
one (several)."""

from __future__ import annotations

import json

import fastavro
import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.options import ConvertOptions, OptionsError

SCHEMA = {"type": "record", "name": "E", "fields": [
    {"name": "user_id", "type": "string"}, {"name": "country", "type": "string"}, {"name": "y", "type": "int"}]}


def _data(tmp_path, ids: int = 60):
    recs = [{"user_id": f"u{i:04d}", "country": ["fr", "de", "us"][i % 3], "y": i % 2} for i in range(ids)]
    with open(tmp_path / "e.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, recs, sync_interval=200)
    return tmp_path / "e.avro"


def _config(tmp_path, user_id: str) -> str:
    path = tmp_path / "features.yaml"
    path.write_text("label: y\nfeatures:\n"
                    f"  - {{name: user, source: user_id, transform: vocabulary{user_id}}}\n"
                    "  - {name: country, transform: vocabulary}\n")
    return str(path)


def _convert(inp, cfg, out, *args: str):
    return CliRunner().invoke(app, ["convert", "-i", str(inp), "-c", cfg, "-o", str(out), "--splits", "train=1",
                                    "--no-progress", *args])


@pytest.mark.parametrize("shards", [1, 3])
def test_a_vocabulary_without_top_k_over_the_limit_stops_the_run_before_any_shard(tmp_path, shards):
    inp, out = _data(tmp_path), tmp_path / "out"
    r = _convert(inp, _config(tmp_path, ""), out, "--num-shards", str(shards), "--max-vocabulary-terms", "50")
    assert r.exit_code == 2, r.output
    said = " ".join(r.output.split())
    assert "feature 'user' (source 'user_id'): 60 distinct terms of the training split occur min_frequency (1)" in said
    assert "--max-vocabulary-terms (50)" in said and "top_k" in said and "transform: hash" in said
    assert "country" not in said.split("distinct terms")[1]  # 3 terms: within the limit
    assert not (out / "dataset_info.json").exists() and not list(out.glob("train-*"))


@pytest.mark.parametrize(("user_id", "limit"), [("", "60"), (", top_k: 10", "5"), (", min_frequency: 2", "5")])
def test_within_the_limit_or_with_top_k_the_run_goes_on(tmp_path, user_id, limit):
    """60 terms at a limit of 60; a top_k bounds the vocabulary whatever its distinct terms; min_frequency 2
    keeps none of the 60 ids (each seen once), so the limit does not apply (the empty vocabulary is the
    min_frequency check's, allowed here)."""
    inp, out = _data(tmp_path), tmp_path / "out"
    extra = user_id + (", allow_all_missing: true" if "min_frequency" in user_id else "")
    r = _convert(inp, _config(tmp_path, extra), out, "--num-shards", "3", "--max-vocabulary-terms", limit)
    assert r.exit_code == 0, r.output
    info = json.loads((out / "dataset_info.json").read_text())
    sizes = {f["name"]: f["params"].get("vocab_size") for f in info["features"]}
    assert sizes["country"] is not None


@pytest.mark.parametrize("bad", [0, -1, 10**10, True, 2.5])
def test_the_limit_is_a_whole_number_in_range(bad):
    with pytest.raises(OptionsError, match="--max-vocabulary-terms"):
        ConvertOptions(inputs=("x.avro",), config="c.yaml", output="o", max_vocabulary_terms=bad)


def test_the_cli_refuses_a_bad_limit_with_exit_2(tmp_path):
    r = _convert(_data(tmp_path), _config(tmp_path, ""), tmp_path / "out", "--max-vocabulary-terms", "0")
    assert r.exit_code == 2 and "--max-vocabulary-terms" in r.output, r.output


@pytest.mark.slow
def test_the_refusal_reads_the_same_from_worker_processes(tmp_path):
    """In a worker process the error reaches the launcher as text: still exit 2 and the message."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    inp, out = _data(tmp_path, ids=3000), tmp_path / "out"
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", "-i", str(inp), "-c", _config(tmp_path, ""),
                        "-o", str(out), "--splits", "train=1", "--num-shards", "3", "--workers", "2",
                        "--max-vocabulary-terms", "100", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "feature 'user' (source 'user_id'): 3,000 distinct terms" in r.stderr and "top_k" in r.stderr, r.stderr
    assert not (out / "dataset_info.json").exists() and not list(out.glob("train-*"))
