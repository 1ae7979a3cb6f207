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

Wire format (protobuf)::

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }   # entry: key=1, value=2
    Feature  { oneof { BytesList bytes_list = 1; FloatList float_list = 2;
                       Int64List int64_list = 3; } }
    *List    { repeated value = 1 [packed]; }         # bytes: not packed
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

_THRESHOLDS = np.array([1 << (7 * k) for k in range(1, 10)], dtype=np.uint64)
_SHIFTS = np.arange(0, 70, 7, dtype=np.uint64)
_GROUP = np.arange(10)


def varint_len(values: np.ndarray) -> np.ndarray:
    """Byte length of each value's varint (int64 values as two's complement)."""
    v = np.asarray(values).astype(np.int64, copy=False).view(np.uint64)
    return 1 + (v[..., None] >= _THRESHOLDS).sum(axis=-1)


def _varint_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varints of a ``(B, n)`` int array: (bytes of each row concatenated, row lengths)."""
    v = np.ascontiguousarray(values, dtype=np.int64).view(np.uint64)
    b, n = v.shape
    if v.size == 0:
        return np.empty(0, np.uint8), np.zeros(b, np.int64)
    # Only as many 7-bit groups as the largest value needs (ids and lengths
    # are small): this is the encoder's hot loop.
    width = 1 + int((v.max() >= _THRESHOLDS).sum())
    thresholds, shifts, group = _THRESHOLDS[: width - 1], _SHIFTS[:width], _GROUP[:width]
    if width == 1:
        return v.astype(np.uint8).reshape(-1), np.full(b, n, dtype=np.int64)
    lens = 1 + (v[..., None] >= thresholds).sum(axis=-1, dtype=np.int64)  # (B, n)
    groups = ((v[..., None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)  # (B, n, width)
    groups |= ((group < (lens[..., None] - 1)) * 0x80).astype(np.uint8)
    mask = group < lens[..., None]
    flat = groups.reshape(b, n * width)[mask.reshape(b, n * width)]
    return flat, lens.sum(axis=1)


def _varint_col(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _varint_rows(np.asarray(values).reshape(-1, 1))


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


@dataclasses.dataclass
class _Ragged:
    """Per-row byte strings: rows concatenated in ``flat``, sizes in ``lens``."""

    flat: np.ndarray
    lens: np.ndarray


def _const(b: bytes, rows: int) -> _Ragged:
    arr = np.frombuffer(b, dtype=np.uint8)
    return _Ragged(np.tile(arr, rows), np.full(rows, len(b), dtype=np.int64))


def _fixed(mat: np.ndarray) -> _Ragged:
    rows = mat.shape[0]
    m = np.ascontiguousarray(mat).view(np.uint8).reshape(rows, -1)
    return _Ragged(m.reshape(-1), np.full(rows, m.shape[1], dtype=np.int64))


def _concat(parts: Sequence[_Ragged], rows: int) -> _Ragged:
    """Row-wise concatenation of ragged parts in one scatter per part."""
    lens = np.zeros(rows, dtype=np.int64)
    for p in parts:
        lens += p.lens
    starts = np.cumsum(lens) - lens
    out = np.empty(int(lens.sum()), dtype=np.uint8)
    cursor = starts.copy()
    for p in parts:
        if p.flat.size:
            src_starts = np.cumsum(p.lens) - p.lens
            dest = np.repeat(cursor - src_starts, p.lens) + np.arange(p.flat.size)
            out[dest] = p.flat
        cursor += p.lens
    return _Ragged(out, lens)


def _len_prefixed(tag: bytes, body: list[_Ragged], body_lens: np.ndarray, rows: int) -> list[_Ragged]:
    vflat, vlens = _varint_col(body_lens)
    return [_const(tag, rows), _Ragged(vflat, vlens), *body]


def _feature_parts(name: str, kind: str, value: np.ndarray | list[bytes], rows: int) -> tuple[list[_Ragged], np.ndarray]:
    """Parts of one map entry ``feature { key: name value: Feature }``, and its per-row length."""
    if kind == "float32":
        mat = np.asarray(value, dtype="<f4").reshape(rows, -1)
        payload = _fixed(mat)
        list_tag, feat_tag = b"\x0a", b"\x12"
    elif kind == "int64":
        flat, lens = _varint_rows(np.asarray(value, dtype=np.int64).reshape(rows, -1))
        payload = _Ragged(flat, lens)
        list_tag, feat_tag = b"\x0a", b"\x1a"
    elif kind == "string":
        # BytesList values are not packed: each is `0x0a len bytes`; one value per row.
        vals = [bytes(v) for v in value]
        vl = np.fromiter((len(v) for v in vals), dtype=np.int64, count=rows)
        raw = _Ragged(np.frombuffer(b"".join(vals), dtype=np.uint8), vl)
        vflat, vlens = _varint_col(vl)
        payload = _concat([_const(b"\x0a", rows), _Ragged(vflat, vlens), raw], rows)
        # payload is the whole BytesList body; wrap straight into Feature.
        feat = _len_prefixed(b"\x0a", [payload], payload.lens, rows)
        feat_len = sum(p.lens for p in feat)
        return _entry(name, feat, feat_len, rows)
    else:
        raise ValueError(f"feature {name!r}: unknown dtype {kind!r}")
    # *List body = `0x0a len packed` (omitted entirely for an empty list: every
    # row has the same number of values, so either all rows have it or none).
    if payload.flat.size == 0:
        lst, lst_len = [], np.zeros(rows, dtype=np.int64)
    else:
        lst = _len_prefixed(list_tag, [payload], payload.lens, rows)
        lst_len = sum(p.lens for p in lst)
    feat = _len_prefixed(feat_tag, lst, lst_len, rows)
    feat_len = sum(p.lens for p in feat)
    return _entry(name, feat, feat_len, rows)


def _entry(name: str, feat: list[_Ragged], feat_len: np.ndarray, rows: int) -> tuple[list[_Ragged], np.ndarray]:
    key = _key_bytes(name)
    body = [_const(key, rows), *_len_prefixed(b"\x12", feat, feat_len, rows)]
    body_len = sum(p.lens for p in body)
    entry = _len_prefixed(b"\x0a", body, body_len, rows)
    return entry, sum(p.lens for p in entry)


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
    parts: list[_Ragged] = []
    total = np.zeros(rows, dtype=np.int64)
    for name in sorted(columns, key=_map_key_order):
        kind, value = columns[name]
        entry, elen = _feature_parts(name, kind, value, rows)
        parts.extend(entry)
        total += elen
    example = _len_prefixed(b"\x0a", parts, total, rows)
    out = _concat(example, rows)
    return out.flat, out.lens


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
