"""convert.sources: reading Avro and JSON into RecordBatches, whole files and byte ranges.

The byte-range contract (Beam's avroio/textio convention): a range ``[start, end)``
owns every Avro block / JSON line that *starts* in it, so cutting a file
anywhere, and reading the pieces separately, yields every record exactly once
and in file order.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import random
import re
import signal
import tracemalloc
import uuid
from pathlib import Path

import fastavro
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from convert.sources import (
    MAX_AVRO_BLOCK_BYTES,
    InputFileError,
    RecordBatch,
    detect_format,
    is_splittable,
    iter_json,
    iter_records,
)

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"

SCHEMA = {
    "type": "record", "name": "Row", "fields": [
        {"name": "id", "type": "long"},
        {"name": "x", "type": ["null", "double"], "default": None},
        {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "int"}},
        {"name": "raw", "type": "bytes"},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "inner", "type": ["null", {"type": "record", "name": "Inner",
                                             "fields": [{"name": "v", "type": "float"}]}], "default": None},
    ],
}


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{
        "id": i,
        "x": None if i % 7 == 0 else rng.uniform(-1e6, 1e6),
        "name": "n\u00e9\u65e5" * rng.randint(0, 5),
        "tags": [f"t{rng.randint(0, 9)}" for _ in range(rng.randint(0, 4))],
        "attrs": {f"k{j}": j for j in range(rng.randint(0, 3))},
        "raw": bytes(rng.randrange(256) for _ in range(rng.randint(0, 9))),
        "color": rng.choice(["RED", "GREEN"]),
        "inner": None if i % 3 else {"v": 0.5},
    } for i in range(n)]


def write_avro(path: Path, rows: list[dict], schema=SCHEMA, codec: str = "null", sync_interval: int = 200) -> Path:
    with open(path, "wb") as f:
        fastavro.writer(f, schema, rows, codec=codec, sync_interval=sync_interval)
    return path


def read_all(path: Path, start: int = 0, end: int | None = None, batch_size: int = 4096,
             json_records_path: str | None = None, **kw) -> list[RecordBatch]:
    """``kw``: more arguments of ``iter_records`` (the caps)."""
    with open(path, "rb") as f:
        return list(iter_records(f, str(path), start, end, batch_size, json_records_path, **kw))


def records_of(batches: list[RecordBatch]) -> list:
    return [r for b in batches for r in b.records]


def read_in_ranges(path: Path, cuts: list[int], check_owner: bool = True, **kw) -> tuple[list, list]:
    """Records and bad lines of ``path`` read as separate ranges ``[c_i, c_{i+1})``, last one open-ended.

    With ``check_owner`` every record's offset must lie in the range that
    yielded it (not for gzip, whose offsets count decompressed bytes).
    """
    bounds = [0, *sorted(set(c for c in cuts if 0 < c)), None]
    recs, bad = [], []
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        for b in read_all(path, s, e, **kw):
            assert len(b.records) == len(b.offsets) == len(b.indexes)
            for off in b.offsets if check_owner else ():
                assert s <= off and (e is None or off < e), (s, e, off)  # owned by this range
            recs.extend(b.records)
            bad.extend(b.bad)
    return recs, bad


def cut_sets(size: int, seed: int = 1) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        list(range(37, size + 40, 37)),
        list(range(1, size + 2, 1)) if size < 1500 else list(range(5, size + 8, 5)),
        sorted(rng.sample(range(1, size + 20), min(60, size))),
        [size // 2],
    ]


@contextlib.contextmanager
def no_hang(seconds: int = 60):
    """Hang guard (not a speed check): fail instead of blocking the suite forever."""
    def boom(*_):
        raise TimeoutError(f"still running after {seconds}s: reader hangs")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ====================================================================== Avro


@pytest.fixture(scope="module")
def avro_rows() -> list[dict]:
    return make_rows(300)


@pytest.fixture(scope="module")
def avro_file(tmp_path_factory, avro_rows) -> Path:
    return write_avro(tmp_path_factory.mktemp("avro") / "rows.avro", avro_rows)


def _block_table(path: Path) -> list[tuple[int, int]]:
    with open(path, "rb") as f:
        return [(b.offset, b.num_records) for b in fastavro.block_reader(f)]


def test_avro_whole_file_equals_fastavro_reader(avro_file, avro_rows):
    blocks = _block_table(avro_file)
    assert len(blocks) > 20  # small sync_interval: many blocks
    batches = read_all(avro_file, batch_size=50)
    assert records_of(batches) == avro_rows
    assert all(b.kind == "avro" and b.path == str(avro_file) and not b.bad for b in batches)
    # offsets are block offsets, indexes the position inside the block
    want = [(off, i) for off, n in blocks for i in range(n)]
    assert [(o, i) for b in batches for o, i in zip(b.offsets, b.indexes, strict=True)] == want
    assert all(len(b) <= 50 + max(n for _, n in blocks) for b in batches)


def test_avro_ranges_cut_anywhere_yield_every_record_once_in_order(avro_file, avro_rows):
    size = avro_file.stat().st_size
    for cuts in cut_sets(size):
        recs, bad = read_in_ranges(avro_file, cuts)
        assert recs == avro_rows, f"cuts {cuts[:5]}..."
        assert bad == []


def test_avro_ranges_cut_just_after_header(avro_file, avro_rows):
    """Cuts within 16 bytes after the header's sync marker: the first block is owned exactly once."""
    header_end = _block_table(avro_file)[0][0]
    for c in range(header_end - 17, header_end + 18):
        recs, _ = read_in_ranges(avro_file, [c])
        assert recs == avro_rows, c
        first, _ = read_in_ranges(avro_file, [c, c + 1])
        assert first == avro_rows, c


