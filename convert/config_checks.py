"""Checking a raw feature config (parsed YAML/JSON) into a ``Config``:
``parse_config`` collects every problem of a config (near misses get a "did
you mean") into one ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from convert import transforms
from convert.config_model import (
    COMMON_OPTIONS,
    DRIFT_MEASURES,
    F32_MAX,
    FILL_NAMES,
    LABEL_DTYPES,
    LABEL_TRANSFORMS,
    MAX_BUCKETIZE_BUCKETS,
    MAX_HASH_BUCKETS,
    MAX_MIN_FREQUENCY,
    MAX_NAME_CHARS,
    MAX_OOV_BUCKETS,
    MAX_TOP_K,
    NAN_POLICIES,
    NUMERIC_TRANSFORMS,
    OPTIONAL_DEFAULTS,
    TIMESTAMP_PARTS,
    TIMESTAMP_UNITS,
    TRANSFORM_TABLE,
    TRANSFORMS,
    Config,
    ConfigError,
    FeatureConfig,
    LabelConfig,
    named_fill,
)
from convert.paths import (
    EACH,
    KEYS,
    PathError,
    Step,
    is_list_step,
    one_value_path,
    parse_path,
    paths_overlap,
)
from convert.spec import MAX_FEATURE_SIZE, daz, short_repr
from convert.transforms.label_vocabulary import MI_KINDS

#: Why a transform does not take an option, where more can be said than which transforms do
#: (each transform's module says: ``Transform.not_taken_why``).
_NOT_TAKEN_WHY = {(t, key): why for t in TRANSFORMS for key, why in transforms.get(t).not_taken_why.items()}


_FEATURE_KEYS = tuple(f.name for f in dataclasses.fields(FeatureConfig))
#: Options of the keyed analyzers, written only when set (``convert.config_model``).
_KEYED_KEYS = ("key", "mutual_information", "min_diff_from_avg")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
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


def show_value(v: Any) -> str:
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
    reads_sources = transforms.get(transform).reads_sources
    common = tuple(o for o in COMMON_OPTIONS if not (reads_sources and o == "source"))
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
        parts.append(show_value(k) + hint)
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
            return f"keys must be strings, found the key {show_value(k)}"
    return None


def _name_problem(what: str, name: Any) -> str | None:
    """Names become file names (``vocab/<name>.txt``): identifier-like, bounded, and
    never a path that leaves the output (no empty, ``.`` or ``..`` component)."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or len(name) > MAX_NAME_CHARS:
        return (f"{what} must be an identifier-like string (letters, digits, _ . - /; at most "
                f"{MAX_NAME_CHARS} characters), found {show_value(name)}")
    if any(part in ("", ".", "..") for part in name.split("/")):
        return (f"{what} {show_value(name)} has an empty, '.' or '..' path component; it names a file "
                f"under the output (vocab/<name>.txt), use e.g. {show_value(name.replace('/', '_'))}")
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


