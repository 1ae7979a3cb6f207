"""``ColumnRecords``: a batch of records held as columns, as the Avro fast
path (``convert.formats.avro_columnar``) yields it, with the term codes and paths
through lists it can give without making Python dicts.

It sits below the readers (``convert.source_types.RecordBatch`` holds it) and
needs only ``convert.columns`` and ``convert.config``'s path steps.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from convert.columns import ListArray, NumericArray, TermCodes
from convert.paths import EACH


class ColumnRecords(Sequence[dict[str, Any]]):
    """A batch of records held as columns (top-level field -> list of values).

    What the Avro fast path yields: the values are exactly those the
    fastavro path puts in its dicts (same types, logical types as raw
    integers), and consumers that work column-wise (``Preparer``) read
    ``columns`` directly instead of transposing dicts. Iterating builds each
    record's dict as it goes (none is kept: a batch of dicts next to its
    columns raised the workers' peak memory), so it still behaves as the list
    of records it stands for.

    Columns given as ``deferred`` (name -> a function making the column's
    list; their entry in ``columns`` only holds the field's place) are made
    on first use: the fast path defers the numeric columns it
    also hands over as ``arrays``, and the string, enum and integer columns it
    can hand over as ``term_codes``, whose Python values the vectorizer does
    not need (building the float lists is measurable: docs/benchmarks.md#design-converter).
    """

    __slots__ = ("_columns", "_deferred", "arrays", "record_json", "_n", "_coders", "_codes", "_lists", "_leaves")

    def __init__(self, columns: dict[str, list[Any]], n: int, arrays: dict[str, NumericArray] | None = None,
                 record_json: list[bytes] | None = None, deferred: dict[str, Callable[[], list[Any]]] | None = None,
                 coders: dict[str, Callable[[], TermCodes | None]] | None = None, lists: dict[str, Any] | None = None):
        if any(len(c) != n for k, c in columns.items() if not deferred or k not in deferred):
            raise ValueError("every column needs one value per record")
        if record_json is not None and len(record_json) != n:
            raise ValueError("record_json needs one entry per record")
        self._columns, self._n = columns, n
        self._deferred = {k: make for k, make in (deferred or {}).items() if k in columns}
        #: Numeric columns also as numpy (``_numeric_arrays``), the same values.
        self.arrays: dict[str, NumericArray] = arrays or {}
        #: Each record's canonical JSON when the reader was asked for it
        #: (``_records_json``), the bytes the whole-record split hashes.
        self.record_json = record_json
        self._coders = coders or {}
        self._codes: dict[str, TermCodes | None] = {}
        #: Top-level columns holding lists (polars Series), for paths through them (``path_leaf``).
        self._lists: dict[str, Any] = lists or {}
        self._leaves: dict[tuple, tuple | None] = {}

    def path_leaf(self, steps: tuple) -> tuple[Any, np.ndarray, np.ndarray] | None:
        """``(items, counts, null rows)`` of a path through lists (``convert.config.parse_path``
        steps with at least one ``EACH``): every row's items, back to back, as one polars
        Series, how many each row has, and which rows are null (null before the first
        list); ``None`` when the columns cannot give them (then read the records).

        Made with list and struct column operations (explode, struct fields) and
        the counts in numpy, so the items' records never become Python dicts:
        the same values, in the same order, as ``convert.records.walk_path``.
        """
        if steps not in self._leaves:
            self._leaves[steps] = _path_leaf(self._lists.get(steps[0]), steps[1:], self._n)
        return self._leaves[steps]

    def path_values(self, steps: tuple) -> list[Any] | None:
        """Each row's items at a path through lists (``path_leaf``) as a Python list, None for a null row."""
        leaf = self.path_leaf(steps)
        if leaf is None:
            return None
        items, counts, null = leaf
        values = items.to_list()
        out: list[Any] = []
        pos = 0
        for c, is_null in zip(counts.tolist(), null.tolist(), strict=True):
            out.append(None if is_null else values[pos:pos + c])
            pos += c
        return out

    def path_term_codes(self, steps: tuple) -> TermCodes | None:
        """``term_codes`` of the string items at a path through lists (kind ``"list"``), when none is null."""
        leaf = self.path_leaf(steps)
        if leaf is None or not _is_text_dtype(leaf[0].dtype) or leaf[0].null_count():
            return None
        import polars as pl

        s = leaf[0].cast(pl.String)
        uniq = s.unique(maintain_order=True)
        codes = s.cast(pl.Enum(uniq)).to_physical().cast(pl.Int32).to_numpy()
        return TermCodes("list", uniq.to_list(), codes, leaf[1])

    def path_array(self, steps: tuple) -> ListArray | None:
        """The numeric items at a path through lists as ``arrays`` gives a list column
        (``ListArray``), when none is null."""
        leaf = self.path_leaf(steps)
        if leaf is None:
            return None
        items, counts, null = leaf
        if not (items.dtype.is_integer() or items.dtype.is_float()) or items.null_count():
            return None
        import polars as pl

        return ListArray(items.cast(pl.Float64).to_numpy(), counts, null)

    def make_term_codes(self, names: Iterable[str]) -> None:
        """Make the ``term_codes`` of these fields now (others later, on first use): the string
        columns among them in two polars queries for all of them (distinct values, then codes)
        instead of several per column (each polars call has a fixed cost: docs/benchmarks.md#design-converter)."""
        batch = [k for k in dict.fromkeys(names) if k not in self._codes and _is_scalar_text_coder(self._coders.get(k))]
        if len(batch) > 1:
            self._codes.update(zip(batch, _scalar_text_codes([self._coders[k].args[0] for k in batch]), strict=True))

    def term_codes(self, name: str) -> TermCodes | None:
        """The field's values as distinct values and codes (``TermCodes``), made
        on first use; ``None`` when the reader cannot give them for this field."""
        if name not in self._codes:
            make = self._coders.get(name)
            self._codes[name] = make() if make is not None else None
        return self._codes[name]

    @property
    def columns(self) -> dict[str, list[Any]]:
        """Field -> its values, in the records' field order (deferred ones made now)."""
        for k in list(self._deferred):
            self.column(k)
        return self._columns

    @property
    def fields(self) -> list[str]:
        """The field names, in order, without making deferred columns."""
        return list(self._columns)

    @property
    def deferred_fields(self) -> list[str]:
        """Fields whose values are not made yet."""
        return list(self._deferred)

    def column(self, name: str, default: Any = None) -> Any:
        """One field's values (``default`` when there is no such field), made if deferred."""
        if name not in self._columns:
            return default
        make = self._deferred.pop(name, None)
        if make is not None:
            values = make()
            if len(values) != self._n:
                raise ValueError(f"column {name!r}: {len(values)} values for {self._n} records")
            self._columns[name] = values
        return self._columns[name]

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return {k: c[i] for k, c in self.columns.items()}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # C-level map chain, no strict zips (lengths are checked in __init__)
        return map(dict, map(zip, itertools.repeat(list(self.columns)), zip(*self.columns.values(), strict=False)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ColumnRecords | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ColumnRecords({self._n} records, fields {self.fields})"


def _path_leaf(s: Any, steps: tuple, n: int) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """``ColumnRecords.path_leaf`` of the column ``s`` (None: no such list column) and the steps after its name."""
    import polars as pl

    if s is None:
        return None
    counts = null = None
    for step in steps:
        if step is EACH:
            if not isinstance(s.dtype, pl.List):
                return None
            lens = s.list.len().fill_null(0).to_numpy().astype(np.int64)
            if counts is None:  # the first list: a row per record
                counts, null = lens, s.is_null().to_numpy()
            else:  # items of the lists so far: add each item's count to its row
                rows = np.repeat(np.arange(n), counts)
                counts = np.bincount(rows, weights=lens, minlength=n).astype(np.int64)
            s = s.explode(empty_as_null=False, keep_nulls=False)
            if len(s) != int(counts.sum()):
                return None
        elif isinstance(step, str) and isinstance(s.dtype, pl.Struct) and step in {f.name for f in s.dtype.fields}:
            s = s.struct.field(step)  # null where the record is null
        elif isinstance(step, int) and not isinstance(step, bool) and isinstance(s.dtype, pl.List):
            s = s.list.get(step, null_on_oob=True)  # null where the list is null or too short
        else:
            return None
    if counts is None or null is None:
        return None
    return s, counts, null



def _is_text_dtype(dtype: Any) -> bool:
    import polars as pl

    return dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum)


def term_coders(leaves: list[tuple[str, Any]]) -> dict[str, Callable[[], TermCodes | None]]:
    """``TermCodes`` makers for the string, enum, integer and list-of-string
    columns among a batch's ``leaves`` (``_leaves``): made in Rust and numpy,
    only for the columns asked for.

    Why: a batch's strings become Python objects only once per distinct
    value, instead of a term-index lookup per record or flattening the
    lists of a tag column into Python strings (measured, docs/benchmarks.md#design-converter).
    """
    import polars as pl

    out: dict[str, Callable[[], TermCodes | None]] = {}
    for path, s in leaves:
        dt = s.dtype
        if _is_text_dtype(dt):
            out[path] = functools.partial(_text_codes, s, "scalar")
        elif isinstance(dt, pl.List) and _is_text_dtype(dt.inner):
            out[path] = functools.partial(_text_codes, s, "list")
        elif dt.is_integer() and dt != pl.UInt64:
            out[path] = functools.partial(_int_codes, s)
    return out


def _text_codes(s: Any, kind: str) -> TermCodes | None:
    import polars as pl

    counts = None
    if kind == "list":
        counts = s.list.len().fill_null(0).to_numpy().astype(np.int64)
        s = s.explode(empty_as_null=False, keep_nulls=False)
        if s.null_count():
            return None  # null items: the vectorizer's per-value path decides
    s = s.cast(pl.String)
    uniq = s.unique(maintain_order=True).drop_nulls()
    codes = s.cast(pl.Enum(uniq)).to_physical().cast(pl.Int32).fill_null(-1).to_numpy()
    return TermCodes(kind, uniq.to_list(), codes, counts)


def _is_scalar_text_coder(make: Any) -> bool:
    """Whether a ``term_coders`` maker is ``_text_codes`` of a scalar string column."""
    return isinstance(make, functools.partial) and make.func is _text_codes and make.args[1] == "scalar"


def _scalar_text_codes(columns: list[Any]) -> list[TermCodes]:
    """``_text_codes(s, "scalar")`` of each series (the same values and codes), from one
    polars query for every column's distinct values and one for their codes."""
    import polars as pl

    frame = pl.DataFrame([s.cast(pl.String).alias(str(i)) for i, s in enumerate(columns)])
    names = frame.columns
    uniq = frame.select([pl.col(c).unique(maintain_order=True).drop_nulls().implode() for c in names])
    uniqs = [uniq.get_column(c)[0] for c in names]
    codes = frame.select([pl.col(c).cast(pl.Enum(u)).to_physical().cast(pl.Int32).fill_null(-1)
                          for c, u in zip(names, uniqs, strict=True)])
    return [TermCodes("scalar", u.to_list(), c.to_numpy()) for u, c in zip(uniqs, codes.get_columns(), strict=True)]


def _int_codes(s: Any) -> TermCodes:
    import polars as pl

    null = s.is_null().to_numpy()
    vals = s.cast(pl.Int64).fill_null(0).to_numpy()
    present = ~null
    uniq, first, inverse = np.unique(vals[present], return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # first-occurrence order
    rank = np.empty(order.size, dtype=np.int32)
    rank[order] = np.arange(order.size, dtype=np.int32)
    codes = np.full(vals.size, -1, dtype=np.int32)
    codes[present] = rank[inverse.reshape(-1)]
    return TermCodes("scalar", uniq[order].tolist(), codes)

