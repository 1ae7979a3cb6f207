"""End to end: the real Beam job (in-process FnApiRunner) converts AVRO and JSON,
and `readers` reads the shards back with TensorFlow. Values are checked against
an independent computation from the source records."""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import numpy as np
import pytest
from _expected_values import tokens
from _pipelines_data import make_records, without_run_id, write_dataset

from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.output_guard import OutputExistsError
from pipelines.run_files import ConversionFailed

pytestmark = pytest.mark.slow


def _opts(inputs, config, output, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(str(inputs),), config=str(config), output=str(output), **kw)


def _read_all(output: str, split: str) -> dict[int, dict[str, np.ndarray]]:
    import readers

    ds = readers.eval_dataset(f"{output}/{split}-*", batch_size=64)
    rows: dict[int, dict[str, np.ndarray]] = {}
    for batch, label in ds.as_numpy_iterator():
        batch = {**batch, "y": label}
        n = len(batch["id"])
        for i in range(n):
            rows[int(batch["id"][i][0])] = {k: v[i] for k, v in batch.items()}
    return rows


def _vocab(values) -> dict[str, int]:
    c = Counter(values)
    terms = sorted(c, key=lambda t: (-c[t], t))
    return {t: 2 + i for i, t in enumerate(terms)}  # 0 missing, 1 OOV


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    records = make_records()
    paths = write_dataset(root, records)
    out = tmp_path_factory.mktemp("out") / "avro"
    result = run_convert(_opts(paths["avro"], paths["config"], out, num_shards=3))
    return records, paths, str(out), result


def test_counts_shards_and_metadata(dataset):
    records, _, out, result = dataset
    info = json.loads(open(os.path.join(out, METADATA_FILENAME)).read())
    assert not result.skipped
    assert info["counts"]["read"] == len(records)
    assert info["counts"]["errors"] == 0
    assert sum(info["counts"]["written"].values()) == len(records)
    for split in ("train", "eval"):
        shards = info["splits"][split]["shards"]
        run = info["run_id"]
        assert len(run) == 12 and [s["file"] for s in shards] == [f"{split}-{i:05d}-of-00003-{run}.tfrecord.gz" for i in range(3)]
        for s in shards:
            assert os.path.getsize(os.path.join(out, s["file"])) == s["num_bytes"]
    assert info["splits"]["train"]["num_records"] > info["splits"]["eval"]["num_records"] > 0
    assert not os.path.exists(os.path.join(out, ".recordprep-tmp"))
    # the vocabulary files hold the terms in id order
    colors = open(os.path.join(out, "vocab", "color.txt")).read().split("\n")[:-1]
    assert info["vocabularies"]["color"]["terms"] == len(colors)


def test_values_match_an_independent_computation(dataset):
    records, _, out, _ = dataset
    train = _read_all(out, "train")
    evals = _read_all(out, "eval")
    assert set(train).isdisjoint(evals)
    assert set(train) | set(evals) == {r["id"] for r in records}
    by_id = {r["id"]: r for r in records}
    tr = [by_id[i] for i in train]  # statistics and vocabularies come from train only

    xs = np.array([r["x"] for r in tr if r["x"] is not None])
    mean, std = xs.mean(), xs.std()
    color_ids = _vocab(r["color"] for r in tr if r["color"] is not None)
    tag_ids = _vocab(t for r in tr for t in r["tags"])
    tok_ids = _vocab(t for r in tr for t in tokens(r["text"]))
    hashes: dict[str, int] = {}
    for rows in (train, evals):
        for i, got in rows.items():
            r = by_id[i]
            x = 0.0 if r["x"] is None else (r["x"] - mean) / std
            assert got["x"][0] == pytest.approx(x, abs=1e-5)
            assert got["x_missing"][0] == int(r["x"] is None)
            assert got["color"][0] == (0 if r["color"] is None else color_ids.get(r["color"], 1))
            tags = [tag_ids.get(t, 1) for t in r["tags"]][:2]
            assert list(got["tags"]) == tags + [0] * (2 - len(tags))
            assert got["tags_len"][0] == len(tags)
            toks = [tok_ids.get(t, 1) for t in tokens(r["text"])][:3]
            assert list(got["text"]) == toks + [0] * (3 - len(toks))
            assert got["text_len"][0] == len(toks)
            assert 1 <= got["user_name"][0] <= 64
            assert hashes.setdefault(r["user"]["name"], got["user_name"][0]) == got["user_name"][0]
            assert got["y"][0] == r["y"]
            assert got["id"][0] == float(i)


