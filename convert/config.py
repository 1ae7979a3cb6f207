"""The feature config: what to do with each input field.

A config is a YAML (safe-loaded) or JSON file::

    label: {source: label, dtype: int64}
    features:
      - {name: age, transform: zscore}
      - {name: country, source: user.country, transform: vocabulary, top_k: 1000}
      - {name: tags, transform: vocabulary, max_len: 8}
      - {name: title, transform: text, max_len: 16}
      - {name: user, source: user_id, transform: hash, buckets: 4096}

Everything is validated here, before any pipeline starts, so a typo fails in
a second with a message naming the feature and what is allowed, not an hour
into a Dataflow job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import reprlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from convert.spec import MAX_FEATURE_SIZE

NUMERIC_TRANSFORMS = ("identity", "zscore", "minmax", "log1p", "clip", "bucketize")
CATEGORICAL_TRANSFORMS = ("vocabulary", "hash")
TRANSFORMS = NUMERIC_TRANSFORMS + CATEGORICAL_TRANSFORMS + ("text", "bytes", "timestamp", "cross")
TIMESTAMP_UNITS = ("s", "ms", "us", "ns", "days")
TIMESTAMP_PARTS = ("hour", "day_of_week", "month")
NAN_POLICIES = ("error", "fill", "keep")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")

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


class ConfigError(ValueError):
    """The feature config is invalid; the message names the feature and the fix."""


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
    source: str
    name: str
    dtype: str = "int64"  # or float32


def _feature_json(f: FeatureConfig) -> dict[str, Any]:
    """``f`` as JSON; options added after outputs existed appear only when set,
    so the config hash (and the fingerprint of those outputs) stays the same."""
    d = dataclasses.asdict(f)
    if not d["allow_all_missing"]:
        del d["allow_all_missing"]
    return d


@dataclasses.dataclass(frozen=True)
class Config:
    features: tuple[FeatureConfig, ...]
    label: LabelConfig | None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": dataclasses.asdict(self.label) if self.label else None,
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


_FEATURE_KEYS = {f.name for f in dataclasses.fields(FeatureConfig)}
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


def _fail(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: {msg}")


class _ShortRepr(reprlib.Repr):
    """``repr`` cut to a bounded size: a config value quoted in an error message
    may be an alias bomb, a megabyte string or an integer of a million digits."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 2, 80, 80, 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 8

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr of a huge int is slow, past 4300 digits an error
            return f"<integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHORT = _ShortRepr()
#: Characters of a config value quoted in an error message.
_SHOW_CHARS = 200


def _show(v: Any) -> str:
    """A config value for an error message: its repr, at most ``_SHOW_CHARS`` long."""
    s = _SHORT.repr(v)
    return s if len(s) <= _SHOW_CHARS else s[:_SHOW_CHARS] + "..."


def _check_keys(where: str, m: Mapping) -> None:
    bad = [k for k in m if not isinstance(k, str)]
    if bad:
        raise _fail(where, f"keys must be strings, found the key {_show(bad[0])}")


def _check_name(where: str, what: str, name: Any) -> None:
    """Names become file names (``vocab/<name>.txt``): identifier-like, bounded, and
    never a path that leaves the output (no empty, ``.`` or ``..`` component)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_CHARS:
        raise _fail(where, f"{what} must be an identifier-like string (letters, digits, _ . - /; at most "
                           f"{MAX_NAME_CHARS} characters), found {_show(name)}")
    if any(part in ("", ".", "..") for part in name.split("/")):
        raise _fail(where, f"{what} {_show(name)} has an empty, '.' or '..' path component; it names a file "
                           f"under the output (vocab/<name>.txt), use e.g. {_show(name.replace('/', '_'))}")


def _float32(v: Any) -> float | None:
    """``v`` as a float when it is a number that float32 holds (finite, |v| <= F32_MAX), else None."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        x = float(v)
    except OverflowError:  # an int beyond float64
        return None
    return x if abs(x) <= F32_MAX else None  # NaN compares False


