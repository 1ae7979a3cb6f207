"""The config checked against the data, before anything is written.

A misspelled ``source`` reads as a field that is missing in every record,
which would convert "successfully" into a constant feature. So every path
the config reads (each feature's ``source``, each ``cross`` source, the
label's ``source``) is checked before a run:

- against the writer schema of **every** Avro input (the header alone): the
  path must exist in each, through records and nullable unions (a map takes
  any key), and its type must be one the transform can take;
- against a bounded sample of the first JSON inputs: some sampled record
  must have the path (a null value counts as present).

Problems are collected and raised together as one :class:`DataMismatchError`
(a ``ConfigError``: the CLI exits 2), each naming the file, the feature, the
path and the closest paths the data has ("did you mean 'country'?"). A feature
with ``allow_all_missing: true`` may be absent (its type is still checked
where present). Pure Python: the caller passes the opener of its file system.

After the run, the same contract on the values: :func:`all_missing_message`
says why a run whose training split had no value of a feature fails, and
:func:`common_rejection` what every rejected record of a failed run shares.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

from convert.config import (
    EACH,
    ENTRIES,
    KEYS,
    Config,
    ConfigError,
    PathError,
    Step,
    is_list_step,
    one_value_path,
    parse_path,
    render_path,
)
from convert.derive import unit_mismatch
from convert.records import getter
from convert.sources import (
    InputFileError,
    iter_records,
    read_record_schema,
)
from convert.transforms import Transform, find, transform_of
from convert.transforms.base import SINGLE_VALUES

__all__ = [
    "DataMismatchError",
    "InputCheck",
    "Read",
    "SampleLimits",
    "all_missing_message",
    "avro_problems",
    "check_inputs",
    "common_rejection",
    "config_paths",
    "sample_paths",
    "sample_problems",
    "unit_problems",
]

#: Levels of nesting the checks follow (schemas may be recursive).
_MAX_DEPTH = 32
#: Paths collected from a schema or sample for suggestions.
_MAX_PATHS = 100_000
#: Problems listed in one error.
_MAX_SHOWN = 20

_NUMBER = frozenset({"int", "long", "float", "double"})
_PRIMITIVES = _NUMBER | {"null", "boolean", "bytes", "string"}


class DataMismatchError(ConfigError):
    """The config reads a field the data does not have (or cannot feed the transform)."""


@dataclasses.dataclass(frozen=True)
class SampleLimits:
    """How much of the JSON inputs the check samples: records and bytes per file, and files."""

    records: int = 1000
    bytes: int = 4 * 1024 * 1024
    files: int = 3
    #: Files sampled in all while a path is still unseen (fields vary between files).
    max_files: int = 100


@dataclasses.dataclass(frozen=True)
class Read:
    """One path the config reads: who reads it and what it must be."""

    path: str
    who: str  # "feature 'x'", "feature 'x' (cross source)", "the label"
    #: A feature's transform name (a cross's sources: "cross"), or "label-int64"/"label-float32"/
    #: "label-vocabulary" for the label, "split-key" for ``--split-key``, "key" for a feature's ``key``.
    reader: str
    multi: bool = False
    optional: bool = False  # allow_all_missing: may be absent

    @property
    def transform(self) -> Transform | None:
        """The transform reading the path (None: the label or ``--split-key``)."""
        return find(self.reader)


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """What the check looked at (``--dry-run`` prints it)."""

    avro_files: int
    avro_schemas: int
    json_files: int
    json_records: int

    def describe(self) -> str:
        parts = []
        if self.avro_files:
            parts.append(f"{self.avro_files} Avro schema(s) ({self.avro_schemas} distinct)")
        if self.json_files:
            parts.append(f"{self.json_records} records sampled from {self.json_files} JSON file(s)")
        return "; ".join(parts) or "nothing (no readable input)"


def _steps(r: Read) -> tuple[Step, ...] | None:
    """The parsed path ``r`` reads (``--split-key`` too: the same grammar); None when it does not parse."""
    try:
        return parse_path(r.path)
    except PathError:
        return None  # the config reported it


def _through_lists(path: str) -> bool:
    try:
        return any(map(is_list_step, parse_path(path)))
    except PathError:
        return False


def config_paths(config: Config, split_key: str | None = None) -> list[Read]:
    """Every path ``config`` reads, in config order (the label, then ``--split-key``, last)."""
    reads = []
    for f in config.features:
        who = f"feature {f.name!r}"
        if transform_of(f).reads_sources:
            reads.extend(Read(s, f"{who} (cross source)", f.transform, optional=f.allow_all_missing)
                         for s in f.sources or ())
        else:
            # a path through lists ([]) gives the items' values: each must be a single value
            multi = f.multi_valued and not _through_lists(f.source)
            reads.append(Read(f.source, who, f.transform, multi, f.allow_all_missing))
        if f.key:  # zscore_per_key's groups: a misspelled key would put every record in the global one
            reads.append(Read(f.key, f"{who} (key)", "key", optional=f.allow_all_missing))
    if config.label is not None:
        kind = config.label.transform or config.label.dtype
        reads.append(Read(config.label.source, "the label", f"label-{kind}"))
    if split_key is not None:  # a misspelled key would hash every record as null: one split gets them all
        reads.append(Read(split_key, "--split-key", "split-key"))
    return reads


# ------------------------------------------------------------------- Avro


class _Schema:
    """An Avro writer schema with its named types resolvable by full or short name."""

    def __init__(self, schema: Any):
        self.root = schema
        self.named: dict[str, Any] = {}
        self._collect(schema, 0)

    def _collect(self, s: Any, depth: int) -> None:
        if depth > _MAX_DEPTH * 4:
            return
        if isinstance(s, list):
            for b in s:
                self._collect(b, depth + 1)
        elif isinstance(s, dict):
            t = s.get("type")
            name = s.get("name")
            if t in ("record", "error", "enum", "fixed") and isinstance(name, str):
                ns = s.get("namespace")
                full = name if "." in name or not isinstance(ns, str) or not ns else f"{ns}.{name}"
                self.named.setdefault(full, s)
                self.named.setdefault(full.rsplit(".", 1)[-1], s)
            for key in ("fields", "items", "values"):
                v = s.get(key)
                if key == "fields" and isinstance(v, list):
                    for fld in v:
                        if isinstance(fld, dict):
                            self._collect(fld.get("type"), depth + 1)
                elif v is not None:
                    self._collect(v, depth + 1)
            if isinstance(t, dict | list):
                self._collect(t, depth + 1)

    def branches(self, s: Any, depth: int = 0) -> list[Any]:
        """The concrete non-null types ``s`` may hold: unions flattened, names resolved."""
        if depth > _MAX_DEPTH:
            return []
        if isinstance(s, list):
            return [b for x in s for b in self.branches(x, depth + 1)]
        if isinstance(s, str):
            if s == "null":
                return []
            if s in self.named:
                return self.branches(self.named[s], depth + 1)
            return [s]
        if isinstance(s, dict):
            t = s.get("type")
            if isinstance(t, list | dict) or (isinstance(t, str) and t not in ("record", "error", "enum", "fixed", "array", "map")):
                return self.branches(t, depth + 1)  # {"type": "long", "logicalType": ...}, a wrapped name
            return [s]
        return []

    def kind(self, s: Any) -> str:
        """One concrete type's kind: number, boolean, string, bytes, record, map,
        array, or unknown (a name this schema does not define: never a problem)."""
        if isinstance(s, str):
            if s in _NUMBER:
                return "number"
            return s if s in _PRIMITIVES else "unknown"
        t = s.get("type")
        return {"record": "record", "error": "record", "enum": "string", "fixed": "bytes"}.get(t, t)

    def describe(self, s: Any) -> str:
        if isinstance(s, str):
            return s
        t = s.get("type")
        if t in ("record", "error"):
            return f"a record ({', '.join(self.field_names(s)[:8])})"
        if t == "array":
            items = self.branches(s.get("items"))
            return "an array of " + (" or ".join(sorted({self.describe(b) for b in items})) or "null")
        if t == "map":
            return "a map"
        return str(t)

    @staticmethod
    def field_names(s: Any) -> list[str]:
        return [f["name"] for f in s.get("fields", []) if isinstance(f, dict) and isinstance(f.get("name"), str)]

    def child(self, s: Any, key: str) -> Any | None:
        """The type under ``key`` of a record (its field) or map (any key); None when there is none."""
        if self.kind(s) == "record":
            for f in s.get("fields", []):
                if isinstance(f, dict) and f.get("name") == key:
                    return f.get("type")
            return None
        if self.kind(s) == "map":
            return s.get("values")
        return None

    def paths(self) -> list[str]:
        """Every field path (records, and the items of arrays: ``items[].price``; a
        map's keys are the data's, its own path gets ``[keys]``), for suggestions."""
        out: list[str] = []
        stack: list[tuple[tuple[Step, ...], Any, int]] = [((), self.root, 0)]
        while stack and len(out) < _MAX_PATHS:
            prefix, s, depth = stack.pop()
            if depth > _MAX_DEPTH:
                continue
            for b in self.branches(s):
                kind = self.kind(b)
                if kind == "array" and prefix:
                    out.append(render_path((*prefix, EACH)))
                    stack.append(((*prefix, EACH), b.get("items"), depth + 1))
                elif kind == "map" and prefix:
                    out.append(render_path((*prefix, KEYS)))
                if kind != "record":
                    continue
                for f in b.get("fields", []):
                    if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                        continue
                    p = (*prefix, f["name"])
                    out.append(render_path(p))
                    stack.append((p, f.get("type"), depth + 1))
        return out

    def step(self, node: Any, step: Step) -> list[Any] | None:
        """The types one path step leads to from ``node`` (None: a type the check
        cannot see into); ``[]`` into an array's items or a map's values, ``[n]``
        into an array's items, ``[keys]`` to a map's keys (strings)."""
        branches = self.branches(node)
        if any(self.kind(b) == "unknown" for b in branches):
            return None
        if step is EACH or isinstance(step, int):
            return [b.get("items") for b in branches if self.kind(b) == "array"] + \
                [b.get("values") for b in branches if step is EACH and self.kind(b) == "map"]
        if step is KEYS or step is ENTRIES:
            return ["string"] if any(self.kind(b) == "map" for b in branches) else []
        return [c for b in branches if (c := self.child(b, step)) is not None]


#: What the path of a reader that is no transform may hold, by its ``Read.reader``
#: (``--split-key``: any single value, ``SINGLE_VALUES``).
_READER_NEEDS = {
    "label-int64": (frozenset({"number", "boolean"}), "integers"),
    "label-float32": (frozenset({"number"}), "numbers"),
    "label-vocabulary": (frozenset({"number", "boolean", "string", "bytes"}), "class names (strings, integers or booleans)"),
}


def _need(r: Read) -> tuple[frozenset[str], str]:
    """The kinds a path may hold for its reader, and how to say so."""
    t = r.transform
    return t.accepts if t is not None else _READER_NEEDS.get(r.reader, SINGLE_VALUES)


def _hint(r: Read, kinds: set[str], example: str | None) -> str:
    t = r.transform
    if "record" in kinds or "map" in kinds:
        return f"; point the source at one of its fields ({example or 'a.b'})"
    if "array" in kinds:
        if _through_lists(r.path):
            return f"; its items are lists: write {r.path + '[]'!r} to flatten them"
        if t is not None and t.list_capable and not t.tokens:  # text takes max_len always
            return "; set max_len to keep a list per record"
        if r.reader == "key":
            return "; point the key at a single-valued field"
        if t is None:  # the label, --split-key
            return f"; {r.who} takes one value per record: read one item, e.g. {one_value_path(r.path)!r}"
        return f"; transform {r.reader!r} takes one value per record"
    if t is not None and t.numeric and "string" in kinds:
        return "; use a categorical transform (vocabulary/hash) for a string field"
    if r.reader == "label-int64" and "string" in kinds:
        return "; for class names use label: {source: ..., transform: vocabulary}"
    return ""


def _type_problem(sch: _Schema, r: Read, leaf: Any) -> str | None:
    """Why the schema type ``leaf`` cannot feed ``r``, or None when it can."""
    branches = sch.branches(leaf)
    if not branches:
        return None if r.optional else "is always null in the schema (type null): every record would be missing it"
    need, what = _need(r)
    usable = []
    for b in branches:
        k = sch.kind(b)
        if k == "array" and r.multi:
            items = sch.branches(b.get("items"))
            usable.append(not items or any(sch.kind(i) in need for i in items))
        else:
            usable.append(k in need)
    if any(usable) or any(sch.kind(b) == "unknown" for b in branches):
        return None
    kinds = {sch.kind(b) for b in branches}
    found = " or ".join(sorted({sch.describe(b) for b in branches}))
    reader = ("the label" if r.reader.startswith("label") else "a key" if r.reader == "key"
              else f"transform {r.reader!r}")
    fields = [n for b in branches if sch.kind(b) == "record" for n in sch.field_names(b)]
    example = f"e.g. {r.path}.{fields[0]}" if fields else None
    return f"is {found} in the schema, but {reader} needs {what}{_hint(r, kinds, example)}"


def _suggest(path: str, known: Sequence[str]) -> str:
    literal = render_path((path,))  # the whole path as one quoted name
    if literal != path and literal in known:
        return (f"a field is named {path!r}, dots included: write {literal!r} (a dot steps into a record; "
                f"[\"...\"] quotes a name)")
    close = difflib.get_close_matches(path, known, n=3, cutoff=0.6)
    if not close:
        last = path.rsplit(".", 1)[-1]
        close = [p for p in known if p.rsplit(".", 1)[-1] == last][:3]
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    if not known:
        return "the records have no fields: nothing in this input can be converted; check it is the data you meant"
    shown = ", ".join(known[:15]) + (", ..." if len(known) > 15 else "")
    return f"the fields are: {shown}"


def _step_text(step: Step) -> str:
    return render_path(("x", step))[1:].lstrip(".")


def avro_types_at(schema: Any, path: str) -> list[tuple[str, str]]:
    """The non-null types an Avro writer ``schema`` has at ``path``, each as ``(kind,
    description)`` (kinds of ``_Schema.kind``: ``array``, ``record``, ``number``, ...;
    descriptions as messages give them: ``an array of long``). Empty where the path is
    missing, does not parse, or goes through a type the check cannot see into."""
    sch = _Schema(schema)
    try:
        steps = parse_path(path)
    except PathError:
        return []
    node: Any = sch.root
    for step in steps:
        children = sch.step(node, step)
        if not children:
            return []
        node = children[0] if len(children) == 1 else [x for c in children for x in (c if isinstance(c, list) else [c])]
    return [(sch.kind(b), sch.describe(b)) for b in sch.branches(node)]


def avro_problems(config: Config, schema: Any, split_key: str | None = None) -> list[str]:
    """What in ``config`` (and ``split_key``) an Avro writer ``schema`` cannot give, one message per path."""
    sch = _Schema(schema)
    problems = []
    known: list[str] | None = None
    for r in config_paths(config, split_key):
        steps = _steps(r)
        if steps is None:
            continue
        node: Any = sch.root
        missing_at = None
        for i, step in enumerate(steps):
            children = sch.step(node, step)
            if children is None:
                node = None  # a type the check cannot see into: leave it to the run
                break
            if not children:
                missing_at = i
                break
            node = children[0] if len(children) == 1 else [x for c in children for x in (c if isinstance(c, list) else [c])]
        if missing_at is not None:
            if r.optional:
                continue
            if known is None:
                known = sch.paths()
            step = steps[missing_at]
            parent = render_path(steps[:missing_at])
            inside = sch.branches(node) if missing_at else []
            kind = " or ".join(sorted({sch.describe(b) for b in inside}))
            if isinstance(step, str) and inside and not any(sch.kind(b) in ("record", "map") for b in inside):
                why = f"{parent!r} is {kind}, a path cannot go into it (paths follow records and maps only)"
                if any(sch.kind(b) == "array" for b in inside):
                    why += f"; write {render_path((*steps[:missing_at], EACH, *steps[missing_at:]))!r} for each item's"
            elif not isinstance(step, str) and inside:
                into = "an array (or a map)" if step is EACH else "an array" if isinstance(step, int) else "a map"
                why = f"{parent!r} is {kind}; {_step_text(step)} steps into {into}"
            else:
                why = f"no field {r.path!r} in the schema; {_suggest(r.path, known)}"
            problems.append(f"{r.who} reads {r.path!r}: {why}")
            continue
        if r.transform is not None and r.transform.counts_items and is_list_step(steps[-1]):
            continue  # counts items of any type
        bad = None if node is None else _type_problem(sch, r, node)
        if bad:
            problems.append(f"{r.who} reads {r.path!r}, which {bad}")
    return problems


# ------------------------------------------------------------------- JSON


#: Items of each list the JSON sample looks into for paths through lists.
_MAX_ITEMS = 1000


def sample_paths(records: Iterable[Any]) -> set[str]:
    """Every path some record has (a null value counts), as ``render_path`` writes
    it: through nested objects (``a.b``, ``["x.y"]`` for a key with a dot) and
    into lists (``items[]``, ``items[].price``, ``m[][]``)."""
    seen: set[str] = set()
    for rec in records:
        stack: list[tuple[tuple[Step, ...], Any, int]] = [((), rec, 0)]
        while stack:
            prefix, obj, depth = stack.pop()
            if depth > _MAX_DEPTH:
                continue
            if isinstance(obj, Mapping):
                children: Iterable[tuple[tuple[Step, ...], Any]] = (((*prefix, k), v) for k, v in obj.items())
            elif isinstance(obj, list) and prefix:
                p = (*prefix, EACH)
                children = [(p, x) for x in obj[:_MAX_ITEMS] if isinstance(x, Mapping | list)]
                children.insert(0, (p, None))
            else:
                continue
            for p, v in children:
                text = render_path(p)
                if text not in seen:
                    if len(seen) >= _MAX_PATHS:
                        return seen
                    seen.add(text)
                if isinstance(v, Mapping | list):
                    stack.append((p, v, depth + 1))
    return seen


def _sampled_form(r: Read) -> str:
    """How ``sample_paths`` writes the path ``r`` reads: ``[n]`` as ``[]``, without a last ``[keys]``/``[entries]``."""
    steps = _steps(r)
    if steps is None:
        return r.path
    steps = tuple(EACH if isinstance(s, int) else s for s in steps)
    return render_path(steps[:-1] if steps[-1] is KEYS or steps[-1] is ENTRIES else steps)


def sample_problems(config: Config, paths: set[str], n_records: int, split_key: str | None = None) -> list[str]:
    """The config's paths no sampled record has (``paths``: ``sample_paths`` of ``n_records`` records)."""
    known = sorted(paths)
    problems = []
    for r in config_paths(config, split_key):
        if r.optional or r.path in paths or _sampled_form(r) in paths:
            continue
        problems.append(f"{r.who} reads {r.path!r}, which none of the {n_records} sampled records has; "
                        f"{_suggest(r.path, known)}")
    return problems


