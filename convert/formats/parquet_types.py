"""How Parquet (Arrow) types map to recordprep's record model, which is the
model of the Avro reader: a Parquet record converts exactly as the same
record read from Avro.

The rule, per Arrow type of a column (at any depth):

==========================================  ====================================  =============================
Arrow type (as pyarrow reads the Parquet)   value in the record                   Avro-equivalent schema
==========================================  ====================================  =============================
bool, int8..int64, uint8..uint64            ``bool`` / ``int``                    boolean / int / long
float16, float32, float64                   ``float``                             float / double
string, large_string, string_view           ``str``                               string
binary, large_binary, fixed_size_binary     ``bytes``                             bytes / fixed
date32                                      days since 1970-01-01 (``int``)       int, ``date``
timestamp[s|ms|us|ns, any tz or none]       the raw integer in the column's unit  long, ``timestamp-*``
                                            (UTC-based; the zone does not move    (``local-timestamp-*``
                                            it)                                   without a zone)
time32[s|ms], time64[us|ns]                 the raw integer in its unit           int/long, ``time-*``
duration[unit]                              the raw integer in its unit           long
decimal128/256(p, s)                        the unscaled integer as big-endian    bytes, ``decimal(p, s)``
                                            two's complement bytes (fastavro's
                                            encoding of a ``bytes`` decimal)
dictionary<values>                          the decoded value                     the values' schema
struct                                      ``dict``                              record
list, large_list, fixed_size_list, views    ``list``                              array
map<K, V>                                   ``dict`` with ``str(key)`` keys       map
null                                        ``None``                              null
extension (``arrow.uuid``, ``arrow.json``)  its storage's value (16 ``bytes``,    its storage's schema
                                            ``str``)
==========================================  ====================================  =============================

Logical types stay raw integers for the reason the Avro reader keeps them
raw: Parquet timestamps reach years 0 and 10000 (and nanoseconds) that
``datetime`` cannot hold. A ``timestamp`` feature reads them with the
``unit`` of the column. Hive-style partition directories (``key=value/``)
above a file add ``key`` as a string field (``__HIVE_DEFAULT_PARTITION__``
is null), see ``partition_fields``.
"""

from __future__ import annotations

import posixpath
import urllib.parse
from typing import Any

import pyarrow as pa

#: Spark's and Hive's name for a null partition value.
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"

_UNIT_LOGICAL = {"ms": "millis", "us": "micros", "ns": "nanos"}

#: The unit INT96 timestamps are read in (``coerce_int96_timestamp_unit``).
INT96_UNIT = "us"

#: How deeply a Parquet schema's Arrow types may nest (structs, lists, maps,
#: each one level); the readers and ``infer`` recurse per level.
MAX_PARQUET_DEPTH = 100


def storage_type(t: pa.DataType) -> pa.DataType:
    """An extension type's storage type (``arrow.uuid``: ``fixed_size_binary[16]``,
    ``arrow.json``: string), other types unchanged."""
    while isinstance(t, pa.BaseExtensionType):
        t = t.storage_type
    return t


def is_list_type(t: pa.DataType) -> bool:
    """Every Arrow list type: list, large_list, fixed_size_list, list_view, large_list_view."""
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _children(t: pa.DataType) -> list[pa.Field]:
    t = storage_type(t)
    if pa.types.is_dictionary(t):
        return [pa.field("", t.value_type)]
    if pa.types.is_struct(t):
        return list(t)
    if pa.types.is_map(t):
        return [t.key_field, t.item_field]
    if is_list_type(t):
        return [t.value_field]
    return []


def schema_problem(schema: pa.Schema) -> str | None:
    """Why the records of ``schema`` cannot be read, or ``None``: a name twice in
    the columns or in one struct (at any depth), or nesting deeper than
    ``MAX_PARQUET_DEPTH``. Iterative, linear in the number of fields."""
    stack: list[tuple[str, str, list[pa.Field], int]] = [("", "", list(schema), 0)]
    while stack:
        column, where, fields, depth = stack.pop()
        if depth > MAX_PARQUET_DEPTH:
            return (f"the Parquet schema nests deeper than {MAX_PARQUET_DEPTH} levels (in the column {column!r}); "
                    "flatten the schema (nest fewer structs, lists and maps inside each other)")
        seen: set[str] = set()
        for f in fields:
            if f.name in seen:
                shown = where if len(where) <= 120 else f"{where[:60]}...{where[-50:]}"
                inside = f"the struct {shown!r}" if where else "the columns"
                return (f"the Parquet schema declares the field {f.name!r} twice in {inside}; a record holds one "
                        "value per name: rewrite the file with distinct field names")
            seen.add(f.name)
            kids = _children(f.type)
            if kids:
                stack.append((column or f.name, f"{where}.{f.name}" if where else f.name, kids, depth + 1))
    return None


