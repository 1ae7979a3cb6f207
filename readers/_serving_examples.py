"""Serialized ``tf.train.Example`` protos of raw records -> the serving layer's wire inputs.

The TFX serving convention: a client in any language builds an Example of the
raw record with its protobuf library and the export's ``serve_examples``
signature decodes it in-graph (docs/serving.md#tftrainexample-requests). The
mapping, per source field of the config:

- **key**: the ``source`` path as the config writes it (``user.id``,
  ``items[].price``); a ``cross`` lists one key per source.
- **absent**: null; no values: an empty list where a list is read, else null.
  Several values: a list; one value where a list belongs is a one-item list,
  as in the converter.
- **kind** from the list type: ``int64_list`` integers, ``float_list`` floats
  (float32: the protobuf type), ``bytes_list`` strings when valid UTF-8, else
  bytes. Example has no bool: send 0/1 where a number is read, ``"true"`` /
  ``"false"`` where a term is.

The protos are decoded with ``tf.io.decode_proto`` (stock TensorFlow), not
``tf.io.parse_example``: that needs one dtype per key and fails the whole batch
on another, while records hold an integer in one row and a float in the next.
What the graph cannot compute is reported per row instead of approximated: a
non-integral float where a term is read (Python's ``repr`` has no TensorFlow
op; send the text), bytes that are not UTF-8 there. So is a row protobuf cannot
parse (``MALFORMED``), which ``decode_proto`` would fail the whole batch for
(``_decoded``).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from convert.config import Config, is_multi_path
from readers._serving_wire import (
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NESTED,
    KIND_NULL,
    KIND_STRING,
    Source,
    Wire,
)
from readers.transforms import serving_of

#: The serialized Examples' input of the ``serve_examples`` signature (TFX's name).
EXAMPLES_INPUT = "examples"
_TYPES = ("bytes_list", "float_list", "int64_list")
_INT64_LIMIT = 2.0**63
_FILL = {"bytes": "", "utf8": True, "float": 0.0, "int": 0}
#: An Example with one feature (key ""), appended to every batch: ``decode_proto`` takes no empty input.
_SENTINEL = b"\n\x06\n\x04\n\x00\x12\x00"
#: The reason of a row protobuf cannot parse as an Example (its other rows are decoded).
MALFORMED = (f"{EXAMPLES_INPUT}: not a serialized tf.train.Example (protobuf cannot parse it: cut short or "
             f"not an Example); send the bytes of Example.SerializeToString()")


def example_keys(config: Config, wire: Wire) -> dict[str, str]:
    """``{wire source path: Example feature key}``: the path as the config writes it
    (a ``count`` of ``items`` reads key ``items``; the first such path of a source wins)."""
    keys: dict[str, str] = {}
    for f in config.features:
        for path in serving_of(f).paths(f):
            keys.setdefault(serving_of(f).wire_path(path), path)
    return {s.path: keys[s.path] for s in wire.sources}


class ExampleDecoder:
    """Serialized Examples (``[batch]`` string) -> ``(wire inputs, errors)`` for a ``TransformLayer``."""

    def __init__(self, config: Config, wire: Wire):
        self.wire = wire
        self.keys = example_keys(config, wire)
        reads_terms = {p for f in config.features for p in serving_of(f).term_paths(f)}
        self._reads_terms = {s.path for s in wire.sources if self.keys[s.path] in reads_terms}

    def decode(self, serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """The layer's inputs, and per row ``""`` or why a value could not be decoded exactly."""
        serialized = tf.reshape(tf.convert_to_tensor(serialized, tf.string), [-1])
        batch = tf.shape(serialized)[0]
        entries, malformed = _decoded(serialized)
        errors = tf.where(malformed, MALFORMED, "")
        per: dict[str, tf.Tensor] = {}
        for s in self.wire.sources:
            v = _gather(entries, self.keys[s.path], batch, _width(s))
            if s.is_list:
                bad = self._list(s, v, per)
            else:
                bad = self._scalar(s, v, per)
            if bad is not None:
                mask, why = bad
                errors = tf.where(mask & tf.equal(errors, ""), f"{self.keys[s.path]}: {why}", errors)
        at = self.wire.positions()
        inputs = {}
        for name in self.wire.columns:
            names = sorted((j, n) for n, (p, j) in at.items() if p == name)
            inputs[name] = tf.stack([per[n] for _, n in names], axis=1)
        inputs.update((n, per[n]) for s in self.wire.sources for n in s.input_names())
        return inputs, errors

    def _scalar(self, s: Source, v: dict[str, tf.Tensor], out: dict[str, tf.Tensor]) -> Any:
        count = v["count"]
        if is_multi_path(s.path) and "term" in s.forms:  # a text through lists: its strings joined by a space
            joined = tf.strings.reduce_join(tf.RaggedTensor.from_tensor(v["bytes"], lengths=count), axis=1, separator=" ")
            strings = tf.equal(v["type"], 0) | tf.equal(count, 0)
            kind = tf.where(v["present"] & strings, KIND_STRING, tf.where(v["present"], KIND_NESTED, KIND_NULL))
            values = {"bytes": joined[:, None], "float": v["float"][:, :1], "int": v["int"][:, :1]}
            kind = tf.cast(kind, tf.int32)
        else:
            kind = _kinds(v["type"][:, None], v["utf8"][:, :1])[:, 0]
            kind = tf.where(tf.equal(count, 1), kind, tf.where(count > 1, KIND_NESTED, KIND_NULL))
            values = {k: v[k][:, :1] for k in ("bytes", "float", "int")}
        out[s.kind_name] = kind
        forms, bad = _forms(kind[:, None], values, s.path in self._reads_terms)
        for form in s.forms:
            out[s.input_name(form)] = forms[form][:, 0]
        return None if bad is None else (bad[0][:, 0], bad[1])

    def _list(self, s: Source, v: dict[str, tf.Tensor], out: dict[str, tf.Tensor]) -> Any:
        count = v["count"]
        width = tf.shape(v["bytes"])[1]
        inside = tf.sequence_mask(count, width)
        kind = tf.where(inside, _kinds(tf.broadcast_to(v["type"][:, None], tf.shape(inside)), v["utf8"]), KIND_NULL)
        out[s.kind_name] = kind
        out[s.len_name] = tf.where(v["present"], count, -1)
        forms, bad = _forms(kind, v, s.path in self._reads_terms)
        for form in s.forms:
            out[s.input_name(form)] = forms[form]
        if bad is None:
            return None
        return tf.reduce_any(bad[0], axis=1), bad[1]


