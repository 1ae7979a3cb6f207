"""A Parquet footer that understates a row group's rows and its column
chunks' value counts alike (convert/formats/parquet_reader.py ``_check_pages``,
parquet_footer.py ``page_counts``): pyarrow reads as many rows as the footer
says and drops the rest without a word, so the reader counts the rows a
chunk's page headers hold and refuses the row group, naming the file, the row
group and the column. Data pages v1 and v2, compressed or not, dictionary or
plain, files of only list columns; page headers that lie or are garbage end in
``InputFileError``, never a crash or a hang."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_convert_parquet_guards import DECODERS, _list_only, _patch_footer, _read, _write

from convert.formats import parquet_footer
from convert.formats.parquet_footer import PageError, chunk_slack, page_counts
from convert.formats.parquet_reader import iter_parquet
from convert.source_types import InputFileError

_ROOT = Path(__file__).resolve().parents[1]
REAL = next((p / "parquet-testing" / "data" for p in (_ROOT.parent / "shared", _ROOT.parent.parent / "shared")
             if (p / "parquet-testing" / "data").is_dir()), None)


def _table(rows: int) -> pa.Table:
    return pa.table({"id": list(range(rows)), "s": [f"v{i % 7}" for i in range(rows)],
                     "l": [[i] * (i % 3) if i % 5 else None for i in range(rows)]})


def _understated(data: bytes, group: int, rows: int, honest: bytes) -> bytes:
    """``data`` whose row group ``group`` claims ``rows`` rows and, in each column chunk, the values the
    file ``honest`` (those rows alone) holds: a footer whose counts agree with each other, not with the pages."""
    md, claims = pq.ParquetFile(io.BytesIO(data)).metadata, pq.ParquetFile(io.BytesIO(honest)).metadata
    lost = md.row_group(group).num_rows - rows
    values = {(4, group, 1, j, 3, 5): claims.row_group(0).column(j).num_values for j in range(md.num_columns)}
    return _patch_footer(data, {(3,): md.num_rows - lost, (4, group, 3): rows, **values})


def _pyarrow_rows(data: bytes, group: int) -> int:
    return sum(b.num_rows for b in pq.ParquetFile(io.BytesIO(data)).iter_batches(row_groups=[group]))


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("compression", ["none", "snappy", "zstd"])
@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
def test_a_footer_understating_rows_and_value_counts_alike_is_refused(version, compression, dictionary):
    options = {"data_page_version": version, "compression": compression, "use_dictionary": dictionary}
    data = _write(_table(100), **options)
    assert len(_read(data)) == 100
    lying = _understated(data, 0, 10, _write(_table(10), **options))
    assert _pyarrow_rows(lying, 0) == 10  # the hole: pyarrow reads the footer's count, 90 rows dropped
    for decoder in DECODERS:
        for columns in (None, {"l"}, set()):
            with pytest.raises(InputFileError, match=r"^t\.parquet at byte 4: row group 0, column '(id|s)': its "
                                                     r"pages hold 100 rows, the footer says 10; .*rewrite it"):
                _read(lying, decoder=decoder, columns=columns)


def test_a_footer_overstating_rows_and_value_counts_alike_is_refused_by_the_pages():
    data = _write(_table(100), use_dictionary=False)
    lying = _patch_footer(data, {(3,): 150, (4, 0, 3): 150, **{(4, 0, 1, j, 3, 5): 150 for j in range(3)}})
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"row group 0, column '(id|s)': its pages hold 100 rows, the "
                                                 r"footer says 150"):
            _read(lying, decoder=decoder)


def test_the_row_groups_before_the_lying_one_are_read_then_the_file_fails():
    data = _write(_table(300), row_group_size=100, data_page_version="2.0")
    lying = _understated(data, 1, 30, _write(_table(30), data_page_version="2.0"))
    for decoder in DECODERS:
        read = []
        with pytest.raises(InputFileError, match=r"row group 1, column '(id|s)': its pages hold 100 rows, the "
                                                 r"footer says 30"):
            for b in iter_parquet(io.BytesIO(lying), "t.parquet", decoder=decoder):
                read.extend(b.records)
        assert [r["id"] for r in read] == list(range(100))


@pytest.mark.parametrize("version", ["1.0", "2.0"])
@pytest.mark.parametrize("columns", [None, {"m"}, set()], ids=["every-column", "not-the-first", "none"])
def test_a_list_only_file_whose_footer_understates_rows_and_values_alike_is_refused(version, columns):
    """No leaf has one value per row: version 2 pages count the rows; version 1 pages count values,
    compared with the values the rows pyarrow decoded take (the first leaf's levels)."""
    table = _list_only(300).drop_columns(["s"])  # s holds a flat leaf (s.k): the first test's case
    options = {"data_page_version": version, "compression": "snappy"}
    data = _write(table, **options)
    assert len(_read(data, columns=columns)) == 300
    lying = _understated(data, 0, 100, _write(table.slice(0, 100), **options))
    assert _pyarrow_rows(lying, 0) == 100
    want = (r"its pages hold 300 rows, the footer says 100" if version == "2.0" else
            r"its pages hold \d+ values, the 100 rows the footer says take \d+; the footer misstates the rows")
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"lists\.parquet at byte 4: row group 0, column "
                                                 rf"'l\.list\.element\.list\.element': {want}"):
            for _ in iter_parquet(io.BytesIO(lying), "lists.parquet", decoder=decoder, columns=columns):
                pass


