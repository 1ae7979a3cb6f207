"""Gzip shards do not depend on where ISA-L's compressor lies in memory.

ISA-L's level 1 and 2 deflate hashes a stream's third byte from its own address, so
the same records gave other gzip bytes when the compressor happened to lie at an
address whose hash bucket is one of the stream's first positions' (a 2-worker run
and an in-process one of the same input once wrote different shards). The address
cannot be chosen, so these tests choose the data instead: its first word is made to
fall in the bucket of the compressor at hand.
"""

from __future__ import annotations

import gzip
import io
import random

import pytest
from isal import isal_zlib
from isal.igzip import IGzipFile

from pipelines.tempfile_format import (
    ISAL_LEVELS,
    ShardWriter,
    address_buckets,
    first_bytes_buckets,
    gzip_file,
    isal_hash,
)


def _compressor(level: int):
    return isal_zlib.compressobj(level, isal_zlib.DEFLATED, -isal_zlib.MAX_WBITS, isal_zlib.DEF_MEM_LEVEL, 0)


def _colliding(level: int, seed: int, held: list) -> tuple[object, bytes]:
    """A fresh compressor, and data whose first word ISA-L files under that compressor's
    address bucket, repeated so that a lost match shows in the bytes."""
    while len(address_buckets(c := _compressor(level), level)) != 1:  # not astride a 64 KiB boundary
        held.append(c)
    held.append(c)
    bucket = address_buckets(c, level).pop()
    rng = random.Random(seed)
    word = next(w for w in iter(lambda: rng.randbytes(4), None) if isal_hash(w, level) == bucket)
    return c, (word + bytes(4) + rng.randbytes(40)) * 20


def _neutral(level: int, data: bytes, held: list):
    """A compressor whose address bucket is none of ``data``'s first positions'."""
    while address_buckets(c := _compressor(level), level) & first_bytes_buckets(data[:6], level):
        held.append(c)
    held.append(c)
    return c


def _gz(make, data: bytes, compressor, cut: int | None = None) -> bytes:
    """``data`` gzipped by the writer ``make(fileobj)`` with ``compressor`` in place of its own,
    in one write or two (``cut``: where the first ends)."""
    out = io.BytesIO()
    f = make(out)
    f.compress = compressor
    for part in ((data,) if cut is None else (data[:cut], data[cut:])):
        f.write(part)
    f.close()
    return out.getvalue()


@pytest.mark.parametrize("level", ISAL_LEVELS)
def test_isal_deflate_depends_on_the_compressors_address_as_the_writer_assumes(level):
    """The library's behaviour the writer works around (if this fails, ISA-L no longer hashes
    from its address: ``AddressFreeIGzipFile`` can go)."""
    held: list = []
    plain = lambda out: IGzipFile(filename="", fileobj=out, mode="wb", compresslevel=level, mtime=0)  # noqa: E731
    compressor, data = _colliding(level, 1, held)
    unlucky = _gz(plain, data, compressor)
    common = _gz(plain, data, _neutral(level, data, held))
    assert unlucky != common and gzip.decompress(unlucky) == gzip.decompress(common) == data
    assert _gz(plain, data, _neutral(level, data, held)) == common  # every neutral address: the same bytes


@pytest.mark.parametrize("level", ISAL_LEVELS)
def test_gzip_shards_are_the_same_bytes_at_an_unlucky_address(tmp_path, level):
    """``gzip_file`` (and the shard writer on it) given a compressor at an address whose bucket
    is the stream's first word's writes the bytes of every other address."""
    held: list = []
    compressor, data = _colliding(level, 2, held)
    common = _gz(lambda out: IGzipFile(filename="", fileobj=out, mode="wb", compresslevel=level, mtime=0),
                 data, _neutral(level, data, held))
    assert _gz(lambda out: gzip_file(out, level), data, compressor) == common

    compressor, data = _colliding(level, 3, held)
    common = _gz(lambda out: gzip_file(out, level), data, _neutral(level, data, held), cut=100)
    w = ShardWriter(str(tmp_path / "s.gz"), "GZIP", level)
    w.f.compress = compressor
    w.write(data[:100], 1)
    w.write(data[100:], 1)
    w.close()
    assert (tmp_path / "s.gz").read_bytes() == common
