"""The Parquet reference path: each record built value by value from Arrow
scalars, by the mapping of ``convert.formats.parquet_types`` (written independently
of the fast path's array casts, so the property tests compare two
implementations). The reader uses it for schemas the fast path does not
take (maps) and when ``avro_decoder="fastavro"`` asks for the reference
decoders.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from convert.formats.parquet_types import decimal_bytes, is_list_type

#: Types whose scalar's ``.value`` is the raw integer of the record model.
_RAW_INTEGER_TESTS = (pa.types.is_timestamp, pa.types.is_date32, pa.types.is_date64, pa.types.is_time32,
                      pa.types.is_time64, pa.types.is_duration)


def record_value(s: pa.Scalar) -> Any:
    """The record model's value of one Arrow scalar (``convert.formats.parquet_types``)."""
    if not s.is_valid:
        return None
    t = s.type
    if isinstance(t, pa.BaseExtensionType):  # arrow.uuid, arrow.json: the storage's value
        return record_value(s.value)
    if pa.types.is_dictionary(t):
        return record_value(s.value)
    if any(test(t) for test in _RAW_INTEGER_TESTS):
        return _raw_integer(s)
    if pa.types.is_decimal(t):
        sign, digits, exp = s.as_py().as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * 10 ** (exp + t.scale)
        return decimal_bytes(-unscaled if sign else unscaled)
    if pa.types.is_struct(t):
        return {t.field(i).name: record_value(s[i]) for i in range(t.num_fields)}
    if pa.types.is_map(t):
        return {str(record_value(k)): record_value(v) for k, v in _map_items(s)}
    if is_list_type(t):
        return [record_value(x) for x in s.values]
    if pa.types.is_float16(t):
        return float(s.as_py())
    return s.as_py()


def _raw_integer(s: pa.Scalar) -> int:
    """The stored integer of a temporal scalar: its ``.value`` where pyarrow has
    one, else the scalar cast to its storage width."""
    value = getattr(s, "value", None)
    if isinstance(value, int):
        return value
    width = pa.int32() if pa.types.is_date32(s.type) or pa.types.is_time32(s.type) else pa.int64()
    return s.cast(width).as_py()


def _map_items(s: pa.Scalar) -> list[tuple[pa.Scalar, pa.Scalar]]:
    entries = s.values
    if entries is None:
        return []
    return list(zip(entries.field(0), entries.field(1), strict=True))


def table_records(table: pa.Table, extra: dict[str, Any] | None = None,
                  memo: dict | None = None) -> list[dict[str, Any]]:
    """Every row of ``table`` as a record dict, ``extra`` fields (partitions) appended.

    With ``memo`` (kept by the caller for the tables of one row group), each
    value of a dictionary column is built once, and the records using it
    share that object: a large value repeated in many rows takes its size once.
    """
    names = table.column_names
    columns = [table.column(i) for i in range(table.num_columns)]
    shared = [_dictionary_values(col, name, memo) if memo is not None else None
              for name, col in zip(names, columns, strict=True)]
    tail = list((extra or {}).items())
    out = []
    for r in range(table.num_rows):
        rec = {name: record_value(col[r]) if values is None else values[r]
               for name, col, values in zip(names, columns, shared, strict=True)}
        rec.update(tail)
        out.append(rec)
    return out


def _dictionary_values(col: pa.ChunkedArray, name: str, memo: dict) -> list[Any] | None:
    """Each row's value of a dictionary column, each dictionary entry built once
    (``memo``: the entries built, keyed by column and dictionary buffers);
    ``None`` for other columns."""
    if not pa.types.is_dictionary(col.type):
        return None
    out: list[Any] = []
    for chunk in col.chunks:
        d = chunk.dictionary
        key = (name, len(d), *(b.address if b is not None else 0 for b in d.buffers()))
        _, built = memo.setdefault(key, (d, {}))  # (d: keeps the buffers, so their addresses, alive)
        for idx in chunk.indices.to_pylist():
            if idx is None:
                out.append(None)
                continue
            if idx not in built:
                built[idx] = record_value(d[idx])
            out.append(built[idx])
    return out
