"""Parquet input that is refused cleanly or read right, never a crash or a
silent change (convert/formats/parquet_reader.py, parquet_footer.py, parquet_types.py):
encrypted files, INT96 outside the nanosecond range, duplicate names at any
depth, partitions that clash, footers that lie about rows or sizes, columns
named ``""``, deep schemas, extension types, column projection and batches
bounded by their decoded size. Each case reads on both decoders."""

from __future__ import annotations

import base64
import datetime as dt
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from convert.formats.parquet_footer import _skip, _varint
from convert.formats.parquet_reader import _first_leaf_levels, iter_parquet, read_parquet_schema
from convert.formats.parquet_types import MAX_PARQUET_DEPTH
from convert.source_types import InputFileError

DECODERS = ("auto", "fastavro")
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "parquet-testing" / "data"


def _write(table: pa.Table, **options) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, **options)
    return buf.getvalue()


def _read(data: bytes, path: str = "t.parquet", decoder: str = "auto", **kw) -> list[dict]:
    return [r for b in iter_parquet(io.BytesIO(data), path, decoder=decoder, **kw) for r in b.records]


def _both(data: bytes, path: str = "t.parquet", **kw) -> list[dict]:
    fast, ref = (_read(data, path, d, **kw) for d in DECODERS)
    assert repr(fast) == repr(ref)
    return fast


# -- a Thrift compact footer, patched: footers that lie ------------------------------------------------------------

def _int_fields(buf: bytes, pos: int, path: tuple, out: dict) -> int:
    """Walk the struct at ``pos``; ``out[path + (field id,)]`` = (start, end) of each integer field's varint."""
    last = 0
    while True:
        byte = buf[pos]
        pos += 1
        if byte == 0:
            return pos
        kind, delta = byte & 0x0F, byte >> 4
        last = last + delta if delta else (lambda r: (r >> 1) ^ -(r & 1))(_varint(buf, pos)[0])
        if not delta:
            pos = _varint(buf, pos)[1]
        key = (*path, last)
        if kind in (4, 5, 6):
            end = _varint(buf, pos)[1]
            out[key] = (pos, end)
            pos = end
        elif kind == 12:
            pos = _int_fields(buf, pos, key, out)
        elif kind == 9 and buf[pos] & 0x0F == 12:  # a list of structs
            n, pos = buf[pos] >> 4, pos + 1
            if n == 15:
                n, pos = _varint(buf, pos)
            for i in range(n):
                pos = _int_fields(buf, pos, (*key, i), out)
        else:
            pos = _skip(buf, pos, kind, 0)


def _patch_footer(data: bytes, values: dict[tuple, int]) -> bytes:
    """``data`` with the footer's integer fields at ``values``' paths set (zigzag varints re-encoded)."""
    length = int.from_bytes(data[-8:-4], "little")
    body, footer = data[:-8 - length], bytearray(data[-8 - length:-8])
    found: dict = {}
    _int_fields(bytes(footer), 0, (), found)
    for key in sorted(values, key=lambda k: found[k][0], reverse=True):
        start, end = found[key]
        z, enc = (values[key] << 1) ^ (values[key] >> 63), bytearray()
        while True:
            enc.append((z & 0x7F) | (0x80 if z > 0x7F else 0))
            z >>= 7
            if not z:
                break
        footer[start:end] = enc
    return body + bytes(footer) + len(footer).to_bytes(4, "little") + b"PAR1"


def test_a_row_group_claiming_fewer_rows_than_its_columns_hold_is_refused():
    data = _write(pa.table({"id": list(range(300)), "s": [str(i) for i in range(300)]}))
    lying = _patch_footer(data, {(3,): 200, (4, 0, 3): 200})  # FileMetaData.num_rows, row_groups[0].num_rows
    batches = pq.ParquetFile(io.BytesIO(lying)).iter_batches(row_groups=[0])
    assert sum(b.num_rows for b in batches) == 200  # pyarrow reads the footer's count: 100 rows dropped
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"row group 0, column 'id': the column chunk holds 300 values, "
                                                 r"the row group has 200 rows"):
            _read(lying, decoder=decoder)


def _list_only(rows: int) -> pa.Table:
    """Only repeated columns: their chunks' value counts count items, not rows (nulls, empty lists and
    structs on the way to the first leaf included)."""
    return pa.table({
        "l": pa.array([None if i % 7 == 3 else [[i, i + 1]] * (i % 3) for i in range(rows)],
                      pa.list_(pa.list_(pa.int64()))),
        "m": pa.array([[(str(i), i)] if i % 5 else [] for i in range(rows)], pa.map_(pa.string(), pa.int64())),
        "s": pa.array([{"t": [str(i)] * (i % 2), "k": i} for i in range(rows)],
                      pa.struct([("t", pa.list_(pa.string())), ("k", pa.int64())])),
    })