# -- page headers that lie, or are not page headers ----------------------------------------------------------------

def _zz(v: int) -> bytes:
    """A Thrift compact i32: zigzag, then varint."""
    z, out = (v << 1) ^ (v >> 63), bytearray()
    while True:
        out.append((z & 0x7F) | (0x80 if z > 0x7F else 0))
        z >>= 7
        if not z:
            return bytes(out)


def _header(kind: int = 0, csize: int = 0, values: int = 0, rows: int | None = None) -> bytes:
    """A Thrift compact ``PageHeader``: v1 (``data_page_header``) or, given ``rows``, v2."""
    head = b"\x15" + _zz(kind) + b"\x15" + _zz(csize) + b"\x15" + _zz(csize)
    if rows is None:
        return head + b"\x2c\x15" + _zz(values) + b"\x15\x00\x15\x06\x15\x06\x00\x00"
    return head + b"\x5c\x15" + _zz(values) + b"\x15\x00\x15" + _zz(rows) + b"\x15\x00\x15\x00\x15\x00\x00\x00"


def _one_column(rows: int = 50) -> tuple[bytes, int, int]:
    """An uncompressed file of one plain column (its chunk starts with its data page), the chunk's offset
    and size."""
    data = _write(pa.table({"id": list(range(rows))}), use_dictionary=False, compression="none")
    c = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(0)
    return data, c.data_page_offset, c.total_compressed_size


_HOSTILE = {
    "size-past-the-chunk": _header(csize=1 << 30, values=50),
    "negative-size": _header(csize=-1, values=50),
    "negative-count": _header(csize=4, values=-5),
    "negative-rows": _header(kind=3, csize=4, values=50, rows=-50),
    "no-counts": b"\x15\x00\x15\x08\x15\x08\x00",
    "deep-nesting": b"\x1c" * 5000,
    "endless-varint": b"\x15" + b"\xff" * 5000,
    "field-id-past-16-bits": b"\x05" + _zz(1 << 20) + b"\x00",
    "garbage": bytes(random.Random(7).randrange(256) for _ in range(400)),
}


@pytest.mark.parametrize("how", sorted(_HOSTILE))
def test_a_page_header_that_lies_or_is_not_one_is_refused_by_name(how):
    data, first, size = _one_column()
    forged = _HOSTILE[how][:size]
    lying = data[:first] + forged + data[first + len(forged):]
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"t\.parquet at byte 4: row group 0, column 'id': the page"):
            _read(lying, decoder=decoder)


