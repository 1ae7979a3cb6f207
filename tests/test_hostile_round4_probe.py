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

from convert.formats.parquet_footer import _skip, _varint
from convert.formats.parquet_reader import read_parquet_schema
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


def _read_in_child(tmp_path: Path, data: bytes, name: str = "e.parquet") -> list[str]:
    """What ``read_parquet_schema`` and ``iter_parquet`` refuse ``data`` with, read in a child process
    (an abort fails the calling test, not the suite)."""
    path = tmp_path / name
    path.write_bytes(data)
    script = ("import sys\nfrom convert.formats.parquet_reader import iter_parquet, read_parquet_schema\n"
              "from convert.source_types import InputFileError\n"
              "for call in (lambda f: read_parquet_schema(f, sys.argv[1]),\n"
              "             lambda f: [b for b in iter_parquet(f, sys.argv[1])]):\n"
              "    try:\n        call(open(sys.argv[1], 'rb'))\n    except InputFileError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    refusals = out.stdout.splitlines()
    assert len(refusals) == 2 and all(r.startswith(f"{path} at byte 0: ") for r in refusals), out.stdout
    return refusals


def test_a_large_unsigned_footer_with_only_column_encryption_markers_is_refused_not_aborting(tmp_path):
    """A footer over the size pyarrow's ``serialized_size`` once let go unscanned (no room for a
    signature), its columns' ``crypto_metadata`` the only marker: pyarrow aborted the process at the
    first column chunk's metadata."""
    data = _without_file_encryption_marker(_encrypted(plaintext_footer=True, wide=1500))
    assert int.from_bytes(data[-8:-4], "little") > 256 << 10
    for refusal in _read_in_child(tmp_path, data):
        assert "an encrypted Parquet file (some of its columns are encrypted)" in refusal


def _chunk_layout(footer: bytes) -> tuple[list[int], list[int], list[int]]:
    """Where, in a footer, each columns list's header is, each column chunk's ``crypto_metadata``
    field header (one byte) and the stop byte ending the ``ColumnMetaData`` of each chunk that has one."""
    lists, cryptos, stops, chunk_stops = [], [], [], []

    def fields(pos: int, on) -> int:
        last = 0
        while footer[pos]:
            byte, at = footer[pos], pos
            last, pos = last + (byte >> 4), pos + 1
            pos = on(last, byte & 0x0F, at, pos)
        return pos + 1

    def chunk(fid, kind, at, pos):
        if fid == 8:
            cryptos.append(at)
            stops.extend(chunk_stops[-1:])
        end = _skip(footer, pos, kind, 0)
        if fid == 3:
            chunk_stops.append(end - 1)
        return end

    def row_group(fid, kind, at, pos):
        if fid != 1:
            return _skip(footer, pos, kind, 0)
        lists.append(pos)
        n, pos = footer[pos] >> 4, pos + 1
        for _ in range(n):
            pos = fields(pos, chunk)
        return pos

    def file(fid, kind, at, pos):
        if fid != 4:
            return _skip(footer, pos, kind, 0)
        n, pos = footer[pos] >> 4, pos + 1
        for _ in range(n):
            pos = fields(pos, row_group)
        return pos

    fields(0, file)
    return lists, cryptos, stops


def _thrift_alike(data: bytes, how: str) -> bytes:
    """``data``'s footer rewritten so that Thrift's C++ compact protocol (pyarrow) reads the same
    FileMetaData, column chunks' ``crypto_metadata`` included, where a walk that is not Thrift's
    own reads something else."""
    length = int.from_bytes(data[-8:-4], "little")
    body, footer = data[:-8 - length], bytearray(data[-8 - length:-8])
    lists, cryptos, stops = _chunk_layout(bytes(footer))
    assert cryptos
    for at in sorted({"stop": stops, "list": lists, "field-id": cryptos}[how], reverse=True):
        if how == "stop":  # a field header of type 0 ends a struct, whatever its delta
            footer[at] = 0x50
        elif how == "list":  # the code generated for parquet.thrift reads a list's items as the schema says
            footer[at] = (footer[at] & 0xF0) | 8
        else:  # field ids are 16-bit: 8 + 65536 is 8
            zigzag = (8 + 65536) << 1
            footer[at:at + 1] = bytes([footer[at] & 0x0F, 0x80 | zigzag & 0x7F, 0x80 | zigzag >> 7 & 0x7F,
                                       zigzag >> 14])
    return body + bytes(footer) + len(footer).to_bytes(4, "little") + b"PAR1"


@pytest.mark.parametrize("how", ["stop", "list", "field-id"])
def test_column_encryption_hidden_from_a_walk_unlike_thrifts_is_refused_not_aborting(tmp_path, how):
    """The footer walk reads field headers, list headers and field ids as Thrift does; where it
    cannot (a field id past 16 bits), the file is refused as unreadable rather than handed to pyarrow."""
    data = _thrift_alike(_without_file_encryption_marker(_encrypted(plaintext_footer=True, wide=20)), how)
    for refusal in _read_in_child(tmp_path, data):
        assert ("an encrypted Parquet file (some of its columns are encrypted)" if how != "field-id" else
                "not a readable Parquet file (its footer is not the Thrift FileMetaData") in refusal
