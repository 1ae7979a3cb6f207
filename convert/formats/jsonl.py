"""Reading JSON input (JSON Lines, a JSON array, or records inside one document
at ``--json-records-path``; gzip or not) into ``RecordBatch``es, with integers
beyond 64 bits kept exact and every line or document capped in size.
"""

from __future__ import annotations

import gzip
import io
import itertools
import json
import re
import zlib
from collections.abc import Generator, Iterator
from typing import IO, Any

import numpy as np
import orjson

from convert.source_types import (
    CHECK_CHUNK_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    GZIP_MAGIC,
    MAX_ERROR_TEXT_BYTES,
    MAX_QUOTED_CHARS,
    InputFileError,
    RecordBatch,
    excerpt,
    mb,
    quoted,
)

#: 19+ digits in a row: maybe an integer outside int64/uint64, which orjson
#: silently turns into a float; the stdlib parser keeps such integers exact.
#: Found with ``bytes.translate`` + ``find`` instead of a regex (``\d{19}``
#: backtracks at every digit run; docs/benchmarks.md#design-converter). Runs after ``.``/``e``/``E``/``+`` are fractions or exponents,
#: not integers (``0.000123456789012345678`` is common in JSON from Python).
_DIGITS_TO_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_LONG_RUN = b"0" * 19
_NOT_AN_INTEGER_BEFORE = frozenset(b".eE+")


def _long_integer_runs(data: bytes) -> Iterator[int]:
    """Start of every run of 19+ digits in ``data`` that may be an integer literal."""
    if len(data) >= _NUMPY_SCAN_BYTES:
        yield from _long_integer_runs_numpy(data)
        return
    t = data.translate(_DIGITS_TO_ZERO)
    i = t.find(_LONG_RUN)
    while i >= 0:
        if i == 0 or t[i - 1] not in _NOT_AN_INTEGER_BEFORE:
            yield i
        i += len(_LONG_RUN)
        while i < len(t) and t[i] == 0x30:  # the rest of this run
            i += 1
        i = t.find(_LONG_RUN, i)


#: From this size on, blocks are scanned with numpy (see _long_integer_runs_numpy).
_NUMPY_SCAN_BYTES = 1 << 16


def _long_integer_runs_numpy(data: bytes) -> Iterator[int]:
    """``_long_integer_runs`` for large blocks: a digit mask, then a few ANDs of
    shifted copies leave ``e[i]`` true where 19 digits start at ``i``.

    Why: JSON Lines blocks are scanned whole, and this is faster than
    translate + find on them (docs/benchmarks.md#design-converter). Small inputs keep translate + find
    (numpy's per-call cost is larger there).
    """
    t = np.frombuffer(data, np.uint8) - np.uint8(48)  # digits become 0..9, the rest wraps above
    digit = np.less(t, 10, out=t.view(bool))
    e = digit.copy()
    n = e.size
    for w in (1, 2, 4, 8, 3):  # runs of 2, 4, 8, 16, then 19 digits
        if n <= w:
            return
        np.logical_and(e[:n - w], e[w:n], out=e[:n - w])
        n -= w
    starts = np.flatnonzero(e[:n])
    if not starts.size:
        return
    starts = starts[(starts == 0) | ~digit[starts - 1]]  # where a run begins
    for i in starts.tolist():
        if i == 0 or data[i - 1] not in _NOT_AN_INTEGER_BEFORE:
            yield i


def _maybe_long_integer(line: bytes) -> bool:
    """Whether ``line`` may hold an integer literal of 19 or more digits."""
    return next(_long_integer_runs(line), None) is not None


#: A ``\uD800``-``\uDFFF`` escape: maybe a lone surrogate, which is not Unicode
#: (it cannot be encoded as UTF-8 for vocabularies, hashing or the error output).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _loads(line: bytes) -> Any:
    if not _maybe_long_integer(line):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    # The same error, or a value orjson refuses (1e400, lone surrogates).
    try:
        value = json.loads(line)
    except RecursionError:
        raise ValueError("JSON nested too deeply for Python's parser (about 1000 levels); flatten the record") from None
    if _SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair), "
                             "which is not valid Unicode; fix the writer") from None
    return value


