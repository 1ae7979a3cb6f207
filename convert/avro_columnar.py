"""The Avro fast path: polars decodes whole blocks into columns
(``ColumnRecords``) for the schemas and codecs of ``_columnar_schema``'s
whitelist; a block polars cannot read goes back to the fastavro path
(``convert.sources.iter_avro``).
"""

from __future__ import annotations

import functools
import io
import itertools
import logging
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import IO, Any

import numpy as np

from convert.avro_framing import (
    _SYNC_SIZE,
    _block_expands_past,
    _block_too_big,
    _inflate_blocks,
    _null_codec_header,
    _read_raw_block,
)
from convert.columns import ListArray, NumericArray, ScalarArray, TermCodes
from convert.source_types import (
    DEFAULT_MAX_BLOCK_BYTES,
    MAX_AVRO_BLOCK_BYTES,
    InputFileError,
    RecordBatch,
)

_log = logging.getLogger("recordprep")


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


_COLUMNAR_CODECS = frozenset({"null", "deflate", "snappy"})
_COLUMNAR_PRIMITIVES = frozenset({"boolean", "int", "long", "float", "double", "string", "bytes"})
#: Logical types polars decodes that cast back to fastavro's raw values exactly.
_COLUMNAR_LOGICAL = frozenset({("long", "timestamp-millis"), ("long", "timestamp-micros"),
                               ("int", "date"), ("string", "uuid")})


#: Most record fields (at any depth) a schema may have for the polars path:
#: polars' Avro reader costs more per value, in time and memory, the more
#: fields a record has; past about a thousand fastavro is faster and smaller.
_COLUMNAR_MAX_FIELDS = 1000


def _field_count(schema: Any) -> int:
    """How many record fields ``schema`` declares at any depth (no recursion)."""
    n, stack = 0, [schema]
    while stack:
        s = stack.pop()
        if isinstance(s, dict):
            if isinstance(s.get("fields"), list):
                n += len(s["fields"])
            stack.extend(v for v in s.values() if isinstance(v, dict | list))
        elif isinstance(s, list):
            stack.extend(s)
    return n


def _columnar_schema(schema: Any) -> bool:
    """Whether polars decodes records of this writer schema to fastavro's values
    (and is the faster decoder: not past ``_COLUMNAR_MAX_FIELDS`` fields).

    A whitelist, each entry covered by ``tests/test_convert_sources_columnar.py``:
    a top-level record with fields of primitives, fixed, nested records,
    arrays, ``[null, T]`` unions, the logical types that cast back to their
    raw integers, and enums as top-level fields. Left out, from trying polars
    2.1: enums anywhere else (a Rust panic), maps, unions of several branches,
    named-type references and recursive schemas (not decoded), ``null``
    fields (not implemented), records with no fields (decoded as zero rows),
    ``time-millis`` of 24:00 (silently null), decimals and the other logical
    types (other values).
    """
    return (isinstance(schema, dict) and schema.get("type") == "record" and _field_count(schema) <= _COLUMNAR_MAX_FIELDS
            and _columnar_type(schema, 0, top=True))


def _columnar_type(schema: Any, depth: int, enum_ok: bool = False, top: bool = False) -> bool:
    """``top``: the file's record, whose fields may be enums."""
    if depth > 32:
        return False
    if isinstance(schema, str):
        return schema in _COLUMNAR_PRIMITIVES
    if isinstance(schema, list):
        if len(schema) != 2 or schema.count("null") != 1:
            return False
        other = schema[1] if schema[0] == "null" else schema[0]
        return not isinstance(other, list) and _columnar_type(other, depth + 1)
    if not isinstance(schema, dict):
        return False
    t, logical = schema.get("type"), schema.get("logicalType")
    if logical is not None:
        return (t, logical) in _COLUMNAR_LOGICAL
    if t in _COLUMNAR_PRIMITIVES:
        return True
    if t == "record":
        fields = schema.get("fields")
        return bool(fields) and all(isinstance(x, dict) and _columnar_type(x.get("type"), depth + 1, enum_ok=top)
                                    for x in fields)
    if t == "array":
        return _columnar_type(schema.get("items"), depth + 1)
    if t == "enum":
        return enum_ok
    return t == "fixed"


