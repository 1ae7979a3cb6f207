"""Regenerate the bundled example data (deterministic): ``python examples/make_data.py``.

A small click-prediction dataset, written twice: as 4 deflate AVRO files
(``data/clicks-*.avro``) and as 2 JSON Lines files (``data/clicks-*.jsonl``).
The JSON Lines copy also holds three deliberately bad records (a malformed
line, a missing label, a string where a number belongs) so the demo shows the
error output at work.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import fastavro

HERE = Path(__file__).parent / "data"
N = 4000

SCHEMA = {
    "type": "record", "name": "Click", "namespace": "recordprep.example",
    "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "age", "type": ["null", "int"], "default": None},
        {"name": "income", "type": ["null", "double"], "default": None},
        {"name": "country", "type": "string"},
        {"name": "device", "type": {"type": "enum", "name": "Device", "symbols": ["desktop", "mobile", "tablet"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "query", "type": "string"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "id", "type": "string"},
            {"name": "segment", "type": ["null", "string"], "default": None},
        ]}},
        {"name": "clicked", "type": "int"},
    ],
}

WORDS = "cheap flights hotel paris berlin shoes running red blue laptop phone case deal review best new".split()
COUNTRIES = ["US", "DE", "FR", "GB", "IN", "BR", "JP", "NG"]
TAGS = ["promo", "returning", "newsletter", "mobile_app", "vip"]


def records(seed: int = 7):
    rng = random.Random(seed)
    for i in range(N):
        device = rng.choice(["desktop", "mobile", "mobile", "tablet"])
        age = None if rng.random() < 0.08 else rng.randint(18, 80)
        income = None if rng.random() < 0.1 else round(rng.lognormvariate(10, 0.6), 2)
        query = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
        tags = rng.sample(TAGS, rng.randint(0, 3))
        score = (0.8 if "deal" in query or "cheap" in query else 0) + (0.6 if device == "mobile" else 0) + (0.5 if "vip" in tags else 0)
        yield {
            "event_id": i,
            "ts": 1_767_225_600_000 + i * 60_000,
            "age": age,
            "income": income,
            "country": rng.choice(COUNTRIES),
            "device": device,
            "tags": tags,
            "query": query,
            "user": {"id": f"u{rng.randint(0, 799):04d}", "segment": rng.choice([None, "a", "b"])},
            "clicked": int(rng.random() < 0.15 + 0.3 * score),
        }


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    recs = list(records())
    per = N // 4
    for k in range(4):
        with open(HERE / f"clicks-{k}.avro", "wb") as f:
            fastavro.writer(f, SCHEMA, recs[k * per:(k + 1) * per], codec="deflate")
    half = N // 2
    for k in range(2):
        lines = [json.dumps(r) for r in recs[k * half:(k + 1) * half]]
        if k == 1:
            lines[10] = lines[10][:-9]  # truncated line: malformed JSON
            bad = dict(recs[half + 20])
            del bad["clicked"]
            lines[20] = json.dumps(bad)  # no label
            bad = dict(recs[half + 30])
            bad["income"] = "n/a"
            lines[30] = json.dumps(bad)  # string where a number belongs
        (HERE / f"clicks-{k}.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
