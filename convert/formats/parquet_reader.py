"""Reading Parquet input into batches of records.

A Parquet file's unit of work is its row group, as an Avro file's is its
block: a byte range ``[start, end)`` owns every row group whose first page
starts in it (``row_group_offsets``), so ranges of one file are read by
different workers with no record read twice or lost. ``RecordBatch.offsets``
holds the row group's byte offset and ``indexes`` the row's position in its
row group; errors name the file, the row group and, where one column is at
fault, the field.

Two paths give the same records (``convert.formats.parquet_types`` says which
values): the fast path reads a batch as Arrow arrays, casts logical types to
their raw values (``raw_array``) and hands polars' columns over as
``ColumnRecords``, the form the Avro fast path gives; the reference path
(``convert.formats.parquet_records``) builds each record value by value. The fast
path takes every schema without maps; a batch it fails on is read by the
reference path.

Nothing pyarrow may abort on runs on a file before ``_open`` has checked it:
encrypted files, and footers not proven free of encryption, are refused from
the raw footer before pyarrow parses it (``convert.formats.parquet_footer``),
schemas by ``convert.formats.parquet_types.schema_problem``. pyarrow reads as
many rows as the footer says, so a row group's rows are proven by the
footer's value counts and by one column chunk's page headers
(``_check_row_group``, ``_check_pages``, ``_check_rows``). Memory is bounded
by the decoded size of a batch, not by what the footer claims
(``_bounded``), and only the columns a run reads are decoded (``columns``).
"""

from __future__ import annotations

import functools
import logging
import re
import sys
from collections.abc import Collection, Iterator
from typing import IO, Any

# A local conversion's processes mark pyarrow absent (``sys.modules[name] = None``, as where it is
# not installed) so that Beam skips its optional Arrow support (pipelines/local/worker.py); reading
# Parquet needs it, so the mark is lifted when a Parquet file is first met.
for _name in ("pyarrow", "pyarrow_hotfix"):
    if _name in sys.modules and sys.modules[_name] is None:
        del sys.modules[_name]

import pyarrow as pa  # noqa: E402 - after the mark is lifted
import pyarrow.compute as pc  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from convert.formats.parquet import PARQUET_MAGIC  # noqa: E402
from convert.formats.parquet_footer import (  # noqa: E402
    ENCRYPTED_MAGIC,
    PageError,
    chunk_slack,
    encryption,
    page_counts,
)
from convert.formats.parquet_records import table_records  # noqa: E402
from convert.formats.parquet_types import (  # noqa: E402
    INT96_UNIT,
    avro_schema,
    is_columnar_type,
    is_list_type,
    partition_fields,
    raw_array,
    schema_problem,
    storage_type,
)
from convert.source_types import (  # noqa: E402
    DEFAULT_MAX_BLOCK_BYTES,
    InputFileError,
    RecordBatch,
    mb,
    quoted,
)

__all__ = ["iter_parquet", "read_parquet_schema", "row_group_offsets"]

_log = logging.getLogger("recordprep")

#: ``_repeats``: a batch whose dictionary values take this many bytes a row is read by the reference
#: path, its records sharing the values (the cost of a Python value is small beside this size).
_SHARED_VALUE_BYTES = 64 << 10

class _ParquetFile(pq.ParquetFile):
    """``pq.ParquetFile`` whose schemas and metadata are built once: pyarrow
    builds them again at each access, in time linear in the columns."""

    @functools.cached_property
    def schema_arrow(self) -> pa.Schema:
        return super().schema_arrow

    @functools.cached_property
    def metadata(self) -> pq.FileMetaData:
        return super().metadata

    @functools.cached_property
    def schema(self) -> pq.ParquetSchema:
        return super().schema


