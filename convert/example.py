"""Bulk serialization of ``tf.train.Example`` without TensorFlow.

Why by hand: the converter's workers must not need TensorFlow, and building
one protobuf message per record in Python is the slowest step of the naive
pipeline. Every feature here has a fixed shape, so a whole batch can be laid
out with numpy: float payloads are fixed-width memory copies, int64 payloads
are varints computed column-wise, and the length prefixes are varints of
per-row sums. Output is byte-identical to
``tf.train.Example.SerializeToString(deterministic=True)`` with the protobuf
runtime TensorFlow installs (upb), which the tests check against TensorFlow's
own protobuf and parser. upb's deterministic map order compares keys' UTF-8
bytes, but a key sorts *after* every longer key it is a prefix of (``a_len``
before ``a``); see ``_map_key_order``.

``encode_examples`` runs the same layout in C (``convert/_example.c``, two
passes over the rows: sizes, then bytes) when it is built; the numpy path
here defines the bytes, and the tests hold the C one to it.

Wire format (protobuf)::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   # entry: key=1, value=2
    Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
                       Int64List int64_list = 3; } }
    *List    { repeated value = 1 [packed]; }         # bytes: not packed
"""

from __future__ import annotations

import numpy as np

from convert.spec import PACKED_KEYS

try:  # the same bytes in C (convert/_example.c); absent when built without a C compiler
    from convert._example import encode as _encode_c
except ImportError:
    _encode_c = None

_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_GROUP = np.arange(10, dtype=np.uint8)


