"""Reference implementations the tests check the fast production paths against.

Each does the job the simple way, a value or a record at a time, so that a
test comparing it with the bulk code would see any difference in bytes.
"""

from __future__ import annotations

import struct
from typing import IO

from convert.tfrecord import masked_crc


def write_records(f: IO[bytes], records: list[bytes]) -> int:
    """Frame and write TFRecord records one by one (``convert.tfrecord.frame_records``
    in bulk gives the same bytes); returns the bytes written."""
    total = 0
    for r in records:
        header = struct.pack("<Q", len(r))
        chunk = header + struct.pack("<I", masked_crc(header)) + r + struct.pack("<I", masked_crc(r))
        f.write(chunk)
        total += len(chunk)
    return total
