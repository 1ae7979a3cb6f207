"""What a Parquet file's raw bytes say before pyarrow reads its columns:
whether the file is encrypted (its footer), and how many rows a column
chunk's pages hold (their headers).

pyarrow aborts the process (an uncaught C++ exception, not a Python error)
when a column's metadata of a file with encrypted columns and a plaintext
footer is touched without keys (``ParquetFile.metadata.row_group(i).column(j)``:
its Cython declares ``RowGroupMetaData::ColumnChunk`` without ``except +``), and
names a file with an encrypted footer "not a Parquet file". So the reader
asks ``encryption`` first: the magic ``PARE`` (encrypted footer) at either
end, or ``FileMetaData.encryption_algorithm`` (field 8, set only in files with
encrypted columns and a plaintext footer) or a ``ColumnChunk.crypto_metadata``
in the Thrift compact encoded footer.

Every footer is walked, whatever its size: a footer whose column chunks say
they are encrypted aborts pyarrow whether or not the file's marker or a
signature is there. The walk reads the footer as pyarrow's Thrift does, so no
footer reads one way here and another there; one it cannot read to its end is
refused (``"unreadable"``), never handed to pyarrow unproven. The walk runs in
C (``convert/_footer.c``) where it is built; the Python path beside it gives the
same answer. Both remember the verdicts of the last footers walked, checked
byte for byte, so that the work units of one file (its row groups) do not walk
it again (``docs/benchmarks.md#design-converter``).

``page_counts`` walks a column chunk's page headers (Thrift compact
``PageHeader`` structs, each followed by its page's bytes) for the values and rows
its data pages hold: the ground truth a footer's counts may misstate
(pyarrow reads as many rows as the footer says, and drops the rest without a
word).
"""

from __future__ import annotations

import os
import re
from typing import IO, Any

try:
    from convert._footer import encryption_fields as _encryption_fields_c
except ImportError:  # built without a C compiler: the Python path
    _encryption_fields_c = None

#: The magic of a Parquet file whose footer is encrypted (plaintext footers keep ``PAR1``).
ENCRYPTED_MAGIC = b"PARE"

_MAX_STRUCT_DEPTH = 64  # the Thrift structs of a footer nest a few levels; deeper is garbage

#: The verdicts of the footers walked last: (length, head, tail) -> (footer, verdict). A process reads
#: a few files at a time; the bytes kept are bounded (``_MAX_REMEMBERED``).
_VERDICTS: dict[tuple[int, bytes, bytes], tuple[bytes, int]] = {}
_MAX_REMEMBERED = 256 << 20
_SAMPLE = 4096


class _Bad(Exception):
    """The footer is not the Thrift compact ``FileMetaData`` the walk reads."""


class PageError(ValueError):
    """A column chunk whose page headers ``page_counts`` cannot walk to the
    chunk's end: the message says where and why."""


def encryption(f: IO[bytes]) -> str | None:
    """``"footer"`` (encrypted footer), ``"columns"`` (encrypted columns,
    plaintext footer), ``"unreadable"`` (a footer the walk cannot read to its
    end: nothing proves it free of markers) or ``None`` (not encrypted, or no
    footer: pyarrow refuses the file by itself). Leaves ``f`` at its start."""
    try:
        f.seek(0)
        head = f.read(4)
        size = f.seek(0, os.SEEK_END)
        if size < 12:
            return "footer" if head == ENCRYPTED_MAGIC else None
        f.seek(size - 8)
        tail = f.read(8)
        if ENCRYPTED_MAGIC in (head, tail[4:]):
            return "footer"
        length = int.from_bytes(tail[:4], "little")
        if tail[4:] != b"PAR1" or not 0 < length <= size - 12:
            return None
        f.seek(size - 8 - length)
        footer = f.read(length)
    finally:
        f.seek(0)
    return {MARKED: "columns", UNREADABLE: "unreadable"}.get(encryption_fields(footer))


#: ``encryption_fields``' answers.
CLEAN, MARKED, UNREADABLE = 0, 1, -1


def encryption_fields(footer: bytes) -> int:
    """``MARKED`` when the Thrift compact ``FileMetaData`` ``footer`` marks
    encryption (``_encryption_fields``), ``CLEAN`` when it does not,
    ``UNREADABLE`` when the walk stops before its end."""
    key = (len(footer), footer[:_SAMPLE], footer[-_SAMPLE:])
    known = _VERDICTS.get(key)
    if known is not None and known[0] == footer:
        return known[1]
    if _encryption_fields_c is not None:
        verdict = _encryption_fields_c(footer)
    else:
        try:
            verdict = MARKED if _encryption_fields(footer) else CLEAN
        except (_Bad, IndexError):
            verdict = UNREADABLE
    _VERDICTS.pop(key, None)
    while _VERDICTS and sum(len(f) for f, _ in _VERDICTS.values()) + len(footer) > _MAX_REMEMBERED:
        del _VERDICTS[next(iter(_VERDICTS))]
    if len(footer) <= _MAX_REMEMBERED:
        _VERDICTS[key] = (footer, verdict)
    return verdict


