"""What a serving request must be before the layer does any work on it: the
shape checks of the packed inputs and the size bounds of an export.

- **Shape** (``checked_inputs``, every call of the layer): each input of a
  request holds one row per record (a 1-row input beside 3-row ones would be
  broadcast to every row), a packed input has one column per source of the
  export, a list source's value and kind inputs share one width, and a list
  length is ``-1`` (null) or more. A request breaking one is not a record the
  converter could read: the call fails with ``InvalidArgumentError`` naming
  the input, before any transform runs.
- **Size** (``ServingLimits``, options of ``export_serving``): a request's
  inputs may hold at most ``max_request_bytes`` (the call fails, naming the
  size), and a record's strings (a serialized Example's bytes) at most
  ``max_record_bytes`` (that row alone is rejected in ``recordprep_error``
  and its strings emptied, so no transform works on them). Strings are what a
  client can make arbitrarily large, and the graph copies them several times.

docs/serving.md#request-checks-and-size-limits states both to clients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from readers._serving_wire import LENS, Wire

#: Default bound of one request's inputs: room for batches of thousands of records, while the
#: graph's copies of a batch's strings (text tokens take tens of bytes each) stay well under a GB.
DEFAULT_MAX_REQUEST_BYTES = 16 << 20
#: Default bound of one record's strings: far above a real record's fields, low enough that
#: one row cannot make the graph's string copies of a batch large.
DEFAULT_MAX_RECORD_BYTES = 1 << 20


@dataclasses.dataclass(frozen=True)
class ServingLimits:
    """The size bounds an export checks in-graph (see the module docstring)."""

    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES

    def __post_init__(self) -> None:
        for name in ("max_request_bytes", "max_record_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive number of bytes, got {v!r}")
        if self.max_record_bytes > self.max_request_bytes:
            raise ValueError(f"max_record_bytes ({self.max_record_bytes}) is over max_request_bytes "
                             f"({self.max_request_bytes}): one record is part of a request")

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def checked_inputs(wire: Wire, packed: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """``packed`` (the layer's inputs, ``{name: [batch, width]}``) once the request's
    shape is checked: the same tensors, run after the checks."""
    names = list(packed)
    checks: list[Any] = [tf.debugging.assert_rank(packed[n], 2, message=f"input `{n}` must be [records, values]")
                         for n in names]
    first = names[0]
    rows = tf.shape(packed[first])[0]
    for n in names[1:]:
        checks.append(tf.debugging.assert_equal(tf.shape(packed[n])[0], rows, message=(
            f"input `{n}` holds a different number of rows than input `{first}`: every input of a request holds "
            f"one row per record")))
    for n, cols in wire.columns.items():
        checks.append(tf.debugging.assert_equal(tf.shape(packed[n])[1], len(cols), message=(
            f"input `{n}` must have {len(cols)} columns, one per source in the order of `columns` in the "
            f"recordprep_config.json of this export")))
    for j, s in enumerate(wire.columns.get(LENS, ())):
        checks.append(tf.debugging.assert_greater_equal(packed[LENS][:, j], -1, message=(
            f"input `{LENS}` column {j} (source `{s.path}`) holds a length below -1; the length of a list is its "
            f"number of items, or -1 when it is null or absent")))
    for s in wire.sources:
        if not s.is_list:
            continue
        named = [s.input_name(form) for form in s.forms] + [s.kind_name]
        for n in named[1:]:
            checks.append(tf.debugging.assert_equal(tf.shape(packed[n])[1], tf.shape(packed[named[0]])[1], message=(
                f"input `{n}` is not as wide as input `{named[0]}`: the inputs of list source `{s.path}` hold "
                f"one column per item sent")))
    checks = [c for c in checks if c is not None]  # eager: raised already, or passed
    if not checks:
        return dict(packed)
    with tf.control_dependencies(checks):
        return {n: tf.identity(t) for n, t in packed.items()}


def bounded(inputs: Mapping[str, tf.Tensor], limits: ServingLimits,
            what: str) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``(inputs, errors)``: ``inputs`` (one row per record, shapes checked) with the strings
    of each record over ``limits.max_record_bytes`` emptied, and per row ``""`` or why it
    is rejected (``what`` names a row's strings in it). Fails with ``InvalidArgumentError``
    for a request over ``limits.max_request_bytes``, before any other work on it."""
    strings = {n: t for n, t in inputs.items() if t.dtype == tf.string}
    rows = tf.shape(next(iter(inputs.values())), out_type=tf.int64)[0]
    per_row = tf.zeros([rows], tf.int64)
    for t in strings.values():
        lengths = tf.cast(tf.strings.length(t), tf.int64)
        per_row += lengths if lengths.shape.rank == 1 else tf.reduce_sum(lengths, axis=1)
    total = tf.reduce_sum(per_row)
    for t in inputs.values():
        if t.dtype != tf.string:
            total += tf.size(t, out_type=tf.int64) * t.dtype.size
    ok = tf.debugging.Assert(total <= limits.max_request_bytes, [tf.strings.join([
        "the request holds ", tf.strings.as_string(total), f" bytes of inputs, over the max_request_bytes of this "
        f"export ({limits.max_request_bytes}): send fewer records per request, or export with a larger bound "
        f"(recordprep export --max-request-mb)"])])
    with tf.control_dependencies([ok] if ok is not None else []):
        over = per_row > limits.max_record_bytes
        any_over = tf.reduce_any(over)

    def emptied() -> dict[str, tf.Tensor]:
        return {n: tf.where(over if t.shape.rank == 1 else over[:, None], tf.constant(b"", tf.string), t)
                for n, t in strings.items()}

    # The strings are copied only for a request with an oversized row.
    kept = tf.cond(any_over, emptied, lambda: {n: tf.identity(t) for n, t in strings.items()}) if strings else {}
    errors = tf.cond(any_over, lambda: tf.where(over, tf.strings.join([
        f"{what} ", tf.strings.as_string(per_row), f" bytes, over this export's max_record_bytes "
        f"({limits.max_record_bytes}); the record is not transformed (recordprep export --max-record-mb)"]), ""),
        lambda: tf.fill([rows], ""))
    return {**inputs, **kept}, errors