def _parse_feature(i: int, raw: Any, src: str) -> FeatureConfig:
    where = f"{src}: features[{i}]"
    if isinstance(raw, str):
        raise _fail(where, f"expected a mapping like {{name: {_show(raw)}, transform: zscore}}, found the string {_show(raw)}")
    if not isinstance(raw, Mapping):
        raise _fail(where, f"expected a mapping with at least 'name' and 'transform', found {type(raw).__name__}")
    _check_keys(where, raw)
    name = raw.get("name")
    _check_name(where, "'name'", name)
    where = f"{src}: feature {name!r}"
    unknown = set(raw) - _FEATURE_KEYS
    if unknown:
        raise _fail(where, f"unknown option(s) {_show(sorted(unknown))}; allowed: {sorted(_FEATURE_KEYS - {'name'})}")
    transform = raw.get("transform")
    if transform not in TRANSFORMS:
        raise _fail(where, f"transform {_show(transform)} is not one of {', '.join(TRANSFORMS)}")
    # ``key: null`` means the default (so ``Config.to_json()`` loads back).
    kw = {k: v for k, v in raw.items() if v is not None}
    kw.setdefault("source", name)
    if not isinstance(kw["source"], str) or not kw["source"]:
        raise _fail(where, f"'source' must be a dotted field path, found {_show(kw['source'])}")
    for key, lo, hi in _INT_RANGES:
        v = kw.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi):
            raise _fail(where, f"{key!r} must be an integer >= {lo} and <= {hi:,} ({_INT_WHY[key]}), found {_show(v)}")
    numeric = transform in NUMERIC_TRANSFORMS
    own = {"num_buckets": ("bucketize",), "unit": ("timestamp",), "parts": ("timestamp",), "sources": ("cross",)}
    for key, allowed in own.items():
        if key in kw and transform not in allowed:
            raise _fail(where, f"{key!r} applies to transform {' / '.join(allowed)}, not {transform!r}")
    if transform == "bucketize":
        kw.setdefault("num_buckets", 10)
        for key in ("fill", "max_len"):
            if key in kw:
                raise _fail(where, f"'bucketize' does not take {key!r}: a missing value gets id 0, values ids 1..num_buckets")
    if transform == "timestamp":
        unit = kw.setdefault("unit", "ms")
        if unit not in TIMESTAMP_UNITS:
            raise _fail(where, f"'unit' must be one of {', '.join(TIMESTAMP_UNITS)} (the epoch unit of numeric inputs), found {_show(unit)}")
        parts = kw.get("parts", [])
        if isinstance(parts, str):
            parts = [parts]
        if not isinstance(parts, list | tuple) or any(p not in TIMESTAMP_PARTS for p in parts) or len(set(parts)) != len(parts):
            raise _fail(where, f"'parts' must be a list of distinct {', '.join(TIMESTAMP_PARTS)}, found {_show(kw.get('parts'))}")
        kw["parts"] = tuple(parts)
        if kw.get("max_len"):
            raise _fail(where, "'timestamp' takes one value per record; remove 'max_len'")
    if transform == "cross":
        srcs = kw.get("sources")
        if not isinstance(srcs, list | tuple) or len(srcs) < 2 or not all(isinstance(x, str) and x for x in srcs):
            raise _fail(where, f"transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths), found {_show(srcs)}")
        kw["sources"] = tuple(srcs)
        if not kw.get("buckets"):
            raise _fail(where, "transform 'cross' needs 'buckets: N' (number of hash buckets for the combinations)")
        if kw.get("max_len"):
            raise _fail(where, "'cross' combines single values; remove 'max_len'")
    if "fill" in kw and not numeric:
        raise _fail(where, f"'fill' applies to numeric transforms ({', '.join(NUMERIC_TRANSFORMS)}), not {transform!r}")
    if numeric:
        default_fill = "mean" if transform in ("zscore", "minmax") else 0.0
        fill = kw.get("fill", default_fill)
        if fill != "mean":
            fill = _float32(fill)
            if fill is None:
                raise _fail(where, f"'fill' must be 'mean' or a finite number within float32's range "
                                   f"(|x| <= {F32_MAX:.7g}), found {_show(kw['fill'])}")
        kw["fill"] = fill
    if kw.get("on_nan", "error") not in NAN_POLICIES:
        raise _fail(where, f"'on_nan' must be one of {NAN_POLICIES}, found {_show(kw.get('on_nan'))}")
    for key in ("clip_min", "clip_max"):
        if kw.get(key) is not None:
            v = _float32(kw[key])
            if v is None:
                raise _fail(where, f"{key!r} must be a finite number within float32's range "
                                   f"(|x| <= {F32_MAX:.7g}), found {_show(kw[key])}")
            kw[key] = v
    for key in ("missing_indicator", "lowercase", "allow_all_missing"):
        if key in kw and not isinstance(kw[key], bool):
            raise _fail(where, f"{key!r} must be true or false, found {_show(kw[key])}")
    if transform == "clip" and kw.get("clip_min") is None and kw.get("clip_max") is None:
        raise _fail(where, "transform 'clip' needs 'clip_min' and/or 'clip_max'")
    if kw.get("clip_min") is not None and kw.get("clip_max") is not None and kw["clip_min"] > kw["clip_max"]:
        raise _fail(where, f"'clip_min' ({kw['clip_min']}) must be <= 'clip_max' ({kw['clip_max']})")
    if transform == "hash" and not kw.get("buckets"):
        raise _fail(where, "transform 'hash' needs 'buckets: N' (number of hash buckets)")
    if transform == "text" and not kw.get("max_len"):
        raise _fail(where, "transform 'text' needs 'max_len: N' (tokens kept per record; shorter texts are padded)")
    if transform == "bytes" and kw.get("max_len"):
        raise _fail(where, "transform 'bytes' stores one value per record; remove 'max_len'")
    if kw.get("max_len") and numeric and transform not in ("identity", "clip", "log1p"):
        raise _fail(where, f"numeric lists support identity, clip and log1p (per element), not {transform!r}")
    if kw.get("missing_indicator") and not (numeric or transform == "timestamp"):
        raise _fail(where, "'missing_indicator' applies to numeric and timestamp transforms; categorical features map null to id 0 already")
    return FeatureConfig(**kw)


