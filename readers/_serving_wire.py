"""The serving layer's wire format: raw records as dense numpy arrays (no TensorFlow op here;
what each feature reads is its transform's, ``readers.transforms``).

TensorFlow Serving's REST ``instances`` have no null and need one shape per
input, so every source field (a dotted ``source`` path of the config) travels
as a few dense values. Few inputs keep a call cheap (a client binds each one),
so single-valued sources share packed ``[batch, columns]`` inputs, one column
per source in ``Wire.columns`` order (config order of first use). Every rule,
with an example request: docs/serving.md#request-format.

- ``kinds`` (int32): what the record held at each single-valued source
  (``KIND_NULL`` .. ``KIND_OTHER``: null or absent, bool, integer, float,
  string, bytes, a record or a list, any other scalar).
- one value input per form the features read (``FORMS``): ``numbers``
  (float64), ``terms`` (the converter's canonical term, ``convert.records.term``),
  ``bytes`` and ``ints`` (int64, for timestamps); where the kind does not use
  a column, any value of its dtype.
- list sources (read by a ``max_len`` feature other than ``text``, or a
  ``count``) have inputs of their own, named from the path (``Source.key``):
  ``<key>`` (the first form; ``<key>__<form>`` the others) and ``<key>__kind``,
  ``[batch, any width]``, and a column of ``lens`` (int32; ``-1``: null or
  absent; a single value counts as a one-item list). A ``count`` sends the
  list it counts (only its length is read), a ``text`` through lists its
  strings joined.

Every input holds one row per record; a request of another shape (rows,
columns, widths, a length below -1) fails naming the input
(``readers._serving_limits.checked_inputs``).

An input with no column is left out. ``Wire.encode`` builds these arrays from
records (the dicts the converter reads) and reports the few values that cannot
travel; ``instances`` writes them as a REST request body.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from convert.config import Config, FeatureConfig, is_multi_path
from convert.records import getter, joined_text, term
from readers._serving_kinds import (
    KIND_BOOL,
    KIND_BYTES,
    KIND_FLOAT,
    KIND_INT,
    KIND_NESTED,
    KIND_NULL,
    KIND_OTHER,
    KIND_STRING,
)
from readers.transforms import serving_of

#: Value forms and their numpy dtypes, in naming order (the first a source uses is ``<key>``).
FORMS = {"number": np.float64, "term": object, "raw": object, "int": np.int64}
#: The packed input of single-valued sources per form (and their kinds), and of the lists' lengths.
PACKED = {"kind": "kinds", "number": "numbers", "term": "terms", "raw": "bytes", "int": "ints"}
LENS = "lens"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_KEY_RE = re.compile(r"[^A-Za-z0-9_]")


_SURROGATE = re.compile("[\ud800-\udfff]")
#: Why a record holding a lone surrogate is refused: the converter's JSON reader refuses its line.
LONE_SURROGATE = ("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff without its pair), which is not "
                  "valid Unicode; the converter rejects such a record: fix the writer")


def lone_surrogate_at(record: Any) -> str | None:
    """The dotted path of the first key or string in ``record`` holding a lone surrogate, else ``None``.

    Checked in C (orjson refuses such strings) and walked in Python only when orjson
    refuses the record for that or another reason (integers beyond 64 bits, deep nesting).
    """
    try:
        orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS, default=lambda _: None)
        return None
    except (TypeError, orjson.JSONEncodeError):
        pass
    stack: list[tuple[str, Any]] = [("<record>", record)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return path
        elif isinstance(v, dict):
            for k, x in v.items():
                at = str(k) if path == "<record>" else f"{path}.{k}"
                if isinstance(k, str) and _SURROGATE.search(k):
                    return at.encode("utf-8", "backslashreplace").decode()  # printable
                stack.append((at, x))
        elif isinstance(v, list | tuple):
            stack.extend((f"{path}[{j}]", x) for j, x in enumerate(v))
    return None


class WireError(ValueError):
    """A record value the wire format cannot carry, or a config it cannot serve."""


def kind_of(v: Any) -> int:
    if v is None:
        return KIND_NULL
    t = type(v)
    if t is bool:
        return KIND_BOOL
    if t is int or isinstance(v, int) and not isinstance(v, bool):
        return KIND_INT
    if isinstance(v, float):
        return KIND_FLOAT
    if isinstance(v, str):
        return KIND_STRING
    if isinstance(v, bytes | bytearray):
        return KIND_BYTES
    if isinstance(v, dict | list | tuple):
        return KIND_NESTED
    return KIND_OTHER


def _number(v: Any) -> float:
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


@dataclasses.dataclass(frozen=True)
class Source:
    """One source field. ``input_name``/``kind_name``/``len_name`` name its
    values, kinds and length as the layer reads them (``Wire.positions``); only a
    list source's values and kinds travel under those names."""

    path: str
    key: str
    is_list: bool
    forms: tuple[str, ...]
    #: list sources: items the features look at, per use: ("items", n) the
    #: first n items, ("non_null", n) the items up to the n-th non-null one
    uses: tuple[tuple[str, int], ...] = ()

    def input_name(self, form: str) -> str:
        return self.key if form == self.forms[0] else f"{self.key}__{form}"

    @property
    def kind_name(self) -> str:
        return f"{self.key}__kind"

    @property
    def len_name(self) -> str:
        return f"{self.key}__len"

    def input_names(self) -> list[str]:
        """The names of its own inputs on the wire (a list source's values and kinds)."""
        return [self.input_name(f) for f in self.forms] + [self.kind_name] if self.is_list else []