# The structs whose fields the walk reads as Thrift's generated code for parquet.thrift does: those on
# the way to a ColumnChunk, and those holding lists. The others are skipped by their wire types.
_OTHER, _FILE, _ROW_GROUP, _COLUMN, _COLUMN_META, _SIZE_STATS, _GEO_STATS = range(7)
_MARKERS = {(_FILE, 8), (_FILE, 9), (_COLUMN, 8), (_COLUMN, 9)}
#: (struct, field) of a list -> its items' kind and role. The generated code reads a list's items as the
#: schema says, whatever kind the list's header names: so does the walk.
_LISTS = {(_FILE, 2): (12, _OTHER), (_FILE, 4): (12, _ROW_GROUP), (_FILE, 5): (12, _OTHER),
          (_FILE, 7): (12, _OTHER), (_ROW_GROUP, 1): (12, _COLUMN), (_ROW_GROUP, 4): (12, _OTHER),
          (_COLUMN_META, 2): (5, _OTHER), (_COLUMN_META, 3): (8, _OTHER), (_COLUMN_META, 8): (12, _OTHER),
          (_COLUMN_META, 13): (12, _OTHER), (_SIZE_STATS, 2): (6, _OTHER), (_SIZE_STATS, 3): (6, _OTHER),
          (_GEO_STATS, 2): (5, _OTHER)}
_STRUCTS = {(_COLUMN, 3): _COLUMN_META, (_COLUMN_META, 16): _SIZE_STATS, (_COLUMN_META, 17): _GEO_STATS}