def _open(f: IO[bytes], path: str) -> pq.ParquetFile:
    """The file, its footer read and its schema checked. pyarrow parses the
    footer only after ``encryption`` has walked it (pyarrow aborts the process
    on an encrypted column chunk's metadata)."""
    f.seek(0)
    head = f.read(4)
    if head == ENCRYPTED_MAGIC:
        _refuse_encrypted(path, "footer")
    if head != PARQUET_MAGIC:
        raise InputFileError(path, "not a Parquet file (it does not start with PAR1); check the file", 0)
    _refuse_encrypted(path, encryption(f))
    try:
        pf = _ParquetFile(f, coerce_int96_timestamp_unit=INT96_UNIT)
        pf.metadata  # noqa: B018 - parsed here, so that a bad footer is named as such
    except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ... for bad footers
        raise InputFileError(path, f"not a readable Parquet file ({quoted(e)}); its footer or schema is "
                                   "damaged, or the file is incomplete (writers write the footer last)", 0) from e
    problem = schema_problem(pf.schema_arrow)
    if problem is not None:
        raise InputFileError(path, problem, 0)
    return pf


def _refuse_encrypted(path: str, encrypted: str | None) -> None:
    if encrypted == "unreadable":
        raise InputFileError(path, "not a readable Parquet file (its footer is not the Thrift FileMetaData Parquet "
                                   "readers read); the footer is damaged, or the file is incomplete", 0)
    if encrypted is not None:
        what = "its footer is encrypted" if encrypted == "footer" else "some of its columns are encrypted"
        raise InputFileError(path, f"an encrypted Parquet file ({what}); recordprep reads no encrypted Parquet: "
                                   "decrypt it (rewrite it without encryption) first", 0)


def _partitions(path: str, pf: pq.ParquetFile) -> dict[str, str | None]:
    """The partition fields; one whose key names a column, or a field inside
    one (``u.id=7/`` beside a struct ``u``), is refused: a record cannot hold both."""
    try:
        parts = partition_fields(path)
    except ValueError as e:
        raise InputFileError(path, str(e), 0) from None
    names = set(pf.schema_arrow.names)
    clash = next((k for k in parts if k in names or re.split(r"[.\[]", k, maxsplit=1)[0] in names), None)
    if clash is not None:
        raise InputFileError(path, f"the partition directory {clash}=... names a field the file also holds as a "
                                   "column; rename the directory or drop the column", 0)
    return parts


def row_group_offsets(pf: pq.ParquetFile) -> list[int]:
    """Each row group's byte offset: where its first column chunk's first page
    (dictionary page if any) starts."""
    md = pf.metadata
    out = []
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        starts = []
        for j in range(rg.num_columns):
            c = rg.column(j)
            starts.append(c.data_page_offset)
            if c.has_dictionary_page and c.dictionary_page_offset:
                starts.append(c.dictionary_page_offset)
        out.append(min(starts) if starts else 4)
    return out


def read_parquet_schema(f: IO[bytes], path: str) -> dict[str, Any]:
    """The Avro-equivalent record schema of a Parquet file's records
    (``convert.formats.parquet_types.avro_schema``), partition fields included: what
    ``infer`` and the config check read its fields from."""
    pf = _open(f, path)
    try:
        return avro_schema(pf.schema_arrow, _partitions(path, pf))
    except TypeError as e:
        raise InputFileError(path, str(e), 0) from e