def _records_at(doc: Any, records_path: str | None, path: str) -> list[Any]:
    node = doc
    if records_path:
        for key in records_path.split("."):
            if not isinstance(node, dict) or key not in node:
                found = [k[:50] for k in sorted(node)[:10]] if isinstance(node, dict) else type(node).__name__
                raise InputFileError(path, f"--json-records-path {records_path!r}: no key {key!r} (found {found})")
            node = node[key]
    if isinstance(node, dict) and not records_path:
        return [node]
    if not isinstance(node, list):
        raise InputFileError(path, f"expected a JSON array of records, found {type(node).__name__}; pass --json-records-path to name the key holding the records")
    return node


def record_lists(doc: Any, depth: int = 3) -> list[str]:
    """The ``--json-records-path`` of every non-empty list of objects in a JSON document
    that is one object (``statuses`` of a search result, ``data.items``), down to
    ``depth`` keys; what ``infer`` reads when a file holds no records of its own."""
    found: list[str] = []
    stack: list[tuple[str, Any, int]] = [("", doc, 0)]
    while stack:
        prefix, node, level = stack.pop()
        if not isinstance(node, dict) or level >= depth:
            continue
        for k, v in node.items():
            path = f"{prefix}.{k}" if prefix else str(k)
            if "." in str(k):
                continue  # --json-records-path splits at dots
            if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                found.append(path)
            elif isinstance(v, dict):
                stack.append((path, v, level + 1))
    return sorted(found)


def _iter_gzip_json(f: IO[bytes], path: str, batch_size: int, records_path: str | None,
                    max_record_bytes: int) -> Iterator[RecordBatch]:
    """JSON inside gzip; damaged gzip data makes the file unreadable (named), not a crash.
    ``GzipFile`` decompresses only what each bounded read asks for, so the
    record cap bounds memory here too."""
    try:
        yield from iter_json(gzip.GzipFile(fileobj=f, mode="rb"), path, 0, None, batch_size, records_path,  # type: ignore[arg-type]
                             max_record_bytes)
    except (OSError, EOFError, zlib.error) as e:
        raise InputFileError(path, f"not valid gzip data ({quoted(e)}); the file starts with gzip's magic bytes") from e


def iter_json(f: IO[bytes], path: str, start: int = 0, end: int | None = None,
              batch_size: int = 4096, records_path: str | None = None,
              max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> Iterator[RecordBatch]:
    """Yield batches from JSON Lines, a JSON array, or records under a key.

    JSON Lines are streamed line by line (ranges align to line starts). A
    whole-document JSON (array, or ``records_path``) is parsed in one piece:
    JSON has no record boundaries to stream on without a second parser, so
    prefer JSON Lines for large inputs.

    ``max_record_bytes`` caps a line and a whole document: a longer line goes
    to ``bad`` (read past in bounded chunks, never held whole); a longer
    document fails the file with ``InputFileError``.
    """
    f.seek(0)
    head = f.read(2)
    f.seek(0)
    if head == GZIP_MAGIC:
        if start > 0:
            return  # not splittable: the range starting at 0 owns the whole file
        yield from _iter_gzip_json(f, path, batch_size, records_path, max_record_bytes)
        return
    buffered = f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f)  # type: ignore[arg-type]

    # Sniff by reading (not every stream has ``peek``, e.g. io.BytesIO).
    probe = buffered.read(64 * 1024)
    buffered.seek(0)
    lead = probe.lstrip(b"\xef\xbb\xbf \t\r\n")
    header = None if records_path else _header_row(probe)
    if header is not None:  # arrays per line under a header row: every range reads the header from line 1
        pos = 0
        if start > 0:
            buffered.seek(start - 1)
            pos = start - 1 + _skip_line(buffered)[0]
        yield from _iter_json_lines(buffered, path, pos, 0 if start > 0 else 1, end, batch_size, max_record_bytes,
                                      header)
        return
    if records_path or lead.startswith(b"["):
        if start > 0:
            return  # one JSON document: owned by the range that starts at 0
        data = buffered.read(max_record_bytes + 4)  # + a BOM, + 1 to see a longer document
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        if len(data) > max_record_bytes:
            raise InputFileError(path, f"the JSON document is larger than {mb(max_record_bytes)}, the cap on a JSON "
                                 "document (--max-record-mb); raise --max-record-mb to read it, or write JSON Lines "
                                 "(one record per line), which are streamed")
        if not data.strip():
            return
        try:
            doc = _loads(data)
        except ValueError as e:
            raise InputFileError(path, f"not valid JSON ({str(e)[:MAX_QUOTED_CHARS]}); expected JSON Lines or one JSON document") from e
        recs = _records_at(doc, records_path, path)
        for s in range(0, len(recs), batch_size):
            chunk = recs[s:s + batch_size]
            yield RecordBatch(path, "json", chunk, [0] * len(chunk), list(range(s, s + len(chunk))))
        return

    pos, line_no = 0, 1
    if start > 0:
        # Own the lines that start in [start, end): skip the partial line.
        buffered.seek(start - 1)
        pos = start - 1 + _skip_line(buffered)[0]
        line_no = _count_newlines(buffered, pos) + 1
        buffered.seek(pos)
    yield from _iter_json_lines(buffered, path, pos, line_no, end, batch_size, max_record_bytes)


