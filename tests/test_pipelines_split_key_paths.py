"""``--split-key`` is a path in the feature config's ``source`` grammar
(``convert/paths.py``): a top-level field whose own name holds a dot is
quoted (``["user.name"]``), as in a ``source``; a key naming nothing in the
data, where a field of that literal dotted name exists, is an error saying how
to spell it. Through the CLI, on JSON Lines and on Parquet."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _e2e import check_accounting, cli, counts_of

from convert.splits import SplitError, Splits

pytestmark = pytest.mark.slow

CONFIG = "label: {source: y, dtype: int64}\nfeatures:\n  - {name: x, transform: identity}\n"
QUOTED = '["user.name"]'


def _records(n: int = 120) -> list[dict]:
    return [{"user.name": f"u{i % 9}", "x": float(i), "y": i % 2} for i in range(n)]


def _write(root: Path, kind: str, records: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if kind == "json":
        path = root / "events.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path = root / "events.parquet"
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=50)
    return path


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_a_top_level_field_named_with_a_dot_is_a_split_key_when_quoted(tmp_path, kind):
    records = _records()
    path = _write(tmp_path / "d", kind, records)
    config = tmp_path / "features.yaml"
    config.write_text(CONFIG)
    out = tmp_path / "out"
    r = cli("convert", "-i", path, "-c", config, "-o", out, "--num-shards", "1", "--split-key", QUOTED,
            "--splits", "train=0.5,eval=0.5")
    assert r.exit_code == 0, r.output
    counts = check_accounting(out)
    want = Splits.parse("train=0.5,eval=0.5", QUOTED).assign(records)  # each user's records in one split
    assert counts["written"] == {"train": int((want == 0).sum()), "eval": int((want == 1).sum())}
    by_user: dict[str, set[int]] = {}
    for rec, s in zip(records, want, strict=True):
        by_user.setdefault(rec["user.name"], set()).add(int(s))
    assert all(len(s) == 1 for s in by_user.values()) and len({min(s) for s in by_user.values()}) == 2


@pytest.mark.parametrize("kind", ["json", "parquet"])
def test_a_dotted_split_key_naming_nothing_says_how_to_quote_the_field(tmp_path, kind):
    path = _write(tmp_path / "d", kind, _records(40))
    config = tmp_path / "features.yaml"
    config.write_text(CONFIG)
    r = cli("convert", "-i", path, "-c", config, "-o", tmp_path / "out", "--split-key", "user.name")
    assert r.exit_code == 2, r.output
    assert "--split-key reads 'user.name'" in r.output and f"write '{QUOTED}'" in r.output, r.output
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_a_nested_split_key_still_reads_the_nested_field(tmp_path):
    """``user.name`` is the field ``name`` inside ``user``: the records hash as before the grammar."""
    records = [{"user": {"name": f"u{i % 9}"}, "x": float(i), "y": i % 2} for i in range(60)]
    path = _write(tmp_path / "d", "json", records)
    config = tmp_path / "features.yaml"
    config.write_text(CONFIG)
    r = cli("convert", "-i", path, "-c", config, "-o", tmp_path / "out", "--split-key", "user.name",
            "--num-shards", "1")
    assert r.exit_code == 0, r.output
    flat = [{"user.name": r["user"]["name"]} for r in records]
    want = Splits.parse("train=0.9,eval=0.1", QUOTED).assign(flat)
    assert counts_of(tmp_path / "out")["written"]["eval"] == int((want == 1).sum())


@pytest.mark.parametrize(("key", "words"), [
    ("tags[]", "a key names one value per record"),
    ("m[keys]", "a key names one value per record"),
    ('["user.name"', "expected ']'"),
    ("", "a key names one value per record"),
])
def test_a_split_key_that_is_no_single_value_path_is_a_usage_error(tmp_path, key, words):
    with pytest.raises(SplitError, match="--split-key"):
        Splits.parse("train=0.9,eval=0.1", key)
    path = _write(tmp_path / "d", "json", _records(10))
    config = tmp_path / "features.yaml"
    config.write_text(CONFIG)
    r = cli("convert", "-i", path, "-c", config, "-o", tmp_path / "out", "--split-key", key)
    assert r.exit_code == 2 and "--split-key" in r.output and words in r.output, r.output