def _varint_matrix(values: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Varints of a ``(B, n)`` int array laid out as a ``(B, n * width)`` byte block.

    Returns ``(block, mask, row_lengths)``: value ``j`` of row ``i`` occupies
    ``block[i, j*width : j*width + len]``; ``mask`` marks the bytes in use
    (``None`` when every value has the same length).

    This is the encoder's hot loop, so it works a 7-bit group at a time on
    ``(B, n)`` arrays, in 32-bit arithmetic when the values allow (ids and
    lengths do), instead of broadcasting over a trailing ``width`` axis
    (numpy reduces such short axes slowly; docs/benchmarks.md#design-converter).
    """
    v = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    b, n = v.shape
    if v.size == 0:
        return np.empty((b, 0), np.uint8), None, np.zeros(b, np.int64)
    # Only as many 7-bit groups as the largest value needs.
    width = 1 + int(np.searchsorted(_THRESHOLDS, v.max(), side="right"))
    if width == 1:
        return v.astype(np.uint8), None, np.full(b, n, dtype=np.int64)
    if width <= 4:  # every value below 2**28
        v = v.astype(np.uint32)
    lens = np.ones(v.shape, dtype=np.uint8)
    for k in range(width - 1):
        lens += v >= _THRESHOLDS[k].astype(v.dtype)
    groups = np.empty((b, n, width), dtype=np.uint8)
    for k in range(width):
        group = (v >> v.dtype.type(7 * k)).astype(np.uint8) & np.uint8(0x7F)
        if k < width - 1:  # continuation bit where the value goes on
            group |= (lens > k + 1).view(np.uint8) << np.uint8(7)
        groups[..., k] = group
    mask = _GROUP[:width] < lens[..., None]
    return groups.reshape(b, n * width), mask.reshape(b, n * width), lens.sum(axis=1, dtype=np.int64)


def _key_bytes(name: str) -> bytes:
    k = name.encode("utf-8")
    return b"\x0a" + _varint_scalar(len(k)) + k


def _varint_scalar(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Rows:
    """Every row's bytes as segments of one ``(rows, width)`` byte matrix.

    A segment is the same bytes on every row, a block of the same width on
    every row, or a block whose rows use only some bytes (a mask). Bytes of
    consecutive constant segments merge. ``bytes()`` lays the segments side
    by side and keeps the used bytes in row-major order: every row's bytes
    back to back, in one boolean-mask copy, with no per-byte index arrays.
    """

    def __init__(self, rows: int):
        self.rows = rows
        self.segments: list[tuple[bytes | np.ndarray, np.ndarray | None]] = []
        # bytes in use per row: ``fixed`` on every row plus ``varying`` (None: nothing varies)
        self.fixed = 0
        self.varying: np.ndarray | None = None

    @property
    def lens(self) -> np.ndarray:
        if self.varying is None:
            return np.full(self.rows, self.fixed, dtype=np.int64)
        return self.varying + self.fixed

    def _add_lens(self, lens: np.ndarray) -> None:
        self.varying = lens.astype(np.int64) if self.varying is None else self.varying + lens

    def const(self, data: bytes) -> None:
        if data:
            self.fixed += len(data)
            if self.segments and isinstance(self.segments[-1][0], bytes):
                data = self.segments.pop()[0] + data  # type: ignore[operator]
            self.segments.append((data, None))

    def block(self, mat: np.ndarray, mask: np.ndarray | None, lens: np.ndarray) -> None:
        """A ``(rows, width)`` block; ``mask``: the bytes in use (None: all), ``lens``: how many per row."""
        if mat.shape[1]:
            self.segments.append((mat, mask))
            if mask is None:  # every row uses the whole block
                self.fixed += mat.shape[1]
            else:
                self._add_lens(lens)

    def varint_lens(self, other: _Rows) -> None:
        """The varint of each row's length in ``other`` (a length prefix)."""
        if other.varying is None:
            self.const(_varint_scalar(other.fixed))
        else:
            self.varint(other.varying + other.fixed)

    def varint(self, values: np.ndarray) -> None:
        """The varint of one non-negative value per row."""
        first = int(values[0])
        if (values == first).all():
            self.const(_varint_scalar(first))
        else:
            self.block(*_varint_matrix(values.reshape(-1, 1)))

    def extend(self, other: _Rows) -> None:
        for data, mask in other.segments:
            if isinstance(data, bytes) and self.segments and isinstance(self.segments[-1][0], bytes):
                data = self.segments.pop()[0] + data  # type: ignore[operator]
            self.segments.append((data, mask))
        self.fixed += other.fixed
        if other.varying is not None:
            self._add_lens(other.varying)

    def bytes(self) -> np.ndarray:
        widths = [len(d) if isinstance(d, bytes) else d.shape[1] for d, _ in self.segments]
        # The constant segments make one template row, copied to every row in
        # one broadcast; only the other segments are written column-block by
        # column-block (cheaper than a write per segment, measured).
        template = np.empty(sum(widths), dtype=np.uint8)
        at = 0
        for (data, _), w in zip(self.segments, widths, strict=True):
            if isinstance(data, bytes):
                template[at:at + w] = np.frombuffer(data, dtype=np.uint8)
            at += w
        out = np.empty((self.rows, template.size), dtype=np.uint8)
        out[:] = template
        masked = any(m is not None for _, m in self.segments)
        keep = np.ones(out.shape, dtype=bool) if masked else None
        at = 0
        for (data, mask), w in zip(self.segments, widths, strict=True):
            if not isinstance(data, bytes):
                out[:, at:at + w] = data
            if mask is not None:
                assert keep is not None
                keep[:, at:at + w] = mask
            at += w
        return out.reshape(-1) if keep is None else out[keep]


def _feature_entry(name: str, kind: str, value: np.ndarray | list[bytes], rows: int) -> _Rows:
    """The map entry ``feature { key: name value: Feature }`` of every row."""
    body = _Rows(rows)  # the *List body: `0x0a len payload`
    if kind == "float32":
        mat = np.ascontiguousarray(np.asarray(value, dtype="<f4").reshape(rows, -1))
        feat_tag = b"\x12"
        if mat.shape[1]:
            body.const(b"\x0a" + _varint_scalar(4 * mat.shape[1]))
            body.block(mat.view(np.uint8), None, np.full(rows, 4 * mat.shape[1], dtype=np.int64))
    elif kind == "int64":
        payload = _varint_matrix(np.asarray(value, dtype=np.int64).reshape(rows, -1))
        feat_tag = b"\x1a"
        if payload[0].shape[1]:
            body.const(b"\x0a")
            body.varint(payload[2])
            body.block(*payload)
    elif kind == "string":
        # BytesList values are not packed: each is `0x0a len bytes`; one value per row.
        vals = [bytes(v) for v in value]
        vl = np.fromiter((len(v) for v in vals), dtype=np.int64, count=rows)
        feat_tag = b"\x0a"
        body.const(b"\x0a")
        body.varint(vl)
        width = int(vl.max()) if rows else 0
        mat = np.zeros((rows, width), dtype=np.uint8)
        mask = np.arange(width)[None, :] < vl[:, None]
        mat[mask] = np.frombuffer(b"".join(vals), dtype=np.uint8)  # row-major: each row's bytes in order
        body.block(mat, mask, vl)
    else:
        raise ValueError(f"feature {name!r}: unknown dtype {kind!r}")
    # An empty list has no body at all (every row has the same number of
    # values, so either all rows have one or none): `tag 0x00`.
    feat = _Rows(rows)
    feat.const(feat_tag)
    feat.varint_lens(body)
    feat.extend(body)
    entry_body = _Rows(rows)
    entry_body.const(_key_bytes(name) + b"\x12")
    entry_body.varint_lens(feat)
    entry_body.extend(feat)
    entry = _Rows(rows)
    entry.const(b"\x0a")
    entry.varint_lens(entry_body)
    entry.extend(entry_body)
    return entry


def _map_key_order(name: str) -> tuple[int, ...]:
    """Sort key reproducing upb's deterministic order of string map keys.

    Bytes compare ascending; when one key is a prefix of another, the longer
    key comes first (a terminator above every byte value does exactly that).
    """
    return (*name.encode("utf-8"), 256)


def encode_examples(columns: dict[str, tuple[str, np.ndarray | list[bytes]]], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Serialize ``rows`` Examples.

    Args:
      columns: feature name -> (dtype, values), dtype ``float32`` / ``int64``
        with values of shape ``(rows, n)`` (or ``(rows,)``), or ``string`` with
        a list of ``rows`` byte strings.
      rows: number of Examples.

    Returns:
      ``(buffer, lengths)``: all serialized Examples back to back as uint8,
      and each one's byte length. Keeping them in one buffer lets the TFRecord
      framing run in bulk too.
    """
    if rows == 0:
        return np.empty(0, np.uint8), np.empty(0, np.int64)
    if _encode_c is not None:
        data, lens = _encode_c(_c_columns(columns, rows), rows)
        return np.frombuffer(data, np.uint8), np.frombuffer(lens, np.int64)
    features = _Rows(rows)
    for name in sorted(columns, key=_map_key_order):
        kind, value = columns[name]
        features.extend(_feature_entry(name, kind, value, rows))
    example = _Rows(rows)
    example.const(b"\x0a")
    example.varint_lens(features)
    example.extend(features)
    return example.bytes(), example.lens


_C_KINDS = {"float32": 0, "int64": 1, "string": 2}


def _c_columns(columns: dict[str, tuple[str, np.ndarray | list[bytes]]], rows: int) -> list[tuple]:
    """``columns`` as ``convert._example.encode`` takes them: ``(key, kind, n, values)``
    in map order, values as the numpy path reads them (little-endian float32,
    int64, a list of bytes)."""
    out = []
    for name in sorted(columns, key=_map_key_order):
        kind, value = columns[name]
        if kind == "float32":
            a = np.ascontiguousarray(np.asarray(value, dtype="<f4").reshape(rows, -1))
        elif kind == "int64":
            a = np.ascontiguousarray(np.asarray(value, dtype=np.int64).reshape(rows, -1))
        elif kind == "string":
            out.append((name.encode("utf-8"), 2, 1, [v if type(v) is bytes else bytes(v) for v in value]))
            continue
        else:
            raise ValueError(f"feature {name!r}: unknown dtype {kind!r}")
        out.append((name.encode("utf-8"), _C_KINDS[kind], a.shape[1], a))
    return out


def pack_columns(columns: dict[str, tuple[str, np.ndarray | list[bytes]]], rows: int,
                 slices: dict[str, list[tuple[str, int, int]]]) -> dict[str, tuple[str, np.ndarray | list[bytes]]]:
    """``columns`` in the packed layout: the float32 and int64 columns listed in
    ``slices`` (``convert.spec.packed_slices``) concatenated, in that order, into
    one ``(rows, total)`` column each under ``PACKED_KEYS[dtype]``; string columns as they are."""
    out = {name: col for name, col in columns.items() if col[0] == "string"}
    for dtype, parts in slices.items():
        if not parts:
            continue
        arrays = []
        for name, _offset, width in parts:
            kind, values = columns[name]
            a = np.asarray(values).reshape(rows, -1)
            if kind != dtype or a.shape[1] != width:
                raise ValueError(f"feature {name!r}: expected {dtype} of width {width}, found {kind} {a.shape}")
            arrays.append(a)
        out[PACKED_KEYS[dtype]] = (dtype, np.concatenate(arrays, axis=1) if len(arrays) > 1 else arrays[0])
    return out


def unpack_decoded(decoded: dict[str, tuple[str, list]],
                   slices: dict[str, list[tuple[str, int, int]]]) -> dict[str, tuple[str, list]]:
    """``decode_example`` output of a packed-layout Example, one entry per feature again.

    Raises ``ValueError`` if a packed Feature is missing or has the wrong dtype or length.
    """
    out = {name: v for name, v in decoded.items() if name not in PACKED_KEYS.values()}
    for dtype, parts in slices.items():
        if not parts:
            continue
        key = PACKED_KEYS[dtype]
        total = sum(w for *_, w in parts)
        if key not in decoded:
            raise ValueError(f"packed feature {key!r} is missing")
        kind, values = decoded[key]
        if kind != dtype or len(values) != total:
            raise ValueError(f"packed feature {key!r} is {kind}[{len(values)}], expected {dtype}[{total}]")
        for name, off, width in parts:
            out[name] = (dtype, values[off:off + width])
    return out


def split_buffer(buf: np.ndarray, lengths: np.ndarray) -> list[bytes]:
    """Individual serialized Examples from ``encode_examples`` output."""
    data = buf.tobytes()
    ends = np.cumsum(lengths).tolist()
    starts = [0, *ends[:-1]][: len(ends)]  # no rows: no starts either
    return [data[s:e] for s, e in zip(starts, ends, strict=True)]


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(b):
            raise ValueError("truncated varint")
        c = b[i]
        i += 1
        result |= (c & 0x7F) << shift
        if not c & 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def decode_example(data: bytes) -> dict[str, tuple[str, list]]:
    """Decode one serialized Example into ``{name: (dtype, values)}``.

    For ``recordprep inspect``/``verify`` on machines without TensorFlow; not
    a hot path. Raises ``ValueError`` on malformed bytes.
    """
    import struct

    def fields(buf: bytes):
        i = 0
        while i < len(buf):
            key, i = _read_varint(buf, i)
            wire = key & 7
            if wire != 2:
                raise ValueError(f"unexpected wire type {wire}")
            n, i = _read_varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated field")
            yield key >> 3, buf[i:i + n]
            i += n

    out: dict[str, tuple[str, list]] = {}
    for num, features in fields(data):
        if num != 1:
            continue
        for _, entry in fields(features):
            name, feat = "", b""
            for fn, v in fields(entry):
                if fn == 1:
                    name = v.decode("utf-8")
                elif fn == 2:
                    feat = v
            for kind, lst in fields(feat):
                vals: list = []
                for _, payload in fields(lst):
                    if kind == 1:
                        vals.append(payload)
                    elif kind == 2:
                        vals.extend(struct.unpack(f"<{len(payload) // 4}f", payload))
                    elif kind == 3:
                        j = 0
                        while j < len(payload):
                            v, j = _read_varint(payload, j)
                            vals.append(v - (1 << 64) if v >= 1 << 63 else v)
                out[name] = ({1: "string", 2: "float32", 3: "int64"}[kind], vals)
            if not feat:
                out[name] = ("float32", [])
    return out
