"""How many of a hash feature's buckets each split used: counted exactly in stats.json (one work
unit or several, merged), shown by `recordprep report` (terminal, --json, HTML) with how crowded
they are; an older stats.json without the count still renders."""

from __future__ import annotations

import json
import math
import pickle

import numpy as np
import pytest
from _expected_values import read_split
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

from convert.derive import cross_ids
from convert.records import hash_id
from convert.stats import MAX_COUNTED_BUCKETS, STATS_FILENAME, _UsedBuckets
from pipelines.cli import app
from pipelines.cli.report import bucket_use

runner = CliRunner()

CONFIG = """
label: {source: y, dtype: int64}
features:
  - {name: id, transform: identity}
  - {name: user_name, source: user.name, transform: hash, buckets: 64}
  - {name: tag_ids, source: tags, transform: hash, buckets: 8, max_len: 2}
  - {name: color_user, transform: cross, sources: [color, user.name], buckets: 32}
"""


def _expected(records: list[dict], out) -> dict[str, dict[str, int]]:
    """Per split, the buckets the written records' values fall in, computed from the input
    values with the converter's own hash (the split of each record read back from its shards)."""
    info = json.loads((out / "dataset_info.json").read_text())
    by_id = {r["id"]: r for r in records}
    want = {}
    for split in info["splits"]:
        ids = read_split(out, split)["id"].reshape(-1).astype(int).tolist()
        rows = [by_id[i] for i in ids]
        want[split] = {"user_name": len({hash_id(r["user"]["name"], 64) for r in rows}),
                       "tag_ids": len({hash_id(t, 8) for r in rows for t in r["tags"][:2]}),
                       "tag_items": sum(len(r["tags"][:2]) for r in rows),
                       "cross": len(set(cross_ids([[r["color"] for r in rows], [r["user"]["name"] for r in rows]], 32).tolist())
                                    - {0})}
    return want


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hashstats")
    records = make_records(300, seed=5)
    data = write_dataset(root / "in", records)
    data["config"].write_text(CONFIG)
    outs = []
    for shards in ("1", "3"):  # one work unit, then several whose statistics merge
        out = root / f"out{shards}"
        r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out),
                                "--num-shards", shards, "--no-progress"])
        assert r.exit_code == 0, r.output
        outs.append(out)
    return records, outs


def test_stats_json_counts_the_buckets_each_split_used_in_one_unit_and_merged(outputs):
    records, outs = outputs
    for out in outs:
        want = _expected(records, out)
        feats = json.loads((out / STATS_FILENAME).read_text())["features"]
        for split, w in want.items():
            user, tags = feats["user_name"]["splits"][split], feats["tag_ids"]["splits"][split]
            assert (user["used_buckets"], user["buckets"]) == (w["user_name"], 64), (out, split)
            assert (tags["used_buckets"], tags["buckets"]) == (w["tag_ids"], 8), (out, split)
            assert tags["items"] == w["tag_items"]  # every id of a multi-valued feature
            assert feats["color_user"]["splits"][split]["used_buckets"] == w["cross"] > 1
            assert 0 < w["user_name"] < 21  # 21 names collide in 64 buckets: the count is not the distinct values


def test_the_report_shows_used_buckets_in_the_terminal_json_and_html(outputs, tmp_path):
    records, outs = outputs
    out = outs[1]
    want = _expected(records, out)
    r = runner.invoke(app, ["report", str(out), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    page = (tmp_path / "r.html").read_text()
    r = runner.invoke(app, ["report", str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    for split, w in want.items():
        use = rep["features"]["user_name"]["splits"][split]["bucket_use"]
        u = w["user_name"]
        assert use["used_buckets"] == u and use["buckets"] == 64 and use["used_share"] == u / 64
        items = rep["features"]["user_name"]["splits"][split]["items"]
        assert use["items_per_used_bucket"] == pytest.approx(items / u)
        assert use["distinct_estimate"] == round(-64 * math.log(1 - u / 64))
        assert use["colliding_share_estimate"] == pytest.approx((u - 1) / 63)
        assert f"into {u} of 64 buckets" in r.output
        assert f"{split}: {items} values hashed into {u} of 64 buckets" in page
        assert f"into {w['tag_ids']} of 8 buckets" in r.output
        assert rep["features"]["color_user"]["splits"][split]["bucket_use"]["used_buckets"] == w["cross"]


def test_an_older_stats_json_without_the_count_still_renders(outputs, tmp_path):
    import shutil

    _, outs = outputs
    old = tmp_path / "old"
    shutil.copytree(outs[0], old)
    doc = json.loads((old / STATS_FILENAME).read_text())
    for feat in doc["features"].values():
        for d in feat["splits"].values():
            d.pop("used_buckets", None)
            d.pop("buckets", None)
    (old / STATS_FILENAME).write_text(json.dumps(doc))
    r = runner.invoke(app, ["report", str(old), "--json", str(tmp_path / "r.json"), "--html", str(tmp_path / "r.html")],
                      env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert "values hashed into 64 buckets" in (tmp_path / "r.html").read_text()
    r = runner.invoke(app, ["report", str(old)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "values hashed into 64 buckets" in r.output and " of 64 buckets" not in r.output
    assert all("bucket_use" not in d for d in rep["features"]["user_name"]["splits"].values())


def test_buckets_beyond_the_bitmap_limit_are_not_counted_and_say_so(tmp_path):
    records = make_records(40)
    data = write_dataset(tmp_path / "in", records)
    data["config"].write_text(CONFIG.replace("buckets: 64", f"buckets: {MAX_COUNTED_BUCKETS + 1}"))
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out), "--no-progress"])
    assert r.exit_code == 0, r.output
    doc = json.loads((out / STATS_FILENAME).read_text())
    assert all(d["used_buckets"] is None and d["buckets"] == MAX_COUNTED_BUCKETS + 1
               for d in doc["features"]["user_name"]["splits"].values())
    r = runner.invoke(app, ["report", str(out)], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and "used buckets not counted above 16,777,216" in r.output, r.output


def test_used_bucket_sets_merge_exactly_in_any_order_and_survive_pickling():
    rng = np.random.default_rng(4)
    chunks = [rng.integers(1, 1001, size=n) for n in (0, 1, 50, 300, 7)]
    want = len(set(np.concatenate(chunks).tolist()))
    for order in ([0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
        parts = []
        for k in order:
            u = _UsedBuckets(1000)
            u.add(chunks[k])
            parts.append(pickle.loads(pickle.dumps(u)))
        merged = _UsedBuckets(1000)
        for u in parts:
            merged.merge(u)
        assert merged.count() == want
    edge = _UsedBuckets(9)  # the last bucket's bit sits alone in the second byte
    edge.add(np.array([1, 8, 9, 9]))
    assert edge.count() == 3 and edge.bits.size == 2


def test_bucket_use_estimates():
    use = bucket_use(100, 32, 64)
    assert use["distinct_estimate"] == round(64 * math.log(2)) and use["colliding_share_estimate"] == pytest.approx(31 / 63)
    assert bucket_use(100, 64, 64)["distinct_estimate"] is None  # every bucket used: no estimate
    assert bucket_use(0, 0, 64)["items_per_used_bucket"] is None
    assert bucket_use(5, None, 64) is None and bucket_use(5, "x", 64) is None and bucket_use(5, 65, 64) is None
