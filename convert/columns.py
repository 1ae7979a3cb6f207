"""Typed column forms at the converter's seams: no Beam, no TensorFlow.

Three seams, each a batch at a time (a form per column, not per record):

- decoder -> preparer: what a columnar reader (``convert.column_records.ColumnRecords``)
  hands over instead of Python values: numeric columns as numpy
  (``ScalarArray``, ``ListArray``) and categorical columns as distinct values
  plus codes (``TermCodes``);
- preparer -> finisher: a ``PreparedBatch``'s part per feature
  (``PreparedPart``): final columns (``Finished``), numbers before fill and
  scaling (``Numbers``), term indexes before vocabulary ids
  (``TermIndexes``) or a vocabulary label's class names (``LabelTerms``);
- preparer -> analyzer: what ``Analyzer.add_prepared`` counts per feature
  (``AnalysisPart``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, TypeAlias

import numpy as np

#: Columns as ``convert.example`` encodes them: name -> (dtype, values).
Columns: TypeAlias = dict[str, tuple[str, Any]]


# ------------------------------------------------------- decoder -> preparer


@dataclasses.dataclass(frozen=True, slots=True)
class ScalarArray:
    """A numeric column as float64, ``NaN`` where null (``null`` marks those rows)."""

    values: np.ndarray  # float64
    null: np.ndarray  # bool


@dataclasses.dataclass(frozen=True, slots=True)
class ListArray:
    """A column of lists of numbers without null items: every row's items back
    to back (float64), how many each row has, and which rows are null (they have none)."""

    items: np.ndarray  # float64
    counts: np.ndarray  # int64
    null: np.ndarray  # bool


NumericArray: TypeAlias = ScalarArray | ListArray


@dataclasses.dataclass(frozen=True, slots=True)
class TermCodes:
    """A column of strings or integers (``"scalar"``), or of lists of strings
    without null items (``"list"``), as its distinct values and a code per value.

    ``values`` are the distinct non-null values in order of first occurrence;
    ``codes[i]`` indexes them, ``-1`` for null. For ``"list"``, ``codes`` holds
    every row's items back to back and ``counts`` how many each row has (a
    null list has none). What the vectorizer would find from the Python
    values, made by the decoder (``ColumnRecords.term_codes``) so that each
    distinct value becomes a Python object once, not once per record.
    """

    kind: Literal["scalar", "list"]
    values: list[Any]
    codes: np.ndarray  # int32
    counts: np.ndarray | None = None  # int64, "list" only


# ------------------------------------------------------ preparer -> finisher


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """A feature finished while preparing (it needs no analysis): its columns.
    ``present``: which rows have a value, for a feature the vectorizer still
    scales by the training split (``Transform.scaled``, a timestamp)."""

    name: str
    columns: Columns
    present: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Numbers:
    """A numeric feature before fill and scaling (``(rows, max_len)`` values;
    ``present`` marks the values to keep, ``lens`` each row's kept length,
    ``missing_row`` the null rows)."""

    name: str
    values: np.ndarray  # float64
    present: np.ndarray  # bool
    lens: np.ndarray  # int64
    missing_row: np.ndarray  # bool
    #: ``zscore_per_key``: each row's key term (None: no key).
    keys: list[str | None] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TermIndexes:
    """A vocabulary or text feature's term indexes, ``(rows, max_len)``
    (``-1`` = padding/missing), and ``lens`` per row for lists (else None).
    The batch added ``new_terms`` at indexes ``first, first + 1, ...``."""

    name: str
    first: int
    new_terms: list[str]
    codes: np.ndarray  # int32
    lens: np.ndarray | None

    @property
    def ids_column(self) -> str:
        """The column of the ids of ``codes``, position for position (the statistics' out-of-vocabulary count)."""
        return self.name


@dataclasses.dataclass(frozen=True, slots=True)
class TermBags(TermIndexes):
    """A feature that writes ids of a whole document (``bag_of_words``, ``tfidf``): ``flat`` is
    every term index of the batch (int32), ``counts`` the terms of each row; ``codes`` and
    ``lens`` are each row's first ``max_len``, in order, as ``TermIndexes`` has them (the
    statistics count those, as a text's), whose ids the finished batch holds in ``ids_column``."""

    flat: np.ndarray  # int32
    counts: np.ndarray  # int64

    @property
    def ids_column(self) -> str:
        return bag_ids_column(self.name)


def bag_ids_column(name: str) -> str:
    """The column of the ids of a ``TermBags``' ``codes`` (no feature name holds a NUL)."""
    return f"{name}\x00terms"


@dataclasses.dataclass(frozen=True, slots=True)
class LabelTerms:
    """A vocabulary label's class name per row (None where rejected)."""

    name: str
    terms: list[str | None]


PreparedPart: TypeAlias = Finished | Numbers | TermIndexes | LabelTerms


# ------------------------------------------------------ preparer -> analyzer


@dataclasses.dataclass(frozen=True, slots=True)
class PresentRows:
    """A feature the analysis only counts: which rows have a value."""

    rows: np.ndarray  # bool


@dataclasses.dataclass(frozen=True, slots=True)
class RawValues:
    """A batch the fast paths did not cover: the feature's Python values; for a
    term feature also the terms its index added (``first``, ``new_terms``),
    since the term indexes advance all the same."""

    values: list[Any]
    first: int | None = None
    new_terms: list[str] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TermRows:
    """A term feature's term indexes (flat) and the row of each (None: one per row)."""

    first: int
    new_terms: list[str]
    codes: np.ndarray  # int32
    row_of: np.ndarray | None


@dataclasses.dataclass(frozen=True, slots=True)
class ValidNumbers:
    """A numeric feature's values finite as float32, the row of each, and the null rows."""

    values: np.ndarray  # float64
    row_of: np.ndarray  # int64
    missing: np.ndarray  # bool
    #: ``zscore_per_key``: each row's key term (None: no key).
    keys: list[str | None] | None = None


#: What ``Analyzer.add_prepared`` takes per feature (``LabelTerms`` for a vocabulary label).
AnalysisPart: TypeAlias = PresentRows | RawValues | TermRows | ValidNumbers | LabelTerms