#: In every message of ``unit_problems`` (the report's footer is about paths).
_UNIT_HINT = "; it looks like epoch "


def unit_problems(config: Config, records: Sequence[Any]) -> list[str]:
    """Timestamp features whose sampled epoch numbers do not fit their ``unit``
    (``convert.derive.unit_mismatch``: nanoseconds read as ``unit: s``), the first value each."""
    problems = []
    for f in config.features:
        if not transform_of(f).epoch_unit:
            continue
        get, unit = getter(f.source), f.unit or "ms"
        for rec in records:
            why = unit_mismatch(get(rec), unit)
            if why:
                problems.append(f"feature {f.name!r} reads {f.source!r}: {why}")
                break
    return problems


# ------------------------------------------------------------------ inputs


def _sample(f: IO[bytes], path: str, limits: SampleLimits, json_records_path: str | None,
            caps: Mapping[str, int]) -> list[Any]:
    records: list[Any] = []
    try:
        for batch in iter_records(f, path, 0, limits.bytes, min(1024, limits.records), json_records_path, **caps):
            records.extend(batch.records[: limits.records - len(records)])
            if len(records) >= limits.records:
                break
    except InputFileError:
        pass  # the run reports a bad file with its offset; the records before it still count
    return records


def _report(problems: list[tuple[str, list[str]]]) -> str:
    lines = ["the config does not match the input data (nothing was written):"]
    total = sum(len(found) for _, found in problems)
    shown = 0
    for where, found in problems:
        if shown == _MAX_SHOWN:
            break
        lines.append(f"  in {where}:")
        lines.extend(f"    - {msg}" for msg in found[: _MAX_SHOWN - shown])
        shown += min(len(found), _MAX_SHOWN - shown)
    if total > shown:
        lines.append(f"  ... and {total - shown} more")
    paths = [msg for _, found in problems for msg in found if _UNIT_HINT not in msg]
    if paths:
        lines.append("Fix each source path (a dotted path into the record)")
        if any(msg.startswith("feature ") for msg in paths):
            lines[-1] += "; a feature whose field is legitimately absent may set allow_all_missing: true"
    return "\n".join(lines)


