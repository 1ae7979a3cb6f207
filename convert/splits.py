"""Deterministic split assignment.

A record's split depends only on its content (a key field, or the whole
record), never on file order, worker or run: re-running a conversion, or
converting a superset of the data, puts every record in the same split, and
with ``--split-key user_id`` all records of one entity land together (no
leakage of an entity between train and eval).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from convert.column_records import ColumnRecords
from convert.paths import PathError, Step, is_list_step, parse_path
from convert.records import digest8, extract, extract_path, term


class SplitError(ValueError):
    """The ``--splits`` specification is invalid; the message says what to write."""


#: Most splits: a record's split index is a uint8.
MAX_SPLITS = 256


@dataclasses.dataclass(frozen=True)
class Splits:
    """Named splits with weights, e.g. ``train=0.9,eval=0.1``.

    ``key``: the field whose value decides a record's split, written in the
    feature config's ``source`` grammar (``convert.paths``): ``user.id`` is the
    field ``id`` inside ``user``, ``["user.id"]`` a top-level field whose name
    holds the dot, ``ids[0]`` a list's first item. A key names one value per
    record: ``[]``, ``[keys]`` and ``[entries]`` are refused.
    """

    names: tuple[str, ...] = ("train", "eval")
    weights: tuple[float, ...] = (0.9, 0.1)
    key: str | None = None

    def __post_init__(self) -> None:
        if len(self.names) != len(self.weights) or not self.names:
            raise SplitError("splits need one weight per name")
        if len(self.names) > MAX_SPLITS:
            raise SplitError(f"--splits: {len(self.names)} splits; at most {MAX_SPLITS}")
        if len(set(self.names)) != len(self.names):
            raise SplitError(f"split names repeat: {self.names}")
        for n in self.names:
            if not n.isidentifier():
                raise SplitError(f"split name {n!r} must be an identifier (it becomes a file prefix)")
        shown = ",".join(f"{n}={w}" for n, w in zip(self.names, self.weights, strict=True))
        if not all(math.isfinite(w) for w in self.weights):
            raise SplitError(f"--splits: weights must be finite numbers, found {shown}")
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise SplitError(f"--splits: weights must be >= 0 and sum to > 0, found {shown}")
        # Weights are normalized by their sum: an infinite sum would make every
        # share 0 and send every record to the last split.
        if not math.isfinite(sum(self.weights)):
            raise SplitError(f"--splits: the weights' sum overflows, found {shown}; use relative weights like train=0.9,eval=0.1")
        if self.key is not None:
            self.key_path  # noqa: B018 - parsed here, so that a bad key is named before any work

    @property
    def key_path(self) -> tuple[Step, ...] | None:
        """The parsed ``key`` (``convert.paths.parse_path``), or None without one."""
        if self.key is None:
            return None
        try:
            steps = parse_path(self.key)
        except PathError as e:
            raise SplitError(f"--split-key: {e}") from None
        if not self.key or any(is_list_step(s) for s in steps):
            raise SplitError(f"--split-key {self.key!r}: a key names one value per record: field names "
                             "(user.id; quote a name holding dots or brackets: [\"user.id\"]) and list indexes "
                             "([0]), no [], [keys] or [entries]")
        return steps

    @classmethod
    def parse(cls, text: str, key: str | None = None) -> Splits:
        """``"train=0.9,eval=0.1"`` (weights are normalized)."""
        names, weights = [], []
        for part in text.split(","):
            name, sep, w = part.strip().partition("=")
            if not sep:
                raise SplitError(f"--splits: expected name=weight pairs like 'train=0.9,eval=0.1', found {part!r}")
            try:
                weights.append(float(w))
            except ValueError:
                raise SplitError(f"--splits: weight {w!r} for {name!r} is not a number") from None
            names.append(name.strip())
        return cls(tuple(names), tuple(weights), key)

    @property
    def hashes_whole_records(self) -> bool:
        """Whether ``assign`` hashes each record's canonical JSON (readers can
        supply it: ``ColumnRecords.record_json``)."""
        return self.key is None and len(self.names) > 1

    @property
    def bounds(self) -> np.ndarray:
        w = np.asarray(self.weights, dtype=np.float64)
        return np.cumsum(w / w.sum())

    def assign(self, records: Sequence[Any]) -> np.ndarray:
        """Split index per record (uint8 array)."""
        if len(self.names) == 1:
            return np.zeros(len(records), dtype=np.uint8)
        if self.key:
            steps = self.key_path
            first = steps[0]
            top = None
            if isinstance(records, ColumnRecords):  # the key's column, no dicts built
                top = {first: records.column(first, [None] * len(records))}
            values = (extract(records, list(steps), top=top) if all(isinstance(k, str) for k in steps)
                      else extract_path(records, steps, top=top))
            blobs = [_key_blob(v) for v in values]
        else:
            if isinstance(records, ColumnRecords) and records.record_json is not None:
                blobs = records.record_json  # made by the reader (polars)
            else:
                blobs = _canonical_batch(records)
            if blobs is None:
                try:  # one orjson call per record, no per-record try (see _canonical)
                    dumps, opt = orjson.dumps, _SORTED
                    blobs = [dumps(r, option=opt, default=_default) for r in records]
                except TypeError:
                    blobs = [_canonical(r) for r in records]
        # 53 high-order bits of each little-endian 64-bit digest as a float in
        # [0, 1); digests joined and converted in numpy, not int by int.
        digests = b"".join(map(digest8, blobs))
        h = (np.frombuffer(digests, dtype="<u8") >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        idx = np.searchsorted(self.bounds, h, side="right")
        return np.minimum(idx, len(self.names) - 1).astype(np.uint8)


def _canonical_batch(records: Sequence[Any]) -> list[bytes] | None:
    """``_canonical`` of every record, from one orjson call over the batch; ``None``
    when the batch cannot be cut back into records (the caller goes per record).

    When every record has the batch's smallest key (a column batch has every
    field; dicts are checked), each record's JSON starts with the same
    ``{"<that key>":``, which cannot occur inside a string (its quotes would be
    escaped). Cutting the batch's JSON array there gives each record's bytes
    when it occurs exactly once per record (a nested object with that first
    key would add more: then per record). It saves orjson's per-call cost
    (docs/benchmarks.md#design-converter).
    """
    n = len(records)
    if n < 2:
        return None
    if isinstance(records, ColumnRecords):
        if not records.fields:
            return None
        first = min(records.fields)  # orjson sorts keys by code point, as Python does
        rows: Sequence[Any] = list(records)
    else:
        if not set(map(type, records)) <= {dict}:
            return None
        try:
            first = min(set().union(*records))
        except (TypeError, ValueError):  # keys that do not compare, or no keys at all
            return None
        if not isinstance(first, str) or not all(map(operator.contains, records, itertools.repeat(first))):
            return None
        rows = records
    head = b"{" + orjson.dumps(first) + b":"
    try:
        whole = orjson.dumps(rows, option=_SORTED, default=_default)
    except TypeError:
        return None
    parts = whole[1:-1].split(b"," + head)
    if len(parts) != n or not parts[0].startswith(head):
        return None
    return [parts[0], *[head + p for p in parts[1:]]]


def _key_blob(v: Any) -> bytes:
    if v is None:
        return b"null"
    if isinstance(v, dict | list):  # str() of a dict depends on key order
        return b"k" + _canonical(v)
    return b"k" + term(v).encode("utf-8", "surrogatepass")


_SORTED = orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS


def _canonical(r: Any) -> bytes:
    try:
        return orjson.dumps(r, option=_SORTED, default=_default)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(r, sort_keys=True, default=_default).encode()


def _default(v: Any) -> Any:
    if isinstance(v, bytes | bytearray):
        return bytes(v).hex()
    return str(v)
