"""convert.sources on hostile input: memory stays bounded, errors name the file and the cap.

A JSON line or document over ``--max-record-mb``, an Avro block that
decompresses past ``--max-block-mb`` (on every codec, both decoders), a schema
nested past Python's recursion limit, and the wide schemas that made the
polars decoder quadratic. Caps are set low in the tests so that the inputs
stay small; memory is measured with tracemalloc (Python allocations: what
the readers make) or, for the default cap, in a child process's peak RSS.
"""

from __future__ import annotations

import functools
import gzip
import io
import json
import subprocess
import sys
import tracemalloc
import zlib
from pathlib import Path

import fastavro
import polars  # noqa: F401 - imported before any measurement (the Avro fast path imports it on first use)
import pytest
from test_convert_sources import no_hang, read_all, read_in_ranges, records_of
from typer.testing import CliRunner

from convert import source_types, sources
from convert.sources import (
    DEFAULT_MAX_BLOCK_BYTES,
    DEFAULT_MAX_RECORD_BYTES,
    MAX_ERROR_TEXT_BYTES,
    InputFileError,
    iter_records,
)
from pipelines.cli import app
from pipelines.options import ConvertOptions

runner = CliRunner()
MB = 2**20


def _peak(fn) -> tuple[object, int]:
    """``fn()``'s result (or the exception it raised) and the peak of Python allocations while it ran."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out = e
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ====================================================================== JSON


LONG = 6 * MB  # a line 6x the cap set in these tests


def _jsonl_with_a_long_line() -> bytes:
    return (b'{"a": 1}\n' + b'{"s": "' + b"x" * LONG + b'"}\n' + b'{"a": 2}\n' + b"not json\n" + b'{"a": 3}')


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_json_line_over_the_cap_goes_to_bad_and_is_never_held_whole(tmp_path, gz):
    data = _jsonl_with_a_long_line()
    path = tmp_path / ("d.jsonl.gz" if gz else "d.jsonl")
    path.write_bytes(gzip.compress(data) if gz else data)
    with open(path, "rb") as f, no_hang():
        batches, peak = _peak(lambda: list(iter_records(f, str(path), max_record_bytes=MB)))
    assert [r for b in batches for r in b.records] == [{"a": 1}, {"a": 2}, {"a": 3}]
    bad = [x for b in batches for x in b.bad]
    assert [(off, line) for off, line, _, _ in bad] == [(9, 2), (data.index(b"not json"), 4)]
    reason, raw = bad[0][2], bad[0][3]
    assert f"line of {LONG + 9} bytes" in reason and "1 MB" in reason and "--max-record-mb" in reason
    assert raw.startswith('{"s": "xxx') and raw.endswith(f"[truncated: the line holds {LONG + 9} bytes]")
    assert len(raw) < MAX_ERROR_TEXT_BYTES + 100
    assert peak < 4 * MB, f"peak {peak} bytes for a {LONG}-byte line and a 1 MB cap"


def test_json_ranges_cut_anywhere_around_a_long_line_yield_every_line_once(tmp_path):
    data = _jsonl_with_a_long_line()
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    n = len(data)
    for cuts in ([5], [9], [10], [MB], [LONG], [n - 30], [5, 10, MB, 3 * MB, n - 20], list(range(1, n, MB // 3))):
        recs, bad = read_in_ranges(path, cuts, max_record_bytes=MB)
        assert recs == [{"a": 1}, {"a": 2}, {"a": 3}], cuts
        assert sorted(off for off, *_ in bad) == [9, data.index(b"not json")], cuts


def test_a_range_starting_inside_a_long_line_skips_it_in_bounded_reads(tmp_path):
    data = _jsonl_with_a_long_line()
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    batches, peak = _peak(lambda: read_all(path, 100, None, max_record_bytes=MB))
    assert [r for b in batches for r in b.records] == [{"a": 2}, {"a": 3}]
    assert peak < 4 * MB


def test_a_line_just_at_the_cap_is_read_and_one_byte_more_is_not(tmp_path):
    cap = 1000
    ok = b'{"s": "' + b"y" * (cap - 9) + b'"}'
    assert len(ok) == cap
    over = b'{"s": "' + b"z" * (cap - 8) + b'"}'
    path = tmp_path / "d.jsonl"
    for eol in (b"\n", b""):
        path.write_bytes(ok + b"\n" + over + eol)
        batches = read_all(path, max_record_bytes=cap)
        assert [len(r["s"]) for b in batches for r in b.records] == [cap - 9]
        assert [(off, line) for b in batches for off, line, _, _ in b.bad] == [(cap + 1, 2)]


@pytest.mark.parametrize("kind", ["array", "records_path", "gzip_array"])
def test_a_json_document_over_the_cap_fails_the_file_naming_cap_and_option(tmp_path, kind):
    items = b",".join(b'{"s": "' + b"x" * 1000 + b'"}' for _ in range(3000))  # ~3 MB
    doc = b'{"rows": [' + items + b"]}" if kind == "records_path" else b"[" + items + b"]"
    path = tmp_path / "doc.json"
    path.write_bytes(gzip.compress(doc) if kind == "gzip_array" else doc)
    with open(path, "rb") as f:
        err, peak = _peak(lambda: list(iter_records(f, str(path), json_records_path="rows" if kind == "records_path" else None,
                                                    max_record_bytes=MB)))
    assert isinstance(err, InputFileError), err
    assert str(path) in str(err) and "1 MB" in str(err) and "--max-record-mb" in str(err)
    assert peak < 4 * MB
    # the same document under a cap it fits is read
    assert sum(len(b) for b in read_all(path, json_records_path="rows" if kind == "records_path" else None)) == 3000


def test_malformed_lines_are_copied_into_bad_as_a_bounded_prefix(tmp_path):
    long_bad = b'{"s": "' + b"q" * (200 * 1024) + b'"'  # no closing brace
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"a": 1}\n' + long_bad + b"\n[1, 2]\n")
    bad = [x for b in read_all(path) for x in b.bad]
    assert len(bad) == 2 and bad[0][2].startswith("malformed JSON")
    assert len(bad[0][3]) < MAX_ERROR_TEXT_BYTES + 100 and bad[0][3].endswith(f"holds {len(long_bad)} bytes]")
    assert bad[1][3] == "[1, 2]"  # short lines stay whole


def test_a_file_of_bad_lines_is_yielded_in_batches(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"nope\n" * 100_000)  # several blocks
    batches = read_all(path, batch_size=100)
    assert sum(len(b.bad) for b in batches) == 100_000
    assert max(len(b.bad) for b in batches) == 100


def test_missing_records_path_key_quotes_long_keys_cut(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"k" * 100_000: 1}))
    with pytest.raises(InputFileError) as ei:
        read_all(path, json_records_path="rows")
    assert len(str(ei.value)) < 1000


# ====================================================================== Avro


SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "long"}, {"name": "s", "type": "string"}]}
CODECS = ["null", "deflate", "snappy", "zstandard", "bzip2", "xz", "lz4"]


BIG = 16 * MB  # the string in the big block: over the 1 MB cap the tests set, and well over what the check holds


@functools.cache
def _avro_with_a_big_block(codec: str, big: int = BIG) -> tuple[bytes, int]:
    """Small blocks, then one block whose one string is ``big`` bytes, then small blocks;
    the offset of the big block."""
    rows = [{"id": i, "s": "a"} for i in range(40)] + [{"id": 40, "s": "x" * big}] + [{"id": i, "s": "b"} for i in range(41, 45)]
    buf = io.BytesIO()
    fastavro.writer(buf, SCHEMA, rows, codec=codec, sync_interval=100)
    data = buf.getvalue()
    with io.BytesIO(data) as f:
        offsets = [b.offset for b in fastavro.block_reader(f) if any(len(r["s"]) == big for r in b)]
    return data, offsets[0]


@pytest.mark.parametrize("decoder", ["auto", "fastavro"])
@pytest.mark.parametrize("codec", CODECS)
def test_an_avro_block_expanding_past_the_cap_fails_before_it_is_decompressed(tmp_path, codec, decoder):
    data, big_at = _avro_with_a_big_block(codec)
    path = tmp_path / f"bomb-{codec}.avro"
    path.write_bytes(data)
    got: list[int] = []

    def read():
        with open(path, "rb") as f:
            for b in iter_records(f, str(path), avro_decoder=decoder, max_block_bytes=MB):
                got.extend(r["id"] for r in b.records)

    with no_hang():
        err, peak = _peak(read)
    assert isinstance(err, InputFileError), err
    assert err.offset == big_at
    msg = str(err)
    assert str(path) in msg and f"at byte {big_at}" in msg and "Avro block " in msg
    assert "1 MB" in msg and "--max-block-mb" in msg
    assert got == list(range(len(got))) and got  # the blocks before it, in order
    assert peak < 4 * MB + (8 * MB if codec == "xz" else 0), f"peak {peak}"  # (xz: its 8 MB dictionary)
    # under the default cap the same file reads whole
    with open(path, "rb") as f:
        assert sum(len(b) for b in iter_records(f, str(path), avro_decoder=decoder)) == 45


def test_the_block_index_counts_from_the_first_block_in_any_range(tmp_path):
    data, big_at = _avro_with_a_big_block("deflate")
    path = tmp_path / "bomb.avro"
    path.write_bytes(data)
    with open(path, "rb") as f:
        index = [b.offset for b in fastavro.block_reader(f)].index(big_at)
    for start in (0, big_at - 5, big_at):
        for decoder in ("auto", "fastavro"):
            with pytest.raises(InputFileError, match=rf"Avro block {index} decompresses"):
                read_all(path, start, None, avro_decoder=decoder, max_block_bytes=MB)


def _zz(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def test_a_deflate_bomb_under_the_default_cap_keeps_a_child_process_small(tmp_path):
    """A block that expands to 400 MB (over the default 256 MB cap) from ~2 MB:
    the reader fails without the child's peak RSS growing by anything near it."""
    header = io.BytesIO()
    fastavro.writer(header, SCHEMA, [], codec="deflate")
    head = header.getvalue()
    with io.BytesIO(head) as f:
        sync = fastavro.reader(f)._header["sync"]
    size = 400 * MB
    assert size > DEFAULT_MAX_BLOCK_BYTES

    comp = zlib.compressobj(1, zlib.DEFLATED, -15)
    body = [comp.compress(_zz(1) + _zz(size))]
    chunk = b"x" * (16 * MB)
    body += [comp.compress(chunk) for _ in range(size // len(chunk))]
    body.append(comp.flush())
    block = b"".join(body)
    path = tmp_path / "bomb.avro"
    path.write_bytes(head + _zz(1) + _zz(len(block)) + block + sync)
    code = (
        "import resource, sys\n"
        "from convert.sources import iter_records, InputFileError\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "for decoder in ('auto', 'fastavro'):\n"
        "    try:\n"
        "        list(iter_records(open(sys.argv[1], 'rb'), sys.argv[1], avro_decoder=decoder))\n"
        "    except InputFileError as e:\n"
        "        print(e)\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all("decompresses to more than 256 MB" in x for x in lines[:2]), r.stdout
    assert int(lines[2]) < 100, f"the child grew by {lines[2]} MB"


def _avro_header_only(schema_json: str) -> bytes:
    """An Avro object container file with no blocks, written by hand (fastavro's
    writer cannot parse a schema this deep either)."""
    def avro_bytes(b: bytes) -> bytes:
        return _zz(len(b)) + b
    meta = avro_bytes(b"avro.schema") + avro_bytes(schema_json.encode()) + avro_bytes(b"avro.codec") + avro_bytes(b"null")
    return b"Obj\x01" + _zz(2) + meta + _zz(0) + b"S" * 16


def _deep_schema(levels: int) -> str:
    s = '{"type": "record", "name": "L0", "fields": [{"name": "v", "type": "long"}]}'
    for i in range(1, levels):
        s = f'{{"type": "record", "name": "L{i}", "fields": [{{"name": "c", "type": {s}}}]}}'
    return s


def test_a_valid_avro_file_with_a_1000_level_schema_says_which_limit_it_hit(tmp_path):
    path = tmp_path / "deep.avro"
    path.write_bytes(_avro_header_only(_deep_schema(1000)))
    limit = sys.getrecursionlimit()
    with pytest.raises(InputFileError) as ei:
        read_all(path)
    msg = str(ei.value)
    assert str(path) in msg and "recursion limit" in msg and "nests 3000 deep" in msg
    assert "not an Avro" not in msg and "is it an Avro" not in msg
    with open(path, "rb") as f, pytest.raises(InputFileError, match="recursion limit"):
        sources.read_avro_schema(f, str(path))
    assert sys.getrecursionlimit() == limit  # the reader does not raise it (a process-wide side effect)
    r = runner.invoke(app, ["infer", "-i", str(path)])
    assert r.exit_code == 1 and "recursion limit" in r.output and "Traceback" not in r.output


# ====================================================================== the polars decoder on wide schemas


def _wide_avro(width: int, rows: int = 3) -> bytes:
    schema = {"type": "record", "name": "W", "fields": (
        [{"name": f"n{i}", "type": "long"} for i in range(width // 2)]
        + [{"name": f"s{i}", "type": ["null", "string"]} for i in range(width - width // 2)])}
    recs = [{**{f"n{i}": i * r for i in range(width // 2)}, **{f"s{i}": f"v{r}" for i in range(width - width // 2)}}
            for r in range(rows)]
    buf = io.BytesIO()
    fastavro.writer(buf, schema, recs, codec="deflate")
    return buf.getvalue()


def test_the_polars_decoder_takes_a_batchs_schema_a_constant_number_of_times(monkeypatch):
    """Each ``DataFrame.schema`` builds the whole schema: taken once per column it made the
    decoder quadratic in the number of fields (a 10 x 8,000 file took 30 s)."""
    import polars as pl

    calls = 0
    schema_prop = pl.DataFrame.schema

    def counting(self):
        nonlocal calls
        calls += 1
        return schema_prop.fget(self)

    monkeypatch.setattr(pl.DataFrame, "schema", property(counting))
    counts = []
    for width in (10, 400):
        calls = 0
        batches = list(iter_records(io.BytesIO(_wide_avro(width)), "w.avro", record_json=True))
        assert sum(len(b) for b in batches) == 3 and batches[0].records.record_json is not None
        counts.append(calls)
    assert counts[0] == counts[1] and counts[0] <= 5, counts


def test_schemas_past_the_field_limit_take_the_fastavro_path_with_the_same_records():
    """polars' Avro reader slows per value and grows in memory with the number of fields
    (4,000 fields: several times fastavro's time and memory), so wide schemas go to fastavro."""
    from convert.column_records import ColumnRecords
    from convert.formats.avro_columnar import _COLUMNAR_MAX_FIELDS

    for width, columnar in ((_COLUMNAR_MAX_FIELDS, True), (_COLUMNAR_MAX_FIELDS + 1, False)):
        data = _wide_avro(width)
        auto = list(iter_records(io.BytesIO(data), "w.avro", avro_decoder="auto"))
        assert isinstance(auto[0].records, ColumnRecords) is columnar, width
        plain = list(iter_records(io.BytesIO(data), "w.avro", avro_decoder="fastavro"))
        assert [dict(r) for b in auto for r in b.records] == [r for b in plain for r in b.records]


# ====================================================================== options and the CLI


def test_cli_defaults_are_the_readers_defaults():
    from pipelines.cli import converting as cli

    assert cli._DEFAULT_RECORD_MB * MB == DEFAULT_MAX_RECORD_BYTES
    assert cli._DEFAULT_BLOCK_MB * MB == DEFAULT_MAX_BLOCK_BYTES
    opts = ConvertOptions(inputs=("x",), config="c", output="o")
    assert (opts.max_record_bytes, opts.max_block_bytes) == (DEFAULT_MAX_RECORD_BYTES, DEFAULT_MAX_BLOCK_BYTES)


def test_the_caps_join_the_fingerprint_only_when_not_the_default():
    base = ConvertOptions(inputs=("x",), config="c", output="o").fingerprint_fields()
    assert "max_record_mb" not in base and "max_block_mb" not in base
    raised = ConvertOptions(inputs=("x",), config="c", output="o", max_record_mb=128, max_block_mb=512).fingerprint_fields()
    assert raised == {**base, "max_record_mb": 128, "max_block_mb": 512}


@pytest.mark.parametrize("command", ["convert", "infer"])
@pytest.mark.parametrize("flag", ["--max-record-mb", "--max-block-mb"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "100000"])
def test_bad_caps_are_usage_errors(tmp_path, command, flag, value):
    (tmp_path / "d.jsonl").write_text('{"a": 1}\n')
    args = [command, "-i", str(tmp_path / "d.jsonl"), flag, value]
    if command == "convert":
        args += ["-c", str(tmp_path / "c.yaml"), "-o", str(tmp_path / "o")]
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert flag in r.output and "Traceback" not in r.output


def test_help_documents_the_caps():
    for command in ("convert", "infer"):
        out = runner.invoke(app, [command, "--help"], terminal_width=200).output
        assert "--max-record-mb" in out and "--max-block-mb" in out


@pytest.fixture
def long_line_jsonl_gz(tmp_path) -> Path:
    lines = [json.dumps({"x": float(i), "label": i % 2}).encode() for i in range(40)]
    lines.insert(7, b'{"x": 1.0, "label": 0, "pad": "' + b"p" * (3 * MB) + b'"}')
    path = tmp_path / "in" / "d.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    return path


@pytest.mark.slow
def test_convert_sends_a_line_over_the_cap_to_the_error_output(tmp_path, long_line_jsonl_gz):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("features:\n  - {name: x, source: x, transform: identity}\nlabel: {name: label, source: label}\n")
    out = tmp_path / "out"
    r = runner.invoke(app, ["convert", "-i", str(long_line_jsonl_gz), "-c", str(cfg), "-o", str(out), "--num-shards", "1",
                            "--max-record-mb", "1", "--max-errors", "1", "--workers", "1"])
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for p in sorted((out / "errors").glob("*.jsonl")) for x in p.read_text().splitlines()]
    assert len(rows) == 1
    assert rows[0]["line"] == 8 and "--max-record-mb" in rows[0]["reason"]
    assert len(rows[0]["record"]) < MAX_ERROR_TEXT_BYTES + 100 and "truncated" in rows[0]["record"]
    info = json.loads((out / "dataset_info.json").read_text())
    assert sum(s["num_records"] for s in info["splits"].values()) == 40


def test_infer_skips_a_line_over_the_cap_and_drafts_from_the_rest(long_line_jsonl_gz):
    r = runner.invoke(app, ["infer", "-i", str(long_line_jsonl_gz), "--max-record-mb", "1"])
    assert r.exit_code == 0, r.output
    assert "inferred from 40 records" in r.output and "name: pad" not in r.output and "# pad:" not in r.output


def test_infer_and_convert_fail_on_an_avro_block_over_the_cap(tmp_path):
    data, big_at = _avro_with_a_big_block("deflate")
    path = tmp_path / "in" / "bomb.avro"
    path.parent.mkdir()
    path.write_bytes(data)
    r = runner.invoke(app, ["infer", "-i", str(path), "--max-block-mb", "1", "--sample", "100000"])
    assert r.exit_code == 1, r.output
    assert str(path) in r.output and f"at byte {big_at}" in r.output and "--max-block-mb" in r.output
    cfg = tmp_path / "c.yaml"
    cfg.write_text("features:\n  - {name: id, source: id, transform: identity}\n")
    r = runner.invoke(app, ["convert", "-i", str(path), "-c", str(cfg), "-o", str(tmp_path / "out"),
                            "--max-block-mb", "1", "--workers", "1"])
    assert r.exit_code == 1, r.output
    assert "bomb.avro" in r.output and "--max-block-mb" in r.output and "Traceback" not in r.output


def test_quoted_exception_texts_are_cut():
    text = source_types.quoted(ValueError("v" * 10_000))
    assert len(text) < 600 and text.startswith("ValueError: vvv")


# ====================================================================== duplicate Avro field names


def _avro_with_a_field_renamed(path: Path, schema: dict, records: list[dict], old: str, new: str) -> Path:
    """An Avro file of ``records`` whose header schema then names field ``old`` ``new`` (same
    length: the bytes stay valid), so a record can declare one field twice as other writers do."""
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema), records)
    data = buf.getvalue()
    was, now = f'{{"name": "{old}"'.encode(), f'{{"name": "{new}"'.encode()
    assert len(was) == len(now) and data.count(was) == 1
    path.write_bytes(data.replace(was, now))
    return path


def _record(name: str, fields: list[tuple[str, object]]) -> dict:
    return {"type": "record", "name": name, "fields": [{"name": n, "type": t} for n, t in fields]}


_DUPLICATES = {  # schema written (field 'z' becomes a second 'x'), a record, where the message says it is
    "top": (_record("R", [("x", "string"), ("z", "long"), ("y", "long")]), {"x": "a", "z": 7, "y": 1}, None),
    "nested": (_record("R", [("u", _record("U", [("x", "string"), ("z", "long")])), ("y", "long")]),
               {"u": {"x": "a", "z": 7}, "y": 1}, "u.x"),
    "array": (_record("R", [("u", {"type": "array", "items": _record("U", [("x", "long"), ("z", "long")])})]),
              {"u": [{"x": 1, "z": 2}]}, "u.x"),
    "map": (_record("R", [("u", {"type": "map", "values": _record("U", [("x", "long"), ("z", "long")])})]),
            {"u": {"k": {"x": 1, "z": 2}}}, "u.x"),
    "union": (_record("R", [("u", ["null", _record("U", [("x", "long"), ("z", "long")])])]),
              {"u": {"x": 1, "z": 2}}, "u.x"),
}


@pytest.mark.parametrize("decoder", ["auto", "fastavro"])
@pytest.mark.parametrize("case", sorted(_DUPLICATES))
def test_an_avro_field_declared_twice_is_refused_naming_it(tmp_path, case, decoder):
    schema, record, at = _DUPLICATES[case]
    path = _avro_with_a_field_renamed(tmp_path / "dup.avro", schema, [record] * 3, "z", "x")
    with pytest.raises(InputFileError) as ei:
        read_all(path, avro_decoder=decoder)
    msg = str(ei.value)
    assert str(path) in msg and "'x' twice" in msg and (at is None or f"at {at}" in msg), msg
    with open(path, "rb") as f, pytest.raises(InputFileError, match="'x' twice"):
        sources.read_avro_schema(f, str(path))


def test_a_duplicate_avro_field_fails_convert_and_infer_without_a_panic(tmp_path):
    schema, record, _ = _DUPLICATES["top"]
    path = _avro_with_a_field_renamed(tmp_path / "dup.avro", schema, [record] * 200, "z", "x")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("label: y\nfeatures:\n  - {name: x, transform: vocabulary}\n")
    exe = Path(sys.executable).with_name("recordprep")
    for args in (["convert", "-i", str(path), "-c", str(cfg), "-o", str(tmp_path / "out")], ["infer", "-i", str(path)]):
        r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert "dup.avro" in r.stderr and "the field 'x' twice in record 'R'" in r.stderr, r.stderr
        assert "panic" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "out" / "dataset_info.json").exists()


def test_the_same_field_name_in_different_records_is_accepted(tmp_path):
    schema = _record("R", [("x", "long"), ("u", _record("U", [("x", "long")]))])
    path = tmp_path / "ok.avro"
    with open(path, "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(schema), [{"x": 1, "u": {"x": 2}}])
    assert records_of(read_all(path)) == [{"x": 1, "u": {"x": 2}}]