def test_avro_range_past_end_and_empty_range_yield_nothing(avro_file):
    size = avro_file.stat().st_size
    assert read_all(avro_file, size + 10, None) == []
    assert read_all(avro_file, 500, 500) == []


@pytest.mark.parametrize("codec", ["null", "deflate", "snappy", "zstandard", "bzip2", "xz", "lz4"])
def test_avro_every_promised_codec_reads_whole_and_in_ranges(tmp_path, codec):
    rows = make_rows(120, seed=5)
    path = write_avro(tmp_path / f"c-{codec}.avro", rows, codec=codec, sync_interval=300)
    with open(path, "rb") as f:
        assert fastavro.reader(f).codec == codec
    assert records_of(read_all(path)) == rows
    recs, _ = read_in_ranges(path, list(range(37, path.stat().st_size, 37)))
    assert recs == rows


def test_avro_logical_types_come_back_raw(tmp_path):
    """Values datetime/Decimal/UUID conversion would choke on come back as the stored ints/bytes/strings."""
    schema = {"type": "record", "name": "L", "fields": [
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 40, "scale": 2}},
        {"name": "fdec", "type": {"type": "fixed", "name": "F16", "size": 16, "logicalType": "decimal",
                                  "precision": 30, "scale": 3}},
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "opt_ts", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
    ]}
    year_10000_ms = 253402300800000  # 10000-01-01T00:00:00Z
    year_0_ms = -62198755200000  # 0000-01-01, before datetime.MINYEAR
    u = str(uuid.UUID(int=12345))
    rows = [
        {"ts_ms": year_10000_ms, "ts_us": year_10000_ms * 1000, "local_ms": year_0_ms, "t_ms": 86400000,
         "t_us": 86400000000, "day": 3_000_000, "dec": b"\x01\x00" * 10, "fdec": b"\xff" * 16, "u": u,
         "opt_ts": year_10000_ms},
        {"ts_ms": 0, "ts_us": -1, "local_ms": 1, "t_ms": 0, "t_us": 0, "day": -800_000, "dec": b"",
         "fdec": b"\x00" * 16, "u": "not-a-uuid", "opt_ts": None},
    ]
    path = write_avro(tmp_path / "logical.avro", rows, schema=schema)
    assert records_of(read_all(path)) == rows


def test_avro_named_types_reused_with_logical_types(tmp_path):
    schema = {"type": "record", "name": "P", "fields": [
        {"name": "a", "type": {"type": "fixed", "name": "Dec8", "size": 8, "logicalType": "decimal",
                               "precision": 18, "scale": 0}},
        {"name": "b", "type": "Dec8"},
        {"name": "c", "type": {"type": "array", "items": "Dec8"}},
    ]}
    rows = [{"a": b"\x00" * 7 + b"\x01", "b": b"\xff" * 8, "c": [b"\x01" * 8, b"\x02" * 8]}]
    path = write_avro(tmp_path / "named.avro", rows, schema=schema)
    assert records_of(read_all(path)) == rows


def test_avro_header_only_file_yields_nothing(tmp_path):
    path = write_avro(tmp_path / "empty.avro", [])
    assert read_all(path) == []
    recs, _ = read_in_ranges(path, list(range(7, path.stat().st_size + 20, 7)))
    assert recs == []


def test_avro_not_named_dot_avro_detected_by_magic(tmp_path, avro_rows):
    path = write_avro(tmp_path / "part-0000", avro_rows[:10])
    assert records_of(read_all(path)) == avro_rows[:10]