@pytest.mark.parametrize("columns", [None, {"m"}, set()], ids=["every-column", "not-the-first", "none"])
def test_a_list_only_file_whose_footer_understates_its_rows_is_refused(columns):
    """Repeated columns hold at least as many values as rows either way: their value counts cannot
    tell. The first column's values the footer's rows take (its levels) can."""
    table = _list_only(300).drop_columns(["s"])  # s holds a flat leaf (s.k): the other guard's case
    data = _write(table, row_group_size=150)
    for decoder in DECODERS:  # an honest file reads whole, whichever columns are read
        assert _read(data, decoder=decoder, columns=columns) == [
            {k: v for k, v in r.items() if columns is None or k in columns} for r in _read(data)]
        assert len(_read(data, decoder=decoder, columns=columns)) == 300
    lying = _patch_footer(data, {(3,): 250, (4, 1, 3): 100})  # FileMetaData.num_rows, row_groups[1].num_rows
    assert sum(b.num_rows for b in pq.ParquetFile(io.BytesIO(lying)).iter_batches(row_groups=[1])) == 100
    for decoder in DECODERS:
        batches = iter_parquet(io.BytesIO(lying), "lists.parquet", decoder=decoder, columns=columns)
        with pytest.raises(InputFileError, match=r"lists\.parquet at byte \d+: row group 1, column "
                                                 r"'l\.list\.element\.list\.element': the column chunk holds \d+ "
                                                 r"values, the 100 rows the footer says take \d+; the footer "
                                                 r"understates the rows"):
            for b in batches:
                assert all(i < 150 for i in b.indexes)


def test_the_levels_of_a_first_leaf_are_its_column_chunks_value_count():
    """``_first_leaf_levels`` counts what a writer counts, on sliced arrays too (batches are slices)."""
    edges = pa.table({"l": pa.array([[], None, [None], [[]]], pa.list_(pa.list_(pa.int64()))),
                      "m": pa.array([None, [], [("a", None)], None], pa.map_(pa.string(), pa.int64())),
                      "s": pa.array([None, {"t": None, "k": None}, {"t": [None], "k": 1}, None],
                                    _list_only(1).schema.field("s").type)})
    table = pa.concat_tables([_list_only(40), edges])
    for name in table.column_names:
        want = pq.ParquetFile(io.BytesIO(_write(table.select([name])))).metadata.row_group(0).column(0).num_values
        column = table.column(name).combine_chunks()
        assert _first_leaf_levels(column) == want
        assert _first_leaf_levels(column.slice(0, 21)) + _first_leaf_levels(column.slice(21)) == want


def test_a_footer_understating_a_chunks_size_still_gets_batches_bounded_by_their_decoded_size():
    rows = 40
    data = _write(pa.table({"id": list(range(rows)), "s": [bytes([i]) * 100_000 for i in range(rows)]}),
                  use_dictionary=False, compression="zstd")
    lying = _patch_footer(data, {(4, 0, 1, 1, 3, 6): 1000})  # columns[1].meta_data.total_uncompressed_size
    assert pq.ParquetFile(io.BytesIO(lying)).metadata.row_group(0).column(1).total_uncompressed_size == 1000
    for decoder in DECODERS:
        batches = list(iter_parquet(io.BytesIO(lying), "t.parquet", decoder=decoder, max_block_bytes=1 << 20))
        assert [r["id"] for b in batches for r in b.records] == list(range(rows))
        assert max(len(b.records) for b in batches) <= 10  # 100 kB a record, 1 MB a batch
        assert [i for b in batches for i in b.indexes] == list(range(rows))


def test_one_dictionary_value_used_by_many_rows_is_bounded_before_it_is_copied_into_each():
    big = b"x" * (1 << 20)
    data = _write(pa.table({"id": list(range(100)), "blob": [big] * 100}), compression="zstd")
    assert len(data) < 20_000
    for decoder in DECODERS:
        batches = list(iter_parquet(io.BytesIO(data), "t.parquet", decoder=decoder, max_block_bytes=2 << 20))
        records = [r for b in batches for r in b.records]
        assert [r["id"] for r in records] == list(range(100))
        assert max(len(b.records) for b in batches) <= 2
        assert records[0]["blob"] == big and len({id(r["blob"]) for r in records}) == 1  # one object, 1 MB once
    two = _write(pa.table({"id": [1, 2], "a": [b"a" * 600_000] * 2, "b": [b"b" * 700_000] * 2}))
    for decoder in DECODERS:  # each chunk (a dictionary of one value) is under the cap, a record is over it
        with pytest.raises(InputFileError, match=r"row group 0, row 0, field 'b': the record decodes to \d+ "
                                                 r"bytes, over the cap of 1 MB; raise --max-block-mb"):
            _read(two, decoder=decoder, max_block_bytes=1 << 20)


