"""The serving side of a transform: what ``readers.serving_layer.TransformLayer``
needs to apply it in TensorFlow, bit for bit as the converter does.

A transform's module (``readers.transforms.<name>``, the twin of the
converter's ``convert.transforms.<name>``) subclasses ``ServingTransform``
and states what travels on the wire for it (``forms``, ``paths``, ``is_list``,
``wire_path``, ``list_use``), what the ``serve_examples`` decoder reads
(``reads_terms``, ``term_paths``), a lookup table of its own (``own_table``),
whether it needs a hash an old output cannot give (``hashed``), and how its raw inputs become the model's inputs (``columns``,
``ids``, ``step``). The shared machinery stays in the layer and
``readers.serving_ops`` and stays vectorized: single-valued numeric features
run as one ``[batch, k]`` op per ``NumericStep`` (each module gives its step
and its per-column parameters), single-valued vocabulary and hash features
as one lookup, and the reasons of rejected rows are gathered in one place.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import tensorflow as tf

from convert.config import FeatureConfig
from readers.serving_ops import f64, f64s, fill_value

if TYPE_CHECKING:  # pragma: no cover
    from readers._serving_wire import Source, Wire

#: A feature's checks: ``(mask, reason)`` pairs, a ``[batch]`` mask of the rows
#: rejected and why (a string, or a callable building per-row strings).
Checks = list[tuple[tf.Tensor, Any]]


class Layer(Protocol):
    """What a transform reads of the layer serving it."""

    wire: Wire

    def stats(self, name: str) -> Mapping[str, Any]:
        """Feature ``name``'s statistics as the converter's finish reads them (``{}`` for none)."""

    def table(self, name: str) -> tf.lookup.StaticHashTable:
        """Feature ``name``'s vocabulary table (its OOV default where it lacks a term)."""

    def ids(self, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        """The ids of ``terms`` (UTF-8) for feature ``f`` (its transform's ``ids``)."""

    def document_frequencies(self, name: str) -> Mapping[str, Any]:
        """Feature ``name``'s training documents and its terms' document frequencies
        (``convert.analysis.Analysis.document_frequencies``)."""

    def numeric(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor], bad: Checks,
                values: Any = None) -> dict[str, tf.Tensor]:
        """A numeric feature's columns outside the grouped op (lists, ``bucketize``); ``values``:
        a stand-in for its transform's ``NumericTransform.values``, with the same arguments."""

    def vocabulary(self, f: FeatureConfig, s: Source, inputs: Mapping[str, tf.Tensor],
                   bad: Checks) -> dict[str, tf.Tensor]:
        """An id feature's columns (one id, or a list of ids and its length) from its terms."""


#: ``apply(x, present, params)`` of a ``NumericStep``.
StepFunction = Callable[[tf.Tensor, Callable[[], tf.Tensor], Mapping[str, list[Any]]], tuple[tf.Tensor, Any]]


@dataclasses.dataclass(frozen=True)
class NumericStep:
    """One computation of the grouped numeric op, run once over the columns of every feature taking it.

    ``apply(x, present, params)``: ``x`` the ``[batch, k]`` float64 values (missing ones
    filled), ``present()`` builds the mask of the values the record held, ``params`` holds
    each parameter's per-column values. It returns the values and, where the step
    rejects some, their ``[batch, k]`` mask (the reasons are ``params["reason"]``), else
    None. The float64 operations are the converter's, in its order, so the bits are.
    """

    name: str
    apply: StepFunction


def _identity(x: tf.Tensor, present: Callable[[], tf.Tensor], params: Mapping[str, list[Any]]) -> tuple[tf.Tensor, None]:
    return x, None


def _linear(x: tf.Tensor, present: Callable[[], tf.Tensor], params: Mapping[str, list[Any]]) -> tuple[tf.Tensor, None]:
    return (x - f64s(params["a"])) / f64s(params["b"]), None


def _zero(x: tf.Tensor, present: Callable[[], tf.Tensor], params: Mapping[str, list[Any]]) -> tuple[tf.Tensor, None]:
    return tf.zeros_like(x), None


#: The value as it is.
IDENTITY = NumericStep("identity", _identity)
#: ``(x - a) / b`` (zscore, and minmax over a range).
LINEAR = NumericStep("linear", _linear)
#: 0.0 (minmax over an empty range).
ZERO = NumericStep("zero", _zero)


