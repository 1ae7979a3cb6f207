"""Serving: the converter's transforms as TensorFlow ops, bit for bit.

A model trained on recordprep shards sees features the converter computed
(vocabulary ids, z-scores with the training mean, fills, bucket ids, ...). This
module builds the same mapping from a finished output, so the model can be
exported with its preprocessing and fed raw fields (docs/serving.md).

- **In**: raw source values in the wire format of ``readers._serving_wire``
  (docs/serving.md#request-format); :meth:`TransformLayer.encode` builds
  them from records. The label is not an input: serving records have none.
- **Out**: ``{feature name: tensor}`` for every non-label feature, with the
  dtypes and shapes of the output's metadata (``[batch] + shape``). For every
  record the converter accepts, each tensor equals what the converter wrote:
  int64 and string features identical, float32 identical as bits (NaN and
  +-inf where ``on_nan: keep`` writes them). Statistics, boundaries and
  vocabularies are constants of the layer: no output directory at serving.
- **Rejected records** (a NaN under ``on_nan: error``, a string in a numeric
  field, ...: docs/serving.md#rejected-records) are never mapped silently:
  :meth:`TransformLayer.transform` returns per row ``""`` or the first reason
  in config order (``"<source>: <why>"``); calling the layer raises
  ``InvalidArgumentError`` naming it. Such rows' features are unspecified.

What is not reproduced in-graph is refused or reported instead of
approximated: outputs older than ``SERVING_MIN_FORMAT_VERSION``, a source read
both as a list and as a single value, ISO 8601 strings outside ``_ISO_RE``'s
forms and integers beyond int64 in timestamp fields
(docs/serving.md#refused-or-reported-instead-of-approximated). Exactness is
tested against the converter's shards (docs/serving.md#exactness).

This module exports the layer with a model (``export_serving``) and is where
the serving names are imported from; the layer itself is
``readers.serving_layer``, its TensorFlow operations ``readers.serving_ops``,
each transform's part ``readers.transforms.<name>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from readers import _io
from readers._serving_examples import EXAMPLES_INPUT, example_keys, transform_examples
from readers._serving_limits import (
    DEFAULT_MAX_RECORD_BYTES,
    DEFAULT_MAX_REQUEST_BYTES,
    ServingLimits,
    bounded,
    checked_inputs,
)
from readers._serving_wire import (
    Wire,
)
from readers.errors import SpecError
from readers.serving_layer import (
    SERVING_MIN_FORMAT_VERSION,
    TransformLayer,
    transform_layer,
    unsupported_reason,
)

__all__ = ["CLASSES_OUTPUT", "ERROR_OUTPUT", "EXAMPLES_SIGNATURE", "EXPORT_CONFIG_FILENAME",
           "SERVING_MIN_FORMAT_VERSION", "TransformLayer", "export_serving", "transform_layer",
           "unsupported_reason", "wire_of_export"]



#: Output of the exported signature holding, per row, ``""`` or why the
#: converter would reject the record (the row's other outputs are then meaningless).
ERROR_OUTPUT = "recordprep_error"
#: Output holding, per row, the label's class names (column ``j``: class id
#: ``j``, ``DatasetInfo.label_classes``), for a label with ``transform: vocabulary``.
CLASSES_OUTPUT = "recordprep_classes"


class _Serving(tf.Module):
    """Raw inputs -> transform -> model, as one SavedModel."""

    def __init__(self, model: Any, layer: TransformLayer, limits: ServingLimits):
        super().__init__(name="recordprep_serving")
        self.model = model
        self.layer = layer
        self._limits = limits
        inputs = getattr(model, "inputs", None)
        names = [getattr(t, "name", None) for t in inputs] if isinstance(inputs, list | tuple) else []
        wanted = {f.name for f in layer.features}
        self._model_inputs = [n for n in names if n in wanted] if names and all(n in wanted for n in names) else None
        classes = layer._applied.info.label_classes
        self._classes = None if classes is None else tf.constant(classes, dtype=tf.string)
        self.serve = tf.function(self._serve, input_signature=[layer.input_signature])
        self.serve_examples = tf.function(self._serve_examples, input_signature=[
            tf.TensorSpec([None], tf.string, name=EXAMPLES_INPUT)])

    def _serve_examples(self, examples: tf.Tensor) -> dict[str, tf.Tensor]:
        bound, too_big = bounded({EXAMPLES_INPUT: tf.reshape(examples, [-1])}, self._limits,
                                 f"{EXAMPLES_INPUT}: the serialized Example has")
        features, errors = transform_examples(self.layer, bound[EXAMPLES_INPUT])
        return self._serve(None, (features, tf.where(tf.equal(too_big, ""), errors, too_big)))

    def _serve(self, inputs: dict[str, tf.Tensor] | None,
               transformed: tuple[dict[str, tf.Tensor], tf.Tensor] | None = None) -> dict[str, tf.Tensor]:
        if transformed is None:
            packed = checked_inputs(self.layer.wire, inputs)
            bound, too_big = bounded(packed, self._limits, "<record>: its strings have")
            features, errors = self.layer.transform(bound)
            transformed = features, tf.where(tf.equal(too_big, ""), errors, too_big)
        features, errors = transformed
        if self._model_inputs is not None:
            features = {n: features[n] for n in self._model_inputs}
        outputs = self.model(features, training=False)
        if not isinstance(outputs, Mapping):
            outputs = {"outputs": outputs}
        for added in (ERROR_OUTPUT, CLASSES_OUTPUT):
            if added in outputs:
                raise ValueError(f"the model has an output named {added!r}, which the export adds; rename it")
        if self._classes is None:
            return {**outputs, ERROR_OUTPUT: errors}
        classes = tf.tile(self._classes[tf.newaxis, :], [tf.shape(errors)[0], 1])
        return {**outputs, ERROR_OUTPUT: errors, CLASSES_OUTPUT: classes}


def export_serving(model: Any, output: str | TransformLayer, export_dir: str, *,
                   max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                   max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> str:
    """Write a SavedModel whose ``serving_default`` takes raw fields and returns the model's outputs.

    Args:
      model: a Keras model (or any callable trackable) taking the feature dict
        the output's shards hold (``readers.keras_inputs(info)``).
      output: the recordprep output the model was trained on (its analysis is
        embedded), or a layer from :func:`transform_layer`.
      export_dir: where to write the SavedModel (local or ``gs://``).
      max_request_bytes: the most bytes a request's inputs may hold (strings' bytes,
        8 or 4 per number); a larger request fails with ``InvalidArgumentError``
        before any work on it.
      max_record_bytes: the most bytes of strings one record may hold (a serialized
        Example's bytes); a larger record is rejected in ``recordprep_error`` alone.

    ``serving_default``'s inputs are the layer's wire format (``layer.input_signature``,
    see ``readers._serving_wire``); ``serve_examples`` takes ``examples``, serialized
    ``tf.train.Example`` protos of the raw records (``readers._serving_examples``,
    TFX's convention). Both return the model's outputs (a single
    tensor is named ``outputs``) plus ``recordprep_error`` (string per row,
    ``""`` when the record converts) and, when the label has classes,
    ``recordprep_classes`` (per row, the class names: column ``j`` names class id ``j``). The SavedModel needs TensorFlow only, not
    recordprep. A request of the wrong shape (rows, columns, widths, a list length
    below -1) fails naming the input. Raises SpecError for an output it cannot serve
    exactly, ValueError for limits that are not positive byte counts.
    """
    limits = ServingLimits(max_request_bytes, max_record_bytes)
    layer = output if isinstance(output, TransformLayer) else transform_layer(output)
    module = _Serving(model, layer, limits)
    tf.saved_model.save(module, export_dir, signatures={
        "serving_default": module.serve.get_concrete_function(),
        EXAMPLES_SIGNATURE: module.serve_examples.get_concrete_function()})
    # For clients that encode records with recordprep (``wire_of_export``); TF Serving ignores assets.extra.
    extra = _io.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(_io.join(extra, EXPORT_CONFIG_FILENAME), "w") as f:
        f.write(json.dumps({"config": layer.config.to_json(), "inputs": layer.wire.input_names(),
                            "columns": layer.wire.column_names(), "limits": limits.to_json(),
                            "example_keys": list(example_keys(layer.config, layer.wire).values())}, indent=1) + "\n")
    return export_dir


#: The signature taking serialized ``tf.train.Example`` protos of raw records.
EXAMPLES_SIGNATURE = "serve_examples"
#: The feature config inside an export (``assets.extra/``), from which a client
#: rebuilds the wire encoder without the recordprep output.
EXPORT_CONFIG_FILENAME = "recordprep_config.json"


def wire_of_export(export_dir: str) -> Wire:
    """The wire encoder of a SavedModel written by :func:`export_serving`:
    ``inputs, rejected = wire_of_export(d).encode(records)``."""
    from convert.config import parse_config

    path = _io.join(_io.join(export_dir, "assets.extra"), EXPORT_CONFIG_FILENAME)
    text = _io.read_bytes(path)
    if text is None:
        raise SpecError(f"{export_dir}: no assets.extra/{EXPORT_CONFIG_FILENAME}; was it written by readers.export_serving?")
    return Wire(parse_config(json.loads(text)["config"], source=path))