def iter_parquet(f: IO[bytes], path: str, start: int = 0, end: int | None = None, batch_size: int = 4096,
                 decoder: str = "auto", record_json: bool = False,
                 max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
                 columns: Collection[str] | None = None) -> Iterator[RecordBatch]:
    """Yield batches of the records of the row groups starting in ``[start, end)``.

    ``decoder``: ``"auto"`` (the fast path where the schema allows) or
    ``"fastavro"`` (the name of the reference decoders: the per-record path).
    ``columns``: the top-level columns to decode (the others are left out of
    the records); ``None`` decodes every column. A batch decodes to at most
    ``max_block_bytes`` (a larger one is split, counting a dictionary's value
    once per row that uses it, before it is copied into each). A row group
    that cannot be decoded, one of whose column chunks claims more than
    ``max_block_bytes`` decompressed or holds other than one value per row
    (not repeated), whose footer understates its rows (``_check_rows``) or
    states other rows than its pages hold (``_check_pages``), or a record
    over ``max_block_bytes``, ends the range: the
    records before it are yielded, then ``InputFileError`` names the file,
    the row group and the column.
    """
    pf = _open(f, path)
    parts = _partitions(path, pf)
    schema = pf.schema_arrow
    names = [n for n in schema.names if columns is None or n in columns]
    leaves = _leaf_columns(pf, names)
    fast = (decoder == "auto" and bool(names) and "" not in names  # polars renames a column ""
            and all(is_columnar_type(schema.field(n).type) for n in names))
    reader = _dictionary_reader(f, pf, names, leaves)
    offsets = row_group_offsets(pf)
    data_end = _check_offsets(f, path, pf, offsets)
    counted = _counted_leaves(pf, leaves)
    probe = _row_probe(pf, counted)
    flat = [j for j in range(pf.metadata.num_columns) if pf.schema.column(j).max_repetition_level == 0]
    for i, off in enumerate(offsets):
        if off < start or (end is not None and off >= end):
            continue
        _check_row_group(pf, path, i, off, max_block_bytes, leaves, counted)
        held = _check_pages(f, pf, path, i, off, data_end, flat)
        row, levels, memo = 0, 0, {}  # memo: the dictionary values built, for this row group's batches
        try:
            for rb in reader.iter_batches(batch_size, row_groups=[i], columns=names, use_threads=False):
                if probe in names:
                    levels += _first_leaf_levels(rb.column(probe))
                for piece in _bounded(rb, path, i, off, row, max_block_bytes):
                    yield _batch(piece, path, parts, fast and not _repeats(piece), record_json, off, row, memo)
                    row += piece.num_rows
            if probe is not None and probe not in names:
                levels = sum(_first_leaf_levels(rb.column(0)) for rb in
                             reader.iter_batches(batch_size, row_groups=[i], columns=[probe], use_threads=False))
        except InputFileError:
            raise
        except Exception as e:
            raise _row_group_error(pf, path, i, off, row, e, names) from e
        _check_rows(pf, path, i, off, row, None if probe is None else levels, held)


def _leaf_counts(t: pa.DataType) -> int:
    """How many Parquet leaf columns (column chunks) hold a column of Arrow type ``t``."""
    t = storage_type(t)
    if pa.types.is_struct(t):
        return sum(_leaf_counts(c.type) for c in t)
    if pa.types.is_map(t):
        return _leaf_counts(t.key_type) + _leaf_counts(t.item_type)
    if is_list_type(t):
        return _leaf_counts(t.value_type)
    return 1


def _leaf_columns(pf: pq.ParquetFile, names: list[str]) -> list[int]:
    """The indexes of the leaf columns of the top-level columns ``names``."""
    wanted = set(names)
    out, j = [], 0
    for field in pf.schema_arrow:
        n = _leaf_counts(field.type)
        if field.name in wanted:
            out.extend(range(j, j + n))
        j += n
    return out if j == pf.metadata.num_columns else list(range(pf.metadata.num_columns))


def _dictionary_reader(f: IO[bytes], pf: pq.ParquetFile, names: list[str], leaves: list[int]) -> pq.ParquetFile:
    """``pf``, or the same file reading its dictionary-encoded top-level string
    and binary columns as dictionaries, so that ``_bounded`` sizes a batch
    before a value that many rows use is copied into each."""
    md = pf.metadata
    if not md.num_row_groups:
        return pf
    rg = md.row_group(0)
    leaf_of = {pf.schema.column(j).path: j for j in leaves}
    dicts = [n for n in names if n in leaf_of and rg.column(leaf_of[n]).has_dictionary_page
             and _is_bytes(storage_type(pf.schema_arrow.field(n).type))]
    if not dicts:
        return pf
    return _ParquetFile(f, metadata=md, read_dictionary=dicts, coerce_int96_timestamp_unit=INT96_UNIT)


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t))


def _decoded_size(col: pa.Array) -> int:
    """The bytes ``col`` takes decoded (a dictionary's value once per row using it)."""
    if pa.types.is_dictionary(col.type) and _is_bytes(col.type.value_type):
        used = pc.sum(pc.take(pc.binary_length(col.dictionary), col.indices)).as_py() or 0
        return used + col.indices.nbytes
    return col.nbytes


