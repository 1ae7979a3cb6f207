"""Score raw records with an exported model: ``python examples/predict.py EXPORT RECORDS``.

``EXPORT`` is a SavedModel from ``recordprep export`` or ``examples/train.py --export``
(``readers.export_serving``): it takes the records' raw fields and applies the
converter's transforms itself, so nothing here computes a feature. ``RECORDS``
is an Avro or JSON Lines file, read by the converter's own reader (Avro logical
types as the converter sees them). recordprep only turns each record into the
signature's dense inputs (nulls and lists as kinds and lengths, see
docs/serving.md); ``--request FILE`` writes the same inputs as a TensorFlow
Serving REST body (``{"instances": [...]}``) for ``POST /v1/models/NAME:predict``.

Each row prints the model's output (with a class label: the probabilities and
the most probable class name, from ``recordprep_classes``) or why the record
was rejected.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep the demo's output readable
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # its start-up line ignores the log level
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from convert.sources import iter_records  # noqa: E402
from readers import instances  # noqa: E402
from readers.serving import CLASSES_OUTPUT, ERROR_OUTPUT, wire_of_export  # noqa: E402


def read_records(path: str, n: int) -> list[Any]:
    """The first ``n`` records of an Avro or JSON Lines file; a line that is not a record ends the script naming it."""
    records: list[Any] = []
    with open(path, "rb") as f:
        for batch in iter_records(f, path, 0, None, max(1, min(n, 4096))):
            if batch.bad:
                _, line, reason, _ = batch.bad[0]
                raise SystemExit(f"error: {path}{f' line {line}' if line else ''}: {reason}")
            records.extend(batch.records[: n - len(records)])
            if len(records) >= n:
                break
    return records


def describe(name: str, preds: np.ndarray, classes: np.ndarray | None) -> str:
    """One row's model output; with class names, the most probable class first."""
    values = [round(float(v), 6) for v in preds.ravel()]
    if classes is None or classes.size != len(values):
        return f"{name} {values}"
    best = classes.ravel()[int(np.argmax(preds))].decode()
    return f"{best} ({name} {values})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export", help="SavedModel directory written by recordprep export or readers.export_serving")
    ap.add_argument("records", help="Avro or JSON Lines file of raw records")
    ap.add_argument("-n", type=int, default=5, help="score the first N records (default 5)")
    ap.add_argument("--request", metavar="FILE", help="also write the TF Serving REST request body to FILE")
    args = ap.parse_args()

    records = read_records(args.records, args.n)
    inputs, rejected = wire_of_export(args.export).encode(records)
    if args.request:
        with open(args.request, "w", encoding="utf-8") as f:
            json.dump({"instances": instances(inputs)}, f)
    serve = tf.saved_model.load(args.export).signatures["serving_default"]
    outputs = serve(**{k: tf.constant(v) for k, v in inputs.items()})
    errors = [e.decode() for e in outputs.pop(ERROR_OUTPUT).numpy().tolist()]
    classes = outputs.pop(CLASSES_OUTPUT, None)
    name, preds = sorted(outputs.items())[0]  # the model's own output (the first by name if it has several)
    for i, record in enumerate(records):
        why = rejected.get(i) or errors[i]
        shown = json.dumps(record, default=str)[:90]
        row = describe(name, preds.numpy()[i], None if classes is None else classes.numpy()[i])
        print(f"{shown:<92} -> " + (f"rejected: {why}" if why else row))


if __name__ == "__main__":
    main()
