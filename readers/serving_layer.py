"""``TransformLayer``: the converter's transforms as a TensorFlow module, raw
record fields in (the request format of ``readers._serving_wire``), the
model's inputs out, bit for bit what the converter writes; records it cannot
transform are named with their reason. ``readers.serving`` exports it with a
model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from convert import spec as _spec
from convert.apply import OutputAnalysis, read_output_analysis
from convert.config import FeatureConfig
from convert.prepare import transform_constants
from readers import _io
from readers._serving_kinds import KIND_NAMES, KIND_NESTED, KIND_NULL
from readers._serving_limits import checked_inputs
from readers._serving_wire import (
    LENS,
    PACKED,
    Source,
    Wire,
    WireError,
    instances,
)
from readers.errors import SpecError
from readers.info import locate
from readers.serving_ops import (
    CUT_LIST,
    PackedColumns,
    Reasons,
    any_bad,
    bools,
    column_params,
    f64s,
    is_number,
    not_number,
    oov_default,
    pad_to,
    reason,
    shared_table,
    shared_vocabularies,
    slots,
    take_columns,
    unknown_kind,
    wrong_kind_reason,
)
from readers.transforms import Checks, serving_of

_F32_MAX = float(np.finfo(np.float32).max)
_TF_FORM = {"number": tf.float64, "term": tf.string, "raw": tf.string, "int": tf.int64}


_TF_PACKED = {PACKED[form]: dtype for form, dtype in _TF_FORM.items()} | {PACKED["kind"]: tf.int32, LENS: tf.int32}


SERVING_MIN_FORMAT_VERSION: int | None = getattr(_spec, "SERVING_MIN_FORMAT_VERSION", None)


def unsupported_reason(info_version: int, f: FeatureConfig) -> str | None:
    """Why feature ``f`` of an output of ``info_version`` cannot be served exactly, or None:
    its ids come from a hash the converter computes, which the layer computes only for
    outputs whose format defines that hash in-graph."""
    what = serving_of(f).hashed(f)
    if what is not None:
        if SERVING_MIN_FORMAT_VERSION is None or info_version < SERVING_MIN_FORMAT_VERSION:
            return (f"feature {f.name!r}: {what} uses a hash or tokenizer TensorFlow cannot reproduce in "
                    f"this output's format (version {info_version}); re-convert with this recordprep to "
                    f"export a serving model")
    return None


class TransformLayer(tf.Module):
    """The converter's mapping of one output, raw fields -> feature tensors.

    Build it with :func:`transform_layer`. ``layer.input_signature`` is the
    inputs it takes (``{name: tf.TensorSpec}``); ``layer.encode(records)``
    makes them from raw records.
    """

    def __init__(self, applied: OutputAnalysis, name: str = "recordprep_transform"):
        super().__init__(name=name)
        info, config = applied.info, applied.config
        if SERVING_MIN_FORMAT_VERSION is not None and info.format_version < SERVING_MIN_FORMAT_VERSION:
            raise SpecError(
                f"this output has format_version {info.format_version}: its hash and text ids were computed "
                f"in ways TensorFlow cannot reproduce (serving needs {SERVING_MIN_FORMAT_VERSION}); "
                f"re-convert with this recordprep to export a serving model")
        problems = [r for f in config.features if (r := unsupported_reason(info.format_version, f))]
        if problems:
            raise SpecError("; ".join(problems))
        self._applied = applied
        self.config = config
        self.wire = Wire(config)
        self.features = tuple(f for f in info.features if f.role != "label")
        self._stats = {k: transform_constants(v) for k, v in applied.analysis.stats.items()}  # as finish_numbers reads them
        self._tables: dict[str, tf.lookup.StaticHashTable] = {}
        shared = shared_vocabularies([f for f in config.features if serving_of(f).shares_table(f)],
                                     applied.analysis.vocabularies)
        for f in config.features:
            if f.needs_vocabulary and f.name not in shared:
                terms = applied.analysis.vocabularies[f.name]
                base = 1 + f.num_oov_buckets
                keys = tf.constant([t.encode("utf-8", "surrogatepass") for t in terms] or [b""], tf.string)
                ids = tf.constant(list(range(base, base + len(terms))) or [oov_default(f)], tf.int64)
                self._tables[f.name] = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(keys, ids), default_value=oov_default(f),
                    name=f"vocab_{len(self._tables)}")
        for f in config.features:
            own = serving_of(f).own_table(f, self._stats.get(f.name) or {})
            if own is not None:
                self._tables[f.name] = own
        self._shared = shared
        self._shared_table = None
        if shared:
            keys, ids = shared_table(config.features, shared, applied.analysis.vocabularies)
            self._shared_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(keys, tf.string), tf.range(len(keys), dtype=tf.int64)),
                default_value=len(keys), name="vocab_shared")
            self._shared_ids = tf.constant(ids.reshape(-1))
        # Tracked so a SavedModel keeps the tables.
        self._table_list = [*self._tables.values(), *([self._shared_table] if shared else [])]
        self._compiled: Any = None

    # -- the interface
    @property
    def input_signature(self) -> dict[str, tf.TensorSpec]:
        sig = {name: tf.TensorSpec([None, len(cols)], _TF_PACKED[name], name=name)
               for name, cols in self.wire.columns.items()}
        for s in self.wire.sources:
            if s.is_list:
                for form in s.forms:
                    sig[s.input_name(form)] = tf.TensorSpec([None, None], _TF_FORM[form], name=s.input_name(form))
                sig[s.kind_name] = tf.TensorSpec([None, None], tf.int32, name=s.kind_name)
        return sig

    def encode(self, records: Sequence[Any]) -> dict[str, np.ndarray]:
        """The layer's inputs for ``records`` (dicts as JSON/Avro decode them), as numpy arrays.

        Raises ValueError naming the record for the few values the wire format
        cannot carry (see ``readers._serving_wire.Wire.encode``).
        """
        inputs, rejected = self.wire.encode(records)
        if rejected:
            i, why = min(rejected.items())
            raise ValueError(f"record {i}: {why}")
        return inputs

    def instances(self, records: Sequence[Any]) -> list[dict[str, Any]]:
        """``records`` as TF Serving REST ``instances`` (JSON-ready) for an exported model."""
        return instances(self.encode(records))

    def transform(self, inputs: Mapping[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
        """``(features, errors)``: the feature tensors, and per row ``""`` or why
        the converter would reject the record (its features are then unspecified).

        Raises ``InvalidArgumentError`` naming the input for a request of the wrong
        shape (``readers._serving_limits.checked_inputs``): no record of it is read."""
        features, any_bad, reasons = self._features(inputs)
        # The reasons (string work) are built only for a batch with a rejected row.
        return features, tf.cond(any_bad, reasons, lambda: tf.fill(reasons.batch, ""))

    def __call__(self, inputs: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        """The feature tensors; raises ``InvalidArgumentError`` if any record would be rejected."""
        features, any_bad, reasons = self._features(inputs)

        def fail() -> tf.Tensor:
            errors = reasons()
            first = tf.boolean_mask(errors, tf.not_equal(errors, ""))[:1]
            with tf.control_dependencies([tf.debugging.Assert(False, [
                    "the converter would reject a record: ", first,
                    " (use TransformLayer.transform for per-row errors)"])]):
                return tf.constant(False)

        ok = tf.cond(any_bad, fail, lambda: tf.constant(True))
        if tf.executing_eagerly() or tf.inside_function():
            return features  # the Assert is stateful: a function call runs it before it returns
        with tf.control_dependencies([ok]):
            return {k: tf.identity(v) for k, v in features.items()}

    def _features(self, inputs: Mapping[str, Any]) -> tuple[dict[str, tf.Tensor], tf.Tensor, Reasons]:
        """The features, whether any row is rejected (one reduction over every
        check), and the per-row reasons to build when one is."""
        packed = {k: tf.convert_to_tensor(inputs[k], dtype=spec.dtype) for k, spec in self.input_signature.items()}
        packed = checked_inputs(self.wire, packed)  # a malformed request fails here, naming the input
        batch = tf.shape(next(iter(packed.values())), out_type=tf.int64)[:1]
        inputs = PackedColumns(self.wire, packed)
        out: dict[str, tf.Tensor] = {}
        tagged = self._invalid_kinds(packed, inputs)
        together = [(i, f) for i, f in enumerate(self.config.features) if serving_of(f).grouped_numeric(f)]
        if together:
            out.update(self._scalar_numerics(together, packed, tagged))
        together = [(i, f) for i, f in enumerate(self.config.features) if serving_of(f).grouped_ids(f)]
        if together:
            out.update(self._scalar_ids(together, packed, inputs, tagged))
        for i, f in enumerate(self.config.features):
            t = serving_of(f)
            if t.grouped_numeric(f) or t.grouped_ids(f):
                continue
            bad: Checks = []
            out.update(t.columns(self, f, inputs, bad))
            tagged += [(i, m, why) for m, why in bad]
        features = {f.name: out[f.name] for f in self.features}
        return features, any_bad(tagged), Reasons(batch, tagged)

    def _invalid_kinds(self, packed: Mapping[str, tf.Tensor], inputs: Mapping[str, tf.Tensor]) -> list:
        """Rows whose kind codes are none of ``KIND_NAMES`` (a request not written by
        ``encode``): rejected first (order -1), naming the source and the code."""
        tagged: list[tuple[Any, tf.Tensor, Any]] = []
        if PACKED["kind"] in packed:
            kinds, sources = packed[PACKED["kind"]], self.wire.columns[PACKED["kind"]]
            tagged.append(([-1] * len(sources), unknown_kind(kinds),
                           [wrong_kind_reason(s.path, kinds, "found ", column=j) for j, s in enumerate(sources)]))
        for s in self.wire.sources:
            if s.is_list:
                kinds = inputs[s.kind_name]
                sent = tf.range(tf.shape(kinds)[1])[None, :] < inputs[s.len_name][:, None]
                tagged.append((-1, tf.reduce_any(sent & unknown_kind(kinds), axis=1), reason(
                    s.path, f"a list item has an invalid kind code on the wire (expected 0..{len(KIND_NAMES) - 1}: "
                            f"{', '.join(KIND_NAMES)}); send it as encode writes it")))
        return tagged

    def transform_records(self, records: Sequence[Any]) -> tuple[dict[str, np.ndarray], list[str]]:
        """Features (numpy) and per-record errors (``""`` = converted) for raw records:
        batch scoring without building inputs by hand. Records the wire format
        cannot carry are reported like rejected ones."""
        inputs, rejected = self.wire.encode(records)
        if self._compiled is None:
            self._compiled = tf.function(self.transform, input_signature=[self.input_signature])
        features, errors = self._compiled(inputs)
        errs = [e.decode("utf-8", "replace") for e in errors.numpy().tolist()]
        for i, why in rejected.items():
            errs[i] = why
        return {k: v.numpy() for k, v in features.items()}, errs

    # -- what the transforms read (readers.transforms.Layer)
    def stats(self, name: str) -> Mapping[str, Any]:
        """Feature ``name``'s statistics as the converter's finish reads them (``{}`` for none)."""
        return self._stats.get(name) or {}

    def table(self, name: str) -> tf.lookup.StaticHashTable:
        """Feature ``name``'s own vocabulary table."""
        return self._tables[name]

    def ids(self, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        """Ids of terms (UTF-8 bytes), by ``f``'s transform (hash buckets, vocabulary ids)."""
        return serving_of(f).ids(self, f, terms)

    def document_frequencies(self, name: str) -> Mapping[str, Any]:
        """Feature ``name``'s documents and document frequencies, as the analysis has them."""
        return self._applied.analysis.document_frequencies[name]

    def numeric(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: Checks,
                values: Any = None) -> dict[str, tf.Tensor]:
        """A numeric feature's columns outside the grouped op (lists, ``bucketize``): the kind and
        NaN checks, then its transform's ``values`` (or ``values``, the same call's stand-in);
        ``_len`` and ``_missing`` where it writes them."""
        kind = inputs[s.kind_name]
        x = inputs[s.input_name("number")]
        n = f.max_len or 1
        if f.multi_valued:
            lens_in = tf.cast(inputs[s.len_name], tf.int64)
            missing_row = lens_in < 0
            x, kind = pad_to(x, n), pad_to(kind, n)  # kind padded with nulls
            lens = tf.clip_by_value(lens_in, 0, n)
            in_list = tf.range(n, dtype=tf.int64)[None, :] < lens[:, None]
            width_ok = tf.minimum(lens, tf.cast(tf.shape(inputs[s.kind_name])[1], tf.int64)) >= lens
            bad.append((~width_ok, reason(s.path, CUT_LIST)))
            bad.append((tf.reduce_any(in_list & not_number(kind), axis=1), reason(s.path, "a list item is not a number")))
            present = in_list & is_number(kind)
        else:
            missing_row = tf.equal(kind, KIND_NULL)
            bad.append((not_number(kind), wrong_kind_reason(s.path, kind, "expected a number, found ")))
            present = is_number(kind)
            x, present = x[:, None], present[:, None]
            lens = in_list = None
        if f.on_nan in ("error", "fill"):
            finite = (tf.abs(x) <= _F32_MAX) | ~present
        if f.on_nan == "error":
            bad.append((~tf.reduce_all(finite, axis=1), reason(
                s.path, f"value is NaN or infinite (or beyond float32's range, |x| > 3.4e38); set on_nan: fill "
                        f"or keep for feature {f.name!r} to accept it")))
        elif f.on_nan == "fill":
            present = present & finite
        cols = {f.name: (values or serving_of(f).values)(f, x, present, in_list, self.stats(f.name), bad)}
        if f.multi_valued:
            cols[f"{f.name}_len"] = lens[:, None]
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = tf.cast(missing_row, tf.int64)[:, None]
        return cols

    def _scalar_numerics(self, together: list[tuple[int, FeatureConfig]], packed: Mapping[str, tf.Tensor],
                         tagged: list) -> dict[str, tf.Tensor]:
        """The single-valued numeric features but ``bucketize``, as ``[batch, k]`` ops over
        the packed columns (one op per step, not per feature: a call's cost grows with
        its graph's nodes). Per element the same float64 operations as ``numeric``
        (each transform's ``step``, the same for a list), so the same bits."""
        orders = [i for i, _ in together]
        fs = [f for _, f in together]
        cols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["number"]])}
        kcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["kind"]])}
        x = take_columns(packed[PACKED["number"]], [cols[f.source] for f in fs])
        kind = take_columns(packed[PACKED["kind"]], [kcols[f.source] for f in fs])

        # Per column: flags, constants and reasons, as plain Python lists.
        stats = [self.stats(f.name) for f in fs]
        p = column_params(fs, stats)
        steps = [serving_of(f).step(f, st) for f, st in zip(fs, stats, strict=True)]
        missing_row = tf.equal(kind, KIND_NULL)
        tagged.append((orders, not_number(kind),
                       [wrong_kind_reason(f.source, kind, "expected a number, found ", column=j) for j, f in enumerate(fs)]))
        present = is_number(kind)
        if any(p["nan_error"]) or any(p["nan_fill"]):
            finite = (tf.abs(x) <= _F32_MAX) | ~present
        if any(p["nan_error"]):
            tagged.append((orders, ~finite & bools(p["nan_error"]), p["nan_reason"]))
        if any(p["nan_fill"]):
            present = present & (finite | ~bools(p["nan_fill"]))
        out = tf.where(present, x, f64s(p["fill"]))
        result: dict[str, tf.Tensor] = {}

        def emit(js: list[int], y: tf.Tensor, dtype: tf.DType = tf.float32, suffix: str = "") -> None:
            for j, col in zip(js, tf.split(tf.cast(y, dtype), len(js), axis=1), strict=True):
                result[fs[j].name + suffix] = col

        # Each step on its own columns (its transforms' parameters side by side), e.g. zscore's
        # and minmax's (x - a) / b together.
        groups = [step.name for step, _ in steps]
        for group in dict.fromkeys(groups):
            js = [j for j, g in enumerate(groups) if g == group]
            step = steps[js[0]][0]
            params = {k: [steps[j][1][k] for j in js] for k in steps[js[0]][1]}
            y, rejected = step.apply(take_columns(out, js), lambda js=js: take_columns(present, js), params)
            if rejected is not None:
                tagged.append(([orders[j] for j in js], rejected, params["reason"]))
            emit(js, y)
        indicated = [j for j, f in enumerate(fs) if f.missing_indicator]
        if indicated:
            emit(indicated, take_columns(missing_row, indicated), tf.int64, "_missing")
        return result

    def _scalar_ids(self, together: list[tuple[int, FeatureConfig]], packed: Mapping[str, tf.Tensor],
                    inputs: Mapping[str, tf.Tensor], tagged: list) -> dict[str, tf.Tensor]:
        """The single-valued ``vocabulary`` and ``hash`` features: an id per feature, then the
        null and nested checks as ``[batch, k]`` ops (``vocabulary``'s, once for all).
        The vocabularies of ``self._shared`` are looked up together, by one op."""
        together = ([(i, f) for i, f in together if f.name in self._shared]
                    + [(i, f) for i, f in together if f.name not in self._shared])
        orders = [i for i, _ in together]
        fs = [f for _, f in together]
        kcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["kind"]])}
        kind = take_columns(packed[PACKED["kind"]], [kcols[f.source] for f in fs])
        parts = []
        k = len(self._shared)
        if k:
            tcols = {s.path: j for j, s in enumerate(self.wire.columns[PACKED["term"]])}
            # The whole packed input is looked up (the other columns' rows unused): slicing
            # the strings out first would copy them.
            rows = take_columns(self._shared_table.lookup(packed[PACKED["term"]]), [tcols[f.source] for f in fs[:k]])
            parts.append(tf.gather(self._shared_ids, rows * k + tf.range(k, dtype=tf.int64)))
        if fs[k:]:
            parts.append(tf.stack([self.ids(f, inputs[self.wire.by_path(f.source).input_name("term")])
                                   for f in fs[k:]], axis=1))
        ids = parts[0] if len(parts) == 1 else tf.concat(parts, axis=1)
        nested = tf.equal(kind, KIND_NESTED)
        tagged.append((orders, nested, [reason(f.source, "expected a scalar value, found a record or list; set max_len "
                                                          "for lists or point 'source' at a leaf field") for f in fs]))
        ids = tf.where(tf.equal(kind, KIND_NULL) | nested, tf.zeros_like(ids), ids)
        return {f.name: col for f, col in zip(fs, tf.split(ids, len(fs), axis=1), strict=True)}

    def vocabulary(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        """An id feature's columns from its terms: one id (0 for null; a record or list rejects
        the row), or a list's first ``max_len`` non-null items' ids and its ``_len``."""
        kind = inputs[s.kind_name]
        terms = inputs[s.input_name("term")]
        if not f.multi_valued:
            ids = self.ids(f, terms)
            nested = tf.equal(kind, KIND_NESTED)
            bad.append((nested, reason(s.path, "expected a scalar value, found a record or list; set max_len for "
                                                "lists or point 'source' at a leaf field")))
            ids = tf.where(tf.equal(kind, KIND_NULL) | nested, tf.zeros_like(ids), ids)
            return {f.name: ids[:, None]}
        n = f.max_len
        lens_in = tf.cast(inputs[s.len_name], tf.int64)
        width = tf.shape(kind, out_type=tf.int64)[1]
        batch = tf.shape(kind, out_type=tf.int64)[0]
        sent = tf.range(width)[None, :] < lens_in[:, None]
        non_null = sent & tf.not_equal(kind, KIND_NULL)
        # The non-null items in row-major order and each one's rank in its row: its place in
        # that order less its row's start (a scan over the rows' counts, cheaper than one
        # along every list).
        at = tf.where(non_null)
        rows = at[:, 0]
        starts = tf.cumsum(tf.reduce_sum(tf.cast(non_null, tf.int64), axis=1), exclusive=True)
        rank = tf.range(tf.shape(at, out_type=tf.int64)[0]) - tf.gather(starts, rows)
        # A list sent cut short (``encode`` stops at its n-th non-null item) lacks items the
        # feature keeps when fewer than n non-null ones arrived: reported, as for numeric lists.
        cut = (lens_in > width) & (tf.reduce_sum(tf.cast(non_null, tf.int64), axis=1) < n)
        bad.append((cut, reason(s.path, CUT_LIST)))
        nested = tf.equal(tf.gather_nd(kind, at), KIND_NESTED) & (rank < n)
        bad.append((tf.math.unsorted_segment_max(tf.cast(nested, tf.int32), rows, batch) > 0, reason(
            s.path, "expected a list of scalar values, found nested records/lists; point 'source' at a leaf field")))
        # Looked up and summed into their row's slot, as a text's tokens are (``readers.transforms.text``): no ragged tensor to build and pad.
        dense = slots(self.ids(f, tf.gather_nd(terms, at)), rows, rank, n, batch)
        # An item's id is never 0 (num_oov_buckets >= 1), so the non-zero slots are the kept items.
        return {f.name: dense, f"{f.name}_len": tf.math.count_nonzero(dense, axis=1)[:, None]}


def transform_layer(output: str) -> TransformLayer:
    """The serving transform of a finished output (local, ``gs://``, ``hdfs://`` path).

    Reads ``dataset_info.json`` and the analysis once; the layer holds
    everything it needs. Raises SpecError for an output it cannot serve
    exactly (the message says which feature and what to do).
    """
    location = locate(output)
    applied = read_output_analysis(_io.read_bytes, location.root, location.metadata_path, _io.join)
    try:
        return TransformLayer(applied)
    except (WireError, SpecError) as e:
        raise SpecError(f"{location.root}: {e}") from None