def _bounded(rb: pa.RecordBatch, path: str, i: int, off: int, row: int, cap: int) -> Iterator[pa.RecordBatch]:
    """``rb`` in order, in slices that each decode to at most ``cap`` bytes."""
    sizes = [_decoded_size(c) for c in rb.columns]
    if sum(sizes) <= cap:
        yield rb
    elif rb.num_rows > 1:
        half = rb.num_rows // 2
        yield from _bounded(rb.slice(0, half), path, i, off, row, cap)
        yield from _bounded(rb.slice(half), path, i, off, row + half, cap)
    else:
        name = rb.schema.names[max(range(len(sizes)), key=sizes.__getitem__)]
        raise InputFileError(path, f"row group {i}, row {row}, field {name!r}: the record decodes to {sum(sizes)} "
                                   f"bytes, over the cap of {mb(cap)}; raise --max-block-mb if the file is trusted",
                             off)


def _repeats(rb: pa.RecordBatch) -> bool:
    """Whether a dictionary column's values are large enough (over
    ``_SHARED_VALUE_BYTES`` a row on average) that the records should share
    them: the reference path builds each value once per row group
    (``table_records``' memo), where polars would copy it into each row."""
    for col in rb.columns:
        if pa.types.is_dictionary(col.type) and _is_bytes(col.type.value_type) and len(col):
            if _decoded_size(col) >= _SHARED_VALUE_BYTES * len(col):
                return True
    return False


def _batch(rb: pa.RecordBatch, path: str, parts: dict[str, str | None], fast: bool, record_json: bool,
           off: int, row: int, memo: dict | None = None) -> RecordBatch:
    n = rb.num_rows
    records: Any = None
    if fast and _polars_reads_arrow():
        try:
            records = _columnar(rb, parts, path, record_json)
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except BaseException as e:  # noqa: BLE001 - polars' Rust panics are BaseExceptions
            _log.debug("%s: the Parquet fast path failed at byte %d row %d (%s: %s); the reference path reads it",
                       path, off, row, type(e).__name__, e)
    if records is None:
        records = table_records(pa.Table.from_batches([rb]), parts, memo)
    return RecordBatch(path, "parquet", records, [off] * n, list(range(row, row + n)))


@functools.cache
def _polars_reads_arrow() -> bool:
    """Whether polars in this process takes Arrow data: not when it was imported while pyarrow was
    marked absent (it then holds no pyarrow for good, and every batch would fail over to the
    per-record path). Said once per process, as a warning: the records are the same, read far slower."""
    import polars as pl

    try:
        pl.from_arrow(pa.table({"probe": [1]}))
    except Exception as e:  # noqa: BLE001 - any reason polars cannot read Arrow here
        _log.warning("polars cannot read Arrow data in this process (%s: %s; was polars imported while pyarrow "
                     "was marked absent?): Parquet is read record by record, the same records but much slower",
                     type(e).__name__, e)
        return False
    return True


def _columnar(rb: pa.RecordBatch, parts: dict[str, str | None], path: str, record_json: bool) -> Any:
    import polars as pl

    from convert.formats.avro_columnar import frame_records

    arrays = [raw_array(c) for c in rb.columns]
    names = list(rb.schema.names)
    for k, v in parts.items():
        arrays.append(pa.array([v] * rb.num_rows, pa.large_string()))
        names.append(k)
    df = pl.from_arrow(pa.Table.from_arrays(arrays, names=names), rechunk=False)
    return frame_records(df, path, record_json)


def _check_offsets(f: IO[bytes], path: str, pf: pq.ParquetFile, offsets: list[int]) -> int:
    """Refuse a row group with rows whose first page the footer places outside
    the file's data (after ``PAR1``, before the footer): no byte range would
    own it, so its rows would be lost without a word. (Writers leave offsets
    0 in a row group of no rows.) Returns where the file's data ends."""
    end = f.seek(0, 2)
    f.seek(end - 8)
    data_end = end - 8 - int.from_bytes(f.read(4), "little")
    f.seek(0)
    md = pf.metadata
    bad = next((i for i, off in enumerate(offsets) if not 4 <= off < data_end and md.row_group(i).num_rows),
               None)
    if bad is not None:
        raise InputFileError(path, f"row group {bad}: the footer places its first page at byte {offsets[bad]}, "
                                   f"outside the file's data (bytes 4 to {data_end}); the file is corrupt "
                                   "(rewrite it)", 0)
    return data_end


