"""Small datasets shared by the pipeline tests (built in tmp dirs, never committed)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import fastavro

SCHEMA = {
    "type": "record", "name": "Row", "fields": [
        {"name": "id", "type": "long"},
        {"name": "x", "type": ["null", "double"], "default": None},
        {"name": "color", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "text", "type": "string"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [{"name": "name", "type": "string"}]}},
        {"name": "y", "type": "int"},
    ],
}

CONFIG = """
label: {source: y, dtype: int64}
features:
  - {name: id, transform: identity}
  - {name: x, transform: zscore, missing_indicator: true}
  - {name: color, transform: vocabulary}
  - {name: tags, transform: vocabulary, max_len: 2}
  - {name: text, transform: text, max_len: 3}
  - {name: user_name, source: user.name, transform: hash, buckets: 64}
"""


#: The run id in a shard name (convert.spec.shard_name): the one part two runs' shard names differ in.
_RUN_ID = re.compile(r"-[0-9a-f]{12}(?=\.tfrecord)")


def without_run_id(name: str) -> str:
    """A shard name (or path) without its run's id: what two outputs of one dataset share."""
    return _RUN_ID.sub("", name)


def by_shard(root: Path, name: str) -> Path:
    """The file in ``root`` that is shard ``name`` (of this output or another run's)."""
    want = without_run_id(name.rsplit("/", 1)[-1])
    found = [p for p in root.iterdir() if without_run_id(p.name) == want]
    assert len(found) == 1, (root, name, found)
    return found[0]


def shards_without_run_id(info) -> dict[str, list[tuple[str, int, int]]]:
    """A ``DatasetInfo``'s shards per split, ``(name less the run id, records, bytes)``: what two runs share."""
    return {n: [(without_run_id(s.file), s.num_records, s.num_bytes) for s in sp.shards] for n, sp in info.splits.items()}


def make_records(n: int = 300, seed: int = 3) -> list[dict]:
    rng = random.Random(seed)
    words = ["alpha", "beta", "Gamma", "delta"]
    out = []
    for i in range(n):
        out.append({
            "id": i,
            "x": None if i % 11 == 0 else round(rng.uniform(-5, 5), 3),
            "color": rng.choice(["red", "green", "blue", "", None]),
            "tags": rng.sample(["a", "b", "c"], rng.randint(0, 3)),
            "text": " ".join(rng.choice(words) for _ in range(rng.randint(0, 5))),
            "user": {"name": f"user{rng.randint(0, 20)}"},
            "y": i % 2,
        })
    return out


def write_dataset(root: Path, records: list[dict], *, bad_json_lines: bool = False) -> dict[str, Path]:
    """AVRO (2 files, small blocks) and JSON Lines copies of the same records."""
    root.mkdir(parents=True, exist_ok=True)
    half = len(records) // 2
    for k, part in enumerate((records[:half], records[half:])):
        with open(root / f"part-{k}.avro", "wb") as f:
            fastavro.writer(f, SCHEMA, part, codec="deflate", sync_interval=1500)
        lines = [json.dumps(r) for r in part]
        if bad_json_lines and k == 1:
            lines.insert(5, '{"id": 9999, "x": ')  # malformed
            lines.insert(9, json.dumps({**part[0], "id": 10000, "y": None}))  # no label
        (root / f"part-{k}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = root / "features.yaml"
    cfg.write_text(CONFIG)
    return {"avro": root / "*.avro", "json": root / "*.jsonl", "config": cfg}