def decimal_bytes(unscaled: int) -> bytes:
    """An unscaled decimal as fastavro writes a ``bytes`` decimal: big-endian
    two's complement, ``(|unscaled|.bit_length() + 8) // 8`` bytes."""
    return unscaled.to_bytes((abs(unscaled).bit_length() + 8) // 8, "big", signed=True)


def partition_fields(path: str) -> dict[str, str | None]:
    """The hive-style partition fields of a file: the directories directly above
    it named ``key=value`` (up to the first one that is not), outermost first,
    keys and values URL-unquoted as Hive and Spark escape them. Raises
    ``ValueError`` for a key named twice (``k=1/k=2/``) or an escape of bytes
    that are not UTF-8 (``%E9``: no string, and two such directories would
    read as one value)."""
    parts = posixpath.dirname(path.replace("\\", "/")).split("/")
    found: list[tuple[str, str | None]] = []
    for part in reversed(parts):
        key, eq, value = part.partition("=")
        if not eq or not key:
            break
        try:
            key, value = (urllib.parse.unquote(x, errors="strict") for x in (key, value))
        except UnicodeDecodeError:
            raise ValueError(f"the partition directory {part!r} escapes bytes that are not UTF-8 text; a partition "
                             "value is a string (Hive and Spark escape UTF-8): rename the directory") from None
        found.append((key, None if value == HIVE_NULL else value))
    out = dict(reversed(found))
    if len(out) != len(found):
        key = next(k for i, (k, _) in enumerate(found) if any(k == k2 for k2, _ in found[i + 1:]))
        raise ValueError(f"the partition directories name {key!r} twice ({key}=.../{key}=...); a record holds one "
                         "value per name: rename or flatten the directories")
    return out


def is_columnar_type(t: pa.DataType) -> bool:
    """Whether the fast path (``raw_array`` then polars) gives the reference
    path's values for this type: everything but maps (polars reads them as
    lists of key/value records, the record model has dicts)."""
    t = storage_type(t)
    if pa.types.is_map(t):
        return False
    if pa.types.is_dictionary(t):
        return is_columnar_type(t.value_type)
    if pa.types.is_struct(t):
        return all(is_columnar_type(t.field(i).type) for i in range(t.num_fields))
    if is_list_type(t):
        return is_columnar_type(t.value_type)
    return True


def raw_array(arr: pa.Array) -> pa.Array:
    """``arr`` with every logical type as its raw value (the table above), in
    types polars reads: dictionaries decoded, decimals as bytes, fixed-size
    binaries and lists as plain ones. Maps are not handled (``is_columnar_type``)."""
    t = arr.type
    if isinstance(t, pa.BaseExtensionType):
        return raw_array(arr.storage)
    if pa.types.is_dictionary(t):
        return raw_array(arr.dictionary_decode())
    if pa.types.is_timestamp(t) or pa.types.is_time64(t) or pa.types.is_duration(t) or pa.types.is_date64(t):
        return arr.cast(pa.int64())
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return arr.cast(pa.int32())
    if pa.types.is_decimal(t):
        return _decimal_raw(arr)
    if pa.types.is_float16(t):
        return arr.cast(pa.float32())
    if pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t):
        return arr.cast(pa.large_binary())
    if pa.types.is_string_view(t):
        return arr.cast(pa.large_string())
    if pa.types.is_struct(t):
        children = [raw_array(arr.field(i)) for i in range(t.num_fields)]
        fields = [pa.field(t.field(i).name, c.type) for i, c in enumerate(children)]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_fixed_size_list(t):
        return raw_array(arr.cast(pa.large_list(t.value_type)))
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return raw_array(_list_of_view(arr))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = arr.offsets if pa.types.is_large_list(t) else arr.offsets.cast(pa.int64())
        start, stop = offsets[0].as_py(), offsets[-1].as_py()
        values = raw_array(arr.values.slice(start, stop - start))
        rebased = pa.compute.subtract(offsets, pa.scalar(start, pa.int64()))
        return pa.LargeListArray.from_arrays(rebased, values, mask=arr.is_null() if arr.null_count else None)
    return arr


