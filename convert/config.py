"""The feature config: what to do with each input field.

A config is a YAML (safe-loaded) or JSON file::

    label: {source: label, dtype: int64}   # or {source: gender, transform: vocabulary}
    features:
      - {name: age, transform: zscore}
      - {name: country, source: user.country, transform: vocabulary, top_k: 1000}
      - {name: tags, transform: vocabulary, max_len: 8}
      - {name: title, transform: text, max_len: 16}
      - {name: user, source: user_id, transform: hash, buckets: 4096}

Everything is validated here, before any pipeline starts, so a typo fails in
a second with a message naming the feature and what is allowed, not an hour
into a Dataflow job. One ConfigError lists every problem of a config (near
misses get a "did you mean"), so it is fixed in one round; ``TRANSFORM_TABLE``
says which options each transform takes, and any other is an error.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from convert.spec import MAX_FEATURE_SIZE, daz, short_repr

# Limits. Each is far beyond what a real config needs and keeps what the
# value controls (memory, files, metadata) bounded; past one, loading fails
# with a ConfigError naming the limit.
#: Bytes of a config file; a config of thousands of features is a few hundred KB.
MAX_CONFIG_BYTES = 1 << 20
#: YAML nodes after expanding aliases: more than any file of MAX_CONFIG_BYTES
#: holds without aliases, so only alias bombs (billion laughs) reach it.
MAX_CONFIG_NODES = 1_000_000
#: Nesting levels of a config document (a real one has 4: features, entry, parts).
MAX_CONFIG_DEPTH = 100
#: Characters of a number in a YAML config: YAML 1.1 base-60 integers
#: (``1:2:3``) cost quadratic time in their length.
MAX_NUMBER_CHARS = 100
#: Characters of a feature or label name; a name becomes the vocabulary file
#: ``vocab/<name>.txt``, which must stay under the usual 255-byte file-name limit.
MAX_NAME_CHARS = 200
#: ``bucketize``: the training quantiles come from a sketch whose resolution is
#: far coarser than this; each boundary is stored in the metadata.
MAX_BUCKETIZE_BUCKETS = 10_000
#: ``hash``/``cross`` buckets: ids ``1..buckets`` and ``vocab_size = buckets + 1``
#: stay exact in int64 and float64, and no embedding table is larger.
MAX_HASH_BUCKETS = 1 << 40
#: ``vocabulary``/``text`` OOV buckets: every OOV id is listed in the metadata.
MAX_OOV_BUCKETS = 100_000
#: ``top_k``: terms kept in a vocabulary (its file and in-memory id table).
MAX_TOP_K = 100_000_000
#: ``min_frequency``: a count of occurrences, kept an exact int64 in the metadata.
MAX_MIN_FREQUENCY = 1 << 53
#: Numeric constants (``fill``, ``clip_min``, ``clip_max``) are written as float32.
F32_MAX = 3.4028234663852886e38

TIMESTAMP_UNITS = ("s", "ms", "us", "ns", "days")
TIMESTAMP_PARTS = ("hour", "day_of_week", "month")
NAN_POLICIES = ("error", "fill", "keep")
LABEL_DTYPES = ("int64", "float32")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


@dataclasses.dataclass(frozen=True)
class TransformInfo:
    """What a transform does (one line, for messages and ``recordprep infer``'s
    header) and the options it takes besides ``COMMON_OPTIONS``."""

    summary: str
    options: tuple[str, ...]
    numeric: bool = False


#: Options of every transform (``cross`` reads ``sources`` instead of ``source``).
COMMON_OPTIONS = ("name", "source", "transform", "allow_all_missing", "allow_label_source", "drift")
#: Drift/skew measures a ``drift`` option (per feature, or top-level as the
#: default) sets a threshold for; ``convert.drift`` computes them.
DRIFT_MEASURES = ("linf", "js", "new_terms", "missing", "mean_shift")
_NUM = ("fill", "missing_indicator", "on_nan")
_VOCAB = ("top_k", "min_frequency", "num_oov_buckets")
#: Every transform and its options: the one table behind validation, its error
#: messages and infer's draft. An option a transform does not take is an error.
TRANSFORM_TABLE: dict[str, TransformInfo] = {
    "identity": TransformInfo("number (or list with max_len) as float32, unchanged", (*_NUM, "max_len"), True),
    "zscore": TransformInfo("(x - mean) / std of the training split", _NUM, True),
    "minmax": TransformInfo("(x - min) / (max - min) of the training split", _NUM, True),
    "log1p": TransformInfo("log(1 + x) for x > -1 (or list with max_len)", (*_NUM, "max_len"), True),
    "clip": TransformInfo("x limited to [clip_min, clip_max] (or list with max_len)",
                          (*_NUM, "clip_min", "clip_max", "max_len"), True),
    "bucketize": TransformInfo("number -> bucket id 1..num_buckets cut at the training split's quantiles",
                               ("num_buckets", "missing_indicator", "on_nan"), True),
    "vocabulary": TransformInfo("category (string, int, bool; or list with max_len) -> id by training frequency",
                                (*_VOCAB, "max_len")),
    "hash": TransformInfo("category -> stable hash id 1..buckets (identifiers, open-ended sets)", ("buckets", "max_len")),
    "text": TransformInfo("string -> max_len word ids (a vocabulary of tokens) + <name>_len",
                          ("max_len", "lowercase", *_VOCAB)),
    "bytes": TransformInfo("bytes or string passed through unvectorized (images)", ()),
    "timestamp": TransformInfo("epoch number in 'unit' or ISO 8601 string -> epoch seconds + calendar 'parts'",
                               ("unit", "parts", "missing_indicator")),
    "cross": TransformInfo("two or more categorical 'sources' hashed together -> id 1..buckets", ("sources", "buckets")),
    "count": TransformInfo("how many items a list (or path through lists, items[]) or map holds -> int64", ()),
}
TRANSFORMS = tuple(TRANSFORM_TABLE)
NUMERIC_TRANSFORMS = tuple(t for t, info in TRANSFORM_TABLE.items() if info.numeric)
#: Why a transform does not take an option, where more can be said than which transforms do.
_NOT_TAKEN_WHY = {
    ("bucketize", "fill"): "a missing value gets id 0, values ids 1..num_buckets",
    ("bucketize", "max_len"): "it takes one number per record",
    ("zscore", "max_len"): "numeric lists support identity, clip and log1p (per element)",
    ("minmax", "max_len"): "numeric lists support identity, clip and log1p (per element)",
    ("timestamp", "max_len"): "it takes one value per record",
    ("cross", "max_len"): "it combines single values",
    ("bytes", "max_len"): "it stores one value per record",
    ("vocabulary", "missing_indicator"): "categorical features map null to id 0 already",
    ("hash", "missing_indicator"): "categorical features map null to id 0 already",
    ("text", "missing_indicator"): "a missing text has length 0 already",
    ("cross", "source"): "it reads its fields from 'sources'",
    ("count", "max_len"): "it gives one number per record",
}


# ------------------------------------------------------------------ paths


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


class ConfigError(ValueError):
    """The feature config is invalid.

    ``problems`` holds every problem found (at most ``MAX_PROBLEMS``; ``more``
    counts the rest), each naming the file, the feature, the option, what was
    found and what is allowed; the message lists them one a line.
    """

    def __init__(self, *problems: str, more: int = 0) -> None:
        self.problems = list(problems)
        self.more = more
        tail = [f"... and {more} more problem(s) not listed; fix these and run again"] if more else []
        super().__init__("\n".join(self.problems + tail))


@dataclasses.dataclass(frozen=True)
class FeatureConfig:
    """One output feature computed from one input field.

    Attributes:
      name: feature key in the Examples.
      source: dotted path into the input record (``user.address.city``);
        defaults to ``name``.
      transform: one of ``TRANSFORMS``.
      fill: numeric transforms: value for a missing (null/absent) input,
        a number or ``"mean"`` (the training mean). Default ``"mean"`` for
        zscore/minmax, else 0.
      missing_indicator: numeric transforms: also write ``{name}_missing``
        (int64, 1 where the input was null/absent), so 0 and null stay
        distinguishable.
      on_nan: numeric: NaN/inf input is an ``error`` (record goes to the error
        output), is ``fill``ed like a missing value, or is ``keep``t.
      clip_min/clip_max: bounds for ``clip`` (applied before other scaling
        for ``clip``).
      top_k, min_frequency, num_oov_buckets: vocabulary size control.
      buckets: ``hash`` bucket count.
      max_len: multi-valued inputs (arrays, text tokens): pad/truncate to this
        many values and write ``{name}_len``. ``None`` means scalar.
      lowercase: ``text``: lower-case before tokenizing.
      num_buckets: ``bucketize``: buckets cut at training-split quantiles.
      unit: ``timestamp``: unit of epoch numbers (``s, ms, us, ns, days``;
        Avro timestamp-millis is ``ms``, date is ``days``).
      parts: ``timestamp``: calendar parts to add (``hour``, ``day_of_week``, ``month``).
      sources: ``cross``: the fields (dotted paths) crossed together.
      allow_all_missing: accept a training split in which this feature's
        source is missing (null or absent) in every record. Off by default:
        such a run fails, since a misspelled source reads as all-missing.
      allow_label_source: read the label's source field as an input. Off by
        default: the label would leak into the model's inputs.
    """

    name: str
    source: str
    transform: str
    fill: float | str | None = None
    missing_indicator: bool = False
    on_nan: str = "error"
    clip_min: float | None = None
    clip_max: float | None = None
    top_k: int | None = None
    min_frequency: int = 1
    num_oov_buckets: int = 1
    buckets: int | None = None
    max_len: int | None = None
    lowercase: bool = True
    num_buckets: int | None = None
    unit: str | None = None
    parts: tuple[str, ...] | None = None
    sources: tuple[str, ...] | None = None
    allow_all_missing: bool = False
    allow_label_source: bool = False
    #: ``(measure, threshold)`` pairs of ``DRIFT_MEASURES`` overriding the
    #: config's top-level ``drift`` for this feature (``recordprep report``).
    drift: tuple[tuple[str, float], ...] | None = None

    @property
    def is_numeric(self) -> bool:
        return self.transform in NUMERIC_TRANSFORMS

    @property
    def needs_vocabulary(self) -> bool:
        return self.transform in ("vocabulary", "text")

    @property
    def needs_stats(self) -> bool:
        return self.is_numeric and (
            self.transform in ("zscore", "minmax", "bucketize") or self.fill == "mean"
        )

    @property
    def multi_valued(self) -> bool:
        return self.max_len is not None


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    """The label: a number (``dtype``), or with ``transform: vocabulary`` a class
    id ``0..K-1`` (int64) for each of the K distinct values of the training
    split, most frequent first, ties by term. No ``top_k``/``min_frequency``:
    every training class is one; a record whose class the training split
    lacks has no id and is rejected (an unknown class cannot be hashed into
    a meaningful target)."""

    source: str
    name: str
    dtype: str = "int64"  # or float32
    transform: str | None = None  # or "vocabulary"

    def to_json(self) -> dict[str, Any]:
        """As JSON; ``transform`` only when set, so the hash of a numeric label's config stays the same."""
        d = dataclasses.asdict(self)
        if d["transform"] is None:
            del d["transform"]
        return d