def test_only_the_projected_columns_are_decoded():
    data = _write(pa.table({"id": [1, 2], "blob": [b"x" * (1 << 20)] * 2}), use_dictionary=False)
    with pytest.raises(InputFileError, match="column 'blob'"):
        _read(data, max_block_bytes=1 << 19)
    for decoder in DECODERS:
        assert _read(data, decoder=decoder, max_block_bytes=1 << 19, columns={"id"}) == [{"id": 1}, {"id": 2}]
        assert _read(data, "/d/k=v/t.parquet", decoder=decoder, columns=set()) == [{"k": "v"}] * 2


# -- encryption -----------------------------------------------------------------------------------------------------

def _encrypted(plaintext_footer: bool, wide: int = 0) -> bytes:
    pe = pytest.importorskip("pyarrow.parquet.encryption")

    class Kms(pe.KmsClient):  # in memory: the "wrapped" key is the key itself
        def __init__(self, config):
            super().__init__()

        def wrap_key(self, key_bytes, master_key_identifier):
            return base64.b64encode(key_bytes).decode()

        def unwrap_key(self, wrapped_key, master_key_identifier):
            return base64.b64decode(wrapped_key)

    factory = pe.CryptoFactory(lambda config: Kms(config))
    config = pe.EncryptionConfiguration(footer_key="footer", column_keys={"col": ["secret"]},
                                        plaintext_footer=plaintext_footer, double_wrapping=False)
    props = factory.file_encryption_properties(pe.KmsConnectionConfig(), config)
    buf = io.BytesIO()
    table = pa.table({"id": [1, 2], "secret": ["a", "b"], **{f"c{i}": [i, i] for i in range(wide)}})
    pq.write_table(table, buf, encryption_properties=props, row_group_size=1)
    return buf.getvalue()


@pytest.mark.parametrize(("plaintext_footer", "wide"), [(True, 0), (True, 1500), (False, 0)],
                         ids=["encrypted-columns", "encrypted-columns-large-footer", "encrypted-footer"])
def test_encrypted_files_are_refused_by_name_before_pyarrow_touches_their_columns(plaintext_footer, wide):
    """With a plaintext footer, pyarrow aborts the process on the first column metadata it reads."""
    data = _encrypted(plaintext_footer, wide)
    if wide:  # a footer of more than 256 KB (one the reader once left unscanned when unsigned)
        assert int.from_bytes(data[-8:-4], "little") > 256 << 10
    what = "some of its columns are encrypted" if plaintext_footer else "its footer is encrypted"
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=rf"e\.parquet at byte 0: an encrypted Parquet file \({what}\)"):
            _read(data, "e.parquet", decoder)
    with pytest.raises(InputFileError, match="an encrypted Parquet file"):
        read_parquet_schema(io.BytesIO(data), "e.parquet")


@pytest.mark.skipif(not REAL.is_dir(), reason=f"apache/parquet-testing is not copied to {REAL}")
def test_the_parquet_testing_encrypted_files_are_refused():
    files = sorted(REAL.glob("*.parquet.encrypted"))
    assert files
    for path in files:
        with pytest.raises(InputFileError, match="an encrypted Parquet file"):
            _read(path.read_bytes(), path.name)


# -- values and names ----------------------------------------------------------------------------------------------

