"""Features read through lists of records: the Avro fast path against fastavro (issue 19).

``python -m bench.record_shapes DECODER [--records N]`` decodes and prepares
(``Preparer.prepare``, what the convert pass does per batch) a seeded file of
orders, each a list of 0-7 item records, with the features of
``CONFIG``; ``DECODER`` is ``auto`` (polars: the lists of records are read
with column operations) or ``fastavro`` (dicts). Run the two under
``farm-bench --vs`` for their ratio; the file is written once, under
``.cache/bench-record-shapes``.
"""

from __future__ import annotations

import argparse
import io
import random
from pathlib import Path

import fastavro

SCHEMA = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "items", "type": ["null", {"type": "array", "items": {"type": "record", "name": "Item", "fields": [
        {"name": "price", "type": "double"},
        {"name": "sku", "type": "string"},
        {"name": "qty", "type": "long"}]}}]},
]}
CONFIG = {"features": [
    {"name": "price", "source": "items[].price", "transform": "identity", "max_len": 8},
    {"name": "sku", "source": "items[].sku", "transform": "vocabulary", "max_len": 8},
    {"name": "n_items", "source": "items", "transform": "count"},
]}


def ensure_data(n: int) -> Path:
    path = Path(".cache/bench-record-shapes") / f"orders-{n}.avro"
    if path.exists():
        return path
    rng = random.Random(19)
    recs = ({"id": i, "items": None if rng.random() < 0.05 else [
        {"price": round(rng.uniform(1, 500), 2), "sku": f"sku{rng.randrange(5000)}", "qty": rng.randrange(1, 9)}
        for _ in range(rng.randrange(8))]} for i in range(n))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        fastavro.writer(f, fastavro.parse_schema(SCHEMA), recs, codec="deflate")
    tmp.rename(path)
    return path


def main() -> None:
    from convert.config import parse_config
    from convert.prepare import Preparer
    from convert.sources import iter_avro

    ap = argparse.ArgumentParser()
    ap.add_argument("decoder", choices=("auto", "fastavro"))
    ap.add_argument("--records", type=int, default=200_000)
    args = ap.parse_args()
    data = ensure_data(args.records).read_bytes()
    prep = Preparer(parse_config(CONFIG), unit_terms=True)
    rows = 0
    for batch in iter_avro(io.BytesIO(data), "orders.avro", batch_size=4096, decoder=args.decoder):
        rows += prep.prepare(batch.records, analyze=True).rows
    assert rows == args.records


if __name__ == "__main__":
    main()
