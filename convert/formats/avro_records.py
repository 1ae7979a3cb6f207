"""The fastavro path's helpers: decoding blocks whose schema has logical types
to their raw values, telling a changed fastavro API from a bad file, and
explaining schemas too deep for Python's recursion limit.
"""

from __future__ import annotations

import io
import sys
from typing import IO, Any

import fastavro

from convert.formats.avro_framing import SYNC_SIZE, block_header, strip_logical
from convert.source_types import quoted

#: What a fastavro whose API no longer fits raises (a renamed attribute, a
#: changed signature): recordprep's fault, never a reason to blame the file.
FASTAVRO_API_ERRORS = (AttributeError, TypeError, NameError, ImportError)


def fastavro_changed(e: BaseException) -> RuntimeError:
    return RuntimeError(f"internal error: recordprep's use of fastavro does not fit the installed fastavro "
                        f"{getattr(fastavro, '__version__', '?')} ({quoted(e)}); install a fastavro in the range "
                        "pyproject.toml gives, and report this")


def header_without_logical(writer_schema: Any, codec: str, sync: bytes) -> bytes:
    """An Avro header declaring ``writer_schema`` minus ``logicalType``, with the
    file's codec and sync marker: a file's blocks behind it decode to the raw
    values of their logical types (``raw_block``)."""
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(strip_logical(writer_schema)), [], codec=codec, sync_marker=sync)
    return buf.getvalue()


def raw_block(f: IO[bytes], raw_header: bytes) -> Any:
    """The fastavro block at ``f``'s position (``f`` left after it) read behind
    ``raw_header``, so fastavro decompresses and checks it as it does in the
    file; ``StopIteration`` at the end of the file."""
    pos = f.tell()
    h = block_header(f.read(20))
    f.seek(pos)
    data = f.read(h[2] + h[1] + SYNC_SIZE if h is not None and h[1] >= 0 else 20)
    if not data:
        raise StopIteration
    return next(fastavro.block_reader(io.BytesIO(raw_header + data)))


def _schema_depth(text: bytes) -> int:
    """How deeply the JSON ``text`` nests (arrays and objects), without
    recursion: for messages about schemas too deep to parse."""
    depth = deepest = 0
    in_string = escaped = False
    for b in text:
        if in_string:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_string = False
        elif b == 0x22:
            in_string = True
        elif b in (0x7B, 0x5B):
            depth += 1
            deepest = max(deepest, depth)
        elif b in (0x7D, 0x5D):
            depth -= 1
    return deepest


def too_deep(f: IO[bytes] | None) -> str:
    """Why a valid Avro file whose schema (or records) nest too deeply for
    Python's recursion limit cannot be read; with ``f``, how deep its writer
    schema nests (read from the header with a flat header schema)."""
    levels = ""
    if f is not None:
        try:
            f.seek(0)
            meta = fastavro.schemaless_reader(f, fastavro.read.HEADER_SCHEMA, None)["meta"]
            levels = f" (its JSON nests {_schema_depth(meta.get('avro.schema', b''))} deep)"
        except Exception:  # noqa: BLE001 - only a detail of the message
            pass
    return (f"the writer schema nests deeper{levels} than the Python recursion limit "
            f"({sys.getrecursionlimit()} frames, a few per level) lets fastavro read; "
            "flatten the schema (nest fewer records, arrays and unions inside each other)")
