"""Hostile input the round-4 fixes missed (issue 44 follow-up): Parquet
footers that lose rows when a run reads only some columns, row groups the
footer places outside the file, partition directories escaping bytes that
are not text, and encrypted columns without the file's encryption marker. Each is refused naming the file and what to do, on both
decoders, where before its rows were dropped or its value changed silently."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from test_convert_parquet_guards import DECODERS, _encrypted, _patch_footer, _read, _write

from convert.parquet import read_parquet_schema
from convert.parquet_footer import _skip, _varint
from convert.source_types import InputFileError


def _ids_and_tags(rows: int = 300, **options) -> bytes:
    return _write(pa.table({"id": list(range(rows)), "tags": [[i, i] for i in range(rows)]}), **options)


@pytest.mark.parametrize("claimed", [0, 200])
def test_a_footer_understating_the_rows_is_refused_when_the_run_reads_only_a_list_column(claimed):
    """pyarrow reads as many rows as the footer says; the list column's chunk holds
    more values than rows anyway, so only an unread flat column shows the lie."""
    lying = _patch_footer(_ids_and_tags(), {(3,): claimed, (4, 0, 3): claimed})  # file's and row group's num_rows
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=rf"row group 0, column 'id': the column chunk holds 300 values, "
                                                 rf"the row group has {claimed} rows"):
            _read(lying, decoder=decoder, columns={"tags"})
    assert len(_read(_ids_and_tags(), columns={"tags"})) == 300


def test_a_repeated_column_holding_fewer_values_than_rows_is_refused():
    lying = _patch_footer(_ids_and_tags(), {(4, 0, 1, 1, 3, 5): 10})  # columns[1].meta_data.num_values
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"column 'tags.list.element': the column chunk holds 10 values, "
                                                 r"the row group has 300 rows"):
            _read(lying, decoder=decoder, columns={"tags"})


@pytest.mark.parametrize("where", [-100, 0, 1 << 40])
def test_a_row_group_placed_outside_the_files_data_is_refused_not_skipped(where):
    """No byte range owns a row group before byte 4 or past the footer: its rows were lost, the run green."""
    data = _ids_and_tags(use_dictionary=False)  # the first page is the data page
    lying = _patch_footer(data, {(4, 0, 1, 0, 3, 9): where, (4, 0, 1, 1, 3, 9): where})  # data_page_offset
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=rf"t\.parquet at byte 0: row group 0: the footer places its first "
                                                 rf"page at byte {where}, outside the file's data"):
            _read(lying, decoder=decoder)


@pytest.mark.parametrize("escaped", ["%E9", "%ff%fe", "%C3"])
def test_a_partition_directory_escaping_bytes_that_are_not_utf8_is_refused(escaped):
    """``unquote`` replaced them with U+FFFD: ``k=%E9/`` and ``k=%E8/`` read as one value."""
    data = _write(pa.table({"id": [1]}))
    path = f"/d/k={escaped}/t.parquet"
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"the partition directory 'k=%.*' escapes bytes that are not "
                                                 r"UTF-8 text"):
            _read(data, path, decoder)
    with pytest.raises(InputFileError, match="not UTF-8 text"):
        read_parquet_schema(io.BytesIO(data), path)
    assert _read(data, "/d/k=%C3%A9/t.parquet") == [{"id": 1, "k": "\u00e9"}]  # escaped UTF-8 reads as text


def test_a_row_group_of_no_rows_may_leave_its_offsets_zero():
    """As parquet-cpp writes an empty table's row group (parquet-testing's column_chunk_key_value_metadata)."""
    empty = _write(pa.table({"id": pa.array([], pa.int64())}), use_dictionary=False)
    assert _read(_patch_footer(empty, {(4, 0, 1, 0, 3, 9): 0})) == []


def _without_file_encryption_marker(data: bytes) -> bytes:
    """``data`` (encrypted columns, plaintext footer) with ``FileMetaData``'s fields from 8 on
    (``encryption_algorithm``, ``footer_signing_key_metadata``) and the signature cut: only the
    column chunks' ``crypto_metadata`` still says the columns are encrypted."""
    length = int.from_bytes(data[-8:-4], "little")
    body, footer = data[:-8 - length], data[-8 - length:-8]
    pos = last = 0
    while footer[pos]:
        start, byte = pos, footer[pos]
        pos += 1
        if byte >> 4:
            last += byte >> 4
        else:
            raw, pos = _varint(footer, pos)
            last = (raw >> 1) ^ -(raw & 1)
        if last >= 8:
            cut = footer[:start] + b"\x00"
            return body + cut + len(cut).to_bytes(4, "little") + b"PAR1"
        pos = _skip(footer, pos, byte & 0x0F, 0)
    raise AssertionError("no encryption marker in the footer")


def test_encrypted_columns_without_the_files_marker_are_refused_not_aborting_the_process():
    """pyarrow aborts the process (SIGABRT: "Cannot decrypt ColumnMetadata") at the first column
    chunk's metadata; the file's ``encryption_algorithm`` is not the only marker to look for."""
    data = _without_file_encryption_marker(_encrypted(plaintext_footer=True))
    for decoder in DECODERS:
        with pytest.raises(InputFileError, match=r"an encrypted Parquet file \(some of its columns are encrypted\)"):
            _read(data, "e.parquet", decoder)
    with pytest.raises(InputFileError, match="an encrypted Parquet file"):
        read_parquet_schema(io.BytesIO(data), "e.parquet")


def test_a_large_unsigned_footer_with_only_column_encryption_markers_is_refused_not_aborting(tmp_path):
    """A footer over the size pyarrow's ``serialized_size`` once let go unscanned (no room for a
    signature), its columns' ``crypto_metadata`` the only marker: pyarrow aborted the process at the
    first column chunk's metadata. Run in a child process, so an abort fails this test, not the suite."""
    data = _without_file_encryption_marker(_encrypted(plaintext_footer=True, wide=1500))
    assert int.from_bytes(data[-8:-4], "little") > 256 << 10
    path = tmp_path / "wide.parquet"
    path.write_bytes(data)
    script = ("import sys\nfrom convert.parquet import iter_parquet, read_parquet_schema\n"
              "from convert.source_types import InputFileError\n"
              "for call in (lambda f: read_parquet_schema(f, sys.argv[1]),\n"
              "             lambda f: [b for b in iter_parquet(f, sys.argv[1])]):\n"
              "    try:\n        call(open(sys.argv[1], 'rb'))\n    except InputFileError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    refusals = out.stdout.splitlines()
    assert len(refusals) == 2 and all(f"{path} at byte 0: an encrypted Parquet file (some of its columns are "
                                      "encrypted)" in r for r in refusals), out.stdout