def _check_values(where: str, kw: dict[str, Any], out: _Problems, part_choices: tuple[str, ...] = TIMESTAMP_PARTS) -> None:
    """Each given option's value on its own (types, ranges, choices; ``parts`` among the
    transform's ``part_choices``); ``kw`` gets normalized values."""
    if "source" in kw and (not isinstance(kw["source"], str) or not kw["source"]):
        out.add(where, f"'source' must be a dotted field path, found {show_value(kw['source'])}")
    for key, lo, hi in _INT_RANGES:
        v = kw.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi):
            out.add(where, f"{key!r} must be an integer >= {lo} and <= {hi:,} ({_INT_WHY[key]}), found {show_value(v)}")
    if "drift" in kw:
        drift = _drift_thresholds(kw["drift"])
        if drift is None:
            out.add(where, _DRIFT_PROBLEM.format(found=show_value(kw["drift"])))
        kw["drift"] = drift
    for key in ("missing_indicator", "lowercase", "allow_all_missing", "allow_label_source", "length"):
        if key in kw and not isinstance(kw[key], bool):
            out.add(where, f"{key!r} must be true or false, found {show_value(kw[key])}")
    if "length_of" in kw and (not isinstance(kw["length_of"], str) or not kw["length_of"]):
        out.add(where, f"'length_of' must name another feature (a numeric list of the same list), "
                       f"found {show_value(kw['length_of'])}")
    if "on_nan" in kw and kw["on_nan"] not in NAN_POLICIES:
        out.add(where, f"'on_nan' must be one of {NAN_POLICIES}, found {show_value(kw['on_nan'])}"
                       f"{_did_you_mean(kw['on_nan'], NAN_POLICIES)}")
    if "fill" in kw and not (isinstance(kw["fill"], str) and kw["fill"] in FILL_NAMES):
        fill = _float32(kw["fill"])
        if fill is None:
            out.add(where, f"'fill' must be 'mean', 'median' or a finite number within float32's range "
                           f"(|x| <= {F32_MAX:.7g}), found {show_value(kw['fill'])}"
                           f"{_did_you_mean(kw['fill'], FILL_NAMES) if isinstance(kw['fill'], str) else ''}")
        kw["fill"] = fill
    for key in ("clip_min", "clip_max"):
        if key in kw:
            v = _float32(kw[key])
            if v is None:
                out.add(where, f"{key!r} must be a finite number within float32's range "
                               f"(|x| <= {F32_MAX:.7g}), found {show_value(kw[key])}")
            kw[key] = v
    if isinstance(kw.get("clip_min"), float) and isinstance(kw.get("clip_max"), float) and kw["clip_min"] > kw["clip_max"]:
        out.add(where, f"'clip_min' ({kw['clip_min']}) must be <= 'clip_max' ({kw['clip_max']})")
    if "unit" in kw and kw["unit"] not in TIMESTAMP_UNITS:
        out.add(where, f"'unit' must be one of {', '.join(TIMESTAMP_UNITS)} (the epoch unit of numeric inputs), "
                       f"found {show_value(kw['unit'])}{_did_you_mean(kw['unit'], TIMESTAMP_UNITS)}")
    if "parts" in kw:
        parts = [kw["parts"]] if isinstance(kw["parts"], str) else kw["parts"]
        if not isinstance(parts, list | tuple) or any(p not in part_choices for p in parts) or len(set(parts)) != len(parts):
            hint = next((_did_you_mean(p, part_choices) for p in parts if p not in part_choices), "") \
                if isinstance(parts, list | tuple) else ""
            out.add(where, f"'parts' must be a list of distinct {', '.join(part_choices)}, found {show_value(kw['parts'])}{hint}")
        else:
            kw["parts"] = tuple(parts)
    _check_keyed(where, kw, out)
    if "sources" in kw:
        srcs = kw["sources"]
        if not isinstance(srcs, list | tuple) or len(srcs) < 2 or not all(isinstance(x, str) and x for x in srcs):
            out.add(where, f"transform 'cross' needs 'sources: [field_a, field_b, ...]' (two or more dotted paths), "
                           f"found {show_value(srcs)}")
        else:
            kw["sources"] = tuple(srcs)


def _check_keyed(where: str, kw: dict[str, Any], out: _Problems) -> None:
    """The keyed analyzers' options: ``key`` (a field path), ``mutual_information``, ``min_diff_from_avg``."""
    if "key" in kw and (not isinstance(kw["key"], str) or not kw["key"]):
        out.add(where, f"'key' must be the dotted path of a categorical field (the groups the statistics are "
                       f"taken per), found {show_value(kw['key'])}")
    if "mutual_information" in kw and kw["mutual_information"] not in MI_KINDS:
        out.add(where, f"'mutual_information' must be one of {', '.join(MI_KINDS)} (adjusted: less what chance "
                       f"gives, as TF Transform's use_adjusted_mutual_info), found {show_value(kw['mutual_information'])}"
                       f"{_did_you_mean(kw['mutual_information'], MI_KINDS)}")
    if "min_diff_from_avg" in kw:
        v = _float32(kw["min_diff_from_avg"])
        if v is None or v < 0:
            out.add(where, f"'min_diff_from_avg' must be a number >= 0 (records a term's count in a class must differ "
                           f"from its expected count to add information), found {show_value(kw['min_diff_from_avg'])}")
        kw["min_diff_from_avg"] = v