#: Bytes read at a time when counting the lines before a range's start.
_COUNT_CHUNK_BYTES = 1 << 20


def _count_newlines(f: IO[bytes], upto: int) -> int:
    """Newlines in the first ``upto`` bytes: a range that starts mid-file numbers its lines from them.

    One sequential read of the bytes before the range, in bounded chunks (docs/converting.md#errors).
    """
    f.seek(0)
    n, left = 0, upto
    while left > 0:
        chunk = f.read(min(left, _COUNT_CHUNK_BYTES))
        if not chunk:
            break
        n += chunk.count(b"\n")
        left -= len(chunk)
    return n


def _header_row(probe: bytes) -> list[str] | None:
    """The column names when the file is JSON Lines of arrays under a header row
    (``["id","name"]`` then ``[1,"a"]``..., as table exports write): a first line
    that is an array of distinct strings followed by a line that is an array.
    ``None`` for anything else (one JSON document, JSON Lines of objects)."""
    lines = probe.removeprefix(b"\xef\xbb\xbf").split(b"\n", 2)
    if len(lines) < 2 or not lines[0].lstrip().startswith(b"[") or not lines[1].lstrip().startswith(b"["):
        return None
    try:
        names = orjson.loads(lines[0])
    except orjson.JSONDecodeError:
        return None
    if not names or not isinstance(names, list) or not all(isinstance(n, str) for n in names) or len(set(names)) < len(names):
        return None
    return names


def _skip_line(f: IO[bytes]) -> tuple[int, bool]:
    """Read past the next newline (or to the end), ``CHECK_CHUNK_BYTES`` at a
    time, so a line of any length is never held whole: the bytes read, and
    whether they end with the newline."""
    n = 0
    while True:
        chunk = f.readline(CHECK_CHUNK_BYTES)
        n += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return n, bool(chunk)


#: JSON Lines are read in blocks of about this many bytes (completed to the
#: next newline): one C-level split and one long-integer scan per block
#: instead of a Python iteration and a scan per line. 128 KB rather than 1 MB:
#: a block's lines stay in the CPU's cache while orjson parses them
#: (smaller blocks measured: docs/benchmarks.md#design-converter).
_JSONL_BLOCK_BYTES = 1 << 17


