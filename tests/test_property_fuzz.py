"""A short smoke run of the fuzz driver (`make fuzz` runs it for minutes)."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fuzz_driver_smoke_run():
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_records.py"), "--seconds", "1",
                        "--examples-per-round", "15", "--seed", "7"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    for target in ("avro", "json", "numbers", "avro-bytes", "json-bytes", "metadata"):
        assert f"ok   {target:<11} round 0: 15 examples" in p.stdout, p.stdout
    assert "no failure" in p.stdout


def _planted(tmp_path, body: str, *args: str) -> subprocess.CompletedProcess:
    """The driver on the json-bytes target with its body replaced by ``body`` (a def of ``planted(data)``)."""
    script = tmp_path / "planted.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import fuzz_records\n"
        "from hypothesis import strategies as st\n"
        f"{body}\n"
        "fuzz_records.TARGETS['json-bytes'] = ((st.integers(0, 1000),), planted)\n"
        "sys.exit(fuzz_records.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, str(script), "--target", "json-bytes", *args],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_fuzz_driver_reports_every_failure_with_its_example_and_a_reproducer(tmp_path):
    """Two distinct bugs: both are printed with their shrunk example, and each --reproduce command re-fails it alone."""
    body = ("def planted(data):\n"
            "    if data % 2:\n"
            "        raise KeyError('planted odd')\n"
            "    assert data == 0, 'planted even'\n")
    p = _planted(tmp_path, body, "--seconds", "0", "--examples-per-round", "50", "--seed", "3")
    err = p.stderr
    assert p.returncode == 1 and "FAIL json-bytes (round 0): 2 distinct failure(s)" in err, err[-3000:]
    assert "planted odd" in err and "planted even" in err and "ExceptionGroup" not in err, err[-3000:]
    assert "data=1," in err and "data=2," in err, err[-3000:]  # the shrunk falsifying examples
    assert "--examples-per-round 50 --seed 3" in err, err[-3000:]  # re-running the round
    blobs = re.findall(r"reproduce failure \d: python tests/fuzz_records.py --target json-bytes --reproduce (\S+)", err)
    assert len(blobs) == 2, err[-3000:]
    for blob in blobs:
        again = _planted(tmp_path, body, "--reproduce", blob)
        assert again.returncode == 1 and "1 distinct failure(s)" in again.stderr, again.stderr[-3000:]
    fixed = _planted(tmp_path, "def planted(data):\n    pass\n", "--reproduce", blobs[0])
    assert fixed.returncode == 0 and "passes now" in fixed.stdout, fixed.stderr[-3000:]


def test_values_beyond_float32_cast_to_infinity_without_a_warning():
    """on_nan: keep writes |x| > float32 max as +-inf, silently (the cast's overflow is the documented result)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_property_roundtrip import record_path

    for transform in ("identity", "zscore"):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            *_, cols = record_path({"features": [{"name": "x", "transform": transform, "on_nan": "keep"}]},
                                   [{"x": 1.0}, {"x": 2.0}, {"x": 3.5e38}, {"x": -(2**200)}])
        assert np.isinf(cols["x"][2:, 0]).all() and np.isfinite(cols["x"][:2, 0]).all(), cols["x"]


#: Found by ``make fuzz`` (avro-bytes): a zstandard block whose bytes are not a zstd frame.
_CORRUPT_ZSTD_AVRO = (
    b'Obj\x01\x04\x14avro.codec\x12zstandard\x16avro.schema\xfa\x02{"type": "record", "name": "prop.Row", '
    b'"fields": [{"name": "f1", "type": "int"}, {"name": "f2", "type": ["null", {"logicalType": "uuid", '
    b'"type": "string"}]}, {"name": "f3", "type": "int"}]}\x00\xae{\xb1\xf9;\x7fg\xda\xbaI\xf3\xc6\xd4]\x19'
    b'\x02\x04\x90\x01(\xb5/\xfd P\xfd\x01\x00\x02\xc5\x0e\x10\xa05\x0fl\te\x0bnb$a\xc3\xff\x07_IsgC'
    b'\x95\xa0\x85\xae\x97S\xba\x06\xbe\xa7\x95]\xdbH\x96\xe8\x00\x98)+h+\x0b\x93\xc6\xf7(\xfc\xea\xda'
    b'\x07\xd5\xbe\x12Ip\xe0\x00\x98\x00\xae{\xb1\xf9;\x7fg\xda\xbaI\xf3\xc6\xd4]\x19\x02\x02\x1a(\xb5/'
    b'\xfd \x03\x19\x00\x00\x00\x00\x00\xae{\xb1\xf9;\x7fg\xda\xbaI\xf3\xc6\xd4]\x19\x02'
)


def test_a_corrupt_zstandard_block_fails_the_file_naming_it():
    """The block-size check (--max-block-mb) met zstd's own error type, which it did not catch."""
    from convert.sources import InputFileError, iter_avro

    with pytest.raises(InputFileError, match="fuzz.avro"):
        for _ in iter_avro(io.BytesIO(_CORRUPT_ZSTD_AVRO), "fuzz.avro", batch_size=64):
            pass