def test_json_input_gives_the_same_dataset(dataset, tmp_path):
    _, paths, out_avro, _ = dataset
    out_json = tmp_path / "json"
    run_convert(_opts(paths["json"], paths["config"], out_json, num_shards=2))
    for split in ("train", "eval"):
        a, j = _read_all(out_avro, split), _read_all(str(out_json), split)
        assert a.keys() == j.keys()
        for k in a:
            for name in a[k]:
                np.testing.assert_array_equal(a[k][name], j[k][name])


def test_train_dataset_feeds_batches(dataset):
    import readers

    _, _, out, _ = dataset
    ds = readers.train_dataset(f"{out}/train-*", batch_size=32, seed=1)
    features, label = next(iter(ds))
    assert features["tags"].shape == (32, 2)
    assert label.shape[0] == 32


def test_rerun_is_a_noop_and_other_inputs_are_refused(dataset, tmp_path):
    _, paths, out, _ = dataset
    meta = os.path.join(out, METADATA_FILENAME)
    before = os.stat(meta).st_mtime_ns
    again = run_convert(_opts(paths["avro"], paths["config"], out, num_shards=3))
    assert again.skipped
    assert os.stat(meta).st_mtime_ns == before
    with pytest.raises(OutputExistsError, match=r"other options \(--num-shards: 3 there, 2 here; .*--overwrite"):
        run_convert(_opts(paths["avro"], paths["config"], out, num_shards=2))
    # The output was written at the default gzip level; a run at another one names the flag that keeps it.
    with pytest.raises(OutputExistsError, match=r"--gzip-level: 2 there, 5 here"):
        run_convert(_opts(paths["avro"], paths["config"], out, num_shards=3, gzip_level=5))
    assert run_convert(_opts(paths["avro"], paths["config"], out, num_shards=3, gzip_level=2)).skipped


