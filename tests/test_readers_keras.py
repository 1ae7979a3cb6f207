"""A tiny Keras model trains on train_dataset and evaluates on eval_dataset."""

from __future__ import annotations

import math

import _readers_fixtures as fx
import numpy as np
import tensorflow as tf

import readers


def test_keras_fit_and_evaluate(tmp_path):
    out = fx.write_output(tmp_path / "out")
    info = readers.load_info(str(out.root / "train-*"))
    names = ["num", "vec", "count", "ids"]
    inputs = readers.keras_inputs(info, names)
    as_float = [tf.keras.layers.Lambda(lambda t: tf.cast(t, "float32"))(inputs[n]) for n in names]
    hidden = tf.keras.layers.Concatenate()(as_float)
    logits = tf.keras.layers.Dense(3)(tf.keras.layers.Dense(8, activation="relu")(hidden))
    model = tf.keras.Model(inputs, logits)
    model.compile(
        optimizer="adam",
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )

    train = readers.train_dataset(str(out.root / "train-*"), 8, features=names, seed=0)
    history = model.fit(train, steps_per_epoch=3, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2
    assert all(np.isfinite(history.history["loss"]))

    evaluation = readers.eval_dataset(str(out.root / "eval-*"), 4, features=names)
    assert int(evaluation.cardinality()) == math.ceil(10 / 4)
    loss, accuracy = model.evaluate(evaluation, verbose=0)
    assert np.isfinite(loss) and 0.0 <= accuracy <= 1.0

    predictions = model.predict(
        readers.eval_dataset(str(out.root / "eval-*"), 4, features=names, label_key=None), verbose=0
    )
    assert predictions.shape == (10, 3)  # one row per record, partial batch kept
