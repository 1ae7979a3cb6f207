"""What every transform is: the ``Transform`` base class, the numeric family's
shared finishing (``NumericTransform``) and the option groups transforms share.

A transform module subclasses one of these and sets what it is (summary,
options, traits the shared machinery asks about); the registry
(``convert.transforms.registry``) lists one instance per transform. Nothing
here imports the feature config (``convert.config_model`` imports this
package), so a transform reads a ``FeatureConfig`` only through its
attributes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from convert.columns import Columns, Numbers
from convert.derive import Scaled
from convert.spec import F64_TINY, FeatureSpec

if TYPE_CHECKING:  # pragma: no cover
    from convert.config_model import FeatureConfig
    from convert.quantiles import QuantileSketch
    from convert.value_sketch import ValueSketch

#: Options of the numeric transforms (fill, missing indicator, NaN policy).
NUM_OPTIONS = ("fill", "missing_indicator", "on_nan")
#: Options of the transforms that learn a vocabulary.
VOCAB_OPTIONS = ("top_k", "min_frequency", "num_oov_buckets")
#: Lists of ids (0 only for padding) may leave out ``<name>_len`` (``length: false``): the count of
#: non-zero ids is the length.
ID_LIST_OPTIONS = ("max_len", "length")
#: Numeric lists pad with 0.0, also a value: they may only share the ``<name>_len`` of another
#: numeric list of the same list (``length_of``).
NUM_LIST_OPTIONS = ("max_len", "length_of")
#: What a path read by a transform may hold when no module says otherwise (``convert.check``).
SINGLE_VALUES = (frozenset({"number", "boolean", "string", "bytes"}), "single values (numbers, strings, booleans)")
#: Why a numeric list cannot leave out its own length (``length: false``).
NUMERIC_LENGTH_WHY = ("a numeric list pads with 0.0, which is also a value, so its length cannot be read from it; "
                      "share the <name>_len of another numeric list of the same list with length_of, or keep its own")
#: Why a list of ids takes no ``length_of``.
ID_LENGTH_OF_WHY = ("a list of ids drops null items, so its length is its own; leave it out with length: false "
                    "(the count of its non-zero ids is its length)")
#: ``complete``'s callback: adds one problem of the feature being checked.
Need = Callable[[str], None]

_F32_TINY = np.float32(np.finfo(np.float32).tiny)


class Transform:
    """One transform: what it is, and the parts of converting that differ by transform.

    The shared machinery (``convert.prepare``, ``convert.analysis``,
    ``convert.stats``, ``convert.vectorize``, ``convert.config_checks``,
    ``convert.check``) keeps its batch-wise structure and asks a feature's
    transform object (``convert.transforms.transform_of``) these attributes
    and methods once per feature and batch, never per record.
    """

    #: The name a config's ``transform:`` gives.
    name: ClassVar[str]
    #: One line, for messages and ``recordprep infer``'s header.
    summary: ClassVar[str]
    #: The options it takes besides ``convert.config_model.COMMON_OPTIONS``.
    options: ClassVar[tuple[str, ...]] = ()
    #: The module of its TensorFlow twin (``readers.transforms.<module>``); convert never imports it.
    serving: ClassVar[str]
    #: A float32 number (or list of them): ``fill``, ``on_nan``, ``missing_indicator``.
    numeric: ClassVar[bool] = False
    #: Its ids come from a vocabulary the analysis learns.
    vocabulary: ClassVar[bool] = False
    #: Text: a string per record, tokenized (each token a term).
    tokens: ClassVar[bool] = False
    #: Ids ``1..buckets`` by a stable hash (``vocab_size = buckets + 1``); 0 exactly where missing.
    hashed: ClassVar[bool] = False
    #: Takes a list per record (a path through ``[]``/``[keys]``) with ``max_len``.
    list_capable: ClassVar[bool] = False
    #: Reads ``sources`` (several fields) instead of ``source``.
    reads_sources: ClassVar[bool] = False
    #: Counts the items of the list its path names (``items`` reads as ``items[]``).
    counts_items: ClassVar[bool] = False
    #: Needs the training split's mean/std/min/max (or quantiles) whatever its ``fill``.
    learns_scaling: ClassVar[bool] = False
    #: Its statistics keep a quantile sketch (bucket boundaries, a median).
    quantiles: ClassVar[bool] = False
    #: The statistics ``sketch_stats`` adds, which a reused analysis must hold (``convert.analysis``).
    sketch_keys: ClassVar[tuple[str, ...]] = ()
    #: An int64 base value written as a float scaled by the training split (``convert.derive.scaled_column``).
    scaled: ClassVar[Scaled | None] = None
    #: Reads epoch numbers in a ``unit`` (``convert.check.unit_problems`` samples them).
    epoch_unit: ClassVar[bool] = False
    #: Numbers at or below it are rejected (``on_nan`` aside); None: any number.
    domain_above: ClassVar[float | None] = None
    #: How ``convert.stats`` summarizes it: numeric, categorical, timestamp, hash, bytes or other.
    stats_kind: ClassVar[str] = "other"
    #: The ``convert.prepare.Preparer`` stage that prepares it (a key of ``convert.prepare.STAGES``).
    prepared_as: ClassVar[str]
    #: The kinds of input (``convert.check``) a path it reads may hold, and how to say so.
    accepts: ClassVar[tuple[frozenset[str], str]] = SINGLE_VALUES
    #: The ``FeatureSpec.encoding`` of its feature; None: the one its dtype and params imply
    #: (``convert.spec.derived_encoding``: ids with a ``vocab_size`` are ``embedding``/``tokens``).
    encoding: ClassVar[str | None] = None
    #: Why it does not take an option, where more can be said than which transforms do.
    not_taken_why: ClassVar[Mapping[str, str]] = {}
    #: Its analysis counts, beside each term's occurrences, the training documents (records)
    #: holding it, and the documents (``convert.analysis.Analysis.document_frequencies``).
    document_frequencies: ClassVar[bool] = False
    #: The options that shape its vocabulary or statistics, besides source and transform: a
    #: reused analysis (``--analysis-from``) must have been computed with the same.
    analysis_options: ClassVar[tuple[str, ...]] = ()

    def check_options(self, kw: dict[str, Any], need: Need) -> None:
        """Check (and normalize) the values in ``kw`` of options only this transform has; ``need``
        each problem. The shared options' values are ``convert.config_checks``' to check."""
    #: The calendar ``parts`` it takes, when it takes ``parts`` (``convert.config_checks``).
    part_choices: ClassVar[tuple[str, ...]] = ("hour", "day_of_week", "month")
    #: Its statistics keep per-key moments of the key its ``key`` option names (``convert.analysis``).
    per_key: ClassVar[bool] = False
    #: Its vocabulary is ranked by mutual information with the label (``convert.analysis``).
    label_ranked: ClassVar[bool] = False

    def outputs(self, f: FeatureConfig) -> list[str]:
        """The columns ``f`` writes itself, in order (its ``_len``/``_missing`` columns are the caller's)."""
        return [f.name, *(f"{f.name}_{p}" for p in f.parts or ())]

    def finish_values(self, f: FeatureConfig, values: list[Any]) -> tuple[Columns, np.ndarray, dict[int, str]]:
        """A feature of the ``own`` stage (no analysis): ``(columns, rows holding a value,
        {row: why it is rejected})`` of a batch's values."""
        raise NotImplementedError(f"transform {self.name!r} is not finished by its own stage")

    def config_problems(self, f: FeatureConfig, label: Any) -> list[str]:
        """Why ``f`` cannot work with the rest of the config (the ``label``: a ``LabelConfig`` or None)."""
        return []

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        """Fill this transform's defaults into the options ``kw``; ``need`` each required one missing."""

    def needs_stats(self, f: FeatureConfig) -> bool:
        """Whether ``f`` needs training statistics (its scaling, or ``fill: mean``)."""
        return False

    def sketch_stats(self, f: FeatureConfig, sketch: QuantileSketch) -> dict[str, Any]:
        """What ``f`` keeps of its training split's quantile sketch (``quantiles``), keyed by
        ``sketch_keys``; ``convert.analysis`` adds it to the feature's statistics."""
        return {}

    def takes_term_codes(self, f: FeatureConfig) -> bool:
        """Whether ``f``'s column may come as term codes (``ColumnRecords.term_codes``) instead of values."""
        return False

    def spec_params(self, f: FeatureConfig, params: dict[str, Any]) -> None:
        """Add what this transform records in its spec's params (ids, sizes) to ``params``."""

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        """The feature spec(s) of ``f`` itself (its ``_len``/``_missing`` columns are the caller's)."""
        n = f.max_len or 1
        return [FeatureSpec(f.name, "int64", (n,), 0, f.source, self.name, params, encoding=self.encoding)]

    def after_from_before(self, f: FeatureConfig, before: ValueSketch, stats: Mapping[str, Any]) -> ValueSketch:
        """The sketch of the written values from the sketch of the input values (``convert.stats``)."""
        return before.mapped(lambda v: v)

    def before_from_after(self, after: ValueSketch) -> ValueSketch | None:
        """The sketch of the input values from the written ones, when it follows from them; else None."""
        return None


class NumericTransform(Transform):
    """A float32 number per record (or a list with ``max_len``), filled, scaled and cast by
    ``finish_numbers``; a module sets its scaling (``scale``)."""

    numeric = True
    stats_kind = "numeric"
    prepared_as = "numbers"
    accepts = (frozenset({"number", "boolean"}), "numbers")
    #: ``fill``'s default.
    fill_default: ClassVar[float | str] = 0.0
    #: The statistics ``fill`` may name (a missing value is the training split's): ``median``
    #: only where the statistics keep a quantile sketch (``quantiles``).
    fill_names: ClassVar[tuple[str, ...]] = ("mean",)
    #: How the normalized config (``convert.config_model.Config.to_json``: the metadata's config,
    #: the config hash) spells a named ``fill`` where the name is not its spelling:
    #: ``{name: spelling}``, read back only from the normalized form (``convert.config_checks``).
    fill_spelling: ClassVar[Mapping[str, str]] = {}

    def complete(self, kw: dict[str, Any], need: Need) -> None:
        kw.setdefault("fill", self.fill_default)

    def needs_stats(self, f: FeatureConfig) -> bool:
        return self.learns_scaling or f.fill == "mean"

    def fill_of(self, f: FeatureConfig, stats: Mapping[str, Any]) -> float:
        """What a missing value of ``f`` becomes before the scaling: its ``fill``, the training
        mean for ``"mean"``; 0.0 where the statistics have none (an empty training split).
        The serving layer takes its fill from here (``readers.serving_ops.fill_value``)."""
        fill = stats.get("mean") if f.fill == "mean" else f.fill
        return 0.0 if fill is None else float(fill)

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        """The filled float64 values ``x`` as written (``present``: rows with a value; None for a sketch's points)."""
        return x

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        return [FeatureSpec(f.name, "float32", (f.max_len or 1,), 0.0, f.source, self.name, params,
                            encoding=self.encoding)]

    def after_from_before(self, f: FeatureConfig, before: ValueSketch, stats: Mapping[str, Any]) -> ValueSketch:
        return before.mapped(lambda v: self.scale(v, f, stats, None))

    def finish_numbers(self, f: FeatureConfig, prepared: Numbers, stats: Mapping[str, Any]) -> Columns:
        """Fill, scale and cast a prepared numeric feature (``stats``: its training statistics
        as ``convert.prepare.transform_constants`` gives them)."""
        out, present, lens, missing_row = prepared.values, prepared.present, prepared.lens, prepared.missing_row
        b, n = out.shape
        out = flush_subnormal_inputs(out)
        fill = self.fill_of(f, stats)
        if f.multi_valued:
            out = np.where(present, out, np.where(np.arange(n)[None, :] < lens[:, None], fill, 0.0))
        else:
            out = np.where(present, out, fill)
        x = self.scale(out, f, stats, present)
        if f.multi_valued:
            x = np.where(np.arange(n)[None, :] < lens[:, None], x, 0.0)
        # Beyond float32's range becomes +-inf, as documented: on_nan: keep writes it; rejected rows are dropped.
        with np.errstate(over="ignore"):
            x32 = x.astype(np.float32)
        # Subnormals become zero of their sign, as TensorFlow's CPU kernels compute them (its
        # threads run with flush-to-zero): the serving layer gets zero there, and so does a model.
        tiny = np.abs(x32) < _F32_TINY
        if tiny.any():
            x32[tiny] *= 0
        cols: dict[str, tuple[str, Any]] = {f.name: ("float32", x32)}
        if f.multi_valued:
            cols[f"{f.name}_len"] = ("int64", lens.reshape(b, 1))
        if f.missing_indicator:
            cols[f"{f.name}_missing"] = ("int64", missing_row.astype(np.int64).reshape(b, 1))
        return cols


class NumericListTransform(NumericTransform):
    """A numeric transform applied per element, so it also takes a list per record (``max_len``)."""

    options = (*NUM_OPTIONS, *NUM_LIST_OPTIONS)
    list_capable = True
    not_taken_why = {"length": NUMERIC_LENGTH_WHY}


class StandardizingTransform(NumericTransform):
    """A numeric transform scaled by the training split's statistics (one number per record;
    a missing value is the training mean unless ``fill`` says otherwise)."""

    options = NUM_OPTIONS
    learns_scaling = True
    fill_default = "mean"
    encoding = "scaled"
    not_taken_why = {"max_len": "numeric lists support identity, clip and log1p (per element)"}

    def span(self, stats: Mapping[str, Any]) -> tuple[float, float] | None:
        """``(center, width)``: a value is written as ``(x - center) / width``; None: every value is 0."""
        raise NotImplementedError

    def scale(self, x: np.ndarray, f: FeatureConfig, stats: Mapping[str, Any], present: np.ndarray | None) -> np.ndarray:
        span = self.span(stats)
        return np.zeros_like(x) if span is None else (x - span[0]) / span[1]


class HashedTransform(Transform):
    """Ids ``1..buckets`` by a stable hash (``convert.records.hash_id``), 0 exactly where missing."""

    hashed = True
    stats_kind = "hash"

    def spec_params(self, f: FeatureConfig, params: dict[str, Any]) -> None:
        params["vocab_size"] = f.buckets + 1  # type: ignore[operator]
        params["pad_id"] = 0


class ScaledTransform(Transform):
    """An int64 base value per record (epoch seconds, a count of items), written as a float
    scaled by the training split's mean and standard deviation (``scaled``)."""

    encoding = "scaled"

    def specs(self, f: FeatureConfig, params: dict[str, Any]) -> list[FeatureSpec]:
        specs = [FeatureSpec(f.name, "float32", (1,), 0.0, f.source, self.name, params, encoding=self.encoding)]
        for part in f.parts or ():
            size = {"hour": 24, "day_of_week": 7, "month": 13}[part]
            specs.append(FeatureSpec(f"{f.name}_{part}", "int64", (1,), 0, f.source, f"{self.name}_{part}",
                                     {"of": f.name, "vocab_size": size}, role="aux"))
        return specs


def flush_subnormal_inputs(out: np.ndarray) -> np.ndarray:
    """Inputs below the smallest normal double as zero of their sign, as TensorFlow's kernels
    read them (``convert.spec.daz``): a bucket boundary at 0.0 then puts -5e-324 where the serving layer does."""
    with np.errstate(invalid="ignore"):
        sub = (np.abs(out) < F64_TINY) & (out != 0)
    return np.where(sub, np.copysign(0.0, out), out) if sub.any() else out