def _feature_json(f: FeatureConfig) -> dict[str, Any]:
    """``f`` as JSON; options added after outputs existed appear only when set,
    so the config hash (and the fingerprint of those outputs) stays the same."""
    d = dataclasses.asdict(f)
    for key in ("allow_all_missing", "allow_label_source"):
        if not d[key]:
            del d[key]
    if f.drift is None:
        del d["drift"]
    else:
        d["drift"] = dict(f.drift)
    return d


@dataclasses.dataclass(frozen=True)
class Config:
    features: tuple[FeatureConfig, ...]
    label: LabelConfig | None
    #: Default drift thresholds, ``(measure, threshold)`` pairs (top-level ``drift``).
    drift: tuple[tuple[str, float], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **({"drift": dict(self.drift)} if self.drift is not None else {}),
            "label": self.label.to_json() if self.label else None,
            "features": [_feature_json(f) for f in self.features],
        }

    @property
    def hash(self) -> str:
        """Stable hash of the normalized config (defaults filled in)."""
        blob = json.dumps(self.to_json(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def output_names(self) -> list[str]:
        names = []
        for f in self.features:
            names.append(f.name)
            if f.multi_valued:
                names.append(f"{f.name}_len")
            if f.missing_indicator:
                names.append(f"{f.name}_missing")
            names.extend(f"{f.name}_{p}" for p in f.parts or ())
        if self.label:
            names.append(self.label.name)
        return names


_FEATURE_KEYS = tuple(f.name for f in dataclasses.fields(FeatureConfig))
#: (option, lowest, highest) of the integer options.
_INT_RANGES = (
    ("top_k", 1, MAX_TOP_K), ("min_frequency", 1, MAX_MIN_FREQUENCY), ("num_oov_buckets", 1, MAX_OOV_BUCKETS),
    ("buckets", 1, MAX_HASH_BUCKETS), ("max_len", 1, MAX_FEATURE_SIZE), ("num_buckets", 2, MAX_BUCKETIZE_BUCKETS),
)
_INT_WHY = {
    "top_k": "terms kept per vocabulary", "min_frequency": "a count of occurrences",
    "num_oov_buckets": "each OOV id is listed in the metadata", "buckets": "hash ids stay exact in int64",
    "max_len": "values per feature a reader allocates per record", "num_buckets": "quantile boundaries kept",
}
#: Problems one ConfigError lists; past them the message says how many more there are.
MAX_PROBLEMS = 50
#: Unknown option names quoted in one problem.
_MAX_UNKNOWN_SHOWN = 5


#: Characters of a config value quoted in an error message.
_SHOW_CHARS = 200


def _show(v: Any) -> str:
    """A config value for an error message: its bounded repr, at most ``_SHOW_CHARS`` long."""
    return short_repr(v, _SHOW_CHARS)


#: Spellings of timestamp units people write, for "did you mean".
_UNIT_ALIASES = {"sec": "s", "secs": "s", "second": "s", "seconds": "s", "milli": "ms", "millis": "ms",
                 "milliseconds": "ms", "micro": "us", "micros": "us", "microseconds": "us", "nano": "ns",
                 "nanos": "ns", "nanoseconds": "ns", "day": "days", "d": "days"}


def _close(word: Any, choices: Sequence[str]) -> str | None:
    """The choice ``word`` most likely misspells (``top-k``, ``topk`` -> ``top_k``), or None."""
    if not isinstance(word, str) or len(word) > 100:
        return None
    norm = word.strip().lower().replace("-", "_").replace(" ", "_")
    if norm in choices:
        return norm
    if choices is TIMESTAMP_UNITS and norm in _UNIT_ALIASES:
        return _UNIT_ALIASES[norm]
    match = difflib.get_close_matches(norm, choices, n=1, cutoff=0.6)
    return match[0] if match else None


def _did_you_mean(word: Any, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for a near miss of one of ``choices``, else ``""``."""
    m = _close(word, choices)
    return f" (did you mean {m!r}?)" if m else ""


def _takes(transform: str) -> tuple[str, ...]:
    """Every option of ``transform``, in the order messages list them."""
    common = tuple(o for o in COMMON_OPTIONS if not (transform == "cross" and o == "source"))
    return (*common[:-1], *TRANSFORM_TABLE[transform].options, common[-1])


def _options_text(transform: str) -> str:
    own = TRANSFORM_TABLE[transform].options
    common = ", ".join(o for o in _takes(transform) if o not in own and o not in ("name", "transform"))
    return (f"the options allowed with transform {transform!r} are: {', '.join(own)} (and {common}, as for every transform)"
            if own else f"transform {transform!r} takes no options besides {common}")


def _not_taken(transform: str, keys: list[str]) -> str:
    """The message for ``keys`` given to a ``transform`` that does not take them."""
    parts = []
    for key in keys:
        takers = [t for t in TRANSFORMS if key in _takes(t)]
        if _NOT_TAKEN_WHY.get((transform, key)):
            why = _NOT_TAKEN_WHY[(transform, key)]
        elif len(takers) > 1 and set(takers) <= set(NUMERIC_TRANSFORMS):
            why = f"{key!r} applies to numeric transforms {' / '.join(takers)}"
        else:
            why = f"{key!r} applies to transform{'s' if len(takers) > 1 else ''} {' / '.join(takers)}"
        parts.append(f"{key!r} ({why})")
    return f"transform {transform!r} does not take {', '.join(parts)}; {_options_text(transform)}"


def _unknown(keys: list[str], transform: str | None) -> str:
    """The message for option names no transform has, each with its near miss."""
    allowed = _takes(transform) if transform else _FEATURE_KEYS
    parts = []
    for k in keys[:_MAX_UNKNOWN_SHOWN]:
        m = _close(k, _FEATURE_KEYS)
        hint = ""
        if m:
            hint = f" (did you mean {m!r}?" + ("" if m in allowed else f" transform {transform!r} does not take it either") + ")"
        parts.append(_show(k) + hint)
    more = f" and {len(keys) - _MAX_UNKNOWN_SHOWN} more" if len(keys) > _MAX_UNKNOWN_SHOWN else ""
    listed = (_options_text(transform) if transform else
              f"allowed: {', '.join(k for k in _FEATURE_KEYS if k not in ('name', 'transform'))}")
    return f"unknown option{'s' if len(keys) > 1 else ''} {', '.join(parts)}{more}; {listed}"


class _Problems:
    """The problems of one config, in the order found, at most ``MAX_PROBLEMS`` kept."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.more = 0

    def __len__(self) -> int:
        return len(self.items) + self.more

    def add(self, where: str, msg: str) -> None:
        if len(self.items) < MAX_PROBLEMS:
            self.items.append(f"{where}: {msg}")
        else:
            self.more += 1

    def raise_any(self) -> None:
        if self:
            raise ConfigError(*self.items, more=self.more)


def _key_problem(m: Mapping) -> str | None:
    for k in m:
        if not isinstance(k, str):
            return f"keys must be strings, found the key {_show(k)}"
    return None


def _name_problem(what: str, name: Any) -> str | None:
    """Names become file names (``vocab/<name>.txt``): identifier-like, bounded, and
    never a path that leaves the output (no empty, ``.`` or ``..`` component)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_CHARS:
        return (f"{what} must be an identifier-like string (letters, digits, _ . - /; at most "
                f"{MAX_NAME_CHARS} characters), found {_show(name)}")
    if any(part in ("", ".", "..") for part in name.split("/")):
        return (f"{what} {_show(name)} has an empty, '.' or '..' path component; it names a file "
                f"under the output (vocab/<name>.txt), use e.g. {_show(name.replace('/', '_'))}")
    return None


def _float32(v: Any) -> float | None:
    """``v`` as a float when it is a number that float32 holds (finite, |v| <= F32_MAX), else None;
    below the smallest normal double, zero of its sign (``convert.spec.daz``)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int beyond float64
        return None
    return daz(x) if abs(x) <= F32_MAX else None  # NaN compares False


def _same(a: Any, b: Any) -> bool:
    """``a == b`` for option values: a list equals a tuple, ``True`` does not equal ``1``."""
    b = tuple(b) if isinstance(b, list) else b
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _check_values(where: str, kw: dict[str, Any], out: _Problems) -> None:
    """Each given option's value on its own (types, ranges, choices); ``kw`` gets normalized values."""
    if "source" in kw and (not isinstance(kw["source"], str) or not kw["source"]):
        out.add(where, f"'source' must be a dotted field path, found {_show(kw['source'])}")
    for key, lo, hi in _INT_RANGES:
        v = kw.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi):
            out.add(where, f"{key!r} must be an integer >= {lo} and <= {hi:,} ({_INT_WHY[key]}), found {_show(v)}")
    if "drift" in kw:
        drift = _drift_thresholds(kw["drift"])
        if drift is None:
            out.add(where, _DRIFT_PROBLEM.format(found=_show(kw["drift"])))
        kw["drift"] = drift
    for key in ("missing_indicator", "lowercase", "allow_all_missing", "allow_label_source"):
        if key in kw and not isinstance(kw[key], bool):
            out.add(where, f"{key!r} must be true or false, found {_show(kw[key])}")
    if "on_nan" in kw and kw["on_nan"] not in NAN_POLICIES:
        out.add(where, f"'on_nan' must be one of {NAN_POLICIES}, found {_show(kw['on_nan'])}"
                       f"{_did_you_mean(kw['on_nan'], NAN_POLICIES)}")
    if "fill" in kw and kw["fill"] != "mean":
        fill = _float32(kw["fill"])
        if fill is None:
            out.add(where, f"'fill' must be 'mean' or a finite number within float32's range "
                           f"(|x| <= {F32_MAX:.7g}), found {_show(kw['fill'])}")
        kw["fill"] = fill
    for key in ("clip_min", "clip_max"):
        if key in kw:
            v = _float32(kw[key])
            if v is None:
                out.add(where, f"{key!r} must be a finite number within float32's range "
                               f"(|x| <= {F32_MAX:.7g}), found {_show(kw[key])}")
            kw[key] = v
    if isinstance(kw.get("clip_min"), float) and isinstance(kw.get("clip_max"), float) and kw["clip_min"] > kw["clip_max"]:
        out.add(where, f"'clip_min' ({kw['clip_min']}) must be <= 'clip_max' ({kw['clip_max']})")
    if "unit" in kw and kw["unit"] not in TIMESTAMP_UNITS:
        out.add(where, f"'unit' must be one of {', '.join(TIMESTAMP_UNITS)} (the epoch unit of numeric inputs), "
                       f"found {_show(kw['unit'])}{_did_you_mean(kw['unit'], TIMESTAMP_UNITS)}")
    if "parts" in kw:
        parts = [kw["parts"]] if isinstance(kw["parts"], str) else kw["parts"]
        if not isinstance(parts, list | tuple) or any(p not in TIMESTAMP_PARTS for p in parts) or len(set(parts)) != len(parts):
            hint = next((_did_you_mean(p, TIMESTAMP_PARTS) for p in parts if p not in TIMESTAMP_PARTS), "") \
                if isinstance(parts, list | tuple) else ""
            out.add(where, f"'parts' must be a list of distinct {', '.join(TIMESTAMP_PARTS)}, found {_show(kw['parts'])}{hint}")
        else:
            kw["parts"] = tuple(parts)
    if "sources" in kw:
        srcs = kw["sources"]
        if not isinstance(srcs, list | tuple) or len(srcs) < 2 or not all(isinstance(x, str) and x for x in srcs):
            out.add(where, f"transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths), "
                           f"found {_show(srcs)}")
        else:
            kw["sources"] = tuple(srcs)


#: Transforms that take a list per record (a path through ``[]``, ``[keys]``) with ``max_len``.
_LIST_TRANSFORMS = ("vocabulary", "hash", "text", "identity", "log1p", "clip")


def _single_path_problem(path: str, who: str) -> str | None:
    """Why ``path`` cannot be read by ``who`` (which takes one value per record), or None."""
    try:
        steps = parse_path(path)
    except PathError as e:
        return str(e)
    if any(map(is_list_step, steps)):
        return f"{who} takes one value per record, but source {path!r} steps through a list or map ([] or [keys])"
    return None


def _check_paths(where: str, transform: str, kw: dict[str, Any], out: _Problems) -> None:
    """The source paths' syntax, and that a path yielding a list feeds a transform that takes one."""
    if transform == "cross":
        for src in kw.get("sources") or ():
            problem = _single_path_problem(src, "transform 'cross'")
            if problem:
                out.add(where, problem)
        return
    try:
        steps = parse_path(kw["source"])
    except PathError as e:
        out.add(where, f"'source': {e}")
        return
    if not any(map(is_list_step, steps)) or transform == "count":
        return
    if transform not in _LIST_TRANSFORMS:
        out.add(where, f"source {kw['source']!r} gives a list per record ([] or [keys]), but transform "
                       f"{transform!r} takes one value; use {', '.join(_LIST_TRANSFORMS)} with max_len, or count")
    elif "max_len" not in kw:
        out.add(where, f"source {kw['source']!r} gives a list per record ([] or [keys]): set max_len "
                       f"(values kept per record; <name>_len holds how many)")


_DRIFT_PROBLEM = ("'drift' must map measures ({measures}) to thresholds (numbers >= 0), "
                  "e.g. {{js: 0.05, missing: 0.02}}, found {found}").replace("{measures}", ", ".join(DRIFT_MEASURES))


def _drift_thresholds(v: Any) -> tuple[tuple[str, float], ...] | None:
    """A ``drift`` option as sorted ``(measure, threshold)`` pairs, or None when invalid."""
    if not isinstance(v, Mapping) or not v:
        return None
    pairs = []
    for k, t in v.items():
        x = _float32(t)
        if k not in DRIFT_MEASURES or x is None or x < 0:
            return None
        pairs.append((k, x))
    return tuple(sorted(pairs))


def _complete(where: str, transform: str, kw: dict[str, Any], out: _Problems) -> None:
    """What ``transform`` needs (required options) and its defaults, filled into ``kw``."""
    if transform == "bucketize":
        kw.setdefault("num_buckets", 10)
    if transform == "timestamp":
        kw.setdefault("unit", "ms")
        kw.setdefault("parts", ())
    if transform == "cross":
        if "sources" not in kw:
            out.add(where, "transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths)")
        if "buckets" not in kw:
            out.add(where, "transform 'cross' needs 'buckets: N' (number of hash buckets for the combinations)")
    if transform == "hash" and "buckets" not in kw:
        out.add(where, "transform 'hash' needs 'buckets: N' (number of hash buckets)")
    if transform == "text" and "max_len" not in kw:
        out.add(where, "transform 'text' needs 'max_len: N' (tokens kept per record; shorter texts are padded)")
    if transform == "clip" and "clip_min" not in kw and "clip_max" not in kw:
        out.add(where, "transform 'clip' needs 'clip_min' and/or 'clip_max'")
    if TRANSFORM_TABLE[transform].numeric:
        kw.setdefault("fill", "mean" if transform in ("zscore", "minmax") else 0.0)


def _parse_feature(i: int, raw: Any, src: str, out: _Problems) -> FeatureConfig | None:
    """Feature ``i``, or None after adding each of its problems to ``out``."""
    where = f"{src}: features[{i}]"
    if isinstance(raw, str):
        out.add(where, f"expected a mapping like {{name: {_show(raw)}, transform: zscore}}, found the string {_show(raw)}")
        return None
    if not isinstance(raw, Mapping):
        out.add(where, f"expected a mapping with at least 'name' and 'transform', found {type(raw).__name__}")
        return None
    problem = _key_problem(raw)
    if problem:
        out.add(where, problem)
        return None
    before = len(out)
    name = raw.get("name")
    problem = _name_problem("'name'", name)
    if problem:
        out.add(where, problem)
    else:
        where = f"{src}: feature {name!r}"
    transform = raw.get("transform")
    if not isinstance(transform, str) or transform not in TRANSFORM_TABLE:
        out.add(where, f"transform {_show(transform)} is not one of {', '.join(TRANSFORMS)}"
                       f"{_did_you_mean(transform, TRANSFORMS)}")
        transform = None
    unknown = [k for k in raw if k not in _FEATURE_KEYS]
    if unknown:
        out.add(where, _unknown(unknown, transform))
    # ``key: null`` means the default (so ``Config.to_json()`` loads back).
    kw = {k: v for k, v in raw.items() if v is not None and k in _FEATURE_KEYS}
    # An entry listing every option is the normalized form (``Config.to_json()``,
    # the metadata's config): there, an option its transform does not take may
    # hold the value the transform gives it anyway (checked once it is built).
    full = set(_FEATURE_KEYS) - {"allow_all_missing", "allow_label_source", "drift"} <= set(raw)
    deferred: dict[str, Any] = {}
    if transform is not None:
        not_taken = [k for k in kw if k not in _takes(transform)]
        for key in not_taken:
            deferred[key] = kw.pop(key)
        if not_taken and not full:
            out.add(where, _not_taken(transform, not_taken))
            deferred = {}
    _check_values(where, kw, out)
    if transform is not None:
        _complete(where, transform, kw, out)
    if len(out) > before:
        return None
    kw.setdefault("source", name)
    _check_paths(where, transform, kw, out)
    if len(out) > before:
        return None
    feature = FeatureConfig(**kw)
    differ = [k for k, v in deferred.items() if not _same(getattr(feature, k), v)]
    if differ:
        out.add(where, _not_taken(transform, differ))
    return None if len(out) > before else feature


_LABEL_KEYS = ("source", "name", "dtype", "transform")


def _parse_label(lraw: Any, src: str, out: _Problems) -> LabelConfig | None:
    where = f"{src}: label"
    if isinstance(lraw, str):
        lraw = {"source": lraw}
    if isinstance(lraw, Mapping):
        problem = _key_problem(lraw)
        if problem:
            out.add(where, problem)
            return None
    if not isinstance(lraw, Mapping) or not isinstance(lraw.get("source"), str) or not lraw["source"]:
        out.add(src, "'label' must be a field name or {source: field, dtype: int64|float32} "
                     "or {source: field, transform: vocabulary}")
        return None
    before = len(out)
    extra = [k for k in lraw if k not in _LABEL_KEYS]
    if extra:
        hints = "".join(_did_you_mean(k, _LABEL_KEYS) for k in extra[:_MAX_UNKNOWN_SHOWN])
        out.add(where, f"unknown option(s) {_show(sorted(extra))}{hints}; allowed: {', '.join(_LABEL_KEYS)}")
    transform = lraw.get("transform")
    if transform is not None and transform != "vocabulary":
        out.add(where, f"transform must be vocabulary (class names -> ids 0..K-1), found {_show(transform)}"
                       f"{_did_you_mean(transform, ('vocabulary',))}; leave it out for a numeric label")
    dtype = lraw.get("dtype", "int64")
    if dtype not in LABEL_DTYPES:
        hint = _did_you_mean(dtype, LABEL_DTYPES)
        if isinstance(dtype, str) and dtype.lower() in ("string", "str", "bytes", "category", "categorical", "vocabulary"):
            hint = "; for class names use transform: vocabulary (ids 0..K-1, int64)"
        out.add(where, f"dtype must be int64 or float32, found {_show(dtype)}{hint}")
    elif transform == "vocabulary" and dtype != "int64":
        out.add(where, f"a vocabulary label's class ids are int64, found dtype {_show(dtype)}; leave dtype out")
    problem = _single_path_problem(lraw["source"], "the label")
    if problem:
        out.add(where, problem)
    lname = lraw.get("name") or lraw["source"].replace(".", "_")
    problem = _name_problem("'name'", lname)
    if problem:
        out.add(where, problem)
    return None if len(out) > before else LabelConfig(source=lraw["source"], name=lname, dtype=dtype,
                                                      transform=transform)


def parse_config(raw: Any, *, source: str = "config") -> Config:
    """Validate a config already loaded as Python data.

    Raises one ConfigError listing every problem found (up to ``MAX_PROBLEMS``),
    so a config with several mistakes is fixed in one round.
    """
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'features' (and usually 'label'), found {type(raw).__name__}")
    problem = _key_problem(raw)
    if problem:
        raise ConfigError(f"{source}: {problem}")
    out = _Problems()
    unknown = [k for k in raw if k not in ("features", "label", "drift")]
    if unknown:
        hints = "".join(_did_you_mean(k, ("features", "label", "drift")) for k in unknown[:_MAX_UNKNOWN_SHOWN])
        out.add(source, f"unknown top-level key(s) {_show(sorted(unknown))}{hints}; allowed: features, label, drift")
    drift = _drift_thresholds(raw["drift"]) if raw.get("drift") is not None else None
    if raw.get("drift") is not None and drift is None:
        out.add(source, _DRIFT_PROBLEM.format(found=_show(raw["drift"])))
    feats_raw = raw.get("features")
    features: list[FeatureConfig | None] = []
    if not isinstance(feats_raw, list) or not feats_raw:
        out.add(source, "'features' must be a non-empty list of feature entries")
    else:
        features = [_parse_feature(i, f, source, out) for i, f in enumerate(feats_raw)]
    label = _parse_label(raw["label"], source, out) if raw.get("label") is not None else None
    cfg = Config(features=tuple(f for f in features if f is not None), label=label, drift=drift)
    _check_label_leak(cfg, source, out)
    seen: set[str] = set()
    for n in cfg.output_names:
        if n in seen:
            out.add(source, f"output feature {n!r} is produced twice (derived names are "
                            f"'<name>_len' and '<name>_missing'); rename one feature")
        seen.add(n)
    for problem in _file_name_clashes([f.name for f in cfg.features] + ([label.name] if label else [])):
        out.add(source, problem)
    out.raise_any()
    return cfg


def _file_name_clashes(names: list[str]) -> list[str]:
    """Pairs of names whose files under the output clash: ``vocab/<a>.txt`` is a file, so
    no other name may put a file below it (``a`` and ``a.txt/b``); found after all the
    work, at commit, the run would fail, so they are refused here."""
    dirs = {}
    for n in names:
        parts = n.split("/")
        for k in range(1, len(parts)):
            dirs.setdefault("/".join(parts[:k]), n)
    problems = []
    for n in dict.fromkeys(names):
        other = dirs.get(f"{n}.txt")
        if other is not None:
            problems.append(f"names {n!r} and {other!r} clash: {n!r} writes the file vocab/{n}.txt and "
                            f"{other!r} a file below vocab/{n}.txt/; rename one")
    return problems


def _check_label_leak(cfg: Config, source: str, out: _Problems) -> None:
    """A feature reading the label's source field puts the label in the model's inputs:
    refused unless the feature sets ``allow_label_source``."""
    if cfg.label is None:
        return
    for f in cfg.features:
        if cfg.label.source in (f.sources or (f.source,)) and not f.allow_label_source:
            out.add(f"{source}: feature {f.name!r}",
                    f"reads the label's source field {cfg.label.source!r}, so the label would leak into the "
                    f"model's inputs; read another field, or set allow_label_source: true on the feature if "
                    f"this is intended")


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses what a config never needs and an
    attacker would use: alias expansion past ``MAX_CONFIG_NODES`` nodes (a
    kilobyte "billion laughs" expands to gigabytes once anything walks it),
    recursive aliases, nesting past ``MAX_CONFIG_DEPTH``, numbers longer than
    ``MAX_NUMBER_CHARS`` and duplicate keys (YAML keeps the last silently)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0  # nodes composed so far, an alias counting as its anchor's expansion
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once composed
        self._checked: set[int] = set()

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_CONFIG_NODES:
            raise ConfigError(f"line {mark.line + 1}: the document expands to more than {MAX_CONFIG_NODES:,} nodes "
                              f"(YAML aliases repeating aliases?); write the config out without them")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._sizes:
                    raise ConfigError(f"line {event.start_mark.line + 1}: alias *{event.anchor} refers to a node "
                                      f"that contains it (a recursive structure); a config is a tree")
                self._count(self._sizes[id(target)], event.start_mark)
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"line {mark.line + 1}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
        start = self._nodes
        self._count(1, mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - start
        return node

    def flatten_mapping(self, node: Any) -> None:
        # Check a mapping's own keys before merge keys (``<<: *base``) add the
        # base's pairs, which the mapping's own keys legitimately override.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"line {line}: duplicate key {_show(key)} (first at line {seen[key]}); "
                                      f"each key may appear once in a mapping")
                seen[key] = line
        super().flatten_mapping(node)

    def _number(self, node: Any) -> None:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise ConfigError(f"line {node.start_mark.line + 1}: a number of {len(node.value):,} characters; "
                              f"numbers in a config have at most {MAX_NUMBER_CHARS}")

    def construct_yaml_int(self, node: Any) -> int:
        self._number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> float:
        self._number(node)
        return super().construct_yaml_float(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _ConfigLoader.construct_yaml_float)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"duplicate key {_show(k)} in a JSON object; each key may appear once")
        out[k] = v
    return out


def _parse_text(text: str, is_json: bool) -> Any:
    """The document in ``text``; ConfigError (without the file name) for anything wrong."""
    try:
        if is_json:
            return json.loads(text, object_pairs_hook=_json_object)
        loader = _ConfigLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:
        raise ConfigError("nested too deeply") from None
    except (ValueError, yaml.YAMLError) as e:  # ValueError: also ints past Python's 4300-digit limit
        if isinstance(e, ConfigError):
            raise
        msg = str(e)  # parser messages quote the offending text: cut a long one
        msg = msg if len(msg) <= 2000 else msg[:2000] + " ..."
        raise ConfigError(f"not valid {'JSON' if is_json else 'YAML'}: {msg}") from e


def load_config(path: str | Path) -> Config:
    """Load and validate a YAML or JSON config file (``.json`` is JSON, anything else YAML).

    Raises ConfigError, naming the file, for every problem: unreadable, larger
    than ``MAX_CONFIG_BYTES``, not UTF-8, not valid YAML/JSON, duplicate keys,
    alias bombs or nesting past the limits above, and any invalid entry.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from e
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES:,} bytes; a feature config is a few KB (is this the right file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{p}: not UTF-8 text (invalid byte {data[e.start]:#04x} at line {line}); save the config as UTF-8") from None
    if not text.strip():  # e.g. `recordprep infer ... > features.yaml` after infer failed
        raise ConfigError(f"{p}: the config file is empty; write one (docs/feature-config.md) or draft it with "
                          f"`recordprep infer -i DATA > {p.name}` and check that infer succeeded")
    try:
        raw = _parse_text(text, p.suffix == ".json")
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    return parse_config(raw, source=str(p))
