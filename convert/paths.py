"""Field paths of the feature config (``source: user.tags[*].name``): the
grammar, parsed into steps (keys, indexes, ``EACH``, ``KEYS``, ``ENTRIES``),
and rendered back.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any


class _Step:
    """A path step that is not a key or an index: ``EACH`` or ``KEYS``."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name

    def __reduce__(self) -> str:
        return self._name  # the module attribute: one object per process


#: ``[]`` in a parsed path (``parse_path``): every item of a list (every value of a map).
EACH = _Step("EACH")
#: ``[keys]`` in a parsed path: a map's keys, as a list (the last step).
KEYS = _Step("KEYS")
#: ``[entries]`` in a parsed path: a map's key/value pairs as terms ``key + "\x1f" + value`` (the last step).
ENTRIES = _Step("ENTRIES")


def is_list_step(step: Any) -> bool:
    """Whether a path step gives a list per record (``[]``, ``[keys]``, ``[entries]``)."""
    return step is EACH or step is KEYS or step is ENTRIES
#: A key written bare in a path: no dot, bracket or quote.
_BARE_KEY_RE = re.compile(r"[^.\[\]\"']+")
_INDEX_RE = re.compile(r"-?\d{1,9}")
Step = str | int | _Step


class PathError(ValueError):
    """A ``source`` that is not a valid path (the message says where and why)."""


def parse_path(path: str) -> tuple[Step, ...]:
    """The steps of a source path: keys (``str``), ``EACH`` for ``[]``, list
    indexes (``int``) for ``[0]``/``[-1]``, ``KEYS`` for ``[keys]``.

    ``a.b.c`` (no bracket) is the keys ``a``, ``b``, ``c``, as it always was.
    Brackets step into lists and maps: ``items[].price`` (every item's price,
    flattened in order, also through nested lists: ``orders[].items[].sku``),
    ``m[][]`` (a list of lists flattened), ``m[0]`` (the first item),
    ``attrs["color"]`` or ``attrs['a.b:c']`` (a key that holds dots, colons or
    brackets; ``"..."`` is a JSON string), ``attrs[keys]`` (a map's keys),
    ``attrs[entries]`` (its key/value pairs as terms).

    Raises:
      PathError: saying what is wrong and where.
    """
    if "[" not in path and "]" not in path:
        return tuple(path.split("."))
    steps: list[Step] = []
    i, n = 0, len(path)
    need_key = True  # at the start or after a dot: a key comes next
    while i < n:
        c = path[i]
        if c == "[":
            i, step = _bracket(path, i)
            if not steps and not isinstance(step, str):
                raise PathError(f"path {path!r} starts with {path[:i]!r}; it starts with a field name (or [\"name\"])")
            if steps and (steps[-1] is KEYS or steps[-1] is ENTRIES):
                raise PathError(f"path {path!r}: [keys] and [entries] end a path")
            steps.append(step)
            need_key = False
            if i < n and path[i] not in ".[":
                raise PathError(f"path {path!r}: expected '.', '[' or the end after the bracket at {i}")
            if i < n and path[i] == ".":
                i += 1
                need_key = True
                if i == n:
                    raise PathError(f"path {path!r} ends with '.'")
            continue
        if not need_key:
            raise PathError(f"path {path!r}: unexpected {c!r} at {i}")
        m = _BARE_KEY_RE.match(path, i)
        if m is None:
            raise PathError(f"path {path!r}: expected a field name at {i}; quote names with dots, brackets "
                            f"or quotes as [\"name\"]")
        if steps and (steps[-1] is KEYS or steps[-1] is ENTRIES):
            raise PathError(f"path {path!r}: [keys] and [entries] end a path")
        steps.append(m.group(0))
        i = m.end()
        need_key = False
        if i < n and path[i] == ".":
            i += 1
            need_key = True
            if i == n:
                raise PathError(f"path {path!r} ends with '.'")
    return tuple(steps)


