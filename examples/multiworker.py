"""Multi-worker training on a recordprep output: ``MultiWorkerMirroredStrategy`` + file-level sharding.

Run one process per worker, each with the same ``TF_CONFIG`` cluster and its
own task index (on Kubernetes or VMs the launcher sets it)::

    TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", "index": 0}}' \
        python examples/multiworker.py gs://bucket/out --steps 100

Each worker builds its input through ``strategy.distribute_datasets_from_function``:
the function receives a ``tf.distribute.InputContext`` and passes it to
``readers.train_dataset(..., input_context=ctx)``, so worker ``i`` of ``n``
opens only shards ``i, i+n, ...`` (disjoint, together the whole split) and
batches at the per-replica size. ``--ids-out`` writes which records (the
``count`` feature of the tests' data) and how many steps this worker's
pipeline covered, for tests/test_readers_multiworker.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", help="recordprep output directory (local or gs://)")
    ap.add_argument("--features", nargs="+", default=None, help="float32 features to train on (default: all)")
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ids-out", default=None, help="write this worker's record ids and steps here (JSON)")
    args = ap.parse_args(argv)
    if "TF_CONFIG" not in os.environ:
        ap.error("TF_CONFIG is not set: every worker needs the cluster and its own task index")

    import tensorflow as tf

    import readers

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    info = readers.load_info(args.data)
    names = args.features or [f.name for f in info.features if f.name != info.label_key and f.dtype == "float32"]
    contexts: list[tf.distribute.InputContext] = []

    def make(ctx: tf.distribute.InputContext, num_epochs: int | None = None) -> tf.data.Dataset:
        contexts.append(ctx)
        return readers.train_dataset(args.data, ctx.get_per_replica_batch_size(args.global_batch), split="train",
                                     features=names, seed=1, num_epochs=num_epochs, input_context=ctx)

    with strategy.scope():
        inputs = {n: tf.keras.Input(shape=info.feature(n).shape, name=n) for n in names}
        x = tf.keras.layers.Concatenate()([tf.keras.layers.Flatten()(v) for v in inputs.values()])
        model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))
        optimizer = tf.keras.optimizers.SGD(1e-4)

    # A custom loop: Keras 3's fit does not take a dataset distributed by the strategy.
    @tf.function
    def train_step(iterator):
        def replica_step(batch):
            features, label = batch
            with tf.GradientTape() as tape:
                err = tf.squeeze(model(features, training=True), -1) - tf.cast(tf.reshape(label, [-1]), tf.float32)
                loss = tf.nn.compute_average_loss(tf.square(err), global_batch_size=args.global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(replica_step, args=(next(iterator),)),
                               axis=None)

    iterator = iter(strategy.distribute_datasets_from_function(make))
    losses = [float(train_step(iterator)) for _ in range(args.steps)]
    ctx = contexts[0]
    print(f"worker {ctx.input_pipeline_id} of {ctx.num_input_pipelines}: trained {args.steps} steps, "
          f"loss {losses[-1]:.4f}", flush=True)
    if args.ids_out:
        # This worker's pipeline for one epoch, with the context the strategy gave it.
        one_epoch = readers.train_dataset(args.data, 1, split="train", features=["count"], label_key=None,
                                          num_epochs=1, input_context=ctx)
        ids = [int(v) for batch in one_epoch for v in batch["count"].numpy()[:, 0]]
        Path(args.ids_out).write_text(json.dumps({
            "pipeline": ctx.input_pipeline_id, "pipelines": ctx.num_input_pipelines, "ids": ids,
            "steps": len(losses), "loss": losses[-1]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