def test_avro_truncated_mid_block_yields_earlier_blocks_then_raises_with_offset(tmp_path, avro_rows):
    """Records of intact blocks come out first; the error names the file and the broken block's offset."""
    src = write_avro(tmp_path / "full.avro", avro_rows)
    blocks = _block_table(src)
    cut_block = blocks[3][0]
    data = src.read_bytes()
    path = tmp_path / "truncated.avro"
    path.write_bytes(data[:cut_block + 20])
    got = []
    with open(path, "rb") as f, pytest.raises(InputFileError) as ei:
        for b in iter_records(f, str(path), 0, None, 4096):
            got.extend(b.records)
    assert got == avro_rows[:sum(n for _, n in blocks[:3])]
    assert str(path) in str(ei.value) and f"byte {cut_block}" in str(ei.value)
    assert ei.value.path == str(path) and ei.value.offset == cut_block


def test_avro_corrupt_sync_marker_raises_naming_file(tmp_path, avro_rows):
    src = write_avro(tmp_path / "full.avro", avro_rows)
    blocks = _block_table(src)
    data = bytearray(src.read_bytes())
    data[blocks[2][0] - 3] ^= 0xFF  # inside the sync marker that ends block 1
    path = tmp_path / "badsync.avro"
    path.write_bytes(bytes(data))
    with pytest.raises(InputFileError, match=re.escape(str(path))) as ei:
        read_all(path)
    assert ei.value.offset == blocks[1][0]


def test_avro_huge_block_size_fails_fast_without_allocating(tmp_path):
    """A block header claiming 2 GiB is rejected before anything reads (or allocates) it."""
    head = io.BytesIO()
    fastavro.writer(head, {"type": "long"}, [])
    header = head.getvalue()
    def zigzag(n: int) -> bytes:
        n = (n << 1) ^ (n >> 63)
        out = bytearray()
        while n > 0x7F:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
        return bytes(out)
    path = tmp_path / "bomb.avro"
    path.write_bytes(header + zigzag(1) + zigzag(2**31) + b"\x00" * 64)
    tracemalloc.start()
    try:
        with no_hang(), pytest.raises(InputFileError) as ei:
            read_all(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak} bytes"
    assert str(path) in str(ei.value) and str(2**31) in str(ei.value)
    assert ei.value.offset == len(header)
    assert MAX_AVRO_BLOCK_BYTES < 2**31


@pytest.mark.parametrize("content", [b"", b"Obj", b"Obj\n", b"Obj\x00" + b"\x8a" * 40, b"Obj\x01\xff\xff"])
def test_avro_bad_header_raises_input_file_error(tmp_path, content):
    path = tmp_path / "bad.avro"
    path.write_bytes(content)
    with pytest.raises(InputFileError) as ei:
        read_all(path)
    assert str(path) in str(ei.value)


def test_input_file_error_pickles_and_keeps_message():
    import pickle

    e = InputFileError("/x/y.avro", "corrupt", 12)
    e2 = pickle.loads(pickle.dumps(e))
    assert str(e2) == str(e) == "/x/y.avro at byte 12: corrupt"
    assert (e2.path, e2.reason, e2.offset) == ("/x/y.avro", "corrupt", 12)


# ====================================================================== JSON

JSONL = (
    b"\xef\xbb\xbf"
    b'{"id": 1, "s": "a\\u00e9"}\r\n'
    b"\r\n"
    b'{"id": 2, "big": 123456789012345678901234567890, "neg": -98765432109876543210}\n'
    b"   \n"
    b'{"id": 3, "oops": }\n'
    b"[1, 2, 3]\n"
    b'{"id": 4, "nested": {"k": [1, null, "x"]}}\r\n'
    b"\n"
    b'"just a string"\n'
    b'{"id": 5, "f": 1.5e300, "t": true}'  # no final newline
)
JSONL_RECORDS = [
    {"id": 1, "s": "a\u00e9"},
    {"id": 2, "big": 123456789012345678901234567890, "neg": -98765432109876543210},
    {"id": 4, "nested": {"k": [1, None, "x"]}},
    {"id": 5, "f": 1.5e300, "t": True},
]


def _line_offset(data: bytes, line_no: int) -> int:
    return sum(len(x) for x in data.splitlines(keepends=True)[: line_no - 1])