def _raw_dtype(dtype: Any) -> Any:
    """The polars type holding fastavro's raw value of a logical type."""
    import polars as pl

    if isinstance(dtype, pl.Datetime):
        return pl.Int64
    if dtype == pl.Date:
        return pl.Int32
    if isinstance(dtype, pl.Struct):
        return pl.Struct({x.name: _raw_dtype(x.dtype) for x in dtype.fields})
    if isinstance(dtype, pl.List):
        return pl.List(_raw_dtype(dtype.inner))
    return dtype


def _leaves(df: Any) -> list[tuple[str, Any]]:
    """``(path, series)`` for every column of ``df``, and for every scalar (not
    list, not record) field of its record columns, at any depth, under its
    dotted path (``user.segment``), null where a record is.

    Why: a feature reading ``user.segment`` then takes the field as numpy or
    codes like a top-level column, and the records of ``user`` are never
    built as Python dicts (docs/benchmarks.md#design-converter).
    """
    import polars as pl

    out: list[tuple[str, Any]] = []
    stack: list[tuple[str, Any, bool]] = [(s.name, s, False) for s in reversed(df.get_columns())]
    while stack:
        path, s, nested = stack.pop()
        if isinstance(s.dtype, pl.Struct):
            # polars' struct.field is null where the record is (the tests check it)
            stack.extend((f"{path}.{f.name}", s.struct.field(f.name), True) for f in reversed(s.dtype.fields))
            if nested:
                continue  # a record inside a record: only its fields
        elif nested and isinstance(s.dtype, pl.List):
            continue  # a list inside a record: read from the record's values
        out.append((path, s))
    return out


def _numeric_arrays(leaves: list[tuple[str, Any]]) -> dict[str, NumericArray]:
    """Integer and float columns among a batch's ``leaves`` (``_leaves``) as
    ``ScalarArray``, lists of them without null items as ``ListArray``: what the vectorizer's numeric fast paths build from Python lists,
    made in Rust (the same float64 values: both round integers to the nearest
    double)."""
    import polars as pl

    out: dict[str, NumericArray] = {}
    for path, s in leaves:
        dt = s.dtype
        if dt.is_integer() or dt.is_float():
            # is_null is a polars expression (a measurable cost per call): skipped when there is none
            null = s.is_null().to_numpy() if s.null_count() else np.zeros(len(s), dtype=bool)
            out[path] = ScalarArray(s.cast(pl.Float64).to_numpy(), null)
        elif isinstance(dt, pl.List) and (dt.inner.is_integer() or dt.inner.is_float()):
            flat = s.explode(empty_as_null=False, keep_nulls=False)
            if flat.null_count() == 0:
                out[path] = ListArray(flat.cast(pl.Float64).to_numpy(),
                                      s.list.len().fill_null(0).to_numpy().astype(np.int64), s.is_null().to_numpy())
    return out


def _path_leaf(s: Any, steps: tuple, n: int) -> tuple[Any, np.ndarray, np.ndarray] | None:
    """``ColumnRecords.path_leaf`` of the column ``s`` (None: no such list column) and the steps after its name."""
    import polars as pl

    from convert.config import EACH

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


def _has_list(dtype: Any) -> bool:
    """Whether a polars type holds a list at some depth."""
    import polars as pl

    if isinstance(dtype, pl.List):
        return True
    return isinstance(dtype, pl.Struct) and any(_has_list(f.dtype) for f in dtype.fields)


def _is_text_dtype(dtype: Any) -> bool:
    import polars as pl

    return dtype == pl.String or isinstance(dtype, pl.Categorical | pl.Enum)