def _width(s: Source) -> int | None:
    """How many leading values of source ``s`` the layer reads (None: all, for a text through lists);
    an Example's list holds no nulls, so a list's first ``max_len`` items are the ones kept."""
    if s.is_list:
        return max([n for _, n in s.uses] + [1])
    return None if is_multi_path(s.path) else 1


def _kinds(types: tf.Tensor, utf8: tf.Tensor) -> tf.Tensor:
    """Per value, its kind from its list type (0 bytes, 1 float, 2 int64): bytes are a string when valid UTF-8."""
    text = tf.where(utf8, KIND_STRING, KIND_BYTES)
    return tf.cast(tf.where(tf.equal(types, 2), KIND_INT, tf.where(tf.equal(types, 1), KIND_FLOAT, text)), tf.int32)


def _forms(kind: tf.Tensor, v: dict[str, tf.Tensor], reads_terms: bool) -> tuple[dict[str, tf.Tensor], Any]:
    """The wire's value forms of ``[batch, n]`` values of ``kind``, and ``(mask, why)``
    for the values whose term the graph cannot compute (None when no term is read)."""
    ints, floats, raw = v["int"], tf.cast(v["float"], tf.float64), v["bytes"]
    is_int, is_float = tf.equal(kind, KIND_INT), tf.equal(kind, KIND_FLOAT)
    text = tf.equal(kind, KIND_STRING) | tf.equal(kind, KIND_BYTES)
    number = tf.where(is_int, tf.cast(ints, tf.float64), tf.where(is_float, floats, tf.zeros_like(floats)))
    # A subnormal float32 is never whole, but TensorFlow's CPU kernels read it as 0: its bits say what it is.
    bits = tf.bitcast(v["float"], tf.int32)
    subnormal = tf.equal(bits & 0x7F800000, 0) & tf.not_equal(bits & 0x007FFFFF, 0)
    whole = tf.equal(floats, tf.math.floor(floats)) & (tf.abs(floats) < _INT64_LIMIT) & ~subnormal
    float_term = tf.where(whole, tf.strings.as_string(tf.cast(tf.where(whole, floats, 0.0), tf.int64)),
                          tf.where(tf.math.is_nan(floats), "nan", tf.where(floats > 0, "inf", "-inf")))
    term = tf.where(is_int, tf.strings.as_string(ints), tf.where(is_float, float_term, tf.where(text, raw, "")))
    forms = {"number": number, "int": tf.where(is_int, ints, tf.zeros_like(ints)), "raw": tf.where(text, raw, ""),
             "term": term}
    if not reads_terms:
        return forms, None
    inexact = (is_float & ~whole & tf.math.is_finite(floats)) | tf.equal(kind, KIND_BYTES)
    return forms, (inexact, "a non-integral float or bytes that are not UTF-8 where a term is read (vocabulary, "
                            "hash, cross): TensorFlow has no op for Python's form of it; send its text as a "
                            "UTF-8 bytes_list value")