class ServingTransform:
    """A transform as the serving layer applies it; the defaults are a categorical
    single value read as its term. One instance per transform, in the registry of
    ``readers.transforms``."""

    #: The transform's name, as configs write it (``FeatureConfig.transform``).
    name: ClassVar[str] = ""
    #: Whether the feature reads its sources' canonical terms (``convert.records.term``),
    #: which the ``serve_examples`` decoder then checks it can give exactly.
    reads_terms: ClassVar[bool] = False

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        """The value forms of ``readers._serving_wire.FORMS`` the feature reads."""
        return ("term",)

    def paths(self, f: FeatureConfig) -> tuple[str, ...]:
        """The source paths the feature reads (each gets the feature's ``forms``)."""
        return f.sources or (f.source,)

    def term_paths(self, f: FeatureConfig) -> tuple[str, ...]:
        """The paths whose canonical terms the feature reads (``reads_terms``: all of them)."""
        return self.paths(f) if self.reads_terms else ()

    def own_table(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tf.lookup.StaticHashTable | None:
        """A lookup table the feature needs besides a vocabulary's, made with the layer
        (``Layer.table`` gives it back); None: none."""
        return None

    def wire_path(self, path: str) -> str:
        """The source the wire carries for a ``source`` path of the feature."""
        return path

    def is_list(self, f: FeatureConfig) -> bool:
        """Whether the feature's source travels as a list (inputs of its own)."""
        return f.multi_valued

    def list_use(self, f: FeatureConfig) -> tuple[str, int]:
        """The items of a list source the feature looks at (``readers._serving_wire.Source.uses``)."""
        return ("non_null", f.max_len or 1)

    def hashed(self, f: FeatureConfig) -> str | None:
        """What of the feature needs a hash outputs of old formats computed otherwise, or None."""
        return None

    def grouped_numeric(self, f: FeatureConfig) -> bool:
        """Whether the feature runs in the grouped numeric op (its ``step``)."""
        return False

    def grouped_ids(self, f: FeatureConfig) -> bool:
        """Whether the feature's single id is computed with the others' (``TransformLayer``'s scalar ids)."""
        return False

    def shares_table(self, f: FeatureConfig) -> bool:
        """Whether the feature's ids come from the one table of every such feature's terms."""
        return False

    def ids(self, layer: Layer, f: FeatureConfig, terms: tf.Tensor) -> tf.Tensor:
        """The ids of ``terms`` (UTF-8); only transforms that map terms to ids have them."""
        raise TypeError(f"transform {self.name!r} maps no terms to ids")

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        """The feature's output columns, its rejected rows appended to ``bad`` (features of the
        grouped ops are computed there instead)."""
        return layer.vocabulary(f, layer.wire.by_path(f.source), inputs, bad)


class NumericTransform(ServingTransform):
    """A numeric transform: the value as a float64 (``number``), a list's first ``max_len``
    items. Single values run in the grouped op with the ``step`` of ``step``."""

    #: Whether a list's slots past its items are zeroed after the step (identity's are 0.0 already).
    zero_past_list: ClassVar[bool] = True

    def forms(self, f: FeatureConfig) -> tuple[str, ...]:
        return ("number",)

    def list_use(self, f: FeatureConfig) -> tuple[str, int]:
        return ("items", f.max_len or 1)

    def grouped_numeric(self, f: FeatureConfig) -> bool:
        return not f.multi_valued

    def step(self, f: FeatureConfig, stats: Mapping[str, Any]) -> tuple[NumericStep, dict[str, Any]]:
        """The feature's step and its parameters (one value each) from its statistics."""
        return IDENTITY, {}

    def columns(self, layer: Layer, f: FeatureConfig, inputs: Mapping[str, tf.Tensor], bad: Checks) -> dict[str, tf.Tensor]:
        return layer.numeric(f, layer.wire.by_path(f.source), inputs, bad)

    def values(self, f: FeatureConfig, x: tf.Tensor, present: tf.Tensor, in_list: tf.Tensor | None,
               stats: Mapping[str, Any], bad: Checks) -> tf.Tensor:
        """``[batch, n]`` outputs of ``x`` outside the grouped op: a missing value takes the fill
        (a list's slots past its items 0.0), then the step, as float32."""
        fill = fill_value(f, stats)
        if f.multi_valued:  # a null item in the list takes the fill, a slot past it 0.0
            # Operands of x's shape: a select that broadcasts scalars costs several times more.
            pad = tf.zeros_like(x)
            if fill != 0.0 or np.signbit(fill):
                pad = tf.where(in_list, tf.broadcast_to(f64(fill), tf.shape(x)), pad)
            out = tf.where(present, x, pad)
        else:
            out = tf.where(present, x, tf.broadcast_to(f64(fill), tf.shape(x)))
        step, params = self.step(f, stats)
        y, rejected = step.apply(out, lambda: present, {k: [v] for k, v in params.items()})
        if rejected is not None:
            bad.append((tf.reduce_any(rejected, axis=1), params["reason"]))
        if f.multi_valued and self.zero_past_list:
            y = tf.where(in_list, y, tf.zeros_like(y))
        return tf.cast(y, tf.float32)


class IdTransform(ServingTransform):
    """A categorical transform whose single value's id is computed with the others'."""

    reads_terms = True

    def grouped_ids(self, f: FeatureConfig) -> bool:
        return not f.multi_valued
