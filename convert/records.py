"""Reading a record's values and their term forms: no Beam, no TensorFlow.

What the vectorizer, the splits, schema inference and the serving wire share
about a record, before any feature transform applies:

- paths: ``getter`` (one record), ``extract`` / ``extract_path`` (a batch a
  level at a time), ``walk_path`` (paths through lists, indexes and map keys),
  ``joined_text`` (a text's strings through lists);
- terms: ``term``, the canonical string of a categorical value;
- hashes: ``stable_hash`` / ``hash_id`` / ``hash_ids`` (FarmHash
  ``Fingerprint64``, the buckets of ``hash``, ``cross`` and OOV ids) and
  ``digest8`` (the split hash);
- tokens: ``tokenize`` and ``ascii_lower``.
- values: ``to_float`` (and ``F32_MAX``, the float32 range) and ``as_list``.

Hashed ids and text tokens are defined so that TensorFlow computes them
identically in a serving graph (``hash_id``, ``tokenize``).
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from farmhash import Fingerprint64 as _fingerprint64

from convert.config import EACH, ENTRIES, KEYS, Step, is_list_step, parse_path
from convert.derive import CROSS_SEPARATOR

#: A token: a maximal run of ASCII letters, digits, ``_`` and non-ASCII characters
#: (surrogates too, whose ``surrogatepass`` bytes are non-ASCII). On UTF-8 bytes
#: these are the runs of ``[0-9A-Za-z_\x80-\xff]``: what TensorFlow's
#: ``TEXT_DELIMITERS_RE`` leaves between spaces (see ``tokenize``).
TOKEN_RE = re.compile("[0-9A-Za-z_\x80-\U0010ffff]+")
#: The delimiters, exactly the ASCII characters other than ``[0-9A-Za-z_]``, as an
#: RE2 pattern for ``tf.strings.regex_replace(text, TEXT_DELIMITERS_RE, " ")``.
TEXT_DELIMITERS_RE = "[\\x00-\\x2f\\x3a-\\x40\\x5b-\\x5e\\x60\\x7b-\\x7f]+"
_BLAKE2B_8 = hashlib.blake2b(digest_size=8)


def getter(path: str) -> Callable[[Any], Any]:
    """Value at a path (``convert.config.parse_path``), ``None`` when any step is
    missing or null; a path through lists gives a list (``walk_path``)."""
    if "[" in path or "]" in path:
        steps = parse_path(path)
        return lambda r: walk_path(r, steps)
    keys = path.split(".")
    if len(keys) == 1:
        k = keys[0]
        return lambda r: r.get(k) if isinstance(r, dict) else None

    def get(r: Any) -> Any:
        for k in keys:
            if not isinstance(r, dict):
                return None
            r = r.get(k)
        return r

    return get


def is_list_path(steps: Sequence[Step]) -> bool:
    """Whether a parsed path needs ``walk_path`` (it has list, index or ``[keys]`` steps)."""
    return not all(isinstance(s, str) for s in steps)


def walk_path(v: Any, steps: Sequence[Step], i: int = 0) -> Any:
    """The value at ``steps[i:]`` of ``v``.

    Keys step into records and maps, ``[n]`` into a list's item (None when
    there is none); ``[keys]`` gives a map's keys as a list. ``[]`` gives a
    list: the rest of the path from each item of a list (each value of a map;
    another value counts as a list of itself), in order; when the rest has
    ``[]`` or ``[keys]`` too, their lists are concatenated (a null list
    there adds nothing; ``[entries]`` gives a map's entries as terms,
    ``_entry``), so ``orders[].items[].sku`` is every order's skus
    in order. ``None`` when the value before the first ``[]`` is null or
    missing; a null item gives a null item.
    """
    n = len(steps)
    while i < n:
        s = steps[i]
        if s is EACH:
            if v is None:
                return None
            items = v.values() if isinstance(v, dict) else v if isinstance(v, list | tuple) else (v,)
            i += 1
            if not any(map(is_list_step, steps[i:])):
                return [walk_path(x, steps, i) for x in items]
            out: list[Any] = []
            for x in items:
                y = walk_path(x, steps, i)
                if y is not None:
                    out.extend(y)
            return out
        if s is KEYS:
            return list(v) if isinstance(v, dict) else None
        if s is ENTRIES:
            return [_entry(k, x) for k, x in v.items()] if isinstance(v, dict) else None
        if isinstance(s, int):
            v = v[s] if isinstance(v, list | tuple) and -len(v) <= s < len(v) else None
        else:
            v = v.get(s) if isinstance(v, dict) else None
        i += 1
    return v


def _entry(key: Any, value: Any) -> Any:
    """A map entry as one term, ``key + CROSS_SEPARATOR + term(value)``; a null
    value gives a null item, a nested one itself (which list features reject)."""
    if value is None or isinstance(value, dict | list):
        return value
    return f"{key}{CROSS_SEPARATOR}{term(value)}"


def extract_path(records: Sequence[Any], steps: Sequence[Step], all_dicts: bool = False,
                 top: dict[str, list[Any]] | None = None) -> list[Any]:
    """``walk_path`` over a batch (``extract`` for the first key)."""
    first = extract(records, [steps[0]], all_dicts, top)  # type: ignore[list-item]
    if len(steps) == 1:
        return first
    return [walk_path(v, steps, 1) for v in first]


def extract(records: Sequence[Any], keys: list[str], all_dicts: bool = False,
            top: dict[str, list[Any]] | None = None) -> list[Any]:
    """``getter(".".join(keys))`` over a batch, a level at a time (a list
    comprehension per level instead of a call per record). ``all_dicts``: every
    record is a dict; ``top``: the batch's top-level columns, when it has them."""
    k = keys[0]
    if top is not None:
        values = top[k]
    elif all_dicts:
        values = [r.get(k) for r in records]
    else:
        values = [r.get(k) if isinstance(r, dict) else None for r in records]
    for k in keys[1:]:
        values = [v.get(k) if isinstance(v, dict) else None for v in values]
    return values


