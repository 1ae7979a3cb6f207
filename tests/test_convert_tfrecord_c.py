"""convert._tfrecord (TFRecord framing in C) against the Python path of
``convert.tfrecord.frame_records``, which tests/test_convert_tfrecord.py reads
back with TensorFlow: the same bytes for random records in any order; its
CRC-32C, on the CPU's instruction and on the portable tables, against
google-crc32c at every length and alignment; ``take_records`` (records back to
back) against its Python path; the records both refuse; and the C code built
with AddressSanitizer and UBSan."""

from __future__ import annotations

import google_crc32c
import numpy as np
import pytest
from _sanitized import run_sanitized
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert import tfrecord

try:
    from convert import _tfrecord as native
except ImportError:
    native = None
needs_native = pytest.mark.skipif(native is None, reason="convert._tfrecord is not built (no C compiler at install)")


def _python_path(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray, take: bool = False) -> bytes:
    saved = tfrecord._frame_c, tfrecord._take_c
    tfrecord._frame_c = tfrecord._take_c = None
    try:
        return (tfrecord.take_records if take else tfrecord.frame_records)(buf, starts, lengths)
    finally:
        tfrecord._frame_c, tfrecord._take_c = saved


def test_the_module_is_built():
    """`make install` builds it wherever a C compiler is (CI has one): a silent
    fallback to the Python path would hide what the bench measures."""
    assert native is not None, "convert._tfrecord is not built: install a C compiler, then `make install`"
    assert tfrecord._frame_c is native.frame and tfrecord._take_c is native.take


@needs_native
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), max_size=40), st.randoms(use_true_random=False))
def test_the_c_framer_writes_the_python_paths_bytes(records, rnd):
    buf = np.frombuffer(b"".join(records), dtype=np.uint8)
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    pick = [rnd.randrange(len(records)) for _ in range(rnd.randint(0, 2 * len(records)))] if records else []
    sel = np.array(pick, dtype=np.int64)
    assert native.frame(buf, starts[sel], lengths[sel]) == _python_path(buf, starts[sel], lengths[sel])
    assert native.take(buf, starts[sel], lengths[sel]) == _python_path(buf, starts[sel], lengths[sel], take=True) \
        == b"".join(records[i] for i in pick)


@needs_native
def test_crc32c_at_every_length_and_alignment():
    """Both CRC paths, every length to 80 bytes at 8 offsets, and a megabyte, equal google-crc32c's."""
    data = np.random.default_rng(3).integers(0, 256, size=(1 << 20) + 100, dtype=np.uint8).tobytes()
    for off in range(8):
        for n in range(81):
            want = google_crc32c.value(data[off:off + n])
            assert native.crc32c(data[off:off + n]) == want == native.crc32c(memoryview(data)[off:off + n],
                                                                               portable=True), (off, n)
    assert native.crc32c(data) == google_crc32c.value(data) == native.crc32c(data, portable=True)


@needs_native
@pytest.mark.parametrize("starts, lengths, error", [
    ([0], [11], "record 0 \\(11 bytes at 0\\) is outside the 10 bytes"),
    ([5, 9], [1, 2], "record 1 \\(2 bytes at 9\\)"),
    ([-1], [1], "record 0"),
    ([0], [-1], "record 0"),
    ([11], [0], "record 0"),
    ([2**62], [2**62], "record 0"),
    ([0, 1], [1], "differ in length"),
])
@pytest.mark.parametrize("call", ["frame", "take"])
def test_the_c_framer_refuses_records_outside_the_data(starts, lengths, error, call):
    with pytest.raises(ValueError, match=error):
        getattr(native, call)(np.zeros(10, np.uint8), np.array(starts, np.int64), np.array(lengths, np.int64))


@needs_native
def test_the_c_framer_takes_int64_offsets_only():
    with pytest.raises(ValueError, match="starts must be a buffer of int64s"):
        native.frame(b"abc", np.zeros(1, np.int32), np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="lengths must be a buffer of int64s"):
        native.frame(b"abc", np.zeros(1, np.int64), np.zeros(2, np.int32))


#: Random selections through the C framer built with AddressSanitizer and UBSan, against the Python path.
_SANITIZED_RUN = r"""
import random, sys
import google_crc32c
import numpy as np
from convert import tfrecord
tfrecord._frame_c = tfrecord._take_c = None  # the Python paths
rnd = random.Random(5)
rng = np.random.default_rng(5)
for t in range(300):
    sizes = [rnd.choice([0, 1, 7, 8, 9, 100, 5000]) for _ in range(rnd.randint(0, 60))]
    buf = rng.integers(0, 256, size=sum(sizes), dtype=np.uint8)
    lengths = np.array(sizes, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    sel = np.array([rnd.randrange(len(sizes)) for _ in range(len(sizes))], dtype=np.int64)
    assert mod.frame(buf, starts[sel], lengths[sel]) == tfrecord.frame_records(buf, starts[sel], lengths[sel]), t
    assert mod.take(bytearray(buf), starts[sel], lengths[sel]) == tfrecord.take_records(buf, starts[sel], lengths[sel]), t
    data = buf.tobytes()[rnd.randint(0, 7):]
    assert mod.crc32c(data) == mod.crc32c(data, portable=True) == google_crc32c.value(data), t
for starts, lengths in (([0], [11]), ([-1], [1]), ([11], [0]), ([2**62], [2**62]), ([0, 1], [1])):
    for call in (mod.frame, mod.take):
        assert refused(ValueError, call, np.zeros(10, np.uint8), np.array(starts, np.int64),
                       np.array(lengths, np.int64)), starts
print("ok")
"""


@pytest.mark.slow
@needs_native
def test_the_c_framer_is_memory_safe_under_address_sanitizer(tmp_path):
    """Built with AddressSanitizer and UBSan (any finding aborts), the C framer frames
    hundreds of random selections (empty records, records of every size class,
    repeats), computes CRCs at odd offsets, refuses records outside its data, and
    agrees with the Python path."""
    run_sanitized("_tfrecord", _SANITIZED_RUN, tmp_path)
