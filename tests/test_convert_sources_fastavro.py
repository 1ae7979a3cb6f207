"""convert.sources uses only fastavro's public API, and a fastavro whose API
changed is reported as recordprep's error, never as a bad input file.

The sync marker (which a byte range starting mid-file searches for) is read
from the file's header by recordprep itself; files with logical types are
decoded to their raw values through fastavro's public block reader, on every
codec; a renamed attribute or changed signature in fastavro raises an
internal error instead of calling every file "not an Avro file".
"""

from __future__ import annotations

import datetime as dt
import io
from pathlib import Path

import fastavro
import pytest
from test_convert_sources import REALDATA, read_all, read_in_ranges

from convert import sources
from convert.formats import avro_framing
from convert.sources import InputFileError

SCHEMA = fastavro.parse_schema({"type": "record", "name": "r", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}]},
]})
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
CODECS = ("null", "deflate", "snappy", "zstandard", "bzip2", "xz", "lz4")
MARK = bytes(range(100, 116))


def _rows(n: int) -> list[dict]:
    return [{"id": i, "ts": EPOCH + dt.timedelta(milliseconds=1_000_003 * i),
             "day": None if i % 4 == 0 else dt.date(1970, 1, 1) + dt.timedelta(days=i)} for i in range(n)]


def _raw(n: int) -> list[dict]:
    return [{"id": i, "ts": 1_000_003 * i, "day": None if i % 4 == 0 else i} for i in range(n)]


def _write(path: Path, codec: str = "deflate", n: int = 300, **kw) -> Path:
    with open(path, "wb") as f:
        fastavro.writer(f, SCHEMA, _rows(n), codec=codec, sync_interval=200, **kw)
    return path


def _header_sync(path: Path) -> bytes:
    with open(path, "rb") as f:
        fastavro.block_reader(f)
        return avro_framing.header_sync(f, f.tell())


def test_the_sync_marker_read_from_the_header_is_the_one_fastavro_wrote(tmp_path):
    path = _write(tmp_path / "a.avro", sync_marker=MARK, metadata={"note": "x" * 5000})
    assert _header_sync(path) == MARK
    with open(path, "rb") as f:
        assert fastavro.reader(f)._header["sync"] == MARK  # fastavro's own reading agrees


def test_the_sync_marker_of_every_real_avro_file_is_fastavros():
    files = sorted(REALDATA.rglob("*.avro")) if REALDATA.is_dir() else []
    if not files:
        pytest.skip(f"real data files not available at {REALDATA} (shared/realdata next to the repo)")
    checked = 0
    for path in files:
        try:
            with open(path, "rb") as f:
                theirs = fastavro.reader(f)._header["sync"]
        except Exception:  # noqa: BLE001 - files fastavro cannot read have no marker to compare
            continue
        assert _header_sync(path) == theirs, path
        checked += 1
    assert checked, "no real Avro file fastavro reads"


@pytest.mark.parametrize("codec", CODECS)
def test_logical_types_decode_to_raw_values_on_every_codec_and_in_ranges(tmp_path, codec):
    path = _write(tmp_path / f"{codec}.avro", codec)
    got = [r for b in read_all(path, avro_decoder="fastavro") for r in b.records]
    assert got == _raw(300)
    size = path.stat().st_size
    recs, _ = read_in_ranges(path, [size // 3, size // 2, 2 * size // 3], avro_decoder="fastavro")
    assert recs == _raw(300)


def test_a_block_claiming_more_records_than_bytes_is_a_corrupt_file(tmp_path):
    empty = fastavro.parse_schema({"type": "record", "name": "e", "fields": []})
    buf = io.BytesIO()
    fastavro.writer(buf, empty, [], codec="null", sync_marker=MARK)
    count = sources.MAX_AVRO_EMPTY_RECORDS + 1

    def zigzag(n: int) -> bytes:
        n, out = (n << 1) ^ (n >> 63), bytearray()
        while n > 0x7F:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        return bytes([*out, n])

    header = buf.getvalue()
    path = tmp_path / "claims.avro"
    path.write_bytes(header + zigzag(count) + zigzag(3) + b"\x00\x00\x00" + MARK)
    with pytest.raises(InputFileError, match=f"claims {count} records") as e:
        read_all(path)
    assert e.value.offset == len(header)


class _Renamed:
    """fastavro's block reader as a release that renamed ``writer_schema`` would give it."""

    def __init__(self, reader):
        self._reader = reader

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._reader)

    @property
    def codec(self):
        return self._reader.codec


@pytest.mark.parametrize("change", ["renamed attribute", "changed signature", "block iteration"])
def test_a_fastavro_api_change_is_an_internal_error_not_the_files_fault(tmp_path, monkeypatch, change):
    path = _write(tmp_path / "a.avro")
    assert [r for b in read_all(path, avro_decoder="fastavro") for r in b.records] == _raw(300)
    real = fastavro.block_reader
    if change == "renamed attribute":
        monkeypatch.setattr(fastavro, "block_reader", lambda fo, *a, **k: _Renamed(real(fo, *a, **k)))
    elif change == "changed signature":
        def changed(fo, schema, *a, **k):
            return real(fo, schema, *a, **k)
        monkeypatch.setattr(fastavro, "block_reader", changed)
    else:
        class Broken(_Renamed):
            writer_schema = property(lambda self: self._reader.writer_schema)

            def __next__(self):
                raise AttributeError("'Block' object has no attribute 'bytes_'")
        monkeypatch.setattr(fastavro, "block_reader", lambda fo, *a, **k: Broken(real(fo, *a, **k)))
    with pytest.raises(RuntimeError, match="internal error: recordprep's use of fastavro does not fit") as e:
        read_all(path, avro_decoder="fastavro")
    assert not isinstance(e.value, InputFileError | ValueError)
    assert fastavro.__version__ in str(e.value)


def test_reading_the_schema_after_a_fastavro_api_change_is_an_internal_error(tmp_path, monkeypatch):
    path = _write(tmp_path / "a.avro")
    real = fastavro.reader
    monkeypatch.setattr(fastavro, "reader", lambda fo, *a, **k: _Renamed(real(fo, *a, **k)))
    with open(path, "rb") as f, pytest.raises(RuntimeError, match="internal error: recordprep's use of fastavro") as e:
        sources.read_avro_schema(f, str(path))
    assert not isinstance(e.value, InputFileError | ValueError)
