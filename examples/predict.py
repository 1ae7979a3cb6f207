"""Score raw JSON records with an exported model: ``python examples/predict.py EXPORT RECORDS.jsonl``.

``EXPORT`` is a SavedModel from ``examples/train.py --export`` (``readers.export_serving``):
it takes the records' raw fields and applies the converter's transforms itself,
so nothing here computes a feature. recordprep only turns each record into the
signature's dense inputs (nulls and lists as kinds and lengths, see
docs/serving.md); ``--request FILE`` writes the same inputs as a TensorFlow
Serving REST body (``{"instances": [...]}``) for ``POST /v1/models/NAME:predict``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep the demo's output readable
import tensorflow as tf  # noqa: E402

from readers._serving_wire import instances  # noqa: E402
from readers.serving import ERROR_OUTPUT, wire_of_export  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("export", help="SavedModel directory written by readers.export_serving")
    ap.add_argument("records", help="JSON Lines file of raw records")
    ap.add_argument("-n", type=int, default=5, help="score the first N records (default 5)")
    ap.add_argument("--request", metavar="FILE", help="also write the TF Serving REST request body to FILE")
    args = ap.parse_args()

    with open(args.records, encoding="utf-8") as f:
        records = [json.loads(line) for line in itertools.islice(f, args.n)]
    inputs, rejected = wire_of_export(args.export).encode(records)
    if args.request:
        with open(args.request, "w", encoding="utf-8") as f:
            json.dump({"instances": instances(inputs)}, f)
    serve = tf.saved_model.load(args.export).signatures["serving_default"]
    outputs = serve(**{k: tf.constant(v) for k, v in inputs.items()})
    errors = [e.decode() for e in outputs.pop(ERROR_OUTPUT).numpy().tolist()]
    (name, preds), *_ = outputs.items()
    for i, record in enumerate(records):
        why = rejected.get(i) or errors[i]
        shown = json.dumps(record)[:90]
        print(f"{shown:<92} -> " + (f"rejected: {why}" if why else f"{name} {preds.numpy()[i].ravel().tolist()}"))


if __name__ == "__main__":
    main()
