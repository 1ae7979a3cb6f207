"""Vectorizing: records in, fixed-shape numpy columns out.

Two passes over the training data, like tf.Transform:

1. ``convert.analysis.Analyzer`` accumulates what transforms need (vocabulary counts,
   count/mean/M2/min/max) over the *training split only*; accumulators merge,
   so the pipeline runs them as a Beam combiner. ``Analyzer.result()`` gives
   an ``Analysis`` (JSON-serializable; ``--analysis-from`` reuses one).
2. ``Vectorizer`` maps a batch of records to numpy columns with the analysis
   fixed (``convert.prepare.Preparer`` does the half that needs no analysis),
   and reports every record it rejects with the field and reason.

Id layout for vocabulary and hash features (recorded in the feature spec):
``0`` = missing/padding, ``1..num_oov_buckets`` = out-of-vocabulary buckets,
then vocabulary terms by descending frequency (ties by term). ``hash``
features use ``0`` = missing and ``1..buckets`` for values. So null, ``""``,
``0`` and ``False`` never share an id.

Hashed ids (``hash``, ``cross``, OOV buckets) and text tokens are those of
``convert.records`` (``hash_id``, ``tokenize``), which a serving graph computes
identically.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from convert.analysis import Analysis, has_stats, vocabulary_label
from convert.columns import (
    Columns,
    Finished,
    LabelTerms,
    Numbers,
    TermBags,
    TermIndexes,
    bag_ids_column,
)
from convert.config import COMMON_OPTIONS, Config, FeatureConfig, LabelConfig
from convert.config_model import spelled_fill
from convert.derive import scaled_column
from convert.prepare import PreparedBatch, Preparer, Rejection, finish_numbers, transform_constants
from convert.records import hash_id
from convert.spec import FeatureSpec, short_repr
from convert.transforms import transform_of


@dataclasses.dataclass
class VectorBatch:
    """Fixed-shape columns for the records that converted (``keep`` mask)."""

    columns: dict[str, tuple[str, Any]]
    keep: np.ndarray
    rejections: list[Rejection]
    #: Lengths computed but not written (``length: false``, ``length_of``), for the statistics.
    unwritten: dict[str, tuple[str, Any]] = dataclasses.field(default_factory=dict)


def unseen_label_class(lab: LabelConfig, name: str) -> str:
    """The rejection reason of a record whose label class the training split never had."""
    return (f"label class {short_repr(name, 60)} does not occur in the training split, so it has no class id; "
            f"a model cannot predict it: drop such records or put examples of it in the training data")


class Vectorizer:
    """Maps record batches to columns with a fixed ``Analysis``."""

    def __init__(self, config: Config, analysis: Analysis):
        self.config = config
        self.analysis = analysis
        self.preparer = Preparer(config)
        self._by_name = {f.name: f for f in config.features}
        self._vocab_ids: dict[str, dict[str, int]] = {}
        for f in config.features:
            if f.needs_vocabulary:
                terms = analysis.vocabularies.get(f.name)
                if terms is None:
                    raise ValueError(f"feature {f.name!r}: the analysis has no vocabulary for it (was it computed with another config?)")
                base = 1 + f.num_oov_buckets
                self._vocab_ids[f.name] = {t: base + i for i, t in enumerate(terms)}
        self._tables: dict[str, np.ndarray] = {}
        #: What ``Transform.finish_bag`` reads of the analysis, per feature of the ``bags`` stage.
        self._bags = {f.name: transform_of(f).bag_constants(f, analysis)  # type: ignore[attr-defined]
                      for f in config.features if transform_of(f).prepared_as == "bags"}
        #: ``<name>_len`` columns computed (by each list's own code) but not written, and the
        #: ids of a bag's first terms (``TermBags.ids_column``), for the statistics.
        self._unwritten = [f"{f.name}_len" for f in config.features if f.multi_valued and not f.writes_length]
        self._unwritten += [bag_ids_column(name) for name in self._bags]
        self._shared = [(f.name, f.length_of) for f in config.features if f.multi_valued and f.length_of]
        #: Each numeric feature's statistics as its transform reads them (``finish_numbers``).
        self._constants = {name: transform_constants(st) for name, st in analysis.stats.items()}
        #: A vocabulary label's class ids (``0..K-1``).
        self.label_ids: dict[str, int] | None = None
        lab = vocabulary_label(config)
        if lab is not None:
            classes = analysis.vocabularies.get(lab.name)
            if classes is None:
                raise ValueError(f"label {lab.name!r}: the analysis has no classes for it (was it computed with another config?)")
            self.label_ids = {t: i for i, t in enumerate(classes)}

    # -- the feature spec this vectorizer produces
    def feature_specs(self) -> list[FeatureSpec]:
        """Each feature's spec(s) (``Transform.specs``, with its analysis in the params), then the label's."""
        specs = []
        for f in self.config.features:
            t = transform_of(f)
            # only the options this transform takes, not every FeatureConfig field
            taken = (*t.options, *COMMON_OPTIONS)
            params: dict[str, Any] = {k: v for k, v in dataclasses.asdict(f).items()
                                      if k in taken and k not in ("name", "source", "transform") and v is not None}
            if "fill" in params:  # as the normalized config spells it, so a spec reads as its outputs' did
                params["fill"] = spelled_fill(f)
            if has_stats(f):
                params["stats"] = self.analysis.stats.get(f.name)
            if f.needs_vocabulary:
                params["vocab_size"] = len(self._vocab_ids[f.name]) + 1 + f.num_oov_buckets
                params["vocabulary_file"] = f"vocab/{f.name}.txt"
                params["pad_id"] = 0
                params["oov_ids"] = list(range(1, 1 + f.num_oov_buckets))
            t.spec_params(f, params)
            if not f.parts:
                params.pop("parts", None)
            if params.get("length") is True:  # the default: written only when off
                del params["length"]
            specs.extend(t.specs(f, params))
            if f.writes_length:
                lparams: dict[str, Any] = {"of": f.name, "max_len": f.max_len}
                shared = [g.name for g in self.config.features if g.length_of == f.name]
                if shared:
                    lparams["shared_by"] = shared
                specs.append(FeatureSpec(f"{f.name}_len", "int64", (1,), 0, f.source, "length", lparams, role="aux"))
            if f.missing_indicator:
                specs.append(FeatureSpec(f"{f.name}_missing", "int64", (1,), 0, f.source, "missing_indicator",
                                         {"of": f.name}, role="aux"))
        if self.config.label:
            lab = self.config.label
            lparams: dict[str, Any] = {}
            if self.label_ids is not None:
                lparams = {"classes": list(self.label_ids), "vocab_size": len(self.label_ids),
                           "vocabulary_file": f"vocab/{lab.name}.txt"}
            specs.append(FeatureSpec(lab.name, lab.dtype, (1,), 0 if lab.dtype == "int64" else 0.0,
                                     lab.source, "label", lparams, role="label"))
        return specs

    # -- applying the analysis
    def prepare(self, records: Sequence[Any], analyze: bool = False) -> PreparedBatch:
        """``Preparer.prepare``: the part of ``vectorize`` that needs no analysis."""
        return self.preparer.prepare(records, analyze)

    def finish(self, batch: PreparedBatch) -> VectorBatch:
        """Columns for a prepared batch; rejected rows are masked out of every column.

        Rejections are ``batch.bad`` and, with a vocabulary label, the rows whose
        class the training split never had (``unseen_label_rows``)."""
        cols: dict[str, tuple[str, Any]] = {}
        bad = batch.bad
        for part in batch.parts:
            match part:
                case Finished():
                    cols.update(part.columns)
                    f = self._by_name.get(part.name)
                    scaled = transform_of(f).scaled if f is not None else None
                    if scaled is not None:
                        assert f is not None
                        cols[f.name] = ("float32", scaled_column(scaled, part.columns[f.name][1], part.present,
                                                                 self._constants.get(f.name) or {}))
                case Numbers():
                    cols.update(finish_numbers(self._by_name[part.name], part, self._constants.get(part.name) or {}))
                case LabelTerms():
                    unseen = self.unseen_label_rows(batch)
                    if unseen:
                        bad = {**unseen, **bad}
                    assert self.label_ids is not None
                    ids = self.label_ids
                    cols[part.name] = ("int64", np.array([ids.get(t, 0) for t in part.terms], dtype=np.int64).reshape(-1, 1))
                case TermBags():
                    cols.update(self._bag_finish(self._by_name[part.name], part))
                case TermIndexes():
                    cols.update(self._vocab_finish(self._by_name[part.name], part))
        unwritten = {k: cols.pop(k) for k in self._unwritten}
        keep = np.ones(batch.rows, dtype=bool)
        if bad:
            keep[list(bad)] = False
            idx = np.nonzero(keep)[0]
            cols = {k: (kind, [v[i] for i in idx.tolist()] if kind == "string" else v[idx]) for k, (kind, v) in cols.items()}
            unwritten = {k: (kind, v[idx]) for k, (kind, v) in unwritten.items()}
        if self._shared:
            self._check_shared_lengths({**cols, **unwritten})
        return VectorBatch(columns=cols, keep=keep, rejections=sorted(bad.values(), key=lambda r: r.index),
                           unwritten=unwritten)

    def _check_shared_lengths(self, cols: dict[str, tuple[str, Any]]) -> None:
        """A feature with ``length_of`` has, in every record, the length of the one it names
        (the config check allows only items of one list with one ``max_len``): an internal
        error otherwise, never a column that silently misstates a length. ``cols``: kept rows only."""
        for name, of in self._shared:
            mine, theirs = cols[f"{name}_len"][1], cols[f"{of}_len"][1]
            if not np.array_equal(mine, theirs):
                row = int(np.flatnonzero(mine[:, 0] != theirs[:, 0])[0])
                raise ValueError(f"feature {name!r} (length_of: {of!r}): record {row} of the batch has "
                                 f"{int(mine[row, 0])} values, {of!r} {int(theirs[row, 0])}; the shared length "
                                 f"would be wrong (report this: the config check should have refused it)")

    def unseen_label_rows(self, batch: PreparedBatch, known: Any = None) -> dict[int, Rejection]:
        """Rows of ``batch`` (not rejected already) whose label class has no id:
        the training split never had it. ``known`` (a container of class names;
        default: this analysis' classes) lets the pipeline ask before the
        analysis is complete, with the training classes seen so far."""
        lab = vocabulary_label(self.config)
        return unseen_label_rows(batch, lab, self.label_ids if known is None else known) if lab else {}

    def vectorize(self, records: Sequence[Any]) -> VectorBatch:
        """Columns for ``records``; rejected rows are masked out of every column."""
        return self.finish(self.prepare(records))

    def _vocab_finish(self, f: FeatureConfig, part: TermIndexes) -> Columns:
        """Ids of the terms new in this batch (one lookup each), then one gather."""
        codes, lens = part.codes, part.lens
        table = self._id_table(f, part)
        b = codes.shape[0]
        cols: dict[str, tuple[str, Any]] = {f.name: ("int64", table[codes])}
        if f.multi_valued:
            assert lens is not None
            cols[f"{f.name}_len"] = ("int64", lens.reshape(b, 1))
        return cols

    def _bag_finish(self, f: FeatureConfig, part: TermBags) -> Columns:
        """The columns of a feature of the ``bags`` stage from every term id of each document
        (``Transform.finish_bag``), and the ids of its first terms for the statistics."""
        table = self._id_table(f, part)
        cols = transform_of(f).finish_bag(f, table[part.flat], part.counts, self._bags[f.name])  # type: ignore[attr-defined]
        cols[part.ids_column] = ("int64", table[part.codes])
        return cols

    def _id_table(self, f: FeatureConfig, part: TermIndexes) -> np.ndarray:
        """Id by term index of the unit's terms so far (the batch's new ones looked up once
        each), then 0 for the code -1 (padding)."""
        first, new_terms = part.first, part.new_terms
        ids = self._vocab_ids[f.name]
        oov = f.num_oov_buckets
        # vocabulary ids start at 2: 0 = not in it
        new = np.fromiter(map(ids.get, new_terms, itertools.repeat(0)), dtype=np.int64, count=len(new_terms))
        unknown = np.flatnonzero(new == 0)
        if oov > 1:
            for i in unknown.tolist():
                new[i] = hash_id(new_terms[i], oov)
        else:
            new[unknown] = 1
        # Ids per term index, kept while the indexes carry over (a unit);
        # the last entry (code -1, padding) stays 0.
        table = self._tables.get(f.name)
        if first == 0 or table is None:
            table = np.zeros(1, dtype=np.int64)
        if table.size - 1 != first:
            raise ValueError(f"feature {f.name!r}: prepared batches out of order (term index {first}, expected {table.size - 1})")
        table = np.concatenate([table[:-1], new, table[-1:]])
        self._tables[f.name] = table
        return table


def unseen_label_rows(batch: PreparedBatch, lab: LabelConfig, known: Any) -> dict[int, Rejection]:
    """``Vectorizer.unseen_label_rows`` with the classes ``known`` given."""
    part = next((p for p in batch.parts if isinstance(p, LabelTerms)), None)
    if part is None:
        return {}
    terms = part.terms
    return {i: Rejection(i, lab.source, unseen_label_class(lab, t)) for i, t in enumerate(terms)
            if t is not None and t not in known and i not in batch.bad}