def test_json_lines_bom_crlf_blank_lines_no_final_newline_big_ints(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(JSONL)
    batches = read_all(path)
    assert records_of(batches) == JSONL_RECORDS
    big = records_of(batches)[1]["big"]
    assert isinstance(big, int) and big == 123456789012345678901234567890  # exact, not a float
    lines = [i for b in batches for i in b.indexes]
    assert lines == [1, 3, 7, 10]
    offsets = [o for b in batches for o in b.offsets]
    assert offsets == [0] + [_line_offset(JSONL, n) for n in (3, 7, 10)]
    assert all(b.kind == "json" for b in batches)


@pytest.mark.parametrize("text, long_int", [
    (b'{"a": 1234567890123456789}', True),  # 19 digits: maybe beyond int64
    (b'{"a": -98765432109876543210}', True),
    (b'[12345678901234567890123]', True),
    (b'1234567890123456789', True),
    (b'{"a": 123456789012345678}', False),  # 18 digits: fits orjson's int64
    (b'{"a": 0.000123456789012345678901}', False),  # a long fraction is not an integer
    (b'{"a": 1.5e+1234567890123456789}', False),  # nor an exponent
    (b'{"a": 1.25, "b": 12345678901234567890}', True),  # a later run still counts
    (b'{"a": 0.1234567890123456789012, "b": 9999999999999999999}', True),
])
def test_long_integer_check_finds_integer_literals_of_19_digits(text, long_int):
    import json

    from convert.formats.jsonl import _loads, _maybe_long_integer

    assert _maybe_long_integer(text) is long_int
    want = json.loads(text)  # the stdlib keeps big integers exact
    assert _loads(text) == want and repr(_loads(text)) == repr(want)


def test_json_lines_malformed_and_non_object_lines_go_to_bad_with_line_numbers(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(JSONL)
    bad = [x for b in read_all(path) for x in b.bad]
    assert [(off, line) for off, line, _, _ in bad] == [(_line_offset(JSONL, n), n) for n in (5, 6, 9)]
    assert "malformed JSON" in bad[0][2] and bad[0][3] == '{"id": 3, "oops": }'
    assert "object" in bad[1][2] and "list" in bad[1][2] and bad[1][3] == "[1, 2, 3]"
    assert "object" in bad[2][2] and "str" in bad[2][2]


def test_json_lines_invalid_utf8_line_goes_to_bad(tmp_path):
    path = tmp_path / "bin.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": "\xff\xfe"}\n{"a": 2}\n')
    batches = read_all(path)
    assert records_of(batches) == [{"a": 1}, {"a": 2}]
    assert [x[1] for b in batches for x in b.bad] == [2]


def test_json_lines_ranges_cut_anywhere_yield_every_record_and_bad_line_once(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_bytes(JSONL)
    for cuts in cut_sets(len(JSONL)):
        recs, bad = read_in_ranges(path, cuts)
        assert recs == JSONL_RECORDS, cuts
        assert sorted(x[0] for x in bad) == [_line_offset(JSONL, n) for n in (5, 6, 9)], cuts


def test_json_lines_many_records_ranges_and_small_batches(tmp_path):
    rows = [{"i": i, "s": "x" * (i % 17), "u": "\u65e5" * (i % 3)} for i in range(500)]
    data = b"".join(json.dumps(r, ensure_ascii=False).encode() + (b"\r\n" if i % 2 else b"\n") for i, r in enumerate(rows))
    path = tmp_path / "many.ndjson"
    path.write_bytes(data)
    batches = read_all(path, batch_size=64)
    assert records_of(batches) == rows and max(len(b) for b in batches) == 64
    assert [i for b in batches for i in b.indexes] == list(range(1, 501))
    for cuts in cut_sets(len(data), seed=3):
        recs, _ = read_in_ranges(path, cuts, batch_size=64)
        assert recs == rows


@pytest.mark.parametrize("block_bytes", [1, 7, 64, 1 << 20])
def test_json_lines_read_in_blocks_of_any_size_give_every_line_as_parsed_alone(tmp_path, monkeypatch, block_bytes):
    """Lines are cut from blocks and scanned for long integers per block: any block size
    (lines split across blocks, many lines per block) gives each line what parsing that
    line alone gives, with its own line number and offset."""
    import convert.formats.jsonl as jsonl

    monkeypatch.setattr(jsonl, "_JSONL_BLOCK_BYTES", block_bytes)
    lines = [
        b'{"i": 0, "x": 0.0012345678901234567890123}',  # long fraction: not a long integer
        b'{"i": 1, "big": 123456789012345678901234567890}',  # long integer: kept exact
        b'{"i": 2, "near": 12345678901234567, "f": 1e300}',
        b'  {"i": 3, "spaced": true}  \r',
        b"",
        b'{"i": 4, "neg": -98765432109876543210, "s": "9999999999999999999"}',
        b'{"i": 5, "bad": }',
        rb'{"i": 6, "u": "\u65e5\u672c"}',
        b'99999999999999999999',  # a long integer alone on its line: not an object
        b'{"i": 7}',
    ]
    data = b"\n".join(lines)
    path = tmp_path / "blocks.jsonl"
    path.write_bytes(data)
    _assert_lines_read_as_parsed_alone(path, lines, 0, 3, cut_sets(len(data), seed=5), 2)


def _assert_lines_read_as_parsed_alone(path: Path, lines: list[bytes], lead: int, batch_size: int,
                                       cut_lists: list[list[int]], range_batch_size: int) -> None:
    """Every line of ``path`` (``lead`` bytes before the first: a BOM) read as
    ``json.loads`` of that line alone gives it: records with their line numbers
    and offsets (ints stay ints), the rest as bad lines; also read in ranges."""
    want, want_bad, off = [], [], 0
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                v = json.loads(line)
                (want if isinstance(v, dict) else want_bad).append((n, off, v))
            except ValueError:
                want_bad.append((n, off, None))
        off += len(line) + 1 + (lead if n == 1 else 0)
    batches = read_all(path, batch_size=batch_size)
    got = [(i, o, r) for b in batches for i, o, r in zip(b.indexes, b.offsets, b.records, strict=True)]
    assert got == want
    assert [repr(r) for _, _, r in got] == [repr(v) for _, _, v in want]  # ints stay ints
    assert [(x[1], x[0]) for b in batches for x in b.bad] == [(n, o) for n, o, _ in want_bad]
    assert max(map(len, batches)) == min(batch_size, len(want))
    for cuts in cut_lists:
        recs, bad = read_in_ranges(path, cuts, batch_size=range_batch_size)
        assert recs == [v for _, _, v in want], cuts
        assert sorted(x[0] for x in bad) == [o for _, o, _ in want_bad], cuts


def test_json_lines_blocks_scanned_with_numpy_give_every_line_as_parsed_alone(tmp_path, monkeypatch):
    """Large blocks are scanned for long integers with numpy: with a long integer,
    long fractions, a blank line, a malformed line, a BOM and CRLF, in ranges cut
    anywhere, every line gives what parsing it alone gives."""
    import convert.formats.jsonl as jsonl

    monkeypatch.setattr(jsonl, "_JSONL_BLOCK_BYTES", 1 << 14)
    monkeypatch.setattr(jsonl, "_NUMPY_SCAN_BYTES", 1 << 12)
    lines = []
    for i in range(2400):
        rec = {"i": i, "f": i / 7, "s": "w" * (i % 13), "frac": float(f"0.000{i:04d}123456789012345")}
        line = json.dumps(rec).encode()
        if i == 700:
            line = b'{"i": 700, "big": 123456789012345678901234567890, "neg": -98765432109876543210}'
        elif i == 1300:
            line = b""
        elif i == 1900:
            line = b'{"i": 1900, "bad": }'
        lines.append(line + (b"\r" if i % 5 == 0 else b""))
    data = b"\xef\xbb\xbf" + b"\n".join(lines) + b"\n"
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(data)
    assert b"123456789012345678901234567890" in data  # a long integer, kept exact
    _assert_lines_read_as_parsed_alone(path, lines, 3, 500, [[len(data) // 3, len(data) // 2],
                                                             list(range(4001, len(data), 4001))], 300)


def test_the_numpy_long_integer_scan_finds_what_translate_and_find_find():
    import convert.formats.jsonl as jsonl

    rng = random.Random(7)
    for trial in range(2000):
        alphabet = b"0123456789.eE+-:, x" if trial % 2 else b"0123456789" * 8 + b".e-,"
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))
        assert list(jsonl._long_integer_runs_numpy(data)) == list(jsonl._long_integer_runs(data)), data


def test_json_lines_range_starting_mid_file_numbers_lines_from_the_file_start(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a":1}\n{"a":2}\n{"a":3}\n')
    (b,) = read_all(path, 8, None)
    assert b.records == [{"a": 2}, {"a": 3}] and b.offsets == [8, 16] and b.indexes == [2, 3]


def test_json_array_file(tmp_path):
    path = tmp_path / "arr.json"
    path.write_bytes(b'\xef\xbb\xbf \n [{"a": 1}, {"a": 18446744073709551617}, {"b": [1, 2]}]\n')
    batches = read_all(path, batch_size=2)
    assert records_of(batches) == [{"a": 1}, {"a": 18446744073709551617}, {"b": [1, 2]}]
    assert [i for b in batches for i in b.indexes] == [0, 1, 2]


def test_json_array_from_in_memory_stream():
    """Streams without ``peek`` (io.BytesIO) are sniffed the same way as files."""
    batches = list(iter_records(io.BytesIO(b'[{"a": 1}, {"a": 2}]'), "mem.json"))
    assert records_of(batches) == [{"a": 1}, {"a": 2}]
    assert [b for b in batches if b.bad] == []
    lines = list(iter_records(io.BytesIO(b'{"a": 1}\n{"a": 2}\n'), "mem.jsonl", 9, None))
    assert records_of(lines) == [{"a": 2}]


def test_json_whole_document_belongs_to_the_range_at_zero(tmp_path):
    """A JSON array cannot be split: a range not starting at 0 owns none of it (no duplicates)."""
    path = tmp_path / "arr.json"
    path.write_bytes(b'[{"a": 1}, {"a": 2}]')
    assert not is_splittable(str(path), path.read_bytes())
    recs, _ = read_in_ranges(path, [5, 11])
    assert recs == [{"a": 1}, {"a": 2}]


def test_json_array_with_non_object_elements_and_top_level_scalar(tmp_path):
    path = tmp_path / "arr.json"
    path.write_bytes(b'[{"a": 1}, 5]')
    # elements are handed on as they are; the vectorizer rejects non-objects per record
    assert records_of(read_all(path)) == [{"a": 1}, 5]


def test_json_records_path_nested_key(tmp_path):
    doc = {"meta": {"n": 2}, "data": {"items": [{"a": 1}, {"a": 2, "big": 2**70}]}}
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps(doc, indent=2))
    assert records_of(read_all(path, json_records_path="data.items")) == doc["data"]["items"]
    assert not is_splittable(str(path), path.read_bytes(), "data.items")


def test_json_records_path_missing_key_error_names_file_key_and_found_keys(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"meta": {}, "data": {"rows": []}}))
    with pytest.raises(InputFileError) as ei:
        read_all(path, json_records_path="data.items")
    msg = str(ei.value)
    assert str(path) in msg and "'items'" in msg and "rows" in msg and "data.items" in msg
    with pytest.raises(InputFileError, match="expected a JSON array"):
        read_all(path, json_records_path="meta")