def _list_of_view(arr: pa.Array) -> pa.Array:
    """A list view as a large list of its items in order (pyarrow's cast of a
    sliced list view gives negative offsets)."""
    sizes = pa.compute.fill_null(pa.compute.list_value_length(arr), 0).cast(pa.int64())
    offsets = pa.concat_arrays([pa.array([0], pa.int64()), pa.compute.cumulative_sum(sizes)])
    return pa.LargeListArray.from_arrays(offsets, arr.flatten(), mask=arr.is_null() if arr.null_count else None)


def _decimal_raw(arr: pa.Array) -> pa.Array:
    """Decimals as ``decimal_bytes`` of their unscaled integers, read from the
    array's little-endian two's complement buffer (no ``Decimal`` objects)."""
    width = arr.type.byte_width
    buf = memoryview(arr.buffers()[1])[arr.offset * width:(arr.offset + len(arr)) * width]
    valid = arr.is_valid().to_pylist() if arr.null_count else None
    out = [decimal_bytes(int.from_bytes(buf[i * width:(i + 1) * width], "little", signed=True))
           if valid is None or valid[i] else None for i in range(len(arr))]
    return pa.array(out, pa.large_binary())


def avro_schema(schema: pa.Schema, partitions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Avro record schema whose records the Parquet schema's records convert
    like (the table above), with partition fields as nullable strings: what
    ``infer`` and the config check read a Parquet file's fields from."""
    names = _Names()
    fields = [{"name": f.name, "type": _field_type(f, names, f.name)} for f in schema]
    fields += [{"name": k, "type": ["null", "string"]} for k in (partitions or {})]
    return {"type": "record", "name": "parquet_record", "fields": fields}


class _Names:
    """Unique Avro names for the records and fixeds of one schema."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def make(self, path: str) -> str:
        base = "".join(c if c.isalnum() else "_" for c in path) or "field"
        name, i = base if not base[0].isdigit() else f"_{base}", 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


def _field_type(f: pa.Field, names: _Names, path: str) -> Any:
    t = _avro_type(f.type, names, path)
    return ["null", t] if f.nullable and t != "null" else t


def _avro_type(t: pa.DataType, names: _Names, path: str) -> Any:
    t = storage_type(t)
    if pa.types.is_dictionary(t):
        return _avro_type(t.value_type, names, path)
    simple = _simple_avro_type(t)
    if simple is not None:
        return simple
    if pa.types.is_fixed_size_binary(t):
        return {"type": "fixed", "name": names.make(path), "size": t.byte_width}
    if pa.types.is_decimal(t):
        return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
    if pa.types.is_struct(t):
        return {"type": "record", "name": names.make(path),
                "fields": [{"name": c.name, "type": _field_type(c, names, f"{path}.{c.name}")} for c in t]}
    if pa.types.is_map(t):
        return {"type": "map", "values": _field_type(t.item_field, names, f"{path}.value")}
    if is_list_type(t):
        return {"type": "array", "items": _field_type(t.value_field, names, f"{path}.item")}
    raise TypeError(f"field {path!r}: the Parquet/Arrow type {t} has no record form; "
                    "cast the column to a supported type (docs/converting.md#parquet) when writing the file")


def _simple_avro_type(t: pa.DataType) -> Any:
    """The Avro type of a scalar Arrow type, ``None`` for the others."""
    checks = ((pa.types.is_null, "null"), (pa.types.is_boolean, "boolean"), (pa.types.is_float16, "float"),
              (pa.types.is_float32, "float"), (pa.types.is_float64, "double"),
              (lambda x: pa.types.is_string(x) or pa.types.is_large_string(x) or pa.types.is_string_view(x), "string"),
              (lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x) or pa.types.is_binary_view(x), "bytes"))
    for test, name in checks:
        if test(t):
            return name
    if pa.types.is_integer(t):
        return "int" if t.bit_width < 32 or t in (pa.int32(),) else "long"
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_date64(t) or pa.types.is_duration(t):
        return "long"
    if pa.types.is_timestamp(t):
        if t.unit == "s":
            return "long"
        local = "" if t.tz else "local-"
        return {"type": "long", "logicalType": f"{local}timestamp-{_UNIT_LOGICAL[t.unit]}"}
    if pa.types.is_time32(t) or pa.types.is_time64(t):
        if t.unit in ("ms", "us"):
            return {"type": "int" if t.unit == "ms" else "long", "logicalType": f"time-{_UNIT_LOGICAL[t.unit]}"}
        return "int" if t.unit == "s" else "long"
    return None
