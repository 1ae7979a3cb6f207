"""The Avro fast path: polars decodes whole blocks into columns
(``ColumnRecords``) for the schemas and codecs of ``columnar_schema``'s
whitelist; a block polars cannot read goes back to the fastavro path
(``convert.sources.iter_avro``).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Generator
from typing import IO, Any

import numpy as np

from convert.column_records import ColumnRecords, term_coders
from convert.columns import ListArray, NumericArray, ScalarArray
from convert.formats.avro_framing import (
    SYNC_SIZE,
    block_expands_past,
    block_too_big,
    inflate_blocks,
    null_codec_header,
    read_raw_block,
)
from convert.source_types import (
    DEFAULT_MAX_BLOCK_BYTES,
    MAX_AVRO_BLOCK_BYTES,
    InputFileError,
    RecordBatch,
)

_log = logging.getLogger("recordprep")



COLUMNAR_CODECS = frozenset({"null", "deflate", "snappy"})
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


def columnar_schema(schema: Any) -> bool:
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



def _has_list(dtype: Any) -> bool:
    """Whether a polars type holds a list at some depth."""
    import polars as pl

    if isinstance(dtype, pl.List):
        return True
    return isinstance(dtype, pl.Struct) and any(_has_list(f.dtype) for f in dtype.fields)


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
    coders = term_coders(leaves)
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


def iter_avro_columnar(f: IO[bytes], path: str, header: bytes, sync: bytes, pos: int, end: int | None,
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
    # deflate blocks are inflated here and read by polars as the null codec (``inflate_blocks``)
    inflated_header = null_codec_header(header) if codec == "deflate" else None
    while end is None or pos < end:
        chunk_start = pos
        blocks: list[tuple[int, bytes, int]] = []
        offsets, counts = [], []
        n = 0
        while n < batch_size and (end is None or pos < end):
            block = read_raw_block(f, sync, max_block_bytes if codec == "null" else MAX_AVRO_BLOCK_BYTES)
            if block is None:
                break
            body = memoryview(block[1])[block[2]:-SYNC_SIZE]  # (no copy)
            if block_expands_past(codec, body, len(body), max_block_bytes) is not None:
                too_big = block_too_big(f, path, first_block, pos, max_block_bytes)
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
                data = b"".join([inflated_header, *inflate_blocks(blocks)])
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