def test_bad_records_go_to_the_error_output(tmp_path):
    records = make_records(120)
    paths = write_dataset(tmp_path / "d", records, bad_json_lines=True)
    out = tmp_path / "out"
    with pytest.raises(ConversionFailed, match=r"2 of 122 records were rejected.*--max-errors 2"):
        run_convert(_opts(paths["json"], paths["config"], out, num_shards=2))
    assert not (out / METADATA_FILENAME).exists()
    assert json.loads((out / FAILURE_FILENAME).read_text())["counts"]["errors"] == 2

    result = run_convert(_opts(paths["json"], paths["config"], out, num_shards=2, max_errors=2))
    counts = result.info["counts"]
    assert counts["read"] == 122 and counts["errors"] == 2
    assert sum(counts["written"].values()) == 120
    assert not (out / FAILURE_FILENAME).exists()
    rows = [json.loads(line) for f in sorted((out / "errors").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert len(rows) == 2
    reasons = {r["field"]: r for r in rows}
    bad = reasons["<record>"]
    assert "malformed JSON" in bad["reason"]
    # the byte offset locates the line exactly (the line number only when the range starts the file)
    raw = (tmp_path / "d" / "part-1.jsonl").read_bytes()
    assert raw[bad["byte_offset"]:].split(b"\n", 1)[0].decode().strip() == bad["record"] == '{"id": 9999, "x":'
    assert bad.get("line", 6) == 6
    assert reasons["y"]["record"]["id"] == 10000 and "label must be an integer" in reasons["y"]["reason"]
    assert all(r["file"].endswith("part-1.jsonl") for r in rows)
    per_file = counts["per_file"]
    for c in per_file.values():
        assert c["read"] == c["train"] + c["eval"] + c["errors"]


def test_analysis_from_reuses_vocabularies(dataset, tmp_path):
    records, paths, out, _ = dataset
    sub = tmp_path / "sub"
    sub.mkdir()
    write_dataset(sub, records[:40])
    out2 = tmp_path / "out2"
    run_convert(_opts(sub / "*.avro", paths["config"], out2, num_shards=1, analysis_from=out))
    a = json.loads(open(os.path.join(out, "analysis.json")).read())
    b = json.loads((out2 / "analysis.json").read_text())
    assert a == b
    x_stats = json.loads((out2 / METADATA_FILENAME).read_text())["statistics"]["x"]
    assert math.isclose(x_stats["mean"], a["stats"]["x"]["mean"])


def test_a_new_run_clears_an_old_failure_marker_before_it_starts(tmp_path, monkeypatch):
    """Waiters (`recordprep wait`, readers.wait_for_dataset) stop at a failure
    marker; one left by yesterday's run must not end today's wait early."""
    import apache_beam as beam

    paths = write_dataset(tmp_path / "d", make_records(40))
    out = tmp_path / "out"
    out.mkdir()
    (out / FAILURE_FILENAME).write_text(json.dumps({"reason": "old run", "counts": {}}))
    seen = []
    real_run = beam.Pipeline.run

    def spy(self, *a, **k):
        seen.append((out / FAILURE_FILENAME).exists())
        return real_run(self, *a, **k)

    monkeypatch.setattr(beam.Pipeline, "run", spy)
    run_convert(_opts(paths["avro"], paths["config"], out, num_shards=1))
    assert seen and seen[0] is False
    assert (out / METADATA_FILENAME).exists()


def test_rejected_records_do_not_shape_the_analysis(tmp_path):
    """A record that goes to the error output (here: no label) must not add
    terms to vocabularies or values to statistics: the model never sees it."""
    records = make_records(100)
    ghosts = [{**r, "id": 5000 + i, "color": "ghost", "x": 1e6, "y": None} for i, r in enumerate(records[:30])]
    root = tmp_path / "d"
    paths = write_dataset(root, records)
    with open(root / "part-1.jsonl", "a") as f:  # Avro could not even hold a null label
        f.writelines(json.dumps(g) + "\n" for g in ghosts)
    out = tmp_path / "out"
    result = run_convert(_opts(paths["json"], paths["config"], out, num_shards=1, max_errors=30))
    assert result.info["counts"]["errors"] == 30
    analysis = json.loads((out / "analysis.json").read_text())
    assert "ghost" not in analysis["vocabularies"]["color"]
    assert analysis["stats"]["x"]["max"] < 1e6


@pytest.mark.parametrize("split_key", [None, "user.name"])
def test_avro_fast_path_writes_the_fastavro_paths_bytes(tmp_path, split_key):
    """The polars decode (default) and fastavro give byte-identical shards, error
    output and counts, rejected records and both split rules included."""
    from convert.splits import Splits

    paths = write_dataset(tmp_path / "d", make_records(400))
    config = tmp_path / "features.yaml"  # log1p rejects x <= -1: some records go to the error output
    config.write_text(paths["config"].read_text().replace("transform: zscore, missing_indicator: true", "transform: log1p"))
    outs = {}
    for decoder in ("auto", "fastavro"):
        out = tmp_path / decoder
        res = run_convert(_opts(paths["avro"], config, out, num_shards=2, avro_decoder=decoder, max_error_fraction=1.0,
                                splits=Splits.parse("train=0.8,eval=0.2", split_key)))
        files = {without_run_id(p.relative_to(out).as_posix()): p.read_bytes() for p in sorted(out.rglob("*"))
                 if p.is_file() and (p.suffix in (".gz", ".jsonl") or ".tfrecord" in p.name)}
        outs[decoder] = (files, res.info["counts"])
    fast, slow = outs["auto"], outs["fastavro"]
    assert fast[1] == slow[1] and 0 < fast[1]["errors"] < 400
    assert fast[0].keys() == slow[0].keys() and any(k.startswith("errors/") for k in fast[0])
    for k in fast[0]:
        assert fast[0][k] == slow[0][k], k


def test_pipeline_options_views_are_made_once_and_share_values():
    """The job's options answer Beam's repeated ``view_as`` with one view per class,
    backed by the same values as a fresh view would be; they pickle without the views."""
    import pickle

    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

    from pipelines.job import _ViewCachingOptions

    opts = _ViewCachingOptions(["--runner", "DirectRunner", "--type_check_strictness", "ALL_REQUIRED"])
    plain = PipelineOptions(["--runner", "DirectRunner", "--type_check_strictness", "ALL_REQUIRED"])
    assert opts.view_as(TypeOptions) is opts.view_as(TypeOptions)
    assert opts.view_as(TypeOptions).type_check_strictness == plain.view_as(TypeOptions).type_check_strictness == "ALL_REQUIRED"
    opts.view_as(StandardOptions).streaming = True  # a write through one view is seen by all
    assert opts.view_as(StandardOptions).streaming and opts.get_all_options()["streaming"]
    back = pickle.loads(pickle.dumps(opts))
    assert "_recordprep_views" not in back.__dict__ and back.view_as(StandardOptions).runner == "DirectRunner"
    assert back.get_all_options() == opts.get_all_options()
