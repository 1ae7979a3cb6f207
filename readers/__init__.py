"""tf.data readers for recordprep outputs.

Typical use::

    import readers

    info = readers.wait_for_dataset("gs://bucket/out", timeout=3600)
    inputs = readers.keras_inputs(info)
    ...
    model.fit(readers.train_dataset("gs://bucket/out/train-*", 512, seed=1),
              steps_per_epoch=1000, epochs=10,
              validation_data=readers.eval_dataset("gs://bucket/out/eval-*", 512))
    readers.export_serving(model, "gs://bucket/out", "gs://bucket/models/1")  # raw fields in

``transform_layer``/``export_serving`` (``readers.serving``) apply the
converter's transforms to raw records in TensorFlow, bit for bit.

``load_info`` and ``wait_for_dataset`` do not need TensorFlow for local
paths; TensorFlow is imported when a dataset is first built (lazily, so that
``import readers`` stays cheap). Nothing here imports Apache Beam.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from readers.errors import (
    DatasetDeadError,
    DatasetFailedError,
    DatasetIncompleteError,
    ShardMismatchError,
    ShardNotFoundError,
    ShardSelectionError,
    SpecError,
    StagingError,
)
from readers.info import (
    check_wait_arguments,
    keras_inputs,
    load_info,
    locate,
    wait_for_dataset,
    wait_for_metadata,
)
from readers.options import ReadOptions

if TYPE_CHECKING:  # pragma: no cover
    from readers._io import exists
    from readers._serving_examples import example_keys
    from readers._serving_wire import instances
    from readers.dataset import eval_dataset, parse_plan, train_dataset
    from readers.encoder import feature_encoder
    from readers.serving import TransformLayer, export_serving, transform_layer

__all__ = [
    "DatasetDeadError",
    "DatasetFailedError",
    "DatasetIncompleteError",
    "ReadOptions",
    "ShardMismatchError",
    "ShardNotFoundError",
    "ShardSelectionError",
    "SpecError",
    "StagingError",
    "TransformLayer",
    "check_wait_arguments",
    "eval_dataset",
    "example_keys",
    "export_serving",
    "exists",
    "feature_encoder",
    "instances",
    "keras_inputs",
    "load_info",
    "locate",
    "parse_plan",
    "train_dataset",
    "transform_layer",
    "wait_for_dataset",
    "wait_for_metadata",
]

_LAZY = {"train_dataset": "readers.dataset", "eval_dataset": "readers.dataset", "parse_plan": "readers.dataset",
         "transform_layer": "readers.serving", "export_serving": "readers.serving", "TransformLayer": "readers.serving",
         "example_keys": "readers._serving_examples", "instances": "readers._serving_wire", "exists": "readers._io",
         "feature_encoder": "readers.encoder"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'readers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
