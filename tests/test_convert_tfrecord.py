"""convert.tfrecord: bulk TFRecord framing, read back by tf.data, and the CRC-checking reader.

Every test runs with ``frame_records`` and ``take_records`` on both paths, Python and C
(``convert/_tfrecord.c``, compared with the Python path in tests/test_convert_tfrecord_c.py)."""

from __future__ import annotations

import gzip
import io
import re
import struct

import numpy as np
import pytest
from _reference import write_records

from convert import tfrecord
from convert.example import encode_examples, split_buffer
from convert.tfrecord import frame_records, iter_records, masked_crc, take_records

tf = pytest.importorskip("tensorflow")


@pytest.fixture(autouse=True, scope="module", params=["c", "python"])
def framer(request):
    """Each test of this module once per path ``frame_records`` can take."""
    if request.param == "c" and tfrecord._frame_c is None:
        pytest.skip("convert._tfrecord is not built (no C compiler at install)")
    saved = tfrecord._frame_c, tfrecord._take_c
    if request.param != "c":
        tfrecord._frame_c = tfrecord._take_c = None
    yield request.param
    tfrecord._frame_c, tfrecord._take_c = saved


def _records() -> list[bytes]:
    """Records of many sizes, incl. empty and ones needing multi-byte lengths."""
    rng = np.random.default_rng(7)
    sizes = [0, 1, 2, 127, 128, 300, 5000, 70000, 3, 0, 11]
    return [bytes(rng.integers(0, 256, size=n, dtype=np.uint8)) for n in sizes]


def _as_buffer(records: list[bytes]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    buf = np.frombuffer(b"".join(records), dtype=np.uint8)
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    return buf, np.cumsum(lengths) - lengths, lengths


def _tf_read(path, compression: str = "") -> list[bytes]:
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path), compression_type=compression)]


def test_frame_records_reads_back_with_tf_data(tmp_path):
    records = _records()
    path = tmp_path / "plain.tfrecord"
    path.write_bytes(frame_records(*_as_buffer(records)))
    assert _tf_read(path) == records


def test_frame_records_gzip_wrapped_reads_back_with_tf_data(tmp_path):
    """The pipeline gzips framed batches written one after another (several write() calls)."""
    records = _records()
    buf, starts, lengths = _as_buffer(records)
    path = tmp_path / "data.tfrecord.gz"
    with gzip.GzipFile(path, "wb", mtime=0) as g:
        g.write(frame_records(buf, starts[:4], lengths[:4]))
        g.write(frame_records(buf, starts[4:], lengths[4:]))
    assert _tf_read(path, "GZIP") == records


def test_frame_records_selects_a_subset_in_any_order(tmp_path):
    """Shard writers frame ``starts[sel]`` of one encoded buffer: only those records, in that order."""
    records = _records()
    buf, starts, lengths = _as_buffer(records)
    sel = np.array([5, 0, 9, 3])
    path = tmp_path / "subset.tfrecord"
    path.write_bytes(frame_records(buf, starts[sel], lengths[sel]))
    assert _tf_read(path) == [records[i] for i in sel]


def test_frame_records_of_encoded_examples_parse_with_tf(tmp_path):
    columns = {"x": ("float32", np.arange(12, dtype=np.float32).reshape(4, 3)),
               "y": ("int64", np.array([[-1], [0], [2**63 - 1], [5]]))}
    buf, lengths = encode_examples(columns, 4)
    path = tmp_path / "ex.tfrecord"
    path.write_bytes(frame_records(buf, np.cumsum(lengths) - lengths, lengths))
    ds = tf.data.TFRecordDataset(str(path)).batch(4).map(
        lambda s: tf.io.parse_example(s, {"x": tf.io.FixedLenFeature([3], tf.float32),
                                          "y": tf.io.FixedLenFeature([1], tf.int64)}))
    got = next(iter(ds))
    np.testing.assert_array_equal(got["x"].numpy(), columns["x"][1])
    np.testing.assert_array_equal(got["y"].numpy(), columns["y"][1])
    assert _tf_read(path) == split_buffer(buf, lengths)


def test_frame_records_empty_selection_is_empty():
    buf, _, _ = _as_buffer(_records())
    assert frame_records(buf, np.empty(0, np.int64), np.empty(0, np.int64)) == b""


def test_write_records_matches_frame_records_and_tf_writer(tmp_path):
    records = _records()
    framed = frame_records(*_as_buffer(records))
    out = io.BytesIO()
    assert write_records(out, records) == len(framed)
    assert out.getvalue() == framed
    tf_path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(tf_path)) as w:
        for r in records:
            w.write(r)
    assert tf_path.read_bytes() == framed


def test_masked_crc_known_value():
    # masked CRC32C of the empty string, as TensorFlow computes it
    assert masked_crc(b"") == 0xA282EAD8


