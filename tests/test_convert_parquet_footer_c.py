"""convert._footer (the Parquet footer's encryption-marker walk in C) against
its Python path, ``convert.formats.parquet_footer._encryption_fields``: the same answer
(marked, clean, unreadable) on real footers, footers with encrypted columns,
and thousands of footers damaged at random bytes or cut short; the Python path
refuses an encrypted file by itself; its verdicts are remembered by the
footer's content; and the C code built with AddressSanitizer and UBSan."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _sanitized import run_sanitized
from test_convert_parquet_guards import _encrypted, _read
from test_hostile_round4_probe import _thrift_alike, _without_file_encryption_marker

from convert.formats import parquet_footer
from convert.formats.parquet_footer import CLEAN, MARKED, UNREADABLE
from convert.source_types import InputFileError

try:
    from convert import _footer as native
except ImportError:
    native = None
needs_native = pytest.mark.skipif(native is None, reason="convert._footer is not built (no C compiler at install)")


def _footer(data: bytes) -> bytes:
    return data[-8 - int.from_bytes(data[-8:-4], "little"):-8]


def _python_path(footer: bytes) -> int:
    try:
        return MARKED if parquet_footer._encryption_fields(footer) else CLEAN
    except (parquet_footer._Bad, IndexError):
        return UNREADABLE


def _seeds() -> list[bytes]:
    plain = io.BytesIO()
    pq.write_table(pa.table({"a": [1, 2], "s": ["x", None], "l": [[1], []], "m": [[("k", 1)], []]},
                            schema=pa.schema([("a", pa.int64()), ("s", pa.string()), ("l", pa.list_(pa.int64())),
                                              ("m", pa.map_(pa.string(), pa.int64()))])),
                   plain, write_page_index=True, store_schema=True)
    hidden = _without_file_encryption_marker(_encrypted(plaintext_footer=True, wide=3))
    return [_footer(d) for d in (plain.getvalue(), _encrypted(plaintext_footer=True), hidden,
                                 *(_thrift_alike(hidden, how) for how in ("stop", "list", "field-id")))]


def test_the_module_is_built():
    """`make install` builds it wherever a C compiler is (CI has one): a silent
    fallback to the Python path would slow every wide Parquet file down."""
    assert native is not None, "convert._footer is not built: install a C compiler, then `make install`"
    assert parquet_footer._encryption_fields_c is native.encryption_fields


@needs_native
def test_the_c_walk_answers_as_the_python_path_on_damaged_footers():
    rnd = random.Random(7)
    seen = set()
    for seed in _seeds():
        assert native.encryption_fields(seed) == _python_path(seed)
        for _ in range(3000):
            footer = bytearray(seed)
            for _ in range(rnd.randint(1, 4)):
                footer[rnd.randrange(len(footer))] = rnd.choice([0, 0x0F, 0x10, 0x1C, 0x80, 0xFF, rnd.randrange(256)])
            if rnd.random() < 0.2:
                footer = footer[:rnd.randrange(len(footer))]
            answer = _python_path(bytes(footer))
            assert native.encryption_fields(bytes(footer)) == answer, bytes(footer).hex()
            seen.add(answer)
    assert seen == {CLEAN, MARKED, UNREADABLE}


def test_the_python_path_refuses_encrypted_columns_and_remembers_each_footer_byte_for_byte(monkeypatch):
    walks = []

    def counted(footer: bytes) -> bool:
        walks.append(len(footer))
        return walk(footer)

    walk = parquet_footer._encryption_fields
    monkeypatch.setattr(parquet_footer, "_encryption_fields_c", None)
    monkeypatch.setattr(parquet_footer, "_encryption_fields", counted)
    monkeypatch.setattr(parquet_footer, "_VERDICTS", {})
    hidden = _without_file_encryption_marker(_encrypted(plaintext_footer=True))
    for data in (hidden, _thrift_alike(hidden, "stop"), _thrift_alike(hidden, "list")):
        with pytest.raises(InputFileError, match=r"an encrypted Parquet file \(some of its columns are encrypted\)"):
            _read(data, "e.parquet")
    with pytest.raises(InputFileError, match="not a readable Parquet file"):
        _read(_thrift_alike(hidden, "field-id"), "e.parquet")
    assert len(walks) == 4
    plain = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(3000)), "s": [str(i) for i in range(3000)]}), plain, row_group_size=1000,
                   write_statistics=False)
    for _ in range(3):  # once per footer, not once per open (each work unit opens its file)
        assert len(_read(plain.getvalue())) == 3000
    assert len(walks) == 5
    # a footer of the same length, head and tail but other bytes between is walked again
    footer = _footer(_encrypted(plaintext_footer=True, wide=200))
    assert len(footer) > 2 * parquet_footer._SAMPLE
    middle = len(footer) // 2
    other = footer[:middle] + bytes([footer[middle] ^ 0xFF]) + footer[middle + 1:]
    assert parquet_footer.encryption_fields(footer) == MARKED
    parquet_footer.encryption_fields(other)
    assert parquet_footer.encryption_fields(footer) == MARKED
    assert len(walks) == 8


_SANITIZED_RUN = """
import random
from convert.formats import parquet_footer
parquet_footer._encryption_fields_c = None

def python_path(footer):
    try:
        return 1 if parquet_footer._encryption_fields(footer) else 0
    except (parquet_footer._Bad, IndexError):
        return -1

rnd = random.Random(11)
for seed in SEEDS:
    for t in range(1500):
        footer = bytearray(seed)
        for _ in range(rnd.randint(1, 6)):
            footer[rnd.randrange(len(footer))] = rnd.randrange(256)
        footer = bytes(footer[:rnd.randrange(len(footer) + 1)])
        assert mod.encryption_fields(footer) == python_path(footer), footer.hex()
deep = b"\\x1c" * 200 + b"\\x19\\xfc" * 100 + b"\\x0b\\xff\\xff\\xff\\xff\\x07"
for footer in (b"", deep, b"\\x19\\xcf\\xff\\xff\\xff\\xff\\x0f", b"\\x08" + b"\\xff" * 12,
               b"\\x1b\\x05\\xcc" + b"\\x00" * 9, b"\\x0c\\xff\\xff\\x03" + b"\\x00" * 4):
    for cut in range(len(footer) + 1):
        assert mod.encryption_fields(footer[:cut]) == python_path(footer[:cut]), footer[:cut].hex()
print("ok")
"""


@pytest.mark.slow
@needs_native
def test_the_c_walk_is_memory_safe_under_address_sanitizer(tmp_path):
    """Built with AddressSanitizer and UBSan (any finding aborts), the C walk reads
    thousands of damaged and cut footers, nesting past the depth limit, counts and
    lengths past 31 bits, and agrees with the Python path."""
    run_sanitized("_footer", f"SEEDS = {_seeds()!r}\n" + _SANITIZED_RUN, tmp_path)