#: Transforms that take a list per record (a path through ``[]``, ``[keys]``) with ``max_len``.
#: Categorical ones first, as messages list them.
_LIST_TRANSFORMS = tuple(sorted((t for t in TRANSFORMS if transforms.get(t).list_capable),
                                key=lambda t: transforms.get(t).numeric))


def single_path_problem(path: str, who: str) -> str | None:
    """Why ``path`` cannot be read by ``who`` (which takes one value per record), or None."""
    try:
        steps = parse_path(path)
    except PathError as e:
        return str(e)
    if any(map(is_list_step, steps)):
        return (f"{who} takes one value per record, but source {path!r} steps through a list or map ([] or [keys]); "
                f"read one value, e.g. {one_value_path(path)!r} (an item by its index, a map's value by its key)")
    return None


def _check_paths(where: str, transform: str, kw: dict[str, Any], out: _Problems) -> None:
    """The source paths' syntax, and that a path yielding a list feeds a transform that takes one."""
    t = transforms.get(transform)
    if t.reads_sources:
        for src in kw.get("sources") or ():
            problem = single_path_problem(src, f"transform {transform!r}")
            if problem:
                out.add(where, problem)
        return
    if isinstance(kw.get("key"), str) and kw["key"]:
        problem = single_path_problem(kw["key"], f"'key' of transform {transform!r}")
        if problem:
            out.add(where, problem)
    try:
        steps = parse_path(kw["source"])
    except PathError as e:
        out.add(where, f"'source': {e}")
        return
    if not any(map(is_list_step, steps)) or t.counts_items:
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


def _fill_problem(transform: str, fill: Any) -> str | None:
    """Why ``transform`` cannot fill with the statistic ``fill`` names (``Transform.fill_names``)."""
    if not isinstance(fill, str) or fill in getattr(transforms.get(transform), "fill_names", ()):
        return None
    takers = [t for t in TRANSFORMS if "fill" in _takes(t) and fill in getattr(transforms.get(t), "fill_names", ())]
    why = (f" (the only transform{'s' if len(takers) > 1 else ''} keeping a quantile sketch of the training split, "
           f"which gives the median)" if fill == "median" else "")
    names = " or ".join(repr(n) for n in getattr(transforms.get(transform), "fill_names", ()))
    return (f"'fill: {fill}' applies to transform{'s' if len(takers) > 1 else ''} {' / '.join(takers)}{why}; "
            f"transform {transform!r} fills a missing value with {names} or a number")


def _complete(where: str, transform: str, kw: dict[str, Any], out: _Problems) -> None:
    """What ``transform`` needs (required options) and its defaults, filled into ``kw``
    (``Transform.complete``)."""
    transforms.get(transform).complete(kw, lambda problem: out.add(where, problem))