def _bracket(path: str, i: int) -> tuple[int, Step]:
    """The step of the bracket at ``path[i]`` and the index after it."""
    rest = path[i + 1:]
    if rest.startswith("]"):
        return i + 2, EACH
    if rest.startswith("keys]"):
        return i + 6, KEYS
    if rest.startswith("entries]"):
        return i + 9, ENTRIES
    if rest[:1] == '"':
        try:
            key, end = json.JSONDecoder().raw_decode(rest)
        except ValueError:
            raise PathError(f"path {path!r}: the quoted name at {i + 1} is not a valid JSON string") from None
        j = i + 1 + end
    elif rest[:1] == "'":
        end = rest.find("'", 1)
        if end < 0:
            raise PathError(f"path {path!r}: the quote at {i + 1} is not closed")
        key, j = rest[1:end], i + 2 + end
    elif m := _INDEX_RE.match(rest):
        key, j = int(m.group(0)), i + 1 + m.end()
    else:
        raise PathError(f"path {path!r}: a bracket at {i} holds [] (every item), [N] (an index), [keys] "
                        f"(a map's keys), [entries] (its key/value pairs) or a quoted name [\"name\"]")
    if path[j:j + 1] != "]":
        raise PathError(f"path {path!r}: expected ']' at {j}")
    return j + 1, key


def render_path(steps: Sequence[Step]) -> str:
    """The canonical text of parsed ``steps`` (``parse_path`` reads it back):
    keys bare where they can be, else ``["..."]``."""
    out = []
    for i, s in enumerate(steps):
        if s is EACH:
            out.append("[]")
        elif s is KEYS:
            out.append("[keys]")
        elif s is ENTRIES:
            out.append("[entries]")
        elif isinstance(s, int):
            out.append(f"[{s}]")
        elif _BARE_KEY_RE.fullmatch(s):
            out.append(f".{s}" if i else s)
        else:
            out.append(f"[{json.dumps(s, ensure_ascii=False)}]")
    return "".join(out)


def count_path(path: str) -> str:
    """The path of the items a ``count`` of ``path`` counts: ``path`` when it ends
    in ``[]`` or ``[keys]``, else ``path[]`` (a list's items, a map's values; a
    single value counts as one)."""
    steps = parse_path(path)
    return path if is_list_step(steps[-1]) else render_path((*steps, EACH))


def is_multi_path(path: str) -> bool:
    """Whether ``path`` yields a list per record (it steps through ``[]`` or ends in ``[keys]``)."""
    if "[" not in path:
        return False
    try:
        steps = parse_path(path)
    except PathError:
        return False
    return any(map(is_list_step, steps))


def one_value_path(path: str) -> str:
    """A path that reads one value per record where ``path`` reads a list: each ``[]``
    becomes ``[0]`` (the first item), ``[keys]`` and ``[entries]`` one map value by its
    key (``["key"]``), and a path without such steps (its value is a list) gets ``[0]``.
    What a message tells a reader that takes one value per record (the label, a cross's
    sources) to write instead."""
    steps = parse_path(path)
    if not any(map(is_list_step, steps)):
        return render_path((*steps, 0))
    return render_path(tuple(0 if s is EACH else "key" if is_list_step(s) else s for s in steps))


def _steps_may_meet(a: Step, b: Step) -> bool:
    """Whether two steps at the same depth of two paths may reach the same value: equal keys,
    equal indexes, indexes of opposite signs (``[0]`` and ``[-1]`` are one item of a list of one),
    and ``[]``, ``[keys]`` or ``[entries]`` against any step. A key never meets an index."""
    if isinstance(a, _Step) or isinstance(b, _Step):
        return True
    if isinstance(a, int) and isinstance(b, int):
        return a == b or (a < 0) != (b < 0)
    return a == b


def paths_overlap(a: Sequence[Step], b: Sequence[Step]) -> bool:
    """Whether one of two parsed paths (``parse_path``) may read the other's value or a part of
    it: step by step, the shorter meets the start of the longer. ``y`` and ``y[0]``, ``y[]``
    and ``y[0]``, ``user`` and ``user.segment`` overlap; ``y[0]`` and ``y[1]`` do not, nor do
    ``["a.b"]`` (one field named ``a.b``) and ``a.b`` (``b`` inside ``a``)."""
    return all(map(_steps_may_meet, a, b))