def test_iter_records_reads_tf_written_file(tmp_path):
    records = _records()
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as w:
        for r in records:
            w.write(r)
    with open(path, "rb") as f:
        assert list(iter_records(f, str(path))) == records


def test_iter_records_empty_stream_yields_nothing():
    assert list(iter_records(io.BytesIO(b""), "empty.tfrecord")) == []


def _offsets(records: list[bytes]) -> list[int]:
    out, pos = [], 0
    for r in records:
        out.append(pos)
        pos += 16 + len(r)
    return out


@pytest.mark.parametrize("cut", ["mid_header", "mid_data", "mid_crc"])
def test_iter_records_truncated_file_raises_naming_path_and_offset(tmp_path, cut):
    records = [b"a" * 10, b"b" * 300, b"c" * 20]
    data = frame_records(*_as_buffer(records))
    second = _offsets(records)[1]
    end = {"mid_header": second + 5, "mid_data": second + 12 + 100, "mid_crc": second + 12 + 300 + 2}[cut]
    path = tmp_path / f"trunc-{cut}.tfrecord"
    path.write_bytes(data[:end])
    got = []
    with open(path, "rb") as f, pytest.raises(ValueError) as ei:
        for r in iter_records(f, str(path)):
            got.append(r)
    assert got == records[:1]  # the intact first record comes out before the error
    msg = str(ei.value)
    assert str(path) in msg
    assert re.search(rf"\bbyte {second}\b", msg), msg
    assert "truncated" in msg


@pytest.mark.parametrize("where", ["length", "length_crc", "data", "data_crc"])
def test_iter_records_flipped_byte_raises_naming_path_and_offset(tmp_path, where):
    records = [b"first-record", b"x" * 50, b"last"]
    data = bytearray(frame_records(*_as_buffer(records)))
    second = _offsets(records)[1]
    pos = {"length": second + 1, "length_crc": second + 9, "data": second + 12 + 25, "data_crc": second + 12 + 50 + 3}[where]
    data[pos] ^= 0x10
    path = tmp_path / f"flip-{where}.tfrecord"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(ValueError) as ei:
        list(iter_records(f, str(path)))
    msg = str(ei.value)
    assert str(path) in msg and re.search(rf"\bbyte {second}\b", msg), msg
    assert "corrupt" in msg and "CRC" in msg
    # TensorFlow agrees the file is corrupt
    with pytest.raises(tf.errors.DataLossError):
        _tf_read(path)


def test_iter_records_without_verify_skips_crc_checks():
    records = [b"abc", b"defg"]
    data = bytearray(frame_records(*_as_buffer(records)))
    data[12] ^= 0xFF  # first data byte
    got = list(iter_records(io.BytesIO(bytes(data)), "x", verify=False))
    assert got == [bytes([ord("a") ^ 0xFF]) + b"bc", b"defg"]


def test_frame_records_header_cache_fills_and_clears_without_changing_bytes(monkeypatch):
    """The Python path's cache of headers by length."""
    import convert.tfrecord as tfr

    monkeypatch.setattr(tfr, "_frame_c", None)
    records = _records() * 3  # repeated lengths: headers come from the cache
    want = io.BytesIO()
    write_records(want, records)
    monkeypatch.setattr(tfr, "_HEADERS", {k: b"stale" for k in range(10**6, 10**6 + (1 << 16))})
    assert frame_records(*_as_buffer(records)) == want.getvalue()  # full: cleared, then refilled
    assert len(tfr._HEADERS) == len({len(r) for r in records})
    assert frame_records(*_as_buffer(records)) == want.getvalue()


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_length_claiming_a_petabyte_is_a_truncated_record_not_an_allocation(tmp_path, gz):
    length = struct.pack("<Q", 2**50)
    data = length + struct.pack("<I", masked_crc(length)) + b"only a few bytes"
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(gzip.compress(data) if gz else data)
    with (gzip.open(path, "rb") if gz else open(path, "rb")) as f, pytest.raises(ValueError) as ei:
        list(iter_records(f, str(path)))
    assert str(path) in str(ei.value) and "truncated record at byte 0" in str(ei.value)


def test_take_records_puts_the_records_back_to_back_in_the_order_given():
    records = _records()
    buf, starts, lengths = _as_buffer(records)
    sel = np.array([5, 0, 5, 10, 1, 7], dtype=np.int64)
    assert take_records(bytearray(buf.tobytes()), starts[sel], lengths[sel]) == b"".join(records[i] for i in sel)
    assert take_records(buf.tobytes(), starts[:0], lengths[:0]) == b""
    # the framed records of a batch, taken in a new order, are a TFRecord file of that order
    framed = frame_records(buf, starts, lengths)
    flens = lengths + 16
    order = np.array([3, 1, 2, 0], dtype=np.int64)
    got = list(iter_records(io.BytesIO(take_records(framed, (np.cumsum(flens) - flens)[order], flens[order]))))
    assert got == [records[i] for i in order]
