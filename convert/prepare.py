"""The analysis-independent half of vectorizing: records in, a ``PreparedBatch`` out.

``Preparer.prepare`` does, once per record, everything that needs no
``Analysis``: field access, type checks and rejections, tokenizing, hashing,
collecting each batch's distinct terms. ``convert.vectorize.Vectorizer.finish``
applies the analysis to the batch (vocabulary ids, statistics) and
``convert.analysis.Analyzer.add_prepared`` counts it, so no record is decoded
or prepared twice.

Column-wise fast paths cover the types Avro/JSON records usually hold
(numbers, strings, lists of strings); any other batch takes the per-value
path, which defines the behaviour (rejections, term forms) both follow.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from convert.column_records import ColumnRecords
from convert.columns import (
    AnalysisPart,
    Columns,
    Finished,
    LabelTerms,
    ListArray,
    Numbers,
    NumericArray,
    PreparedPart,
    PresentRows,
    RawValues,
    ScalarArray,
    TermBags,
    TermCodes,
    TermIndexes,
    TermRows,
    ValidNumbers,
)
from convert.config import EACH, Config, FeatureConfig, Step, is_list_step, parse_path
from convert.derive import cross_ids
from convert.prepare_values import (
    NONE_TYPE,
    Rejection,
    TermIndex,
    apply_on_nan,
    bytes_columns,
    flat_list_codes,
    gather,
    index_codes,
    label_columns,
    label_terms,
    leaf_items,
    list_numbers,
    numbers_for_analysis,
    per_value_list_codes,
    reject_log1p_domain,
    scalar_codes,
    scalar_numbers,
    scalar_terms,
    short_value,
    terms_of,
    timestamp_columns,
)
from convert.records import (
    F32_MAX,
    as_list,
    extract,
    extract_path,
    getter,
    hash_id,
    hash_ids,
    is_list_path,
    joined_text,
    term,
    tokenize,
    walk_path,
)
from convert.spec import daz
from convert.transforms import NumericTransform, transform_of
from convert.transforms.ngrams import UNIGRAMS, document_terms, ngram_counts


def _count_steps(steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """A ``count`` feature's path as a path through the list it counts (``items`` -> ``items[]``)."""
    return steps if is_list_step(steps[-1]) else (*steps, EACH)


@dataclasses.dataclass
class PreparedBatch:
    """The analysis-independent work on a batch, done once per record.

    Everything the vectorizer does that needs no ``Analysis`` (field access,
    type checks and rejections, tokenizing, hashing, collecting each batch's
    distinct terms) is done by ``Preparer.prepare``; ``Vectorizer.finish``
    applies the analysis (vocabulary ids, statistics). The pipeline's
    analysis pass prepares each batch, feeds ``Analyzer.add_prepared``, and
    stores the batch (``analysis`` dropped) for the convert pass, so no record
    is decoded or prepared twice.

    ``parts`` holds, per feature in config order (then the label), a
    ``convert.columns.PreparedPart``: ``Finished`` (final columns),
    ``Numbers`` (numerics before fill and scaling), ``TermIndexes`` (term
    indexes before vocabulary ids: with ``Preparer(unit_terms=True)`` indexes
    carry over from the previous batches of the unit, so batches must be
    finished in order) or, for a vocabulary label, ``LabelTerms``.
    ``analysis`` holds what ``Analyzer.add_prepared`` needs per analyzed
    feature (and the label).
    """

    rows: int
    parts: list[PreparedPart]
    bad: dict[int, Rejection]
    analysis: dict[str, AnalysisPart] | None = None


class _RowCount:
    """Stands for a column whose values nobody reads (``Preparer._fast``):
    it has a length and nothing else, so a use of its values fails loudly."""

    __slots__ = ("_n",)

    def __init__(self, n: int):
        self._n = n

    def __len__(self) -> int:
        return self._n


@dataclasses.dataclass
class _Batch:
    """One batch being prepared: its records and columns, its rejections so far and
    (``analyze``) what the analysis needs, which the stages add to."""

    records: Sequence[Any]
    bad: dict[int, Rejection]
    all_dicts: bool
    top: dict[str, list[Any]] | None
    #: Features whose column came as term codes (``ColumnRecords.term_codes``).
    coded: dict[str, TermCodes]
    extras: dict[str, AnalysisPart] | None