def parse_config(raw: Any, *, source: str = "config") -> Config:
    """Validate a config already loaded as Python data."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a mapping with 'features' (and usually 'label'), found {type(raw).__name__}")
    _check_keys(source, raw)
    unknown = set(raw) - {"features", "label"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {_show(sorted(unknown))}; allowed: features, label")
    feats_raw = raw.get("features")
    if not isinstance(feats_raw, list) or not feats_raw:
        raise ConfigError(f"{source}: 'features' must be a non-empty list of feature entries")
    features = tuple(_parse_feature(i, f, source) for i, f in enumerate(feats_raw))
    label = None
    lraw = raw.get("label")
    if lraw is not None:
        if isinstance(lraw, str):
            lraw = {"source": lraw}
        if isinstance(lraw, Mapping):
            _check_keys(f"{source}: label", lraw)
        if not isinstance(lraw, Mapping) or not isinstance(lraw.get("source"), str) or not lraw["source"]:
            raise ConfigError(f"{source}: 'label' must be a field name or {{source: field, dtype: int64|float32}}")
        extra = set(lraw) - {"source", "name", "dtype"}
        if extra:
            raise ConfigError(f"{source}: label: unknown option(s) {_show(sorted(extra))}; allowed: source, name, dtype")
        dtype = lraw.get("dtype", "int64")
        if dtype not in ("int64", "float32"):
            raise ConfigError(f"{source}: label: dtype must be int64 or float32, found {_show(dtype)}")
        lname = lraw.get("name") or lraw["source"].replace(".", "_")
        _check_name(f"{source}: label", "'name'", lname)
        label = LabelConfig(source=lraw["source"], name=lname, dtype=dtype)
    cfg = Config(features=features, label=label)
    seen: set[str] = set()
    for n in cfg.output_names:
        if n in seen:
            raise ConfigError(
                f"{source}: output feature {n!r} is produced twice (derived names are "
                f"'<name>_len' and '<name>_missing'); rename one feature"
            )
        seen.add(n)
    return cfg


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
    try:
        raw = _parse_text(text, p.suffix == ".json")
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    return parse_config(raw, source=str(p))
