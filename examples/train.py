"""Train a small Keras model on a recordprep output: ``python examples/train.py OUTPUT [--save FILE] [--export DIR]``.

``--save FILE`` writes the trained Keras model (``model.keras``), the file
``recordprep export OUTPUT FILE DIR`` turns into a serving SavedModel.
``--export DIR`` writes a SavedModel that takes raw records' fields (the
converter's transforms embedded, ``readers.export_serving``); score raw JSON
lines with it: ``python examples/predict.py DIR RECORDS.jsonl``.

The model is built from the data's own description (``readers.load_info``)
by ``readers.feature_encoder``: id features get embeddings sized by their
``vocab_size``, token ids are mean-pooled, scaled floats and missing
indicators go in as they are; features written raw are left out. Nothing here
names a feature. The last line is the eval split's loss, accuracy and AUC.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep the demo's output readable
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")  # its start-up line ignores the log level
import tensorflow as tf  # noqa: E402

import readers  # noqa: E402


def build_model(info: readers.DatasetInfo, embedding_dim: int = 8, hidden: Sequence[int] = (32,), dropout: float = 0.2,
                l2: float = 0.03) -> tf.keras.Model:
    """``readers.feature_encoder``'s encoding of every feature a model can take as written, then
    ReLU layers ``hidden`` wide (each followed by ``dropout``), then one sigmoid.

    ``embedding_dim`` caps the embeddings' widths (``feature_encoder``'s ``max_embedding_dim``)
    and ``l2`` penalizes their tables: on a small dataset an identifier's embedding (a hashed id
    seen once or twice) otherwise learns the training records by heart. ``bench/tft.py`` builds
    a larger model from the same code.
    """
    reg = tf.keras.regularizers.L2(l2) if l2 else None
    inputs, h = readers.feature_encoder(info, max_embedding_dim=embedding_dim, embeddings_regularizer=reg)
    for width in hidden:
        h = tf.keras.layers.Dense(width, activation="relu")(h)
        if dropout:
            h = tf.keras.layers.Dropout(dropout, seed=0)(h)
    out = tf.keras.layers.Dense(1, activation="sigmoid")(h)
    return tf.keras.Model(inputs=inputs, outputs=out)


class _Throughput(tf.keras.callbacks.Callback):
    def __init__(self, batch_size: int):
        super().__init__()
        self.batch_size = batch_size

    WARMUP = 20  # steps excluded from the rate: graph tracing, first file opens

    def on_train_begin(self, logs=None):
        self.t0 = time.perf_counter()
        self.steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if self.steps == self.WARMUP:
            self.t_warm = time.perf_counter()

    def on_train_end(self, logs=None):
        end = time.perf_counter()
        line = f"trained {self.steps} steps in {end - self.t0:.1f} s"
        if self.steps > self.WARMUP:
            rate = (self.steps - self.WARMUP) * self.batch_size / (end - self.t_warm)
            line += f": {rate:,.0f} examples/s after {self.WARMUP} warm-up steps"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("output", help="recordprep output directory")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=0.003, help="Adam's learning rate")
    ap.add_argument("--l2", type=float, default=0.03, help="L2 penalty of the embedding tables (0: none)")
    ap.add_argument("--save", metavar="FILE", help="also save the trained Keras model to FILE (.keras) for `recordprep export`")
    ap.add_argument("--export", metavar="DIR", help="also write a serving SavedModel (raw fields in) to DIR")
    args = ap.parse_args()

    info = readers.load_info(args.output)
    tf.keras.utils.set_random_seed(0)
    model = build_model(info, l2=args.l2)
    model.compile(optimizer=tf.keras.optimizers.Adam(args.learning_rate), loss="binary_crossentropy", metrics=["accuracy", tf.keras.metrics.AUC(name="auc")])
    names = list(model.input) if isinstance(model.input, dict) else [t.name for t in model.inputs]
    train = readers.train_dataset(f"{args.output}/train-*", batch_size=args.batch_size, seed=0, features=names)
    evald = readers.eval_dataset(f"{args.output}/eval-*", batch_size=256, features=names)
    epochs = 3
    model.fit(train, steps_per_epoch=max(1, args.steps // epochs), epochs=epochs, verbose=2, shuffle=False,
              callbacks=[_Throughput(args.batch_size)])
    loss, acc, auc = model.evaluate(evald, verbose=0)
    print(f"eval: loss {loss:.4f}  accuracy {acc:.4f}  auc {auc:.4f}")
    if args.save:
        model.save(args.save)
        print(f"saved the Keras model to {args.save}")
    if args.export:
        readers.export_serving(model, args.output, args.export)
        print(f"exported a serving model (raw fields in) to {args.export}")


if __name__ == "__main__":
    main()