class Preparer:
    """The analysis-independent half of vectorizing; see ``PreparedBatch``.

    Column-wise fast paths cover the types Avro/JSON records usually hold
    (numbers, strings, lists of strings); any other batch takes the per-value
    path, which defines the behaviour (rejections, term forms) both follow.
    """

    #: A unit's term index starts afresh beyond this many terms of a feature.
    MAX_UNIT_TERMS = 1 << 20

    def __init__(self, config: Config, unit_terms: bool = False):
        self.config = config
        #: Keep term indexes across batches (the pipeline: one Preparer per
        #: unit), so each batch's distinct terms are looked up and counted once
        #: per unit, not once per batch; else every batch starts afresh.
        self.unit_terms = unit_terms
        self._index: dict[str, TermIndex] = {}
        steps = {f.name: _count_steps(parse_path(f.source)) if transform_of(f).counts_items else parse_path(f.source)
                 for f in config.features}
        #: Sources through lists, indexes or map keys (read with ``walk_path``), parsed.
        self._paths = {name: st for name, st in steps.items() if is_list_path(st)}
        self._keys: dict[str, list[str]] = {name: [st[0]] if name in self._paths else list(st)  # type: ignore[misc]
                                            for name, st in steps.items()}
        self._cross_keys = {f.name: [list(parse_path(s)) for s in f.sources or ()] for f in config.features}
        #: A ``key`` path read beside the feature's source (``zscore_per_key``).
        self._side_keys = {f.name: list(parse_path(f.key)) for f in config.features if f.key}
        self._get = {f.name: getter(f.source) for f in config.features}
        #: The label's source, parsed: read as a feature reading that path reads it (``_source_values``).
        self._label_steps = parse_path(config.label.source) if config.label else None
        self._top_keys = sorted({k[0] for k in self._keys.values()}
                                | {k[0] for ks in self._cross_keys.values() for k in ks}
                                | {k[0] for k in self._side_keys.values()}
                                | ({self._label_steps[0]} if self._label_steps else set()))  # type: ignore[misc]
        #: Per top-level field, the features reading it (None: a reader that
        #: needs its values, such as a cross or the label).
        self._uses: dict[str, list[FeatureConfig | None]] = {}
        for f in config.features:
            if f.name in self._paths:
                continue  # read by ``_path_values``
            for keys in [self._keys[f.name], *self._cross_keys[f.name]]:
                self._uses.setdefault(keys[0], []).append(None if f.sources else f)
            if f.name in self._side_keys:
                self._uses.setdefault(self._side_keys[f.name][0], []).append(None)
        if self._label_steps:
            self._uses.setdefault(self._label_steps[0], []).append(None)  # type: ignore[arg-type]
        #: Features that can take their column without its Python values, from
        #: a ``ColumnRecords``: its numpy form (``arrays``) of this class, or
        #: its ``term_codes`` of this kind.
        self._fast_array: dict[str, type[ScalarArray] | type[ListArray]] = {}
        self._fast_codes: dict[str, str] = {}
        for f in config.features:
            if f.is_numeric and not (f.multi_valued and f.needs_stats):
                self._fast_array[f.name] = ListArray if f.multi_valued else ScalarArray
            elif transform_of(f).takes_term_codes(f):
                self._fast_codes[f.name] = "list" if f.multi_valued else "scalar"
        #: Each feature's stage (``Transform.prepared_as``), called once per batch.
        self._stages = {f.name: STAGES[transform_of(f).prepared_as] for f in config.features}
        #: Sources whose scalar term codes ``prepare`` asks a ``ColumnRecords`` for (made together).
        self._scalar_code_sources = [f.source for f in config.features
                                     if self._fast_codes.get(f.name) == "scalar" and f.name not in self._paths]

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self.config, "unit_terms": self.unit_terms}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["config"], state.get("unit_terms", False))  # term indexes start afresh

    def _top_columns(self, records: Sequence[Any]) -> dict[str, list[Any]] | None:
        """Every top-level field the config reads, as columns, when every record
        has them all (Avro records always do): one ``itemgetter`` per record and
        one transpose, in C (docs/benchmarks.md#design-converter)."""
        keys = self._top_keys
        if len(keys) < 2 or not records:
            return None
        try:
            rows = list(map(operator.itemgetter(*keys), records))
        except KeyError:
            return None
        return dict(zip(keys, map(list, zip(*rows, strict=True)), strict=True))

    def prepare(self, records: Sequence[Any], analyze: bool = False) -> PreparedBatch:
        """Prepare a batch; ``analyze``: also keep what ``Analyzer.add_prepared`` needs.

        Stages: the batch's columns (``_columns``), each feature's values
        (``_feature_values``) prepared by its transform's stage
        (``Transform.prepared_as``, one call per feature and batch), the label."""
        batch = self._columns(records, analyze)
        parts: list[PreparedPart] = []
        for f in self.config.features:
            values, arr, leaf = self._feature_values(f, batch)
            part = self._stages[f.name](self, f, values, batch, arr, leaf)
            parts.append(part)
            if batch.extras is not None and f.name not in batch.extras and isinstance(part, Finished):
                batch.extras[f.name] = PresentRows(_present_rows(f, part.columns, values))
        if self._label_steps is not None:
            parts.append(self._label_part(batch))
        return PreparedBatch(len(records), parts, batch.bad, batch.extras)

    def _columns(self, records: Sequence[Any], analyze: bool) -> _Batch:
        """The batch's top-level columns: a ``ColumnRecords``' own (a column's values made only
        for a reader the fast forms do not serve), else one transpose of the records when all
        are dicts with every field; records that are not objects are rejected."""
        b = len(records)
        batch = _Batch(records, {}, True, None, {}, {} if analyze else None)
        if isinstance(records, ColumnRecords):  # the Avro fast path: already columns
            missing = [None] * b
            top: dict[str, list[Any]] = {}
            records.make_term_codes(self._scalar_code_sources)
            for k in self._top_keys:
                made = False
                for f in self._uses.get(k, ()):
                    if f is None:
                        made = True
                    elif f.name in self._fast_codes:
                        tc = records.term_codes(f.source)
                        if tc is not None and tc.kind == self._fast_codes[f.name]:
                            batch.coded[f.name] = tc
                        else:
                            made = True
                    elif f.name in self._fast_array:
                        made = made or not isinstance(records.arrays.get(f.source), self._fast_array[f.name])
                    else:
                        made = True
                top[k] = records.column(k, missing) if made else _RowCount(b)
            batch.top = top
            return batch
        batch.all_dicts = set(map(type, records)) <= {dict}
        if not batch.all_dicts:
            for i, r in enumerate(records):
                if not isinstance(r, dict):
                    batch.bad[i] = Rejection(i, "<record>", f"expected a record (object), found {type(r).__name__}")
        batch.top = self._top_columns(records) if batch.all_dicts else None
        return batch

    def _feature_values(self, f: FeatureConfig, batch: _Batch) -> tuple[Any, NumericArray | None, tuple | None]:
        """``(values, numeric array, leaf)`` of ``f`` in ``batch`` (term codes go to ``batch.coded``)."""
        records, top = batch.records, batch.top
        keys = self._keys[f.name]
        arr = records.arrays.get(f.source) if isinstance(records, ColumnRecords) else None
        leaf = None
        if f.name in self._paths:
            values, tc, arr, leaf = self._path_values(f, batch)
            if tc is not None:
                batch.coded[f.name] = tc
        elif top is not None and isinstance(top.get(keys[0]), _RowCount):
            values = top[keys[0]]  # served without values (``_columns``)
        else:
            values = self._source_values(keys, batch)
        return values, arr, leaf

    def _source_values(self, steps: Sequence[Step], batch: _Batch) -> list[Any]:
        """Each record's value at the parsed source path ``steps`` (``walk_path``'s value, None
        when missing): what a feature reading that path takes, and what the label is read as,
        so a label and a feature with the same ``source`` read the same values. Keys alone
        a level at a time (``extract``); through lists, indexes or map keys from a
        ``ColumnRecords``' list columns (``path_values``) when they can follow the path,
        else by walking each record."""
        records = batch.records
        if not is_list_path(steps):
            return extract(records, list(steps), batch.all_dicts, batch.top)  # type: ignore[arg-type]
        if isinstance(records, ColumnRecords):
            values = records.path_values(tuple(steps))
            if values is None:
                values = [walk_path(v, steps, 1) for v in records.column(steps[0], [None] * len(records))]  # type: ignore[arg-type]
            return values
        return extract_path(records, steps, batch.all_dicts, batch.top)

    def _label_part(self, batch: _Batch) -> PreparedPart:
        """The label's part: class names (``LabelTerms``) for a vocabulary label, else its final column."""
        lab = self.config.label
        assert lab is not None and self._label_steps is not None
        values = self._source_values(self._label_steps, batch)
        if not lab.needs_vocabulary:
            return Finished(lab.name, label_columns(lab, values, batch.bad))
        part = LabelTerms(lab.name, label_terms(lab, values, batch.bad))
        if batch.extras is not None:
            batch.extras[lab.name] = part
        return part

    # -- the stages, one per ``Transform.prepared_as`` (``STAGES``)
    def _stage_count(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return Finished(f.name, _count(f, values, batch.extras, leaf))

    def _stage_numbers(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return self._numeric(f, values, batch.bad, batch.extras, arr)

    def _stage_bytes(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return Finished(f.name, bytes_columns(f, values, batch.bad))

    def _stage_hash(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return Finished(f.name, self._hash(f, values, batch.bad, batch.coded.get(f.name)))

    def _stage_timestamp(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        ts_cols = timestamp_columns(f, values, batch.bad)
        return Finished(f.name, ts_cols, _present_rows(f, ts_cols, values))

    def _stage_own(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        """A transform that finishes its values itself (``Transform.finish_values``; no analysis)."""
        cols, present, rejected = transform_of(f).finish_values(f, values)
        for i, why in rejected.items():
            batch.bad.setdefault(i, Rejection(i, f.source, why))
        if batch.extras is not None:
            batch.extras[f.name] = PresentRows(present)
        return Finished(f.name, cols, present)

    def _stage_keyed_numbers(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any,
                             leaf: tuple | None) -> PreparedPart:
        """A number and its row's key term (``key``): the numbers as ``_numeric`` prepares them, the
        analysis' valid numbers with their rows' keys."""
        part = self._numeric(f, values, batch.bad, None, arr)
        assert isinstance(part, Numbers)
        keys: list[str | None] = []
        for i, v in enumerate(self._source_values(self._side_keys[f.name], batch)):
            if isinstance(v, dict | list):
                batch.bad.setdefault(i, Rejection(i, f.key or "", f"a key needs a single value, found "
                                                                  f"{type(v).__name__} {short_value(v)}"))
                v = None
            keys.append(None if v is None else term(v))
        if batch.extras is not None:
            with np.errstate(invalid="ignore"):
                valid = part.present[:, 0] & (np.abs(part.values[:, 0]) <= F32_MAX)
            batch.extras[f.name] = ValidNumbers(part.values[valid, 0], np.flatnonzero(valid), part.missing_row, keys)
        return dataclasses.replace(part, keys=keys)

    def _stage_cross(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return Finished(f.name, self._cross(f, batch.records, batch.all_dicts, batch.bad, batch.top))

    def _stage_terms(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return self._terms(f, values, batch.bad, batch.extras, batch.coded.get(f.name))

    def _stage_bags(self, f: FeatureConfig, values: Any, batch: _Batch, arr: Any, leaf: tuple | None) -> PreparedPart:
        return self._bags(f, values, batch.bad, batch.extras)

    def _path_values(self, f: FeatureConfig, batch: _Batch) -> tuple[Any, TermCodes | None, ListArray | None, tuple | None]:
        """``(values, term codes, numeric array, leaf)`` of a feature whose source goes
        through lists (``walk_path``). From a ``ColumnRecords``, the column
        operations of ``ColumnRecords.path_leaf`` give the codes, the array or
        (``count``) the leaf where the feature's fast path takes them, with a
        ``_RowCount`` for values, else each row's items (``_source_values``)."""
        steps = self._paths[f.name]
        records = batch.records
        b = len(records)
        values = None
        if isinstance(records, ColumnRecords):
            if f.multi_valued and not any(map(is_list_step, steps)):
                steps = (*steps, EACH)  # a list at an index (m[0]): the same values, as a path through it
            if self._fast_codes.get(f.name) == "list":
                tc = records.path_term_codes(steps)
                if tc is not None:
                    return _RowCount(b), tc, None, None
            elif self._fast_array.get(f.name) is ListArray:
                arr = records.path_array(steps)
                if arr is not None:
                    return _RowCount(b), None, arr, None
            elif transform_of(f).counts_items:
                leaf = records.path_leaf(steps)
                if leaf is not None:
                    return _RowCount(b), None, None, leaf
            values = records.path_values(steps)
        if values is None:
            values = self._source_values(self._paths[f.name], batch)
        return (joined_text(values) if transform_of(f).tokens else values), None, None, None

    # -- numerics
    def _numeric(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
                 extras: dict[str, AnalysisPart] | None, arr: NumericArray | None = None) -> Numbers | Finished:
        """``arr``: the column as numpy (``ColumnRecords.arrays``), which takes
        the fast paths without looking at ``values``.

        Stages: the values as ``(rows, max_len)`` numbers (``list_numbers`` or
        ``scalar_numbers``), what the analysis needs (``numbers_for_analysis``),
        ``on_nan`` (``apply_on_nan``), log1p's domain (``reject_log1p_domain``)."""
        col = None
        if f.multi_valued:
            out, present, lens, missing_row = list_numbers(f, values, bad, arr)
        else:
            out, present, lens, missing_row, col = scalar_numbers(f, values, bad, arr)
        if extras is not None:
            extras[f.name] = numbers_for_analysis(f, values, col, present, missing_row)
        apply_on_nan(f, out, present, bad)
        if transform_of(f).domain_above is not None:
            reject_log1p_domain(f, out, present, bad)
        prepared = Numbers(f.name, out, present, lens, missing_row)
        if f.needs_stats:
            return prepared
        return Finished(f.name, finish_numbers(f, prepared, {}))  # nothing left to learn: finish now

    # -- crosses: final ids here (no analysis)
    def _cross(self, f: FeatureConfig, records: Sequence[Any], all_dicts: bool,
               bad: dict[int, Rejection], top: dict[str, list[Any]] | None = None) -> dict[str, tuple[str, Any]]:
        assert f.sources and f.buckets
        parts: list[list[str | None]] = []
        for src, keys in zip(f.sources, self._cross_keys[f.name], strict=True):
            col: list[str | None] = []
            for i, v in enumerate(extract(records, keys, all_dicts, top)):
                if isinstance(v, dict | list):
                    bad.setdefault(i, Rejection(i, src, f"cross needs single values, found {type(v).__name__} {short_value(v)}; cross scalar fields only"))
                    v = None
                col.append(None if v is None else term(v))
            parts.append(col)
        return {f.name: ("int64", cross_ids(parts, f.buckets).reshape(-1, 1))}

    # -- hashed categoricals: final ids here (no analysis)
    def _hash(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
              tc: TermCodes | None = None) -> dict[str, tuple[str, Any]]:
        """``tc``: the column as codes (``ColumnRecords.term_codes``), used instead of ``values``."""
        b = len(values)
        buckets = f.buckets
        assert buckets is not None
        if tc is not None:  # each distinct value hashed once; null is id 0
            ids = np.append(hash_ids(terms_of(tc.values), buckets), 0)
            return {f.name: ("int64", ids[tc.codes].reshape(b, 1))}
        if not f.multi_valued:
            types = set(map(type, values))
            if types <= {str, NONE_TYPE} or types <= {int, NONE_TYPE}:
                # Hash each distinct value once; null is id 0.
                uniq = [u for u in dict.fromkeys(values) if u is not None]
                terms = uniq if str in types else [str(u) for u in uniq]
                table = dict(zip(uniq, hash_ids(terms, buckets).tolist(), strict=True))
                table[None] = 0
                out = np.fromiter(map(table.__getitem__, values), dtype=np.int64, count=b).reshape(b, 1)
                return {f.name: ("int64", out)}
        n = f.max_len or 1
        out = np.zeros((b, n), dtype=np.int64)
        lens = np.zeros(b, dtype=np.int64)

        def to_id(t: str) -> int:
            return hash_id(t, buckets)

        if f.multi_valued:
            for i, v in enumerate(values):
                items = leaf_items(f, i, v, n, bad)
                if items is not None:
                    lens[i] = len(items)
                    out[i, : len(items)] = [to_id(term(x)) for x in items]
            return {f.name: ("int64", out), f"{f.name}_len": ("int64", lens.reshape(b, 1))}
        col = out[:, 0]
        for i, t in scalar_terms(f, values, bad):
            col[i] = to_id(t)
        return {f.name: ("int64", out)}

    # -- vocabulary and text: term indexes here, ids come in ``finish``
    def _term_index(self, f: FeatureConfig) -> TermIndex:
        """Term -> index for ``f``: the unit's (``unit_terms``) or this batch's.

        It starts with one sentinel that is never a term (``None``; for text
        ``"\\x00"``, never a token) at -1, so terms get ``len(index) - 1``.
        """
        sentinel = "\x00" if transform_of(f).tokens else None
        index = self._index.get(f.name) if self.unit_terms else None
        if index is None or len(index) > self.MAX_UNIT_TERMS:
            # Afresh (a batch with first index 0 restarts the consumers'
            # tables too): bounds memory for very high-cardinality features.
            index = TermIndex({sentinel: -1})
            if self.unit_terms:
                self._index[f.name] = index
        return index

    def _terms(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
               extras: dict[str, AnalysisPart] | None, tc: TermCodes | None = None) -> TermIndexes:
        """The batch's term indexes (``TermIndexes``): codes index the terms; ``new_terms``
        are the terms this batch added, at indexes ``first, first + 1, ...``.
        ``tc``: the column as codes (``ColumnRecords.term_codes``), used instead of ``values``.

        Stages: every term's index, flat with the count per row (text tokens,
        list items) or one per row (scalars); then each row's first ``max_len``
        (``gather``). Lists the fast forms do not cover go value by value."""
        b = len(values)
        n = f.max_len or 1
        index = self._term_index(f)
        first = len(index) - 1
        counts: np.ndarray | None = None
        fcodes: np.ndarray | None
        if transform_of(f).tokens:
            fcodes, counts = document_terms(f, values, f.ngram_range or UNIGRAMS, f.separator, bad, index)
        elif tc is not None and tc.kind == "list":
            assert tc.counts is not None
            fcodes, counts = index_codes(index, tc), tc.counts
        elif f.multi_valued:
            fcodes, counts = flat_list_codes(values, index)
        else:
            fcodes = scalar_codes(f, values, bad, index, tc)
        row_of: np.ndarray | None = None
        lens: np.ndarray | None = None
        if counts is not None:
            assert fcodes is not None
            codes, lens = gather(fcodes, counts, n)
            row_of = np.repeat(np.arange(b), counts)  # the analysis counts every item, not only max_len
        elif fcodes is not None:
            codes = fcodes.reshape(b, 1)
        else:
            codes, lens = per_value_list_codes(f, values, bad, index, n)
        new_terms = list(itertools.islice(index, first + 1, None))
        if extras is not None:
            extras[f.name] = RawValues(values, first, new_terms) if fcodes is None else TermRows(first, new_terms, fcodes, row_of)
        return TermIndexes(f.name, first, new_terms, codes, lens)

    def _bags(self, f: FeatureConfig, values: list[Any], bad: dict[int, Rejection],
              extras: dict[str, AnalysisPart] | None) -> TermBags:
        """Every term index of each document (``TermBags``): the columns of a ``bags``
        transform come from its whole document's ids (``Transform.finish_bag``)."""
        index = self._term_index(f)
        first = len(index) - 1
        fcodes, counts = document_terms(f, values, f.ngram_range or UNIGRAMS, f.separator, bad, index)
        codes, lens = gather(fcodes, counts, f.max_len or 1)
        new_terms = list(itertools.islice(index, first + 1, None))
        if extras is not None:
            extras[f.name] = TermRows(first, new_terms, fcodes, np.repeat(np.arange(len(values)), counts))
        return TermBags(f.name, first, new_terms, codes, lens, fcodes, counts)


def _count(f: FeatureConfig, values: Any, extras: dict[str, AnalysisPart] | None,
           leaf: tuple | None) -> dict[str, tuple[str, Any]]:
    """``count``: each row's number of items, from the values of its path through
    the list it counts (``_count_steps``: a list per row, or None when null or
    missing, which counts 0). ``leaf``: ``ColumnRecords.path_leaf``, used instead of ``values``."""
    if leaf is not None:
        counts, present = leaf[1].astype(np.int64), ~leaf[2]
    else:
        counts = np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=len(values))
        present = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    if extras is not None:
        extras[f.name] = PresentRows(present)
    return {f.name: ("int64", counts.reshape(-1, 1))}


def count_values(f: FeatureConfig, values: Sequence[Any]) -> int:
    """Values of ``f`` in ``values`` as ``Analyzer.present`` counts them: non-null
    scalars, non-null list items, text tokens. Zero exactly when the pipeline's
    count (``add_prepared``) is zero, for lists up to ``max_len`` long."""
    if transform_of(f).tokens:
        lo, hi = f.ngram_range or UNIGRAMS
        lens = np.array([len(tokenize(v, f.lowercase)) for v in values if isinstance(v, str)], dtype=np.int64)
        return int(ngram_counts(lens, lo, hi).sum())
    if f.multi_valued:
        return sum(x is not None for v in values for x in as_list(v))
    return len(values) - list(values).count(None)


def _present_rows(f: FeatureConfig, cols: dict[str, tuple[str, Any]], values: Any) -> np.ndarray:
    """Which rows have a value, for a feature finished in ``prepare`` (the
    analysis only counts them): hash and cross ids are 0 exactly where the
    input is missing; bytes and timestamps look at their values."""
    if transform_of(f).hashed:
        return (cols[f.name][1] != 0).any(axis=1)
    return np.fromiter((v is not None for v in values), dtype=bool, count=len(values))


def transform_constants(stats: Mapping[str, Any]) -> dict[str, Any]:
    """A numeric feature's statistics as its transform uses them (``finish_numbers``, and the
    serving layer): mean, std, min, max and bucket boundaries below the smallest normal
    double read as zero of their sign (``convert.spec.daz``), as TensorFlow's kernels
    read such a constant. The statistics recorded in the analysis stay exact."""
    out = dict(stats)
    for key in ("mean", "std", "min", "max"):
        if isinstance(out.get(key), float):
            out[key] = daz(out[key])
    if out.get("boundaries"):
        out["boundaries"] = [daz(float(b)) for b in out["boundaries"]]
    return out


def finish_numbers(f: FeatureConfig, prepared: Numbers, stats: Mapping[str, Any]) -> Columns:
    """Fill, scale and cast a prepared numeric feature (``stats``: its training statistics
    as ``transform_constants`` gives them, made once per analysis by its reader):
    ``NumericTransform.finish_numbers`` of its transform."""
    t = transform_of(f)
    assert isinstance(t, NumericTransform)
    return t.finish_numbers(f, prepared, stats)


#: ``Transform.prepared_as`` -> the ``Preparer`` stage that prepares such features.
STAGES = {
    "count": Preparer._stage_count,
    "numbers": Preparer._stage_numbers,
    "bytes": Preparer._stage_bytes,
    "hash": Preparer._stage_hash,
    "timestamp": Preparer._stage_timestamp,
    "cross": Preparer._stage_cross,
    "own": Preparer._stage_own,
    "keyed_numbers": Preparer._stage_keyed_numbers,
    "terms": Preparer._stage_terms,
    "bags": Preparer._stage_bags,
}