@pytest.mark.parametrize("delta", [-1, 1, 1 << 20])
def test_a_chunk_whose_footer_misstates_its_size_is_refused(delta):
    """A chunk cut inside its page, or running on into the footer: the pages do not end where it does."""
    data, _, size = _one_column()
    lying = _patch_footer(data, {(4, 0, 1, 0, 3, 7): size + delta})  # meta_data.total_compressed_size
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"row group 0, column 'id': the (page|footer places the column)"):
            _read(lying, decoder=decoder)


def test_page_counts_ends_in_counts_or_page_error_on_damaged_chunks():
    """Thousands of chunks damaged at random bytes or cut short: counts or ``PageError``, nothing else."""
    rng = random.Random(11)
    chunks = []
    for options in ({}, {"data_page_version": "2.0"}, {"compression": "none", "use_dictionary": False}):
        data = _write(_table(400), data_page_size=256, **options)
        for j in range(3):
            c = pq.ParquetFile(io.BytesIO(data)).metadata.row_group(0).column(j)
            first = min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
            chunks.append(data[first:first + c.total_compressed_size])
    outcomes = set()
    for _ in range(3000):
        chunk = bytearray(rng.choice(chunks))
        for _ in range(rng.randrange(1, 4)):
            chunk[rng.randrange(min(len(chunk), 64) if rng.random() < 0.8 else len(chunk))] = rng.randrange(256)
        size = len(chunk) if rng.random() < 0.8 else rng.randrange(len(chunk) + 1)
        try:
            values, rows = page_counts(io.BytesIO(bytes(chunk)), size)
            assert values >= 0 and (rows is None or rows >= 0)
            outcomes.add("counts")
        except PageError:
            outcomes.add("refused")
    assert outcomes == {"counts", "refused"}


class _Reads(io.BytesIO):
    """A file recording its seeks and the bytes read."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.seeks, self.read_bytes = 0, 0

    def seek(self, *args):
        self.seeks += 1
        return super().seek(*args)

    def read(self, n=-1):
        out = super().read(n)
        self.read_bytes += len(out)
        return out


@pytest.mark.parametrize("window", [32, 1 << 20])
def test_page_counts_reads_the_chunk_once_front_to_back_whatever_its_window(window, monkeypatch):
    """The file may be remote: no seek, each byte read once, pages larger than the window read past."""
    monkeypatch.setattr(parquet_footer, "_WINDOW", window)
    for version in ("1.0", "2.0"):
        data = _write(_table(2000), data_page_size=512, data_page_version=version, compression="zstd")
        md = pq.ParquetFile(io.BytesIO(data)).metadata
        rows = None if version == "1.0" else 2000  # version 1 pages count values only
        for j in (0, 2):
            c = md.row_group(0).column(j)
            first = min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
            f = _Reads(data)
            f.seek(first)
            f.seeks = 0
            assert page_counts(f, c.total_compressed_size) == (c.num_values, rows)
            assert (f.seeks, f.read_bytes, f.tell()) == (0, c.total_compressed_size, first + c.total_compressed_size)


@pytest.mark.parametrize(("created_by", "slack"), [
    ("parquet-mr", 100), ("parquet-mr version 1.2.8 (build 1)", 100), ("parquet-mr version 1.2.9 (build 1)", 0),
    ("parquet-mr version 1.10.0-SNAPSHOT (build 2)", 0), ("parquet-cpp-arrow version 1.0.0", 0), (None, 0)])
def test_old_parquet_mr_chunks_may_run_past_their_size_as_pyarrow_pads_them(created_by, slack):
    assert chunk_slack(created_by, 1000) == slack
    assert chunk_slack(created_by, 7) == min(slack, 7)


@pytest.mark.skipif(REAL is None, reason="apache/parquet-testing is not copied beside the checkout")
def test_an_old_parquet_mr_file_leaving_its_dictionary_headers_out_of_the_chunk_sizes_reads():
    """parquet-testing's nation.dict-malformed: parquet-mr with no version, its dictionary page headers
    outside ``total_compressed_size`` (PARQUET-816); pyarrow pads the chunk, so does the page walk."""
    data = (REAL / "nation.dict-malformed.parquet").read_bytes()
    assert len(_read(data)) == 25