def _check_pages(f: IO[bytes], pf: pq.ParquetFile, path: str, i: int, off: int, data_end: int,
                 flat: list[int]) -> int | None:
    """Refuse row group ``i`` when the pages of one of its column chunks hold
    other rows than its footer says. pyarrow reads as many rows, and as many
    values of each chunk, as the footer says: a footer understating a row
    group's rows and its chunks' value counts alike passes
    ``_check_row_group`` and drops the other rows without a word. The pages
    tell (``page_counts``: one ranged read of the chunk, front to back).

    The chunk walked is the smallest (compressed) of the leaves not repeated
    (``flat``), whose values are its rows; in a file of only repeated leaves,
    the first leaf (``_row_probe``'s column): its version 2 pages count rows,
    version 1 pages only values, which are returned for ``_check_rows`` to
    compare with the values of the rows pyarrow decoded. ``None`` otherwise.
    A chunk whose headers do not walk to its end is refused as well."""
    md = pf.metadata
    if not md.num_columns:
        return None
    rg = md.row_group(i)
    c = rg.column(min(flat, key=lambda j: rg.column(j).total_compressed_size) if flat else 0)
    where = f"row group {i}, column {c.path_in_schema!r}"
    first = c.data_page_offset  # where pyarrow starts reading the chunk
    if c.has_dictionary_page and 0 < (c.dictionary_page_offset or 0) < first:
        first = c.dictionary_page_offset
    size = c.total_compressed_size
    if not (4 <= first < data_end and 0 <= size <= data_end - first):
        if not rg.num_rows:
            return None  # writers leave the offsets of a row group of no rows 0
        raise InputFileError(path, f"{where}: the footer places the column chunk at bytes {first} to {first + size}, "
                                   f"outside the file's data (bytes 4 to {data_end}); the file is corrupt (rewrite "
                                   "it)", off)
    try:
        f.seek(first)
        values, rows = page_counts(f, size, chunk_slack(md.created_by, data_end - first - size))
    except PageError as e:
        raise InputFileError(path, f"{where}: {e}; the file is corrupt (rewrite it)", off) from None
    finally:
        f.seek(0)
    held = (rows if rows is not None else values) if flat else rows
    if held is not None and held != rg.num_rows:
        raise InputFileError(path, f"{where}: its pages hold {held} rows, the footer says {rg.num_rows}; pyarrow "
                                   "would read only the footer's count: the file is corrupt (rewrite it with a "
                                   "writer that records its rows right)", off)
    return values if not flat and rows is None else None


def _counted_leaves(pf: pq.ParquetFile, leaves: list[int]) -> list[int]:
    """The leaf columns whose value counts ``_check_row_group`` compares with
    the row group's rows: those read, and one not repeated (one value per row)
    if none read is, so that a footer understating the rows is seen when the
    run reads only list columns (pyarrow would read as many rows as it says)."""
    schema = pf.schema
    if any(schema.column(j).max_repetition_level == 0 for j in leaves):
        return leaves
    flat = next((j for j in range(pf.metadata.num_columns) if schema.column(j).max_repetition_level == 0), None)
    return leaves if flat is None else [*leaves, flat]


def _check_row_group(pf: pq.ParquetFile, path: str, i: int, off: int, cap: int, leaves: list[int],
                     counted: list[int]) -> None:
    """Refuse a row group one of whose read column chunks (``leaves``) claims
    more than ``cap`` bytes decompressed, or one of whose ``counted`` chunks
    holds other than one value per row (not repeated; fewer than one
    repeated): pyarrow would read only as many rows as the footer says."""
    rg = pf.metadata.row_group(i)
    for j in leaves:
        c = rg.column(j)
        if c.total_uncompressed_size > cap:
            raise InputFileError(path, f"row group {i}, column {c.path_in_schema!r}: the column chunk claims "
                                       f"{c.total_uncompressed_size} bytes decompressed, over the cap of "
                                       f"{mb(cap)}; raise --max-block-mb if the file is trusted", off)
    for j in counted:
        c = rg.column(j)
        flat = pf.schema.column(j).max_repetition_level == 0
        if (c.num_values != rg.num_rows) if flat else (c.num_values < rg.num_rows):
            raise InputFileError(path, f"row group {i}, column {c.path_in_schema!r}: the column chunk holds "
                                       f"{c.num_values} values, the row group has {rg.num_rows} rows; the file is "
                                       "corrupt (rewrite it)", off)