def _encryption_fields(buf: bytes) -> bool:
    """Whether the Thrift compact ``FileMetaData`` at the start of ``buf`` marks
    encryption: its ``encryption_algorithm`` or ``footer_signing_key_metadata``
    (fields 8, 9), or a column chunk's ``crypto_metadata`` or
    ``encrypted_column_metadata`` (``ColumnChunk`` fields 8, 9; a file may hold
    these without the file's marker, and pyarrow then aborts as well).

    Reads as Apache Thrift's C++ compact protocol does (a field header whose
    type is 0 ends a struct, field ids are 16-bit, lengths 31-bit), so that no
    footer reads one way here and another in pyarrow; raises ``_Bad`` (or
    ``IndexError``) where it cannot tell. One loop over an explicit stack:
    footers of wide files hold millions of values."""
    pos = 0
    # frames: [is_struct, last field id, list items left, list item kind, role (of the struct or the items)]
    stack: list[list[int]] = [[1, 0, 0, 0, _FILE]]
    while stack:
        frame = stack[-1]
        if frame[0]:  # a struct: the next field header
            byte = buf[pos]
            pos += 1
            kind = byte & 0x0F
            if not kind:
                stack.pop()
                continue
            if byte >> 4:
                fid = frame[1] + (byte >> 4)
            else:
                raw, pos = _varint(buf, pos)
                fid = (raw >> 1) ^ -(raw & 1)
            if not -0x8000 <= fid <= 0x7FFF:  # Thrift would wrap it round: refused
                raise _Bad
            frame[1] = fid
            key = (frame[4], fid)
            if key in _MARKERS:
                return True
            role = _STRUCTS.get(key, _OTHER) if kind == 12 else _OTHER
            if kind == 9 and key in _LISTS:
                n, pos = _list_size(buf, pos)
                item, role = _LISTS[key]
                if len(stack) > _MAX_STRUCT_DEPTH:
                    raise _Bad
                stack.append([0, 0, n, item, role])
                continue
        else:  # a list or set: the next item
            if not frame[2]:
                stack.pop()
                continue
            frame[2] -= 1
            kind, role = frame[3], frame[4]
        if kind <= 2:  # bool in a field header (items' bools are kind 3)
            continue
        if kind == 3:
            pos += 1
        elif kind <= 6:  # zigzag varints
            while buf[pos] & 0x80:
                pos += 1
            pos += 1
        elif kind == 7:
            pos += 8
        elif kind == 8:
            n, pos = _size(buf, pos)
            pos += n
        elif kind == 12:
            if len(stack) > _MAX_STRUCT_DEPTH:
                raise _Bad
            stack.append([1, 0, 0, 0, role])
        elif kind in (9, 10):
            elem = buf[pos] & 0x0F
            n, pos = _list_size(buf, pos)
            if len(stack) > _MAX_STRUCT_DEPTH or not elem:
                raise _Bad
            stack.append([0, 0, n, 3 if elem in (1, 2) else elem, _OTHER])
        elif kind == 11:
            pos = _skip(buf, pos, kind, len(stack))
        else:
            raise _Bad
        if pos > len(buf):
            raise _Bad
    return False


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A varint of at most 10 bytes (Thrift refuses longer ones)."""
    out = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, pos
        shift += 7
        if shift >= 70:
            raise _Bad


def _size(buf: bytes, pos: int) -> tuple[int, int]:
    """A length or count: a varint Thrift reads as a non-negative 32-bit int."""
    n, pos = _varint(buf, pos)
    if n >> 31:
        raise _Bad
    return n, pos


def _list_size(buf: bytes, pos: int) -> tuple[int, int]:
    """The item count of the list header at ``pos``, and the position after the header."""
    n = buf[pos] >> 4
    pos += 1
    if n == 15:
        n, pos = _size(buf, pos)
    if n > len(buf):
        raise _Bad
    return n, pos


def _skip(buf: bytes, pos: int, kind: int, depth: int) -> int:
    """The position after one value of Thrift compact type ``kind`` at ``pos``
    (read by its wire types, as Thrift skips a field it does not know)."""
    if kind in (1, 2):  # bool in a field header
        return pos
    if kind == 3:  # byte (also a bool inside a list)
        return pos + 1
    if kind in (4, 5, 6):  # zigzag varints
        return _varint(buf, pos)[1]
    if kind == 7:  # double
        return pos + 8
    if kind == 8:  # binary
        n, pos = _size(buf, pos)
        return pos + n
    if depth > _MAX_STRUCT_DEPTH:
        raise _Bad
    if kind in (9, 10):  # list, set
        elem = buf[pos] & 0x0F
        n, pos = _list_size(buf, pos)
        elem = 3 if elem in (1, 2) else elem
        for _ in range(n):
            pos = _skip(buf, pos, elem, depth + 1)
            if pos > len(buf):
                raise _Bad
        return pos
    if kind == 11:  # map
        n, pos = _size(buf, pos)
        if n == 0:
            return pos
        kv = buf[pos]
        pos += 1
        kt, vt = kv >> 4, kv & 0x0F
        kt, vt = (3 if kt in (1, 2) else kt), (3 if vt in (1, 2) else vt)
        for _ in range(n):
            pos = _skip(buf, _skip(buf, pos, kt, depth + 1), vt, depth + 1)
            if pos > len(buf):
                raise _Bad
        return pos
    if kind == 12:  # struct
        while True:
            byte = buf[pos]
            pos += 1
            if not byte & 0x0F:
                return pos
            if not byte >> 4:
                pos = _varint(buf, pos)[1]
            pos = _skip(buf, pos, byte & 0x0F, depth + 1)
    raise _Bad


# -- page headers: the values and rows a column chunk's pages hold ------------------------------------------------

#: Page types (``PageType``) whose headers carry counts; the others (dictionary, index pages) hold no rows.
DATA_PAGE, DATA_PAGE_V2 = 0, 3
#: pyarrow's default limit on a page header's size; a header not ending within it is refused.
_MAX_PAGE_HEADER = 16 << 20
#: The bytes read at a time: a chunk's pages are read in order, their bodies read past (never sought).
_WINDOW = 1 << 20


def page_counts(f: IO[bytes], size: int, slack: int = 0) -> tuple[int, int | None]:
    """The values (levels: one per row of a column not repeated) and rows
    the data pages of the column chunk of ``size`` bytes at ``f``'s position
    hold, in order: ``(sum of num_values, sum of num_rows)``, the rows
    ``None`` when a version 1 data page (which does not count rows) is among
    them. Reads the chunk once, front to back, at most ``_WINDOW`` bytes at a
    time (no seek: the file may be remote). ``slack``: bytes past ``size``
    the last page may take (pyarrow pads the chunks of writers known to
    leave a page header out of ``size``: ``chunk_slack``).

    Raises ``PageError`` (never another error, never loops without reading)
    when the headers do not walk to the chunk's end exactly: a header the
    Thrift compact protocol cannot read (garbage, nested past
    ``_MAX_STRUCT_DEPTH``, a varint past 10 bytes, over ``_MAX_PAGE_HEADER``),
    a data page's header without its counts, a negative size or count, a
    page running past the chunk, or a chunk running past the file."""
    values = rows = 0
    v1 = False
    limit = size + slack
    buf, at, pos = b"", 0, 0  # the next header: the chunk's byte pos, buf[at]
    while pos < size:
        try:
            end, (kind, csize, n_values, n_rows) = _page_header(buf, at)
        except (_Bad, IndexError, RecursionError):
            have = len(buf) - at
            if have >= min(limit - pos, _MAX_PAGE_HEADER):
                raise PageError(f"the page header at byte {pos} of the column chunk cannot be read") from None
            buf = buf[at:] + _read(f, min(limit - pos, _MAX_PAGE_HEADER, max(_WINDOW, 2 * have)) - have, pos)
            at = 0
            continue
        step = end - at + csize  # the header and its page
        if csize < 0 or step > limit - pos:
            raise PageError(f"the page at byte {pos} of the column chunk claims {csize} bytes, past the chunk's "
                            f"end ({size} bytes)")
        if kind in (DATA_PAGE, DATA_PAGE_V2):
            values += n_values
            rows += n_rows
            v1 = v1 or kind == DATA_PAGE
        if end + csize <= len(buf):
            at = end + csize
        else:  # the page runs past the bytes read: read past it
            _read(f, end + csize - len(buf), pos, keep=False)
            buf, at = b"", 0
        pos += step
    return values, None if v1 else rows


def chunk_slack(created_by: str | None, room: int) -> int:
    """The bytes past a column chunk's ``total_compressed_size`` pyarrow
    reads (at most ``room``, the bytes after it in the file): parquet-mr
    before 1.2.9 left the dictionary page's header out of that size
    (PARQUET-816), and pyarrow pads such files' chunks by up to 100 bytes; a
    page walk that did not would refuse what pyarrow reads right."""
    m = re.match(r"parquet-mr(?: version (\d+)(?:\.(\d+))?(?:\.(\d+))?)?", created_by or "")
    if m is None or tuple(int(v or 0) for v in m.groups()) >= (1, 2, 9):
        return 0
    return max(0, min(100, room))


def _read(f: IO[bytes], n: int, pos: int, keep: bool = True) -> bytes:
    """The next ``n`` bytes of ``f`` (read in pieces of at most ``_WINDOW``,
    dropped unless ``keep``); ``PageError`` where the file ends first."""
    out = []
    while n > 0:
        piece = f.read(min(n, _WINDOW))
        if not piece:
            raise PageError(f"the column chunk runs past the file's end (its page at byte {pos})")
        n -= len(piece)
        if keep:
            out.append(piece)
    return b"".join(out)


def _page_header(buf: bytes, pos: int) -> tuple[int, tuple[int, int, int, int]]:
    """The position after the Thrift compact ``PageHeader`` at ``pos`` in
    ``buf``, and its (type, compressed_page_size, num_values, num_rows):
    the counts of ``data_page_header`` (field 5, for ``DATA_PAGE``) or
    ``data_page_header_v2`` (field 8, for ``DATA_PAGE_V2``), 0 for other
    pages. Raises ``IndexError`` where ``buf`` ends first, ``_Bad`` where a
    field the page needs is missing or negative."""
    end, head = _i32_fields(buf, pos, {5, 8}, 1)
    if not all(isinstance(head.get(k), int) for k in (1, 2, 3)) or min(head[2], head[3]) < 0:
        raise _Bad
    kind, counts = head[1], (0, 0)
    if kind in (DATA_PAGE, DATA_PAGE_V2):
        sub = head.get(5 if kind == DATA_PAGE else 8)
        need = (1,) if kind == DATA_PAGE else (1, 3)
        if not isinstance(sub, dict) or not all(isinstance(sub.get(k), int) and sub[k] >= 0 for k in need):
            raise _Bad
        counts = (sub[1], sub[3] if kind == DATA_PAGE_V2 else 0)
    return end, (kind, head[3], *counts)


def _i32_fields(buf: bytes, pos: int, nested: set[int], depth: int) -> tuple[int, dict[int, Any]]:
    """The position after the struct at ``pos``, and its i32 fields by id
    (the last of a field given twice, as Thrift's generated code keeps), the
    structs ``nested`` read alike; other fields are skipped by their wire
    types."""
    out: dict[int, Any] = {}
    last = 0
    while True:
        byte = buf[pos]
        pos += 1
        kind = byte & 0x0F
        if not kind:
            return pos, out
        if byte >> 4:
            fid = last + (byte >> 4)
        else:
            raw, pos = _varint(buf, pos)
            fid = (raw >> 1) ^ -(raw & 1)
        if not -0x8000 <= fid <= 0x7FFF:
            raise _Bad
        last = fid
        if kind == 5:
            raw, pos = _varint(buf, pos)
            if raw >> 32:
                raise _Bad
            out[fid] = (raw >> 1) ^ -(raw & 1)
        elif kind == 12 and fid in nested:
            pos, out[fid] = _i32_fields(buf, pos, set(), depth + 1)
        else:
            pos = _skip(buf, pos, kind, depth)
        if pos > len(buf):
            raise IndexError