def _key(path: str, taken: set[str]) -> str:
    """An input name for ``path``: ASCII letters, digits and ``_``, starting with a
    letter (TensorFlow renames signature inputs that are not Python identifiers)."""
    key = _KEY_RE.sub("_", path)
    if not ("a" <= key[:1].lower() <= "z"):
        key = "f_" + key
    base, i = key, 2
    while key in taken:
        key = f"{base}_{i}"
        i += 1
    return key


class Wire:
    """The inputs a config's features read, and how records become them."""

    def __init__(self, config: Config):
        uses: dict[str, list[tuple[FeatureConfig, bool]]] = {}
        for f in config.features:
            t = serving_of(f)  # e.g. text: one string per record (max_len counts its tokens); count: a list's length
            for path in t.paths(f):
                uses.setdefault(t.wire_path(path), []).append((f, t.is_list(f)))
        self.sources: list[Source] = []
        taken: set[str] = {*PACKED.values(), LENS}
        for path, fs in uses.items():
            lists = {is_list for _, is_list in fs}
            if len(lists) > 1:
                names = ", ".join(f.name for f, _ in fs)
                raise WireError(f"source {path!r} is read both as a list (max_len) and as a single value "
                                f"(features {names}); the serving layer takes one shape per source: "
                                f"give them separate source fields")
            forms = tuple(form for form in FORMS if any(form in serving_of(f).forms(f) for f, _ in fs))
            key = _key(path, taken)
            src = Source(path, key, lists.pop(), forms, tuple(serving_of(f).list_use(f) for f, _ in fs))
            for n in src.input_names():
                if n in taken:
                    raise WireError(f"input name {n!r} of source {path!r} is taken by another source; rename a field")
            taken.update(src.input_names())
            self.sources.append(src)
        # a single value read through lists is a text's: its strings joined, as the converter reads them
        self._get = {s.path: _joined(getter(s.path)) if not s.is_list and is_multi_path(s.path) else getter(s.path)
                     for s in self.sources}
        #: packed input name -> the sources of its columns, in order (inputs without a column left out)
        self.columns: dict[str, list[Source]] = {}
        scalars = [s for s in self.sources if not s.is_list]
        for form, name in PACKED.items():
            cols = [s for s in scalars if form == "kind" or form in s.forms]
            if cols:
                self.columns[name] = cols
        if any(s.is_list for s in self.sources):
            self.columns[LENS] = [s for s in self.sources if s.is_list]

    def column_names(self) -> dict[str, list[str]]:
        """``{packed input: [source path of each column]}``, for clients that write requests by hand."""
        return {name: [s.path for s in cols] for name, cols in self.columns.items()}

    def _column_of(self, name: str, s: Source) -> str:
        """The name the layer reads column ``s`` of packed input ``name`` under."""
        if name == LENS:
            return s.len_name
        if name == PACKED["kind"]:
            return s.kind_name
        return s.input_name(next(f for f, n in PACKED.items() if n == name))

    def positions(self) -> dict[str, tuple[str, int]]:
        """Where each single-valued source's values, kinds and list lengths travel:
        ``{name the layer reads (Source.input_name, kind_name, len_name): (packed input, column)}``."""
        return {self._column_of(name, s): (name, j) for name, cols in self.columns.items() for j, s in enumerate(cols)}

    def by_path(self, path: str) -> Source:
        for s in self.sources:
            if s.path == path:
                return s
        raise KeyError(path)

    def input_names(self) -> list[str]:
        """The wire's inputs: the packed ones (``columns``), then each list source's own."""
        return [*self.columns, *(n for s in self.sources for n in s.input_names())]

    def encode(self, records: Sequence[Any]) -> tuple[dict[str, np.ndarray], dict[int, str]]:
        """``(inputs, rejected)``: the arrays of ``records`` and, per record the
        wire cannot carry, its index and why (its row is sent as all-null).

        What cannot travel: a record that is not an object and one holding a
        lone surrogate in any key or string (the converter rejects both) and,
        in a source read by a ``timestamp`` feature, an
        integer beyond int64 (the converter accepts one whose seconds fit in
        int64, e.g. nanoseconds after 2262; the layer takes int64 counts).
        """
        b = len(records)
        rejected: dict[int, str] = {}
        rows = []
        for i, r in enumerate(records):
            if isinstance(r, dict):
                where = lone_surrogate_at(r)
                if where is not None:
                    rejected[i] = f"{where}: {LONE_SURROGATE}"
                rows.append(r if where is None else {})
            else:
                rejected[i] = f"<record>: expected a record (object), found {type(r).__name__}"
                rows.append({})
        per_source: dict[str, np.ndarray] = {}
        for s in self.sources:
            get = self._get[s.path]
            values = [get(r) for r in rows]
            if s.is_list:
                self._encode_list(s, values, per_source)
            else:
                kinds = np.fromiter(map(kind_of, values), dtype=np.int32, count=b)
                per_source[s.kind_name] = kinds
                for form in s.forms:
                    per_source[s.input_name(form)] = _form_values(form, values, kinds, s, rejected)
        out = {name: np.stack([per_source[self._column_of(name, s)] for s in cols], axis=1)
               for name, cols in self.columns.items()}
        out.update((n, per_source[n]) for s in self.sources for n in s.input_names())
        return out, rejected

    def _encode_list(self, s: Source, values: list[Any], out: dict[str, np.ndarray]) -> None:
        b = len(values)
        lens = np.full(b, -1, dtype=np.int32)
        items_per_row: list[list[Any]] = []
        for i, v in enumerate(values):
            if v is None:
                items_per_row.append([])
                continue
            items = list(v) if isinstance(v, list | tuple) else [v]
            lens[i] = len(items)
            items_per_row.append(items[: _needed(items, s.uses)])
        width = max([len(x) for x in items_per_row] + [1])
        kinds = np.zeros((b, width), dtype=np.int32)
        flat = [x for items in items_per_row for x in items]
        fk = np.fromiter(map(kind_of, flat), dtype=np.int32, count=len(flat))
        counts = np.array([len(x) for x in items_per_row], dtype=np.int64)
        mask = np.arange(width)[None, :] < counts[:, None]
        kinds[mask] = fk
        out[s.kind_name] = kinds
        out[s.len_name] = lens
        for form in s.forms:
            col = _form_values(form, flat, fk, s, {})
            arr = np.zeros((b, width), dtype=FORMS[form]) if form in ("number", "int") else np.full((b, width), b"", dtype=object)
            arr[mask] = col
            out[s.input_name(form)] = arr