def _probe(path: str, open_file: Callable[[str], IO[bytes]]) -> tuple[str, Any]:
    """``("schema", schema)`` for a file whose format has a record schema (Avro; Parquet's
    Avro-equivalent one), ``("sample", None)`` for one without (JSON), or ``("bad", None)``
    for a file the run will report."""
    try:
        with open_file(path) as f:
            schema = read_record_schema(f, path)
            return ("sample", None) if schema is None else ("schema", schema)
    except (InputFileError, OSError):
        return "bad", None


def _files(paths: Sequence[str]) -> str:
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def check_inputs(config: Config, paths: Sequence[str], open_file: Callable[[str], IO[bytes]], *,
                 json_records_path: str | None = None, limits: SampleLimits = SampleLimits(),
                 max_record_bytes: int | None = None, max_block_bytes: int | None = None,
                 split_key: str | None = None) -> InputCheck:
    """Check ``config`` against every Avro input's schema and a sample of the JSON inputs.

    ``open_file(path)`` opens an input for binary reading (the caller's file
    system); only headers and samples are read, several files at once. JSON
    is sampled from the first ``limits.files`` files, and from further ones
    (up to ``limits.max_files``) only while a path is still unseen. A file
    whose header cannot be read is left to the run, which reports it with
    its offset.

    Raises:
      DataMismatchError: listing every problem found.
    """
    caps = {k: v for k, v in (("max_record_bytes", max_record_bytes), ("max_block_bytes", max_block_bytes)) if v is not None}
    if len(paths) > 1:
        with ThreadPoolExecutor(min(16, len(paths))) as pool:  # remote headers: a request each
            kinds = list(pool.map(lambda p: _probe(p, open_file), paths))
    else:
        kinds = [_probe(p, open_file) for p in paths]
    problems: list[tuple[str, list[str]]] = []  # (where, what is wrong there)
    by_schema: dict[str, list[str]] = {}
    schemas: dict[str, Any] = {}
    for path, (kind, schema) in zip(paths, kinds, strict=True):
        if kind == "schema":
            key = json.dumps(schema, sort_keys=True, default=str)
            by_schema.setdefault(key, []).append(path)
            schemas[key] = schema
    for key, files in by_schema.items():
        where = files[0] if len(files) == 1 else f"{files[0]} (and {len(files) - 1} more Avro file(s) with its schema)"
        problems.append((f"the Avro schema of {where}", avro_problems(config, schemas[key], split_key)))
    if by_schema and any(transform_of(f).epoch_unit for f in config.features):
        first = next(iter(by_schema.values()))[0]
        with open_file(first) as f:
            got = _sample(f, first, limits, None, caps)
        problems.append((f"the records sampled from {first}", unit_problems(config, got)))

    wanted = {_sampled_form(r) for r in config_paths(config, split_key) if not r.optional}
    seen: set[str] = set()
    n_records = 0
    sampled_from: list[str] = []
    json_paths = [p for p, (kind, _) in zip(paths, kinds, strict=True) if kind == "sample"]
    for i, path in enumerate(json_paths):
        if i >= limits.max_files or (i >= limits.files and wanted <= seen):
            break
        with open_file(path) as f:
            got = _sample(f, path, limits, json_records_path, caps)
        if got:
            seen |= sample_paths(got)
            n_records += len(got)
            sampled_from.append(path)
            problems.append((f"the records sampled from {path}", unit_problems(config, got)))
    if n_records:
        problems.append((f"the JSON records sampled from {_files(sampled_from)}", sample_problems(config, seen, n_records, split_key)))
    problems = [(where, found) for where, found in problems if found]
    if problems:
        raise DataMismatchError(_report(problems))
    return InputCheck(sum(len(v) for v in by_schema.values()), len(by_schema), len(sampled_from), n_records)


