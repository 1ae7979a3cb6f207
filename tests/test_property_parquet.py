"""Property tests: on random Arrow tables written as Parquet (random nested
types, logical types, codecs, dictionary encoding, row group and page sizes),
the fast path (``convert.formats.parquet_types.raw_array`` + polars) and the
per-record reference path (``convert.formats.parquet_records``) give the same records,
value types included (compared by ``repr``), and the fast path's record JSON
is the reference records' canonical JSON byte for byte."""

from __future__ import annotations

import decimal
import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from convert.formats.parquet_reader import iter_parquet
from convert.source_types import InputFileError
from convert.splits import _canonical

SETTINGS = settings(max_examples=int(os.environ.get("RECORDPREP_PROPERTY_EXAMPLES", "40")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_I64 = st.integers(-(2**63), 2**63 - 1)
_TEXT = st.text(max_size=6)

#: (Arrow type, strategy of Python values pyarrow builds it from)
_SCALARS = [
    (pa.bool_(), st.booleans()),
    (pa.int8(), st.integers(-128, 127)),
    (pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.int64(), _I64),
    (pa.uint8(), st.integers(0, 255)),
    (pa.uint32(), st.integers(0, 2**32 - 1)),
    (pa.uint64(), st.integers(0, 2**64 - 1)),
    (pa.float32(), st.floats(width=32, allow_nan=True)),
    (pa.float64(), st.floats(allow_nan=True)),
    (pa.string(), _TEXT),
    (pa.large_string(), _TEXT),
    (pa.binary(), st.binary(max_size=6)),
    (pa.binary(3), st.binary(min_size=3, max_size=3)),
    (pa.date32(), st.integers(-(2**31), 2**31 - 1)),
    (pa.time32("ms"), st.integers(0, 86_400_000 - 1)),
    (pa.time64("us"), st.integers(0, 86_400_000_000 - 1)),
    (pa.time64("ns"), st.integers(0, 86_400_000_000_000 - 1)),
    (pa.timestamp("ms"), _I64),
    (pa.timestamp("us", tz="UTC"), _I64),
    (pa.timestamp("ns", tz="Asia/Tokyo"), _I64),
    (pa.decimal128(9, 2), st.decimals(-(10**7) + 1, 10**7 - 1, places=2, allow_nan=False, allow_infinity=False)),
    (pa.decimal128(38, 0), st.integers(-(10**38) + 1, 10**38 - 1).map(decimal.Decimal)),
    (pa.decimal256(50, 10), st.integers(-(10**50) + 1, 10**50 - 1).map(lambda i: decimal.Decimal(f"{i}E-10"))),
]


#: Extension types pyarrow reads from Parquet (top-level columns: ``pa.array`` builds no nested ones).
_EXTENSIONS = [
    (pa.uuid(), st.binary(min_size=16, max_size=16)),
    (pa.json_(), st.sampled_from(['{"a": 1}', "[]", "null", '"x"'])),
]


def _types(depth: int = 0) -> st.SearchStrategy:
    scalar = st.sampled_from(_SCALARS)
    if depth >= 2:
        return scalar

    def struct(children):
        names = [f"f{i}" for i in range(len(children))]
        t = pa.struct([(n, c[0]) for n, c in zip(names, children, strict=True)])
        return t, st.fixed_dictionaries({n: st.none() | c[1] for n, c in zip(names, children, strict=True)})

    def listed(child):
        return pa.list_(child[0]), st.lists(st.none() | child[1], max_size=4)

    def viewed(child):  # pyarrow writes list views and reads them back as views
        return pa.list_view(child[0]), st.lists(st.none() | child[1], max_size=4)

    def mapped(child):
        return pa.map_(pa.string(), child[0]), st.lists(st.tuples(_TEXT, st.none() | child[1]), max_size=3, unique_by=lambda kv: kv[0])

    inner = _types(depth + 1)
    return st.one_of(scalar, st.lists(inner, min_size=1, max_size=3).map(struct), inner.map(listed), inner.map(viewed), inner.map(mapped))


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(0, 30))
    columns, names = [], []
    for i in range(draw(st.integers(1, 5))):
        t, values = draw(st.sampled_from(_EXTENSIONS) if draw(st.integers(0, 5)) == 0 else _types())
        column = pa.array(draw(st.lists(st.none() | values, min_size=n, max_size=n)), t)
        if pa.types.is_string(t) and draw(st.booleans()):
            column = column.dictionary_encode()
        columns.append(column)
        names.append(f"c{i}")
    if draw(st.integers(0, 4)) == 0:  # a column named "" (polars would rename it)
        names[draw(st.integers(0, len(names) - 1))] = ""
    return pa.Table.from_arrays(columns, names=names)


_WRITE_OPTIONS = st.fixed_dictionaries({
    "compression": st.sampled_from(["none", "snappy", "gzip", "zstd", "lz4", "brotli"]),
    "use_dictionary": st.booleans(),
    "row_group_size": st.integers(1, 16),
    "data_page_version": st.sampled_from(["1.0", "2.0"]),
    "data_page_size": st.sampled_from([64, 1 << 20]),
    "use_deprecated_int96_timestamps": st.booleans(),
})


def _read(buf: io.BytesIO, decoder: str, batch_size: int, **kw) -> tuple[list, list, str | None]:
    """The records, the fast path's record JSON, and the error ending the file (if any)."""
    records, texts = [], []
    try:
        for b in iter_parquet(buf, "random.parquet", batch_size=batch_size, decoder=decoder, record_json=True, **kw):
            records.extend(b.records)
            texts.extend(getattr(b.records, "record_json", None) or [None] * len(b.records))
    except InputFileError as e:
        return records, texts, str(e)
    return records, texts, None


@SETTINGS
@given(table=tables(), options=_WRITE_OPTIONS, batch_size=st.integers(1, 12), data=st.data())
def test_fast_and_reference_paths_give_identical_records(table, options, batch_size, data):
    buf = io.BytesIO()
    try:
        pq.write_table(table, buf, **options)
    except pa.ArrowInvalid:  # INT96 holds no timestamp past the int64 of nanoseconds
        assume(False)
    names = table.column_names
    columns = data.draw(st.none() | st.sets(st.sampled_from(names)), label="columns")
    cap = data.draw(st.sampled_from([1 << 28, 1 << 10]), label="max_block_bytes")
    fast, texts, fast_error = _read(buf, "auto", batch_size, columns=columns, max_block_bytes=cap)
    reference, _, error = _read(buf, "fastavro", batch_size, columns=columns, max_block_bytes=cap)
    assert fast_error == error
    # pyarrow 25 misreads null lists in tiny v2 data pages (no row, or a failed decode): the reader says so
    # naming the row group, it never drops a row; on any other file both paths read every row
    pyarrow_bug = options["data_page_version"] == "2.0" and options["data_page_size"] == 64
    assert error is None or (pyarrow_bug and "row group" in error) or (cap < 1 << 28 and "over the cap" in error), error
    if error is None:
        assert len(reference) == table.num_rows
        assert all(list(r) == [n for n in names if columns is None or n in columns] for r in reference)
    assert repr(fast) == repr(reference)
    for text, record in zip(texts, reference, strict=True):
        if text is not None:  # (maps: the reference path reads them; the split makes their JSON)
            assert text == _canonical(record)