def _joined(get: Any) -> Any:
    return lambda r: joined_text([get(r)])[0]


def _needed(items: list[Any], uses: tuple[tuple[str, int], ...]) -> int:
    """How many leading items of a list the features look at."""
    need = 0
    for how, n in uses:
        if how == "items":
            need = max(need, n)
        else:
            seen = 0
            for j, x in enumerate(items):
                if x is not None:
                    seen += 1
                    if seen == n:
                        need = max(need, j + 1)
                        break
            else:
                need = len(items)
    return min(need, len(items))


def _form_values(form: str, values: list[Any], kinds: np.ndarray, s: Source, rejected: dict[int, str]) -> np.ndarray:
    n = len(values)
    if form == "number":
        return np.array([_number(v) if k in (KIND_BOOL, KIND_INT, KIND_FLOAT) else 0.0
                         for v, k in zip(values, kinds.tolist(), strict=True)], dtype=np.float64).reshape(n)
    if form == "int":
        out = np.zeros(n, dtype=np.int64)
        for i, (v, k) in enumerate(zip(values, kinds.tolist(), strict=True)):
            if k == KIND_INT:
                if _INT64_MIN <= v <= _INT64_MAX:
                    out[i] = v
                else:
                    rejected.setdefault(i, f"{s.path}: the integer {v} is beyond int64; the serving layer "
                                           f"takes timestamps as int64 epoch counts")
        return out
    col = np.empty(n, dtype=object)
    for i, (v, k) in enumerate(zip(values, kinds.tolist(), strict=True)):
        if form == "raw":
            col[i] = bytes(v) if k == KIND_BYTES else v.encode("utf-8", "surrogatepass") if k == KIND_STRING else b""
        else:
            col[i] = term(v).encode("utf-8", "surrogatepass") if k not in (KIND_NULL, KIND_NESTED) else b""
    return col


def instances(inputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The rows of ``inputs`` as TF Serving REST ``instances`` (JSON-ready):
    strings as UTF-8 text (bytes that are not UTF-8 as ``{"b64": ...}``)."""
    import base64

    def cell(x: Any) -> Any:
        if isinstance(x, np.ndarray):
            return [cell(y) for y in x]
        if isinstance(x, bytes):
            try:
                return x.decode("utf-8")
            except UnicodeDecodeError:
                return {"b64": base64.b64encode(x).decode("ascii")}
        return x.item() if isinstance(x, np.generic) else x

    b = len(next(iter(inputs.values()))) if inputs else 0
    return [{k: cell(v[i]) for k, v in inputs.items()} for i in range(b)]