def _term_coders(leaves: list[tuple[str, Any]]) -> dict[str, Callable[[], TermCodes | None]]:
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
    """Whether a ``_term_coders`` maker is ``_text_codes`` of a scalar string column."""
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


def _json_ready(expr: Any, dtype: Any) -> Any:
    """``expr`` (of polars type ``dtype``) as the values ``convert.splits._canonical``
    serializes: struct fields in sorted order, float32 as the float64 Python
    holds, bytes as their hex (its ``default``), enums as their symbol."""
    import polars as pl

    if isinstance(dtype, pl.Struct):
        fields = pl.struct([_json_ready(expr.struct.field(f.name), f.dtype).alias(f.name)
                            for f in sorted(dtype.fields, key=lambda f: f.name)])
        return pl.when(expr.is_null()).then(None).otherwise(fields)  # a new struct is never null
    if isinstance(dtype, pl.List):
        return expr.list.eval(_json_ready(pl.element(), dtype.inner)) if _json_differs(dtype.inner) else expr
    if dtype == pl.Float32:
        return expr.cast(pl.Float64)
    if dtype == pl.Binary:
        return expr.bin.encode("hex")
    if isinstance(dtype, pl.Enum | pl.Categorical):
        return expr.cast(pl.String)
    return expr


def _json_differs(dtype: Any) -> bool:
    """Whether ``_json_ready`` changes values of ``dtype``."""
    import polars as pl

    if isinstance(dtype, pl.List):
        return _json_differs(dtype.inner)
    return isinstance(dtype, pl.Struct | pl.Enum | pl.Categorical) or dtype in (pl.Float32, pl.Binary)


def _records_json(df: Any) -> list[bytes]:
    """Each row's canonical JSON, as ``convert.splits._canonical`` makes it from
    the row's dict (keys sorted at every level), made by polars in Rust.

    Why: the whole-record split hashes these bytes, and building them with
    orjson first needs every record as a Python dict (docs/benchmarks.md#design-converter).
    polars and orjson both write shortest round-trip floats, ``null``
    for NaN and infinities and the same string escapes; tests compare the two
    on every whitelisted type, random schemas, real files and random floats
    and strings.
    """
    import polars as pl

    schema = df.schema  # once: each ``df.schema`` builds the whole schema
    row = pl.struct([_json_ready(pl.col(c), schema[c]).alias(c) for c in sorted(schema)])
    return df.select(row.struct.json_encode().cast(pl.Binary)).to_series().to_list()


def _decode_avro_blocks(pl: Any, data: bytes, n: int, path: str, record_json: bool) -> ColumnRecords:
    """The ``n`` records of a small Avro file (a header and whole blocks), decoded
    by polars (the module ``pl``) into columns; raises whatever polars raises on
    blocks it cannot read."""
    df = pl.read_avro(io.BytesIO(data))
    if df.height != n or df.width == 0:
        raise ValueError(f"decoded {df.height} records x {df.width} fields, the blocks hold {n}")
    raw = {c: _raw_dtype(t) for c, t in df.schema.items()}
    if any(raw[c] != t for c, t in df.schema.items()):
        df = df.cast(raw)
    return frame_records(df, path, record_json)


def frame_records(df: Any, path: str, record_json: bool) -> ColumnRecords:
    """A polars DataFrame of raw values (logical types already as their raw
    integers) as ``ColumnRecords``: numeric arrays, term codes, deferred
    columns and, with ``record_json``, each row's canonical JSON. Shared by
    the Avro and the Parquet fast paths, so both hand over the same columns."""
    import polars as pl

    n = df.height
    leaves = _leaves(df)  # once: each record field is a polars call
    arrays = _numeric_arrays(leaves)
    coders = _term_coders(leaves)
    # Columns go to the vectorizer as arrays and codes where they can:
    # the lists of these, and of record columns, are made only if asked for.
    # (each ``df.schema``, ``df.columns`` or ``get_column`` call walks every column: once here)
    series = df.get_columns()
    lists = {s.name: s for s in series if _has_list(s.dtype)}  # paths through lists (path_leaf)
    deferred = {s.name: s.to_list for s in series
                if s.name in arrays or s.name in coders or s.name in lists or isinstance(s.dtype, pl.Struct)}
    columns = {s.name: None if s.name in deferred else s.to_list() for s in series}
    texts = None
    if record_json:
        try:
            texts = _records_json(df)
        except Exception as e:  # the split makes them from the records instead
            _log.debug("%s: no record JSON from polars (%s: %s)", path, type(e).__name__, e)
    del df, series  # their Arrow buffers are not kept while the batch is processed (deferred columns keep theirs)
    return ColumnRecords(columns, n, arrays, texts, deferred, coders, lists)