def test_int96_timestamps_outside_the_nanosecond_range_read_right_in_microseconds():
    stamps = [dt.datetime(9999, 12, 31), dt.datetime(1000, 1, 1), dt.datetime(2024, 5, 6, 7, 8, 9, 123456), None]
    data = _write(pa.table({"t": pa.array(stamps, pa.timestamp("us"))}), use_deprecated_int96_timestamps=True)
    epoch = dt.datetime(1970, 1, 1)
    want = [(s - epoch) // dt.timedelta(microseconds=1) if s else None for s in stamps]
    assert [r["t"] for r in _both(data)] == want
    schema = read_parquet_schema(io.BytesIO(data), "t.parquet")
    assert schema["fields"][0]["type"] == ["null", {"type": "long", "logicalType": "local-timestamp-micros"}]


def test_duplicate_names_inside_a_struct_are_refused_at_any_depth():
    inner = pa.StructArray.from_arrays([pa.array([1]), pa.array(["x"])],
                                       fields=[pa.field("a", pa.int64()), pa.field("a", pa.string())])
    for column in (inner, pa.ListArray.from_arrays([0, 1], pa.StructArray.from_arrays([inner], names=["u"]))):
        data = _write(pa.table({"s": column}))
        for decoder in DECODERS:
            with pytest.raises(InputFileError, match=r"declares the field 'a' twice in the struct 's(\.element\.u)?'"):
                _read(data, decoder=decoder)
        with pytest.raises(InputFileError, match="declares the field 'a' twice"):
            read_parquet_schema(io.BytesIO(data), "t.parquet")


def test_partitions_naming_a_field_inside_a_column_or_a_key_twice_are_refused():
    data = _write(pa.table({"u": [{"id": 1}]}))
    with pytest.raises(InputFileError, match=r"partition directory u\.id=\.\.\. names a field"):
        _read(data, "/d/u.id=7/p.parquet")
    with pytest.raises(InputFileError, match=r"partition directory u\[0\]=\.\.\. names a field"):
        _read(data, "/d/u[0]=7/p.parquet")
    with pytest.raises(InputFileError, match=r"name 'k' twice \(k=\.\.\./k=\.\.\.\)"):
        _read(data, "/d/k=1/k=2/p.parquet")
    assert _both(data, "/d/uid=7/p.parquet") == [{"u": {"id": 1}, "uid": "7"}]


def test_a_column_named_empty_keeps_its_name_on_both_decoders():
    data = _write(pa.table({"": [1, 2], "s": [{"": "a"}, {"": None}]}))
    assert _both(data) == [{"": 1, "s": {"": "a"}}, {"": 2, "s": {"": None}}]


def test_uuid_and_json_columns_read_as_their_storage():
    table = pa.table({"u": pa.array([b"0123456789abcdef", None], pa.uuid()),
                      "j": pa.array(['{"a": 1}', None], pa.json_()),
                      "s": pa.StructArray.from_arrays([pa.array([b"fedcba9876543210", None], pa.uuid())], names=["u"],
                                                      mask=pa.array([False, True]))})
    data = _write(table)
    assert _both(data) == [{"u": b"0123456789abcdef", "j": '{"a": 1}', "s": {"u": b"fedcba9876543210"}},
                           {"u": None, "j": None, "s": None}]
    fields = {f["name"]: f["type"] for f in read_parquet_schema(io.BytesIO(data), "t.parquet")["fields"]}
    assert fields["u"] == ["null", {"type": "fixed", "name": "u", "size": 16}]
    assert fields["j"] == ["null", "string"]


def _nested(depth: int) -> tuple[pa.DataType, dict]:
    t, v = pa.int64(), 1
    for _ in range(depth):
        t, v = pa.struct([("x", t)]), {"x": v}
    return t, v


@pytest.mark.parametrize("store_schema", [True, False])
def test_a_schema_nested_past_the_limit_is_refused_by_name(store_schema):
    t, v = _nested(MAX_PARQUET_DEPTH)
    data = _write(pa.table({"c": pa.array([v], t)}), store_schema=store_schema)
    assert _both(data) == [{"c": v}]
    t, v = _nested(300)
    data = _write(pa.table({"c": pa.array([v], t)}), store_schema=False)  # (pyarrow's own schema fails at 300)
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=rf"deep\.parquet at byte 0: the Parquet schema nests deeper than "
                                                 rf"{MAX_PARQUET_DEPTH} levels \(in the column 'c'\)"):
            _read(data, "deep.parquet", decoder)
    with pytest.raises(InputFileError, match="nests deeper than"):
        read_parquet_schema(io.BytesIO(data), "deep.parquet")


def test_list_view_columns_read_as_lists():
    """pyarrow writes list views and reads them back as list views (its schema in the file)."""
    for t in (pa.list_view(pa.int64()), pa.large_list_view(pa.string())):
        values = [[1, 2], None, [], [3, 4]] if t.value_type == pa.int64() else [["a"], None, [], ["b", "c"]]
        data = _write(pa.table({"l": pa.array(values, t)}))
        assert pq.ParquetFile(io.BytesIO(data)).schema_arrow.field("l").type == t
        assert [r["l"] for r in _both(data, batch_size=3)] == values  # (a batch of 3: a sliced view)
        fields = read_parquet_schema(io.BytesIO(data), "t.parquet")["fields"]
        assert fields[0]["type"][1]["type"] == "array"