def _decoded(serialized: tf.Tensor) -> tuple[dict[str, Any], tf.Tensor]:
    """``(_entries, malformed)``: the entries of the Examples, and per row whether it is
    not one (protobuf cannot parse it), decoded as an empty Example (every key absent).

    ``decode_proto`` fails a whole batch on one malformed row, and a graph catches
    errors only in ``tf.data`` (``ignore_errors``): the batch is decoded at once in a
    one-element dataset whose error drops the element, and only then is each row
    tried alone (a dataset over the rows) to find the malformed ones. The other rows
    decode to the same entries either way."""
    one = tf.data.Dataset.from_tensors(serialized)
    whole = one.map(lambda s: (_entries(_with_sentinel(s)), tf.zeros_like(s, tf.bool))).ignore_errors()

    def row_by_row(s: tf.Tensor) -> tuple[dict[str, Any], tf.Tensor]:
        malformed = _malformed(s)
        return _entries(_with_sentinel(tf.where(malformed, b"", s))), malformed

    options = tf.data.Options()
    options.experimental_optimization.apply_default_optimizations = False  # nothing to gain on one element
    options.autotune.enabled = False
    # The second dataset is read only when the first yields nothing (its batch failed).
    return whole.concatenate(one.map(row_by_row)).take(1).with_options(options).get_single_element()


def _malformed(serialized: tf.Tensor) -> tf.Tensor:
    """Per row, whether decoding it alone fails: every ``decode_proto`` of ``_entries``
    runs, as the row's count of values depends on each."""
    n = tf.shape(serialized, out_type=tf.int64)[0]
    rows = tf.data.Dataset.from_tensor_slices((tf.range(n), serialized))
    parsed = rows.map(lambda i, s: (i, tf.reduce_sum(_entries(_with_sentinel(s[None]))["count"]))).ignore_errors()
    done = tf.data.Dataset.from_tensors((tf.constant(-1, tf.int64), tf.constant(0, tf.int32)))  # never empty
    good, _ = parsed.concatenate(done).batch(n + 1).get_single_element()
    hits = tf.math.unsorted_segment_sum(tf.ones_like(good), tf.where(good < 0, n, good), n + 1)[:n]
    return tf.equal(hits, 0)


def _with_sentinel(serialized: tf.Tensor) -> tf.Tensor:
    return tf.concat([serialized, [_SENTINEL]], 0)