def _iter_json_lines(buffered: IO[bytes], path: str, pos: int, line_no: int, end: int | None,
                     batch_size: int, max_line: int = DEFAULT_MAX_RECORD_BYTES,
                     header: list[str] | None = None) -> Iterator[RecordBatch]:
    """JSON Lines from byte ``pos`` (a line start), lines starting before ``end``.

    With ``header`` (``_header_row``), line 1 is the header and every other
    line an array of as many values, read as the object ``{name: value}``.

    ``line_no`` is the 1-based number of the line at ``pos``, 0 when unknown.
    Per-line work is kept to ``orjson.loads``: blocks are split in C and the
    scan for integers orjson would round (``_long_integer_runs``) runs once per
    block; a block of plain objects is parsed by one ``map`` (``_plain_block``),
    any other line by line. A line orjson refuses, or that may hold a long
    integer, goes through ``_loads`` (stripped).

    A line longer than ``max_line`` bytes goes to ``bad``: a block is completed
    to the next newline only up to the cap, and the rest of a longer line is
    read past in bounded chunks (``_skip_line``). Batches are yielded at
    ``batch_size`` records plus bad lines, so a file of bad lines is not held whole.
    """
    batch = RecordBatch(path, "json", [], [], [])
    while end is None or pos < end:  # (a line starting before ``end`` may run past it)
        read = _json_block(buffered, max_line)
        if read is None:
            break
        block, long_head, long_len = read
        long_runs = list(_long_integer_runs(block))
        lines = block.split(b"\n")
        if block.endswith(b"\n") or not block:
            lines.pop()  # the empty piece after the last newline is not a line
        plain = None if long_runs or header is not None else _plain_block(lines, pos, end, max_line)
        if plain is not None:
            batch = yield from _add_plain_records(batch, *plain, line_no, batch_size)
            if line_no:
                line_no += len(plain[0])
        else:
            batch, line_no = yield from _add_lines(batch, lines, long_runs, pos, line_no, end, batch_size,
                                                   max_line, header)
        pos += len(block)
        if long_head is not None:
            if end is not None and pos >= end:
                break
            bad, long_len = _skip_long_line(buffered, pos, line_no, long_head, long_len, max_line)
            batch.bad.append(bad)
            if line_no:
                line_no += 1
            pos += long_len
    if batch.records or batch.bad:
        yield batch


def _add_plain_records(batch: RecordBatch, recs: list[dict], offsets: list[int], line_no: int,
                       batch_size: int) -> Generator[RecordBatch, None, RecordBatch]:
    """A plain block's records (``_plain_block``) added to ``batch``; full batches
    are yielded, and the batch being filled is returned."""
    done = 0
    while done < len(recs):
        room = batch_size - len(batch.records) - len(batch.bad)
        if room <= 0:
            yield batch
            batch = RecordBatch(batch.path, "json", [], [], [])
            continue
        upto = min(len(recs), done + room)
        batch.records += recs[done:upto]
        batch.offsets += offsets[done:upto]
        batch.indexes += range(line_no + done, line_no + upto) if line_no else [0] * (upto - done)
        done = upto
    return batch


def _add_lines(batch: RecordBatch, lines: list[bytes], long_runs: list[int], pos: int, line_no: int,
               end: int | None, batch_size: int, max_line: int,
               header: list[str] | None) -> Generator[RecordBatch, None, tuple[RecordBatch, int]]:
    """A block's ``lines`` (the block at byte ``pos``) read one by one into ``batch``
    (records, or ``bad`` entries); full batches are yielded, and the batch being
    filled and the next line's number are returned."""
    rel = 0  # offset of the current line in the block
    run = 0  # next entry of long_runs at or after the current line
    for line in lines:
        if len(batch.records) + len(batch.bad) >= batch_size:
            yield batch
            batch = RecordBatch(batch.path, "json", [], [], [])
        off, line_start = pos + rel, rel
        rel += len(line) + 1
        this_line = line_no
        if line_no:
            line_no += 1
        if end is not None and off >= end:
            break
        while run < len(long_runs) and long_runs[run] < line_start:
            run += 1
        got = _json_line(line, off, run < len(long_runs) and long_runs[run] < rel, max_line, header)
        if isinstance(got, dict):
            batch.records.append(got)
            batch.offsets.append(off)
            batch.indexes.append(this_line)
        elif got is not None:
            batch.bad.append((off, this_line, *got))
    return batch, line_no