def term(v: Any) -> str:
    """Canonical string form of a categorical value (vocabulary key)."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, bytes | bytearray):
        return bytes(v).decode("utf-8", "backslashreplace")
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def digest8(data: bytes) -> bytes:
    """``blake2b(data, digest_size=8).digest()``; copying a ready hasher is
    cheaper than making one with its parameters (docs/benchmarks.md#design-converter)."""
    h = _BLAKE2B_8.copy()
    h.update(data)
    return h.digest()


def _utf8(s: str) -> bytes:
    """The bytes a term or text is hashed and tokenized as: UTF-8, lone surrogates
    (only reachable through the Python API; sources reject them) as their 3-byte
    ``surrogatepass`` form, which a serving client must send as the same bytes."""
    return s.encode("utf-8", "surrogatepass")


@functools.lru_cache(maxsize=1 << 18)
def stable_hash(s: str) -> int:
    """FarmHash ``Fingerprint64`` of ``_utf8(s)``, unsigned: the same on every
    machine, run and version, and the hash TensorFlow's
    ``tf.strings.to_hash_bucket_fast`` computes, so a serving graph gets the
    converter's ids: ``hash_id(t, n) == to_hash_bucket_fast(t, n) + 1``."""
    try:
        return _fingerprint64(s)  # encodes str as strict UTF-8 itself
    except UnicodeEncodeError:
        return _fingerprint64(_utf8(s))


def hash_id(t: str, buckets: int) -> int:
    """The id ``1..buckets`` of term ``t`` in ``hash``, ``cross`` and OOV buckets."""
    return 1 + stable_hash(t) % buckets


def hash_ids(terms: Sequence[str], buckets: int) -> np.ndarray:
    """``hash_id(t, buckets)`` for every term, in bulk (int64): one C call per
    term, the modulo in numpy (uint64, exact)."""
    try:
        h = np.fromiter(map(_fingerprint64, terms), dtype=np.uint64, count=len(terms))
    except UnicodeEncodeError:  # a lone surrogate somewhere
        h = np.fromiter((_fingerprint64(_utf8(t)) for t in terms), dtype=np.uint64, count=len(terms))
    return (h % np.uint64(buckets)).astype(np.int64) + 1


def ascii_lower(text: str) -> str:
    """``text`` with ``A-Z`` mapped to ``a-z`` and nothing else changed: Unicode case
    mappings differ between Python and ICU versions, ASCII's cannot."""
    if text.isascii():
        return text.lower()
    return _utf8(text).lower().decode("utf-8", "surrogatepass")  # bytes.lower() is ASCII-only


def tokenize(text: str, lowercase: bool = True) -> list[str]:
    """The tokens of a ``text`` feature: ``ascii_lower`` when ``lowercase``, then the
    maximal runs of ASCII letters, digits, ``_`` and non-ASCII characters (every
    other ASCII character, NUL included, delimits). TensorFlow computes the same
    on the UTF-8 bytes: ``tf.strings.split(tf.strings.regex_replace(
    tf.strings.lower(text), TEXT_DELIMITERS_RE, " "))`` (``lower`` without an
    encoding is ASCII-only)."""
    return TOKEN_RE.findall(ascii_lower(text) if lowercase else text)


def joined_text(values: list[Any]) -> list[Any]:
    """A ``text`` feature's values from a path through lists: each row's strings
    joined by a space (a delimiter, so the tokens are those of each string in
    order); a row holding anything else is left for the vectorizer to reject."""
    out = []
    for v in values:
        if isinstance(v, list) and all(isinstance(x, str) or x is None for x in v):
            v = " ".join(x for x in v if x is not None)
        out.append(v)
    return out


#: The largest float32: a number beyond it is not finite as float32 (the converter's output type).
F32_MAX = float(np.finfo(np.float32).max)
#: The smallest normal float32: written float features below it in magnitude are zero (subnormals flushed).
F32_TINY = np.float32(np.finfo(np.float32).tiny)


def to_float(x: int | float) -> float:
    """``float(x)``; integers beyond the float range become +-inf (then ``on_nan`` applies)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def as_list(v: Any) -> list[Any]:
    """``v`` as a list: none for None, a list's or tuple's items, else ``[v]``."""
    if v is None:
        return []
    if isinstance(v, list | tuple):
        return list(v)
    return [v]