def _iter_avro_columnar(f: IO[bytes], path: str, header: bytes, sync: bytes, pos: int, end: int | None,
                        batch_size: int, record_json: bool = False, codec: str = "null",
                        max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                        first_block: int = 0) -> Generator[RecordBatch, None, int | None]:
    """The Avro fast path: whole blocks of ``[pos, end)`` decoded by polars, a
    batch at a time (the file's header plus the batch's raw blocks make a small
    Avro file; deflate blocks inflated by zlib-ng behind a null-codec header). Returns ``None`` when the range is done, or the offset of the
    first block it could not decode: the fastavro path goes on from there and
    reports what is wrong, so nothing is read twice or lost. A block that
    decompresses past ``max_block_bytes`` (``codec`` is the file's) is checked
    before polars sees it: the blocks before it are yielded, then
    ``InputFileError`` (``first_block``: the file's first block, to number it).

    Why: polars decodes in Rust, several times fastavro's rate (docs/benchmarks.md#design-converter),
    and hands over columns (``ColumnRecords``), which is the form the
    vectorizer works on.
    """
    import polars as pl  # only in processes that decode Avro

    too_big: InputFileError | None = None
    # deflate blocks are inflated here and read by polars as the null codec (``_inflate_blocks``)
    inflated_header = _null_codec_header(header) if codec == "deflate" else None
    while end is None or pos < end:
        chunk_start = pos
        blocks: list[tuple[int, bytes, int]] = []
        offsets, counts = [], []
        n = 0
        while n < batch_size and (end is None or pos < end):
            block = _read_raw_block(f, sync, max_block_bytes if codec == "null" else MAX_AVRO_BLOCK_BYTES)
            if block is None:
                break
            body = memoryview(block[1])[block[2]:-_SYNC_SIZE]  # (no copy)
            if _block_expands_past(codec, body, len(body), max_block_bytes) is not None:
                too_big = _block_too_big(f, path, first_block, pos, max_block_bytes)
                break
            offsets.append(pos)
            counts.append(block[0])
            blocks.append(block)
            n += block[0]
            pos += len(block[1])
        if too_big is not None and not counts:
            raise too_big
        if not counts:  # end of file, or a block only fastavro can judge
            f.seek(chunk_start)
            return chunk_start
        if n == 0:
            if too_big is not None:
                raise too_big
            continue
        try:
            if inflated_header is not None:
                data = b"".join([inflated_header, *_inflate_blocks(blocks)])
            else:
                data = b"".join([header, *(b[1] for b in blocks)])
            records = _decode_avro_blocks(pl, data, n, path, record_json)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as e:  # noqa: BLE001 - polars' Rust panics are BaseExceptions
            _log.debug("%s: the Avro fast path stops at byte %d (%s: %s); fastavro goes on",
                       path, chunk_start, type(e).__name__, e)
            f.seek(chunk_start)
            return chunk_start
        rec_offsets: list[int] = []
        indexes: list[int] = []
        for off, c in zip(offsets, counts, strict=True):
            rec_offsets.extend([off] * c)
            indexes.extend(range(c))
        del data
        blocks.clear()
        yield RecordBatch(path, "avro", records, rec_offsets, indexes)
        if too_big is not None:
            raise too_big
    return None