def _row_probe(pf: pq.ParquetFile, counted: list[int]) -> str | None:
    """The top-level column whose first leaf (the file's leaf column 0) proves
    a row group's rows when none of the ``counted`` leaves has one value per
    row (a run reading only lists, in a file of only lists): ``None`` when one
    has, or the file has no columns. A repeated leaf's value count counts
    list items, not rows, so a footer understating the rows would pass
    ``_check_row_group`` and pyarrow would read only the rows it claims."""
    schema = pf.schema
    if not pf.metadata.num_columns or any(schema.column(j).max_repetition_level == 0 for j in counted):
        return None
    return pf.schema_arrow.names[0]


def _first_leaf_levels(a: pa.Array) -> int:
    """How many Parquet levels (the values a column chunk counts: one per
    item, and one per null or empty list or null struct on the way) the first
    leaf column of the values ``a`` takes."""
    while isinstance(a, pa.ExtensionArray):
        a = a.storage
    t = a.type
    if pa.types.is_struct(t):  # flatten: the struct's nulls become its child's
        return _first_leaf_levels(a.flatten()[0]) if t.num_fields else len(a)
    if pa.types.is_map(t):
        a = a.cast(pa.list_(pa.field("entries", pa.struct([t.key_field, t.item_field]), nullable=False)))
    elif not is_list_type(t):
        return len(a)
    filled = pc.sum(pc.greater(pc.list_value_length(a), 0)).as_py() or 0
    return len(a) - filled + _first_leaf_levels(a.flatten())


def _check_rows(pf: pq.ParquetFile, path: str, i: int, off: int, row: int, levels: int | None,
                held: int | None = None) -> None:
    """Refuse a row group whose rows pyarrow read (``row``) are not the
    footer's count, or whose first leaf column holds more values than those
    rows take (``levels``, when ``_row_probe`` named a column), by its
    footer or by its pages (``held``, when ``_check_pages`` counted them):
    pyarrow reads as many rows as the footer says, and a footer understating
    them would drop the others without a word."""
    rg = pf.metadata.row_group(i)
    if row != rg.num_rows:  # pyarrow misreads some files: tests/test_property_parquet.py
        raise InputFileError(path, f"row group {i}: pyarrow decoded {row} rows, the file's footer says "
                                   f"{rg.num_rows}; the file is corrupt or pyarrow misreads it (rewrite it, or try "
                                   "another pyarrow version)", off)
    c = rg.column(0) if levels is not None else None
    if c is not None and levels < c.num_values:
        raise InputFileError(path, f"row group {i}, column {c.path_in_schema!r}: the column chunk holds "
                                   f"{c.num_values} values, the {rg.num_rows} rows the footer says take {levels}; "
                                   "the footer understates the rows, the file is corrupt (rewrite it)", off)
    if c is not None and held is not None and levels != held:
        raise InputFileError(path, f"row group {i}, column {c.path_in_schema!r}: its pages hold {held} values, the "
                                   f"{rg.num_rows} rows the footer says take {levels}; the footer misstates the "
                                   "rows, the file is corrupt (rewrite it with a writer that records its rows right)",
                             off)


def _row_group_error(pf: pq.ParquetFile, path: str, i: int, off: int, row: int, e: BaseException,
                     names: list[str]) -> InputFileError:
    """The error naming the row group, and the first of the columns read (``names``)
    that cannot be read alone (in small batches: memory stays bounded)."""
    field = ""
    for name in names:
        try:
            for _ in pf.iter_batches(64, row_groups=[i], columns=[name], use_threads=False):
                pass
        except Exception:  # noqa: BLE001 - only locating the fault
            field = f", field {name!r}"
            break
    return InputFileError(path, f"row group {i} (rows from {row} in it){field} cannot be decoded ({quoted(e)}); "
                                "the file is corrupt or was cut short", off)