def test_json_single_object_document_with_records_path_on_json_lines_file(tmp_path):
    path = tmp_path / "lines.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    with pytest.raises(InputFileError, match="not valid JSON"):
        read_all(path, json_records_path="a")


def test_gzip_json_lines(tmp_path):
    path = tmp_path / "data.jsonl.gz"
    path.write_bytes(gzip.compress(JSONL))
    assert not is_splittable(str(path), path.read_bytes())
    batches = read_all(path)
    assert records_of(batches) == JSONL_RECORDS
    assert [x[1] for b in batches for x in b.bad] == [5, 6, 9]
    # a gzip file is one unit: only the range starting at 0 yields it
    recs, _ = read_in_ranges(path, [10, 40], check_owner=False)
    assert recs == JSONL_RECORDS


def test_gzip_json_array_and_records_path(tmp_path):
    path = tmp_path / "arr.json.gz"
    path.write_bytes(gzip.compress(b'[{"a": 1}]'))
    assert records_of(read_all(path)) == [{"a": 1}]
    path2 = tmp_path / "wrapped.json.gz"
    path2.write_bytes(gzip.compress(b'{"r": [{"a": 2}]}'))
    assert records_of(read_all(path2, json_records_path="r")) == [{"a": 2}]


def test_malformed_json_array_raises_naming_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"a": 1},\n  ,\n]')
    with pytest.raises(InputFileError, match=re.escape(str(path)) + ".*not valid JSON"):
        read_all(path)


