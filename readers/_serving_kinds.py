"""The kind codes of the serving wire format (``readers._serving_wire``): what a
record held at a source. A module of its own so that the TensorFlow operations
(``readers.serving_ops``) and the transforms (``readers.transforms``) read them
without importing the wire, which asks the transforms for its inputs.
"""
from __future__ import annotations

KIND_NULL, KIND_BOOL, KIND_INT, KIND_FLOAT, KIND_STRING, KIND_BYTES, KIND_NESTED, KIND_OTHER = range(8)
KIND_NAMES = ("null", "bool", "int", "float", "str", "bytes", "nested", "other")