def _parse_feature(i: int, raw: Any, src: str, out: _Problems) -> FeatureConfig | None:
    """Feature ``i``, or None after adding each of its problems to ``out``."""
    where = f"{src}: features[{i}]"
    if isinstance(raw, str):
        out.add(where, f"expected a mapping like {{name: {show_value(raw)}, transform: zscore}}, found the string {show_value(raw)}")
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
        out.add(where, f"transform {show_value(transform)} is not one of {', '.join(TRANSFORMS)}"
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
    full = set(_FEATURE_KEYS) - {"allow_all_missing", "allow_label_source", "drift", "length", "length_of",
                                 *_KEYED_KEYS, *OPTIONAL_DEFAULTS} <= set(raw)
    deferred: dict[str, Any] = {}
    if transform is not None:
        not_taken = [k for k in kw if k not in _takes(transform)]
        for key in not_taken:
            deferred[key] = kw.pop(key)
        if not_taken and not full:
            out.add(where, _not_taken(transform, not_taken))
            deferred = {}
    if full and transform is not None and "fill" in kw:  # the normalized form's spelling (``Config.to_json``)
        kw["fill"] = named_fill(transform, kw["fill"])
    _check_values(where, kw, out, transforms.get(transform).part_choices if transform is not None else TIMESTAMP_PARTS)
    if transform is not None:
        problem = _fill_problem(transform, kw.get("fill")) if "fill" in kw else None
        if problem:
            out.add(where, problem)
        transforms.get(transform).check_options(kw, lambda problem: out.add(where, problem))
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
        out.add(where, f"unknown option(s) {show_value(sorted(extra))}{hints}; allowed: {', '.join(_LABEL_KEYS)}")
    transform = lraw.get("transform")
    if transform is not None and transform not in LABEL_TRANSFORMS:
        out.add(where, f"transform must be vocabulary (class names -> ids 0..K-1), found {show_value(transform)}"
                       f"{_did_you_mean(transform, ('vocabulary',))}; leave it out for a numeric label")
    dtype = lraw.get("dtype", "int64")
    if dtype not in LABEL_DTYPES:
        hint = _did_you_mean(dtype, LABEL_DTYPES)
        if isinstance(dtype, str) and dtype.lower() in ("string", "str", "bytes", "category", "categorical", "vocabulary"):
            hint = "; for class names use transform: vocabulary (ids 0..K-1, int64)"
        out.add(where, f"dtype must be int64 or float32, found {show_value(dtype)}{hint}")
    elif transform in LABEL_TRANSFORMS and dtype != "int64":
        out.add(where, f"a vocabulary label's class ids are int64, found dtype {show_value(dtype)}; leave dtype out")
    lname = lraw.get("name") or lraw["source"].replace(".", "_")
    problem = single_path_problem(lraw["source"], f"the label {lname!r}" if isinstance(lname, str) else "the label")
    if problem:
        out.add(where, problem)
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
        out.add(source, f"unknown top-level key(s) {show_value(sorted(unknown))}{hints}; allowed: features, label, drift")
    drift = _drift_thresholds(raw["drift"]) if raw.get("drift") is not None else None
    if raw.get("drift") is not None and drift is None:
        out.add(source, _DRIFT_PROBLEM.format(found=show_value(raw["drift"])))
    feats_raw = raw.get("features")
    features: list[FeatureConfig | None] = []
    if not isinstance(feats_raw, list) or not feats_raw:
        out.add(source, "'features' must be a non-empty list of feature entries")
    else:
        features = [_parse_feature(i, f, source, out) for i, f in enumerate(feats_raw)]
    label = _parse_label(raw["label"], source, out) if raw.get("label") is not None else None
    cfg = Config(features=tuple(f for f in features if f is not None), label=label, drift=drift)
    _check_label_leak(cfg, source, out)
    for f in cfg.features:
        for problem in transforms.transform_of(f).config_problems(f, label):
            out.add(source, problem)
    _check_lengths(cfg, source, out)
    seen: set[str] = set()
    for n in cfg.output_names:
        if n in seen:
            out.add(source, f"output feature {n!r} is produced twice (derived names are "
                            f"'<name>_len', '<name>_missing' and a transform's own, such as '<name>_weights'); rename one feature")
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
    """A feature whose path overlaps the label's (``paths_overlap``: ``y`` or ``y[]`` and the
    label ``y[0]``, ``user`` and ``user.segment``, either way round) would hold the label's
    values, so the model would see the answer: refused unless the feature sets
    ``allow_label_source``. Its ``source``, a ``cross``'s ``sources`` and a ``zscore_per_key``'s
    ``key`` are all checked. Paths that do not parse are left to the checks that report them."""
    if cfg.label is None:
        return
    try:
        label = parse_path(cfg.label.source)
    except PathError:
        return
    for f in cfg.features:
        if f.allow_label_source:
            continue
        paths = [("sources" if f.sources else "source", p) for p in (f.sources or (f.source,))]
        paths += [("key", f.key)] if f.key else []
        for kind, path in paths:
            how = _leak(f, kind, path, label)
            if how:
                which = f"one of its sources {path!r}" if kind == "sources" else f"its {kind} {path!r}"
                out.add(f"{source}: feature {f.name!r}",
                        f"{which} {how} the label's source {cfg.label.source!r}, so the feature "
                        f"would hold the label's values and the model would see the answer; drop the feature "
                        f"or pick another source (or set allow_label_source: true on the feature where this "
                        f"is intended, e.g. a baseline)")
                break


def _leak(f: FeatureConfig, kind: str, path: str, label: tuple[Any, ...]) -> str | None:
    """``label_leak`` of one of ``f``'s paths (``kind`` saying which); None where it does not parse."""
    try:
        steps = parse_path(path)
    except PathError:
        return None
    return label_leak(steps, label, counts_items=kind == "source" and transforms.transform_of(f).counts_items)


def label_leak(steps: Sequence[Step], label: Sequence[Step], counts_items: bool = False) -> str | None:
    """How a feature reading the parsed path ``steps`` reaches the values of the label at
    ``label`` ("is", "holds", "reads inside", "may read the same value as"), or None where it
    does not. ``counts_items``: the feature counts the items at ``steps`` (``count``).

    A path that reads only the lengths or the keys of a list, map or record that holds the
    label (a ``count`` of ``y`` or ``user``, a ``m[keys]`` path, beside the label ``y[0]``,
    ``user.segment``, ``m["k"]``) is no leak: it reads none of the label's values, and the
    label's presence it implies is the same in every record written, since a record without
    a label is rejected. The counted or keyed container must lie strictly above the label: a
    ``count`` of the label's own path reads the label. ``recordprep infer`` leaves out of its
    draft what this refuses."""
    steps, label = tuple(steps), tuple(label)
    if not paths_overlap(steps, label):
        return None
    container = None
    if counts_items:
        container = steps[:-1] if is_list_step(steps[-1]) else steps
    elif steps[-1] is KEYS:
        container = steps[:-1]
    if container is not None and len(container) < len(label):
        return None
    if steps == label:
        return "is"
    if len(steps) < len(label):
        return "holds"
    return "reads inside" if len(steps) > len(label) else "may read the same value as"


def _item_list(path: str) -> tuple[Any, ...] | None:
    """The list whose items ``path`` reads one value each of (the steps up to its last ``[]``,
    below it only field names: ``items[].price``), or None for another kind of path."""
    steps = parse_path(path)
    last = max((k for k, x in enumerate(steps) if is_list_step(x)), default=None)
    if last is None or steps[last] is not EACH or not all(isinstance(x, str) for x in steps[last + 1:]):
        return None
    return steps[: last + 1]


def _check_lengths(cfg: Config, source: str, out: _Problems) -> None:
    """``length: false`` only on lists; ``length_of`` only naming a numeric list feature that
    writes its own ``<name>_len``, of the same list (one value per item, the same ``max_len``),
    so that the two lengths are equal in every record and the shared column is exact."""
    by_name = {f.name: f for f in cfg.features}
    for f in cfg.features:
        where = f"{source}: feature {f.name!r}"
        if not f.length and not f.multi_valued:
            out.add(where, "'length: false' leaves out <name>_len, which only lists (max_len) write; remove it")
        if f.length_of is None:
            continue
        other = by_name.get(f.length_of)
        why = None
        if not f.multi_valued:
            why = "only a list (max_len) has a length to share; remove length_of or set max_len"
        elif other is None:
            why = f"no feature is named {f.length_of!r}{_did_you_mean(f.length_of, list(by_name))}"
        elif other is f:
            why = "a feature cannot share its own length; remove length_of to write <name>_len"
        elif not (other.is_numeric and other.multi_valued):
            why = (f"{other.name!r} is not a numeric list (identity, log1p or clip with max_len); only those count "
                   f"every item, null ones too, as this feature does")
        elif other.length_of is not None:
            why = f"{other.name!r} shares the length of {other.length_of!r} itself: name {other.length_of!r}"
        elif other.max_len != f.max_len:
            why = (f"{other.name!r} keeps max_len {other.max_len} items, this feature {f.max_len}: the lengths "
                   f"differ past the smaller; give both the same max_len")
        elif f.source != other.source and (_item_list(f.source) is None or _item_list(f.source) != _item_list(other.source)):
            why = (f"sources {f.source!r} and {other.source!r} are not fields of the items of one list "
                   f"(items[].a and items[].b), so their lengths may differ; remove length_of")
        if why:
            out.add(where, f"length_of: {why}")