def _json_line(line: bytes, off: int, may_hold_long: bool, max_line: int,
               header: list[str] | None) -> dict | tuple[str, str] | None:
    """One JSON line at byte ``off``: its record, ``(reason, text)`` when it is
    rejected, or None when it holds none (blank, the header row). A line that
    may hold a long integer (``_long_integer_runs``), or that orjson refuses,
    is read by ``_loads``."""
    if len(line) > max_line:  # (only when the cap is below the block size)
        return _too_long(len(line), max_line), excerpt(line)
    if off == 0 and line.startswith(b"\xef\xbb\xbf"):
        line = line[3:]
    if not line or line.isspace():
        return None
    try:
        if may_hold_long:
            rec = _loads(line.strip())
        else:
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                rec = _loads(line.strip())
    except ValueError as e:
        return f"malformed JSON: {str(e)[:MAX_QUOTED_CHARS]}", excerpt(line.strip())
    if header is not None:
        if off == 0:
            return None  # the header row
        if not isinstance(rec, list) or len(rec) != len(header):
            found = f"{len(rec)} values" if isinstance(rec, list) else type(rec).__name__
            return (f"expected an array of {len(header)} values (the header row's columns), found {found}",
                    excerpt(line.strip()))
        rec = dict(zip(header, rec, strict=True))
    if not isinstance(rec, dict):
        return f"expected a JSON object per line, found {type(rec).__name__}", excerpt(line.strip())
    return rec


def _plain_block(lines: list[bytes], pos: int, end: int | None, max_line: int) -> tuple[list[dict], list[int]] | None:
    """``(records, offsets)`` of a block's ``lines`` (the block at byte ``pos``, without long-integer
    runs) when every line is one JSON object ``orjson.loads`` reads as it is, starts before ``end``
    and is within ``max_line``: what the per-line loop of ``_iter_json_lines`` would make of them,
    from one C-level ``map`` instead of a Python step per line. ``None`` when any line needs that
    loop (blank, malformed, not an object, a BOM at the file's start, past ``end``, too long)."""
    if not lines or (pos == 0 and lines[0].startswith(b"\xef\xbb\xbf")):
        return None
    lens = list(map(len, lines))
    if max(lens) > max_line:
        return None
    offsets = list(itertools.accumulate(lens[:-1], lambda at, n: at + n + 1, initial=pos))
    if end is not None and offsets[-1] >= end:
        return None
    try:
        recs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        return None
    return (recs, offsets) if set(map(type, recs)) == {dict} else None


def _json_block(buffered: IO[bytes], max_line: int) -> tuple[bytes, bytes | None, int] | None:
    """The next block of whole lines, ``None`` at the end of the file.

    ``(block, long_head, long_len)``: a last line over ``max_line`` bytes is cut
    off the block; ``long_head`` is its start (``None`` when there is none) and
    ``long_len`` the bytes of it read so far (its rest is still unread).
    """
    block = buffered.read(_JSONL_BLOCK_BYTES)
    if not block:
        return None
    long_head, long_len = None, 0
    if not block.endswith(b"\n"):
        last = block.rfind(b"\n") + 1
        need = max_line + 1 - (len(block) - last)
        if need > 0:
            block += buffered.readline(need)  # complete the last line (unless at EOF or over the cap)
        if not block.endswith(b"\n") and len(block) - last > max_line:
            long_head, long_len = block[last:last + MAX_ERROR_TEXT_BYTES], len(block) - last
            block = block[:last]
    return block, long_head, long_len


def _skip_long_line(buffered: IO[bytes], pos: int, line_no: int, long_head: bytes, long_len: int,
                    max_line: int) -> tuple[tuple[int, int, str, str], int]:
    """Reads past the rest of a line over the cap that starts at ``pos``: its ``bad``
    entry, and the line's whole length (with its newline)."""
    rest, newline = _skip_line(buffered)
    long_len += rest
    text_len = long_len - newline
    return (pos, line_no, _too_long(text_len, max_line), excerpt(long_head, text_len)), long_len


def _too_long(nbytes: int, cap: int) -> str:
    return (f"line of {nbytes} bytes is longer than {mb(cap)}, the cap on a JSON record (--max-record-mb); "
            "raise --max-record-mb to read it")