# ---------------------------------------------------------- after the run


def all_missing_message(config: Config, present: Mapping[str, int], train_records: int) -> str | None:
    """Why a run whose training split had no value of some feature must fail, or None.

    ``present``: values seen per feature in the training split
    (``Analyzer.present``). A feature with ``allow_all_missing`` is exempt;
    an empty training split proves nothing.
    """
    if train_records <= 0:
        return None
    empty = [f for f in config.features if not f.allow_all_missing and present.get(f.name, 1) == 0]
    if not empty:
        return None
    what = "; ".join(f"feature {f.name!r} (source {', '.join(map(repr, f.sources)) if f.sources else repr(f.source)})"
                     for f in empty)
    return (f"{what}: missing (null, absent or empty) in every one of the {train_records} training records; "
            f"no dataset was committed. Fix the source path, or set allow_all_missing: true on the feature "
            f"if that is expected")


#: Fields of a rejected record that a message lists.
_FIELDS_SHOWN = 30


def common_rejection(rows: Iterable[Mapping[str, Any]]) -> str | None:
    """What every rejected record (error-output rows: field, reason, record) has in common, or None.

    E.g. ``field 'salry' (label must be an integer, found missing (null)); the
    records' fields are: age, salary``. The reason is given when it is the
    same for all, else the first as an example.
    """
    field = reason = None
    same_reason = True
    keys: list[str] | None = None
    n = 0
    for row in rows:
        n += 1
        f, why = row.get("field"), row.get("reason")
        if n == 1:
            field, reason = f, why
            rec = row.get("record")
            keys = [str(k) for k in rec] if isinstance(rec, Mapping) else None
        elif f != field:
            return None
        else:
            same_reason = same_reason and why == reason
    if not n or field is None:
        return None
    text = f"field {field!r} ({reason})" if same_reason else f"field {field!r} (the first: {reason})"
    if keys is not None and field != "<record>":
        shown = ", ".join(keys[:_FIELDS_SHOWN]) + (", ..." if len(keys) > _FIELDS_SHOWN else "")
        text += f"; the records' fields are: {shown or '(none)'}"
    return text