def _entries(serialized: tf.Tensor) -> dict[str, Any]:
    """Every feature of every Example: its row, key, list type and values (``[entries, width]``, padded)."""
    batch = tf.shape(serialized)[0]
    _, (features,) = tf.io.decode_proto(serialized, "tensorflow.Example", ["features"], [tf.string])
    sizes, (maps,) = tf.io.decode_proto(features[:, 0], "tensorflow.Features", ["feature"], [tf.string])
    inside = tf.sequence_mask(sizes[:, 0], tf.shape(maps)[1])
    rows = tf.boolean_mask(tf.broadcast_to(tf.range(batch)[:, None], tf.shape(maps)), inside)
    _, (keys, values) = tf.io.decode_proto(tf.boolean_mask(maps, inside), "tensorflow.Features.FeatureEntry",
                                           ["key", "value"], [tf.string, tf.string])
    which, lists = tf.io.decode_proto(values[:, 0], "tensorflow.Feature", list(_TYPES), [tf.string] * 3)
    out: dict[str, Any] = {"row": rows, "key": keys[:, 0], "typed": tf.reduce_sum(which, axis=1) > 0,
                           "type": tf.argmax(which, axis=1, output_type=tf.int32)}
    counts = []
    for t, (name, dtype, field) in enumerate([("bytes", tf.string, "BytesList"), ("float", tf.float32, "FloatList"),
                                              ("int", tf.int64, "Int64List")]):
        n, (vals,) = tf.io.decode_proto(lists[t][:, 0], f"tensorflow.{field}", ["value"], [dtype])
        out[name] = vals
        counts.append(n[:, 0])
        if name == "bytes":
            out["utf8"] = tf.equal(tf.strings.unicode_transcode(vals, "UTF-8", "UTF-8", errors="replace"), vals)
    out["count"] = tf.gather(tf.stack(counts, axis=1), out["type"], batch_dims=1)
    return out


def _gather(entries: dict[str, Any], key: str, batch: tf.Tensor, width: int | None) -> dict[str, tf.Tensor]:
    """Row by row, the feature ``key`` (the last one where a row repeats it, as protobuf maps merge):
    whether it is there, its type, its number of values and its first ``width`` values (all: None),
    ``[batch, width]``; values of absent rows are any of their dtype."""
    n = tf.shape(entries["key"])[0]
    hit = tf.where(tf.equal(entries["key"], key), tf.range(n), -1)
    at = tf.math.unsorted_segment_max(hit, entries["row"], batch + 1)[:batch]  # -1 or int32's min: absent
    present = at >= 0
    i = tf.maximum(at, 0)  # the sentinel's entry makes 0 valid
    values = {k: entries[k] for k in ("bytes", "utf8", "float", "int")}
    w = width if width is not None else tf.maximum(tf.reduce_max(tf.stack([tf.shape(t)[1] for t in values.values()])), 1)
    out = {k: tf.gather(t[:, :w] if width is not None else t, i) for k, t in values.items()}
    out = {k: tf.pad(t, [[0, 0], [0, w - tf.shape(t)[1]]], constant_values=_FILL[k]) for k, t in out.items()}
    return {**out, "present": present & tf.gather(entries["typed"], i), "type": tf.gather(entries["type"], i),
            "count": tf.where(present, tf.gather(entries["count"], i), 0)}


# ------------------------------------------------------------------ client side (Python)


def to_example(record: dict[str, Any], keys: Sequence[str]) -> bytes:
    """``record`` as the serialized Example ``serve_examples`` takes: the value at each
    of ``keys`` (``example_keys``' values) by the module's mapping. Raises ValueError
    naming the key for a value an Example cannot carry (a nested record, a null list item)."""
    from convert.records import getter

    feature = {}
    for key in dict.fromkeys(keys):
        v = getter(key)(record)
        if v is None:
            continue
        items = list(v) if isinstance(v, list | tuple) else [v]
        kinds = {type(x) for x in items}
        if any(x is None or isinstance(x, dict | list | tuple) for x in items):
            raise ValueError(f"{key}: a null or nested item cannot travel in a tf.train.Example")
        if kinds <= {str, bytes, bytearray} and kinds:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[x.encode("utf-8") if isinstance(x, str) else bytes(x) for x in items]))
        elif kinds <= {int, bool} and kinds:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in items]))
        elif kinds <= {float, int} and kinds:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(np.float32(x)) for x in items]))
        elif not kinds:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List())
        else:
            raise ValueError(f"{key}: one Example feature holds one type; found {sorted(k.__name__ for k in kinds)}")
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def transform_examples(layer: Any, serialized: Any) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``layer.transform`` of serialized Examples: ``(features, errors)``, errors per row
    ``""`` or the first reason (a value the Example could not carry exactly, then the layer's)."""
    decoder = getattr(layer, "_example_decoder", None)
    if decoder is None:
        decoder = layer._example_decoder = ExampleDecoder(layer.config, layer.wire)
    inputs, decode_errors = decoder.decode(serialized)
    features, errors = layer.transform(inputs)
    return features, tf.where(tf.equal(decode_errors, ""), errors, decode_errors)