@pytest.mark.parametrize("content", [b"", b"\n\n  \r\n", b"\xef\xbb\xbf", b"[]", b"[\n\t\n]", b"\xef\xbb\xbf  []"])
def test_empty_json_inputs_yield_nothing(tmp_path, content):
    path = tmp_path / "e.json"
    path.write_bytes(content)
    assert records_of(read_all(path)) == []
    assert [x for b in read_all(path) for x in b.bad] == []


# ============================================================ is_splittable


@pytest.mark.parametrize("path, head, records_path, want", [
    ("a.avro", b"Obj\x01rest", None, True),
    ("part-0", b"Obj\x01rest", None, True),
    ("a.avro", b"Obj\x01rest", "x", True),  # records path is a JSON option
    ("a.jsonl", b'{"a": 1}\n', None, True),
    ("a.json", b'\xef\xbb\xbf{"a": 1}\n', None, True),
    ("a.json", b"[{}]", None, False),
    ("a.json", b"\xef\xbb\xbf \r\n\t[{}]", None, False),
    ("a.json", b'{"rows": []}', "rows", False),
    ("a.jsonl.gz", gzip.compress(b'{"a":1}\n'), None, False),
    ("a.avro.gz", gzip.compress(b"Obj\x01"), None, False),
])
def test_is_splittable_decisions(path, head, records_path, want):
    assert is_splittable(path, head, records_path) is want


def test_detect_format():
    assert detect_format("x.json", b"Obj\x01") == "avro"
    assert detect_format("x.avro", b"{}") == "avro"  # the Avro reader reports the bad magic
    assert detect_format("x.avro12", b"Obj\x00") == "avro"  # legacy/other Avro containers are not JSON
    assert detect_format("x.json", b'{"a"') == "json"
    assert detect_format("x.AVRO", b"") == "avro"


# ================================================================= real data


