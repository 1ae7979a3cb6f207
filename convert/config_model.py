"""The feature config's model: its limits, the transform table (which options
each transform takes), ``ConfigError`` and the frozen ``FeatureConfig``,
``LabelConfig`` and ``Config`` that ``convert.config`` builds and checks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from convert import transforms

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
#: The statistics a ``fill`` may name (each transform takes those of its ``fill_names``).
FILL_NAMES = ("mean", "median")
LABEL_DTYPES = ("int64", "float32")


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
#: Every transform and its options, a view of ``convert.transforms``' registry (each
#: transform's module holds its own): validation, its error messages and infer's draft
#: read it. An option a transform does not take is an error.
TRANSFORM_TABLE: dict[str, TransformInfo] = {
    t.name: TransformInfo(t.summary, t.options, t.numeric) for t in map(transforms.get, transforms.names())
}
TRANSFORMS = transforms.names()
NUMERIC_TRANSFORMS = tuple(t for t, info in TRANSFORM_TABLE.items() if info.numeric)
#: The transforms a label takes (``LabelConfig.transform``): class names -> ids 0..K-1.
LABEL_TRANSFORMS = ("vocabulary",)


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
        a number, ``"mean"`` (the training mean) or, for transforms keeping a
        quantile sketch (robust_scale), ``"median"``. Default ``"mean"`` for
        zscore/minmax/zscore_per_key, ``"median"`` for robust_scale, else 0.
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
      length: lists of ids (vocabulary, hash, text): ``False`` writes no
        ``{name}_len``, since an item's id is never 0 and the count of
        non-zero ids is the length.
      length_of: numeric lists: the name of another numeric list feature of
        the same list (``items[].a`` and ``items[].b``, same ``max_len``) whose
        ``{length_of}_len`` holds this feature's length too; none of its own
        is written. ``convert.config`` checks that the two lengths are equal
        for every record.
      lowercase: ``text``: lower-case before tokenizing.
      ngram_range: ``ngrams``, ``bag_of_words``, ``tfidf``: ``(min, max)`` sizes of the n-grams of
        tokens that are a document's terms (``(1, 1)``: its tokens).
      separator: the string between the tokens of an n-gram (default ``" "``).
      smooth: ``tfidf``: ``idf = log((N + 1) / (df + 1)) + 1`` (default), else ``log(N / df) + 1``.
      num_buckets: ``bucketize``: buckets cut at training-split quantiles.
      unit: ``timestamp``: unit of epoch numbers (``s, ms, us, ns, days``;
        Avro timestamp-millis is ``ms``, date is ``days``).
      parts: ``timestamp``: calendar parts to add (``hour``, ``day_of_week``, ``month``).
      sources: ``cross``: the fields (dotted paths) crossed together.
      allow_all_missing: accept a training split in which this feature's
        source is missing (null or absent) in every record. Off by default:
        such a run fails, since a misspelled source reads as all-missing.
      allow_label_source: read a path that overlaps the label's (``y`` or ``y[]``
        beside the label ``y[0]``) as an input. Off by default: the label would
        leak into the model's inputs (``convert.config_checks._check_label_leak``).
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
    length: bool = True
    length_of: str | None = None
    ngram_range: tuple[int, int] | None = None
    separator: str = " "
    smooth: bool = True
    #: ``zscore_per_key``: the path of the categorical field whose groups the statistics are taken per.
    key: str | None = None
    #: ``label_vocabulary``: ``adjusted`` (default) or ``plain`` mutual information with the label.
    mutual_information: str | None = None
    #: ``label_vocabulary``: a class's count must differ from its expected count by this much to
    #: add information (None: TF Transform's recommendation for the training split's size).
    min_diff_from_avg: float | None = None
    #: ``(measure, threshold)`` pairs of ``DRIFT_MEASURES`` overriding the
    #: config's top-level ``drift`` for this feature (``recordprep report``).
    drift: tuple[tuple[str, float], ...] | None = None

    @property
    def is_numeric(self) -> bool:
        t = transforms.find(self.transform)
        return t is not None and t.numeric

    @property
    def needs_vocabulary(self) -> bool:
        t = transforms.find(self.transform)
        return t is not None and t.vocabulary

    @property
    def needs_stats(self) -> bool:
        t = transforms.find(self.transform)
        return t is not None and t.numeric and t.needs_stats(self)

    @property
    def multi_valued(self) -> bool:
        return self.max_len is not None

    @property
    def writes_length(self) -> bool:
        """Whether the feature writes its own ``<name>_len`` (a list not sharing another's, length not off)."""
        return self.multi_valued and self.length and self.length_of is None


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
    transform: str | None = None  # or one of LABEL_TRANSFORMS ("vocabulary")

    @property
    def needs_vocabulary(self) -> bool:
        """Whether its classes come from the analysis (``transform: vocabulary``)."""
        return self.transform is not None

    def to_json(self) -> dict[str, Any]:
        """As JSON; ``transform`` only when set, so the hash of a numeric label's config stays the same."""
        d = dataclasses.asdict(self)
        if d["transform"] is None:
            del d["transform"]
        return d


#: Options added after outputs existed, with their defaults: ``Config.to_json`` leaves them
#: out when so, and a normalized config (every other option listed) loads back without them.
OPTIONAL_DEFAULTS: dict[str, Any] = {"ngram_range": None, "separator": " ", "smooth": True}


def spelled_fill(f: FeatureConfig) -> float | str | None:
    """``f.fill`` as the normalized config and the feature spec's params spell it
    (``Transform.fill_spelling``: a named fill whose outputs were written under another name)."""
    if not isinstance(f.fill, str):
        return f.fill
    return getattr(transforms.find(f.transform), "fill_spelling", {}).get(f.fill, f.fill)


def named_fill(transform: str, fill: Any) -> Any:
    """The ``fill`` a normalized config's spelling ``fill`` stands for (``spelled_fill`` undone)."""
    if not isinstance(fill, str):
        return fill
    spelling = getattr(transforms.find(transform), "fill_spelling", {})
    return {v: k for k, v in spelling.items()}.get(fill, fill)


def _feature_json(f: FeatureConfig) -> dict[str, Any]:
    """``f`` as JSON; options added after outputs existed appear only when set,
    so the config hash (and the fingerprint of those outputs) stays the same."""
    d = dataclasses.asdict(f)
    d["fill"] = spelled_fill(f)
    for key in ("allow_all_missing", "allow_label_source"):
        if not d[key]:
            del d[key]
    if d["length"]:
        del d["length"]
    for key in ("length_of", "key", "mutual_information", "min_diff_from_avg"):
        if d[key] is None:
            del d[key]
    for key, default in OPTIONAL_DEFAULTS.items():
        if d[key] == default:
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
            names.extend(transforms.transform_of(f).outputs(f))
            if f.writes_length:
                names.append(f"{f.name}_len")
            if f.missing_indicator:
                names.append(f"{f.name}_missing")
        if self.label:
            names.append(self.label.name)
        return names
