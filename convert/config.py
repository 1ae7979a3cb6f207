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
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

NUMERIC_TRANSFORMS = ("identity", "zscore", "minmax", "log1p", "clip", "bucketize")
CATEGORICAL_TRANSFORMS = ("vocabulary", "hash")
TRANSFORMS = NUMERIC_TRANSFORMS + CATEGORICAL_TRANSFORMS + ("text", "bytes", "timestamp", "cross")
TIMESTAMP_UNITS = ("s", "ms", "us", "ns", "days")
TIMESTAMP_PARTS = ("hour", "day_of_week", "month")
NAN_POLICIES = ("error", "fill", "keep")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")


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


@dataclasses.dataclass(frozen=True)
class Config:
    features: tuple[FeatureConfig, ...]
    label: LabelConfig | None

    def to_json(self) -> dict[str, Any]:
        return {
            "label": dataclasses.asdict(self.label) if self.label else None,
            "features": [dataclasses.asdict(f) for f in self.features],
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


def _fail(where: str, msg: str) -> ConfigError:
    return ConfigError(f"{where}: {msg}")


def _parse_feature(i: int, raw: Any, src: str) -> FeatureConfig:
    where = f"{src}: features[{i}]"
    if isinstance(raw, str):
        raise _fail(where, f"expected a mapping like {{name: {raw}, transform: zscore}}, found the string {raw!r}")
    if not isinstance(raw, Mapping):
        raise _fail(where, f"expected a mapping with at least 'name' and 'transform', found {type(raw).__name__}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise _fail(where, f"'name' must be an identifier-like string, found {name!r}")
    where = f"{src}: feature {name!r}"
    unknown = set(raw) - _FEATURE_KEYS
    if unknown:
        raise _fail(where, f"unknown option(s) {sorted(unknown)}; allowed: {sorted(_FEATURE_KEYS - {'name'})}")
    transform = raw.get("transform")
    if transform not in TRANSFORMS:
        raise _fail(where, f"transform {transform!r} is not one of {', '.join(TRANSFORMS)}")
    # ``key: null`` means the default (so ``Config.to_json()`` loads back).
    kw = {k: v for k, v in raw.items() if v is not None}
    kw.setdefault("source", name)
    if not isinstance(kw["source"], str) or not kw["source"]:
        raise _fail(where, f"'source' must be a dotted field path, found {kw['source']!r}")

    def _int(key: str, lo: int) -> None:
        v = kw.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
            raise _fail(where, f"{key!r} must be an integer >= {lo}, found {v!r}")

    for key, lo in (("top_k", 1), ("min_frequency", 1), ("num_oov_buckets", 1), ("buckets", 1), ("max_len", 1)):
        _int(key, lo)
    numeric = transform in NUMERIC_TRANSFORMS
    _int("num_buckets", 2)
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
            raise _fail(where, f"'unit' must be one of {', '.join(TIMESTAMP_UNITS)} (the epoch unit of numeric inputs), found {unit!r}")
        parts = kw.get("parts", [])
        if isinstance(parts, str):
            parts = [parts]
        if not isinstance(parts, list | tuple) or any(p not in TIMESTAMP_PARTS for p in parts) or len(set(parts)) != len(parts):
            raise _fail(where, f"'parts' must be a list of distinct {', '.join(TIMESTAMP_PARTS)}, found {kw.get('parts')!r}")
        kw["parts"] = tuple(parts)
        if kw.get("max_len"):
            raise _fail(where, "'timestamp' takes one value per record; remove 'max_len'")
    if transform == "cross":
        srcs = kw.get("sources")
        if not isinstance(srcs, list | tuple) or len(srcs) < 2 or not all(isinstance(x, str) and x for x in srcs):
            raise _fail(where, f"transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths), found {srcs!r}")
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
        if not (fill == "mean" or (isinstance(fill, int | float) and not isinstance(fill, bool) and math.isfinite(fill))):
            raise _fail(where, f"'fill' must be a finite number or 'mean', found {fill!r}")
        kw["fill"] = fill if fill == "mean" else float(fill)
    if kw.get("on_nan", "error") not in NAN_POLICIES:
        raise _fail(where, f"'on_nan' must be one of {NAN_POLICIES}, found {kw.get('on_nan')!r}")
    for key in ("clip_min", "clip_max"):
        v = kw.get(key)
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or math.isnan(v)):
            raise _fail(where, f"{key!r} must be a number, found {v!r}")
    for key in ("missing_indicator", "lowercase"):
        if key in kw and not isinstance(kw[key], bool):
            raise _fail(where, f"{key!r} must be true or false, found {kw[key]!r}")
    if transform == "clip":
        if kw.get("clip_min") is None and kw.get("clip_max") is None:
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
    unknown = set(raw) - {"features", "label"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown)}; allowed: features, label")
    feats_raw = raw.get("features")
    if not isinstance(feats_raw, list) or not feats_raw:
        raise ConfigError(f"{source}: 'features' must be a non-empty list of feature entries")
    features = tuple(_parse_feature(i, f, source) for i, f in enumerate(feats_raw))
    label = None
    lraw = raw.get("label")
    if lraw is not None:
        if isinstance(lraw, str):
            lraw = {"source": lraw}
        if not isinstance(lraw, Mapping) or not isinstance(lraw.get("source"), str):
            raise ConfigError(f"{source}: 'label' must be a field name or {{source: field, dtype: int64|float32}}")
        extra = set(lraw) - {"source", "name", "dtype"}
        if extra:
            raise ConfigError(f"{source}: label: unknown option(s) {sorted(extra)}; allowed: source, name, dtype")
        dtype = lraw.get("dtype", "int64")
        if dtype not in ("int64", "float32"):
            raise ConfigError(f"{source}: label: dtype must be int64 or float32, found {dtype!r}")
        lname = lraw.get("name") or lraw["source"].replace(".", "_")
        if not isinstance(lname, str) or not _NAME_RE.match(lname):
            raise ConfigError(f"{source}: label: 'name' must be an identifier-like string, found {lname!r}")
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


def load_config(path: str | Path) -> Config:
    """Load and validate a YAML or JSON config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from e
    try:
        raw = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {e}") from e
    return parse_config(raw, source=str(p))