def _readme_rows() -> list[tuple[str, str, int]]:
    text = (REALDATA / "README.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[1].startswith("`") and cells[2].isdigit():
            rows.append((cells[0], cells[1].strip("`"), int(cells[2])))
    return rows


def _realdata_params(kind: str):
    if not (REALDATA / "README.md").is_file():
        return [pytest.param(None, None, marks=pytest.mark.skip(
            reason=f"real data files not available at {REALDATA} (shared/realdata next to the repo)"))]
    return [pytest.param(f, n, id=f.split("/")[-1]) for k, f, n in _readme_rows() if k == kind]


def test_realdata_readme_table_lists_all_kinds():
    if not (REALDATA / "README.md").is_file():
        pytest.skip(f"real data files not available at {REALDATA}")
    kinds = {k for k, _, _ in _readme_rows()}
    assert {"valid Avro", "bad Avro", "JSON records", "JSON edge / bad"} <= kinds
    assert len(_readme_rows()) >= 40


@pytest.mark.parametrize("rel, count", _realdata_params("valid Avro"))
def test_realdata_valid_avro_reads_with_readme_record_count(rel, count):
    path = REALDATA / rel
    with no_hang():
        batches = read_all(path, batch_size=256)
    recs = records_of(batches)
    assert len(recs) == count
    assert all(not b.bad and b.kind == "avro" for b in batches)
    with open(path, "rb") as f:
        plain = fastavro.reader(f)
        if "logicalType" not in json.dumps(plain.writer_schema):  # else we differ on purpose: raw values
            assert recs == list(plain)
    # ... and the same records when the file is cut into ranges at random points
    size = path.stat().st_size
    rng = random.Random(rel)
    with no_hang():
        ranged, _ = read_in_ranges(path, sorted(rng.sample(range(1, size), min(25, size - 1))))
    assert ranged == recs


@pytest.mark.parametrize("rel, count", _realdata_params("bad Avro"))
def test_realdata_bad_avro_raises_input_file_error_naming_file(rel, count):
    path = REALDATA / rel
    got = []
    tracemalloc.start()
    try:
        with no_hang(), pytest.raises(InputFileError) as ei, open(path, "rb") as f:
            for b in iter_records(f, str(path)):
                got.extend(b.records)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(path) in str(ei.value)
    assert len(got) <= count  # never more records than a plain reader gets before failing
    assert peak < 64 * 2**20  # the 2 GiB block claim is never allocated


def test_realdata_person_10_no_codec_yields_10_records_then_fails_at_trailing_byte():
    """Decision: the 10 records before the trailing 0x0a are read, then InputFileError.

    The byte after the last sync marker starts a block that cannot be complete
    (truncated write or appended garbage). Ignoring it would hide corruption in
    other files, so the reader fails the file; it still hands on the records of
    the intact blocks first, and the error names the file and the offset of the
    trailing byte.
    """
    path = REALDATA / "apache__avro/lang/js/test/dat/person-10.no-codec.avro"
    if not path.is_file():
        pytest.skip(f"real data file not available: {path}")
    got = []
    with pytest.raises(InputFileError) as ei, open(path, "rb") as f:
        for b in iter_records(f, str(path)):
            got.extend(b.records)
    assert len(got) == 10
    assert ei.value.offset == path.stat().st_size - 1
    assert str(path) in str(ei.value) and f"byte {path.stat().st_size - 1}" in str(ei.value)


# Files that wrap their records under a key need --json-records-path (README: "object wrapper").
RECORDS_PATH = {"sample_utf8_bom.json": "users"}


@pytest.mark.parametrize("rel, count", _realdata_params("JSON records"))
def test_realdata_json_records_read_with_readme_record_count(rel, count):
    path = REALDATA / rel
    rp = RECORDS_PATH.get(path.name)
    batches = read_all(path, json_records_path=rp)
    recs = records_of(batches)
    assert len(recs) == count
    assert [x for b in batches for x in b.bad] == []
    raw = path.read_bytes().decode("utf-8-sig")
    if rp is None:  # NDJSON: the same records as json.loads per line, and the same when cut in ranges
        assert recs == [json.loads(line) for line in raw.splitlines() if line.strip()]
        size = path.stat().st_size
        ranged, _ = read_in_ranges(path, list(range(13, size, 13)))
        assert ranged == recs
    else:
        assert recs == json.loads(raw)[rp]


def _json_edge(name: str) -> Path:
    matches = list((REALDATA / "duckdb__duckdb").rglob(name)) if REALDATA.is_dir() else []
    if not matches:
        pytest.skip(f"real data file {name} not available under {REALDATA}")
    return matches[0]


def test_realdata_json_duplicate_key_last_value_wins():
    batches = read_all(_json_edge("duplicate_key.ndjson"))
    recs = records_of(batches)
    assert [r["id"] for r in recs] == [1, 2, 42, 4, 5]  # like json.loads: the last duplicate wins
    assert [x for b in batches for x in b.bad] == []


@pytest.mark.parametrize("name", ["empty.ndjson", "empty_array.json"])
def test_realdata_json_empty_files_yield_nothing(name):
    assert read_all(_json_edge(name)) == []


def test_realdata_json_array_comma_malformed_raises_naming_file():
    path = _json_edge("array_comma_malformed.json")
    with pytest.raises(InputFileError, match=re.escape(str(path))):
        read_all(path)


def test_realdata_json_multiple_objects_per_line_is_one_bad_line():
    batches = read_all(_json_edge("multiple_objects_per_line.ndjson"))
    assert records_of(batches) == []
    bad = [x for b in batches for x in b.bad]
    assert [(off, line) for off, line, _, _ in bad] == [(0, 1)]
    assert "malformed JSON" in bad[0][2]


@pytest.mark.parametrize("name, ids, bad_lines", [
    ("trailing_content.ndjson", None, [2]),
    ("unterminated_quotes.ndjson", [1, 2, 4, 5], [3]),
])
def test_realdata_json_bad_lines_go_to_bad_with_line_numbers(name, ids, bad_lines):
    batches = read_all(_json_edge(name))
    recs = records_of(batches)
    if ids is None:
        assert recs == [{"a": 1}, {"a": 3}]
    else:
        assert [r["id"] for r in recs] == ids
    assert [x[1] for b in batches for x in b.bad] == bad_lines


_LINE_KINDS = st.one_of(
    st.dictionaries(st.text(max_size=4), st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                                                  st.text(max_size=6), st.none(), st.booleans()), max_size=4)
    .map(lambda d: json.dumps(d, ensure_ascii=False).encode()),  # an object (long integers too)
    st.sampled_from([b"", b"  ", b"\r", b"[1, 2]", b"7", b'{"a": }', b'{"a": "\\ud800"}', b"\xef\xbb\xbf{}",
                     b'{"a": 1}\r', b' {"b": [1, {"c": null}]} ', b'"text"', b"{" + b" " * 40 + b"}"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_LINE_KINDS, min_size=1, max_size=40), st.booleans(), st.integers(1, 9),
       st.sampled_from([16, 64, 1 << 17]), st.sampled_from([20, 1 << 20]), st.data())
def test_json_lines_whole_block_path_gives_what_the_per_line_loop_gives(lines, bom, batch_size, block_bytes,
                                                                      max_line, data):
    """A block whose lines are all plain objects is read by one ``map`` of ``orjson.loads``
    (``_plain_block``); any other block line by line. Both give the same batches (records,
    offsets, line numbers, bad lines), for random lines (blank, malformed, not objects, long
    integers, lone surrogates, a BOM, too long), block sizes, batch sizes and byte ranges."""
    import convert.formats.jsonl as jsonl

    raw = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines) + data.draw(st.sampled_from([b"", b"\n"]))
    cut = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=3)))
    ranges = list(zip([0, *cut], [*cut, None], strict=True))

    def read(plain: bool) -> list[tuple]:
        out = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(jsonl, "_JSONL_BLOCK_BYTES", block_bytes)
            if not plain:
                mp.setattr(jsonl, "_plain_block", lambda *a: None)
            for start, end in ranges:
                try:
                    for b in iter_json(io.BytesIO(raw), "p.jsonl", start, end, batch_size=batch_size,
                                       max_record_bytes=max_line):
                        out.append((repr(b.records), b.offsets, b.indexes, [x[:3] for x in b.bad]))
                except InputFileError as e:  # a first line "[1, 2]": the file is read as one JSON document
                    out.append(("error", str(e)))
        return out

    assert read(True) == read(False)


@settings(max_examples=200, deadline=None)
@given(st.lists(_LINE_KINDS, min_size=1, max_size=40), st.booleans(), st.data())
def test_json_lines_ranges_starting_mid_file_number_every_line_from_the_file_start(lines, bom, data):
    """Whatever byte ranges split a file, each record and bad line carries its true 1-based line
    number (the error output's ``line``), never 0 for ranges after the first."""
    raw = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(lines) + data.draw(st.sampled_from([b"", b"\n"]))
    if raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
        return  # one JSON document, not JSON Lines
    cut = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4)))
    line_of = {off: n for n, off in enumerate([0, *(i + 1 for i, b in enumerate(raw) if b == 0x0A)], start=1)}
    got = {}
    for start, end in zip([0, *cut], [*cut, None], strict=True):
        for b in iter_json(io.BytesIO(raw), "p.jsonl", start, end, batch_size=7):
            got.update(zip(b.offsets, b.indexes, strict=True))
            got.update((off, index) for off, index, *_ in b.bad)
    assert {off: line_of[off] for off in got} == got
