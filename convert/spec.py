"""The on-disk contract between the converter and the readers.

A finished output directory holds sharded TFRecord files of ``tf.train.Example``
(``{split}-{i:05d}-of-{n:05d}-{run_id}.tfrecord[.gz]``), vocabulary files, the error
output, and ``dataset_info.json``. The metadata file is written last and
atomically, so *its presence means the output is complete*: readers refuse a
directory without it and never glob for shards, they take the shard list from
here.

This module is pure Python (no Beam, no TensorFlow) so that both sides, and
tools such as ``recordprep inspect``, share one definition.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
from collections.abc import Mapping
from typing import Any

# The check of a feature's statistics and its helpers, importable from here as before.
from convert.feature_stats import is_count, short_repr, statistics_problems

#: Newest metadata version this code reads and writes; every new output, of
#: either layout, is written with it. 1: one Feature per column. 2: adds
#: ``layout`` (``"packed"`` outputs were version 2, so that older readers
#: refuse them with "upgrade recordprep" instead of failing to parse). 3:
#: ``hash``/``cross``/OOV ids are FarmHash fingerprints and text tokens are
#: ASCII-defined (``convert.records.hash_id``, ``tokenize``), both computable
#: in a TensorFlow graph. Readers train on versions 1..3 alike.
FORMAT_VERSION = 3
#: Oldest version a serving model may be exported from: older outputs hashed
#: with BLAKE2b and tokenized with Python's Unicode tables, which TensorFlow
#: cannot reproduce; re-convert them with this recordprep to export.
SERVING_MIN_FORMAT_VERSION = 3
METADATA_FILENAME = "dataset_info.json"

#: The smallest normal double.
F64_TINY = sys.float_info.min


def daz(x: float) -> float:
    """``x``, or zero of its sign below the smallest normal double: how TensorFlow's CPU
    kernels read a subnormal operand (denormals-are-zero). Numeric inputs, the statistics
    a transform uses and the config's constants are read this way, so the converter
    computes what the serving layer computes."""
    return math.copysign(0.0, x) if abs(x) < F64_TINY else x

#: Written instead of the metadata by a run that failed (``{"reason": ..., "counts": ...}``);
#: removed when a later run starts, so waiters do not see an old failure.
FAILURE_FILENAME = "_FAILURE.json"

#: Most values one feature holds in an Example (``max_len`` in the config, the
#: flattened ``shape`` in the metadata). A reader allocates batch x this per
#: feature, so a config or a tampered metadata file must not ask for more.
MAX_FEATURE_SIZE = 65_536
#: Most shards per split; more would be files of a few records each, and a
#: listing or commit of that many objects is itself the bottleneck.
MAX_SHARDS = 100_000
#: Most features one dataset lists: one per field of schemas with thousands of
#: fields, plus their aux features, stays far below; a reader builds a parse
#: spec entry and a tensor per feature.
MAX_FEATURES = 100_000
#: Most dimensions of a feature's shape (the converter writes 1-D shapes).
MAX_RANK = 8
#: Largest ``vocab_size`` in a feature's params: ids stay exact in int64 and in
#: float64 (how many JSON readers parse numbers); the config's bucket and
#: vocabulary limits (``convert.config``) are below it.
MAX_VOCAB_SIZE = 2**53
#: Deepest nesting of JSON arrays/objects accepted in the metadata. What the
#: converter writes nests a few levels (the config, per-file counts); a deeper
#: document would make every recursive walk (copying, dumping) hit Python's
#: recursion limit.
MAX_METADATA_DEPTH = 64
#: Longest file name inside an output, in characters: far above what the
#: converter writes (``vocab/<feature>.txt``), below every OS's PATH_MAX.
MAX_NAME_LENGTH = 1024
#: Longest path component in UTF-8 bytes: what ext4, XFS, APFS and NTFS accept.
MAX_NAME_COMPONENT_BYTES = 255

#: Example dtypes a feature can have on disk; they map 1:1 to the three
#: ``tf.train.Feature`` lists (float_list, int64_list, bytes_list).
#: Class names of a vocabulary label (``params["classes"]``), kept in the
#: metadata for the model's output layer: a list this long is not a class label.
MAX_LABEL_CLASSES = 100_000
#: Characters of one class name in the metadata.
MAX_CLASS_CHARS = 10_000
DTYPES = ("float32", "int64", "string")


class SpecError(ValueError):
    """The metadata is missing, malformed, or from an unsupported version."""


class MetadataNotJSONError(SpecError):
    """The metadata file is not valid JSON: damaged, or being replaced right now (waiters retry)."""


_short = short_repr


def name_problem(name: Any, *, plain: bool = False) -> str | None:
    """Why ``name`` cannot be a file inside an output directory, or None if it can.

    Allowed: a plain file name, or (unless ``plain``) a relative POSIX path
    strictly under the output, written normalized: no leading ``/``, no empty,
    ``.`` or ``..`` component, no scheme or drive (``:``), no backslash, no
    control character (NUL included), valid UTF-8, at most
    ``MAX_NAME_LENGTH`` characters and ``MAX_NAME_COMPONENT_BYTES`` per
    component.
    """
    if not isinstance(name, str):
        return f"is of type {type(name).__name__}, not a string"
    if not name:
        return "is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"is longer than {MAX_NAME_LENGTH} characters"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "contains a control character"
    if "\\" in name:
        return "contains a backslash"
    if ":" in name:
        return "contains ':' (a URL scheme or a drive)"
    if name.startswith("/"):
        return "is an absolute path"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    parts = name.split("/")
    if ".." in parts:
        return "has a '..' component"
    if plain and len(parts) > 1:
        return "contains '/'"
    if "" in parts or "." in parts:
        return "is not normalized (an empty or '.' component)"
    if any(len(p.encode("utf-8")) > MAX_NAME_COMPONENT_BYTES for p in parts):
        return f"has a component longer than {MAX_NAME_COMPONENT_BYTES} bytes"
    return None


def check_name(name: Any, where: str, *, plain: bool = False) -> str:
    """Return ``name`` if it names a file strictly inside an output directory, else raise SpecError.

    Every file name the metadata lists (shards, vocabularies, error files, the
    analysis) goes through here when it is loaded, so no reader, staging copy
    or ``verify`` ever touches a path outside the output; the converter can
    check the names it writes the same way. ``plain`` (shards): a bare file
    name, no ``/``. ``where`` names the entry, e.g.
    ``"dataset_info.json: split 'train' shard 3"``.
    """
    problem = name_problem(name, plain=plain)
    if problem is not None:
        kind = "a plain file name" if plain else "a plain file name or a relative path"
        raise SpecError(f"{where}: file {_short(name)} must be {kind} inside the output; it {problem}")
    return name


def _default_fits(default: Any, dtype: str, size: int) -> bool:
    """Whether a feature's default can be parsed as its dtype and broadcast to its shape."""
    scalar = str if dtype == "string" else (int, float)
    if default is None or isinstance(default, scalar):
        return True
    return (isinstance(default, list | tuple) and len(default) in (1, size)
            and all(isinstance(v, scalar) for v in default))


def _depth_problem(doc: Any) -> bool:
    """Whether ``doc`` nests arrays/objects deeper than ``MAX_METADATA_DEPTH`` (iterative walk)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_METADATA_DEPTH:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def _count(value: Any, where: str) -> int:
    if not is_count(value):
        raise SpecError(f"{where} must be a non-negative integer, found {_short(value)}; re-run the conversion")
    return value


#: How features are laid out in each Example. ``"features"``: one Feature per
#: column (what ``tf.io.parse_example`` users expect). ``"packed"``: every
#: float32 column concatenated into one float_list Feature and every int64
#: column into one int64_list Feature (keys ``PACKED_KEYS``; string columns
#: keep their own Feature); readers slice them back. Parsing then handles two
#: Features instead of dozens: much cheaper to parse, and smaller records
#: (docs/benchmarks.md#design-converter).
LAYOUTS = ("features", "packed")
#: Packed Feature keys; ':' cannot appear in a configured feature name.
PACKED_KEYS = {"float32": "recordprep:float32", "int64": "recordprep:int64"}


def packed_slices(features: Any) -> dict[str, list[tuple[str, int, int]]]:
    """Where each float32/int64 feature sits in its packed Feature.

    ``{dtype: [(name, offset, width), ...]}`` in the metadata's feature order,
    width = the feature's flattened size. The one definition both the
    converter and the readers use.
    """
    out: dict[str, list[tuple[str, int, int]]] = {"float32": [], "int64": []}
    offsets = {"float32": 0, "int64": 0}
    for f in features:
        if f.dtype in out:
            out[f.dtype].append((f.name, offsets[f.dtype], f.size))
            offsets[f.dtype] += f.size
    return out


#: How a model consumes a feature (``FeatureSpec.encoding``):
#: ``embedding``: an int64 id ``0..vocab_size-1`` (0 = missing), for an embedding;
#: ``tokens``: int64 ids padded with 0 (``vocab_size`` in params), for a mean of their embeddings over the non-zero ids;
#: ``weighted_tokens``: ``tokens`` weighted by the float32s of the feature its params' ``weights`` names, position for
#: position (bag of words' counts, tf-idf), for a weighted mean; ``scaled``: float32 scaled by the training split to
#: about unit range, taken as it is; ``indicator``: int64 0/1 (a missing indicator), taken as a float;
#: ``raw``: written as the input had it (identity, clip, log1p, bytes; a timestamp or count of an older
#: output), not fit for direct input: scale it in the model or pick a scaling transform;
#: ``aux``: a helper column another feature's encoding uses (a list's length ``<name>_len``, whose params' ``of``
#: names its list and ``shared_by`` the numeric lists of the same items whose length it holds too, their params'
#: ``length_of``; a list of ids with ``length: false`` has none, the count of its non-zero ids being its length;
#: the weights of ``weighted_tokens``, whose params' ``of`` names their ids); ``label``: the label.
ENCODINGS = ("embedding", "tokens", "weighted_tokens", "scaled", "indicator", "raw", "aux", "label")
#: Float transforms scaled by the training split, for metadata without ``encoding`` (``Transform.encoding``).
SCALED_TRANSFORMS = ("zscore", "minmax", "timestamp", "count")
#: The encoding of a helper column by its spec's ``transform`` (no transform of a config's: its kind of column).
_AUX_ENCODINGS = {"missing_indicator": "indicator", "length": "aux"}


def derived_encoding(spec: FeatureSpec) -> str:
    """The encoding a feature's role, dtype, transform and params imply: what the converter
    writes, and the reading of metadata written before ``encoding`` existed (where a
    timestamp or a count was int64 as the input had it: ``raw``)."""
    if spec.role == "label":
        return "label"
    if spec.transform in _AUX_ENCODINGS:
        return _AUX_ENCODINGS[spec.transform]
    if spec.dtype == "int64" and spec.params.get("vocab_size"):
        return "tokens" if spec.size > 1 else "embedding"
    if spec.dtype == "float32" and spec.transform in SCALED_TRANSFORMS:
        return "scaled"
    return "raw"


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One feature as it is stored in every Example.

    Every feature has a fixed shape, so readers parse it with
    ``tf.io.FixedLenFeature(shape, dtype, default)`` and no string work.

    Attributes:
      name: key in the Example.
      dtype: one of ``DTYPES``.
      shape: fixed shape. Scalars are stored with shape ``(1,)`` so that every
        parsed tensor is at least 2-D after batching and concatenates directly.
      default: value used by the parser if the key were absent (the converter
        always writes every key; the default documents the fill value).
      source: dotted path of the input field it came from.
      transform: name of the transform that produced it.
      params: transform parameters and what the analysis found (e.g. mean/std,
        vocabulary file and size), enough to rebuild the mapping.
      role: ``"feature"``, ``"label"`` or ``"aux"`` (derived features such as
        lengths and missing indicators).
      encoding: how a model consumes it, one of ``ENCODINGS``, written for every
        feature so that any reader of the metadata (not only this package) can
        build a model from it; metadata without it (older outputs) reads as
        ``derived_encoding``'s.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    default: Any = None
    source: str | None = None
    transform: str = "identity"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    role: str = "feature"
    encoding: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"feature name {_short(self.name)} must be a non-empty string")
        where = f"feature {_short(self.name)}"
        if self.dtype not in DTYPES:
            raise SpecError(f"{where}: dtype {_short(self.dtype)} is not one of {DTYPES}")
        if not isinstance(self.shape, list | tuple) or len(self.shape) > MAX_RANK or any(
            isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in self.shape
        ):
            raise SpecError(
                f"{where}: shape {_short(self.shape)} must be a list of at most {MAX_RANK} integers >= 1"
            )
        object.__setattr__(self, "shape", tuple(self.shape))
        if self.size > MAX_FEATURE_SIZE:
            raise SpecError(
                f"{where}: shape {list(self.shape)} holds {self.size} values per record, more than "
                f"the {MAX_FEATURE_SIZE} a feature may hold (MAX_FEATURE_SIZE)"
            )
        for field in ("transform", "role"):
            if not isinstance(getattr(self, field), str):
                raise SpecError(f"{where}: {field} {_short(getattr(self, field))} must be a string")
        if self.source is not None and not isinstance(self.source, str):
            raise SpecError(f"{where}: source {_short(self.source)} must be a string or null")
        if not isinstance(self.params, Mapping):
            raise SpecError(f"{where}: params must be an object, found {type(self.params).__name__}")
        if not _default_fits(self.default, self.dtype, self.size):
            raise SpecError(
                f"{where}: default {_short(self.default)} must be null, one {self.dtype} value or a "
                f"flat list of {self.size} of them"
            )
        vocab_size = self.params.get("vocab_size")
        if vocab_size is not None and (
            isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 1 <= vocab_size <= MAX_VOCAB_SIZE
        ):
            raise SpecError(f"{where}: vocab_size {_short(vocab_size)} must be an integer in 1..{MAX_VOCAB_SIZE}")
        if "vocabulary_file" in self.params:
            check_name(self.params["vocabulary_file"], f"{where}: vocabulary_file")
        if "classes" in self.params:
            _check_classes(self, where)
        stats = self.params.get("stats")
        if stats is not None:
            if not isinstance(stats, Mapping):
                raise SpecError(f"{where}: params.stats must be an object, found {_short(stats)}")
            problems = statistics_problems(self.name, stats)
            if problems:
                raise SpecError(f"{where}: {'; '.join(problems)}; re-run the conversion")
        if self.encoding is None:
            object.__setattr__(self, "encoding", derived_encoding(self))
        elif self.encoding not in ENCODINGS:
            raise SpecError(f"{where}: encoding {_short(self.encoding)} is not one of {ENCODINGS}; "
                            f"upgrade recordprep to read it")

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shape"] = list(self.shape)
        d["params"] = dict(self.params)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FeatureSpec:
        """Raises SpecError when a field is missing or has the wrong type or range."""
        if not isinstance(d, Mapping):
            raise SpecError(f"a feature must be an object, found {type(d).__name__}")
        missing = [k for k in ("name", "dtype", "shape") if k not in d]
        if missing:
            raise SpecError(f"feature {_short(d.get('name'))} has no {', '.join(missing)}")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def _check_classes(spec: FeatureSpec, where: str) -> None:
    """``params["classes"]`` (a vocabulary label's class names, id = position):
    on the label only, distinct strings, as many as ``vocab_size`` says."""
    classes = spec.params["classes"]
    if spec.role != "label" or spec.dtype != "int64":
        raise SpecError(f"{where}: only an int64 label has classes (role {_short(spec.role)}, dtype {spec.dtype})")
    if not isinstance(classes, list) or not 1 <= len(classes) <= MAX_LABEL_CLASSES:
        raise SpecError(f"{where}: classes must be a list of 1..{MAX_LABEL_CLASSES} class names, "
                        f"found {_short(classes)}")
    for i, c in enumerate(classes):
        if not isinstance(c, str) or len(c) > MAX_CLASS_CHARS:
            raise SpecError(f"{where}: classes[{i}] {_short(c)} must be a string of at most {MAX_CLASS_CHARS} characters")
    if len(set(classes)) != len(classes):
        raise SpecError(f"{where}: classes repeat a name; each class id needs its own")
    if spec.params.get("vocab_size") != len(classes):
        raise SpecError(f"{where}: vocab_size {_short(spec.params.get('vocab_size'))} is not the "
                        f"{len(classes)} classes listed")


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One TFRecord file: its name relative to the output directory."""

    file: str
    num_records: int
    num_bytes: int


@dataclasses.dataclass(frozen=True)
class SplitInfo:
    name: str
    shards: tuple[ShardInfo, ...]

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """Typed view of ``dataset_info.json``.

    ``extra`` keeps every other top-level key (config, inputs, statistics,
    counts, ...) untouched so tools can show them without this class having
    to model each one.
    """

    format_version: int
    features: tuple[FeatureSpec, ...]
    label_key: str | None
    compression: str  # "NONE" or "GZIP"
    splits: Mapping[str, SplitInfo]
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    layout: str = "features"

    @functools.cached_property
    def packing(self) -> dict[str, list[tuple[str, int, int]]] | None:
        """:func:`packed_slices` of the features for the ``packed`` layout, else None."""
        return packed_slices(self.features) if self.layout == "packed" else None

    @property
    def order(self) -> str:
        """``"shuffled"`` (each shard a uniform random sample of its split, records
        in random order) or ``"input"`` (each shard a range of the input, in
        input order: ``--no-shuffle``, and every output without ``shuffle``
        in its metadata, which older versions wrote)."""
        shuffle = self.extra.get("shuffle")
        return shuffle["order"] if isinstance(shuffle, Mapping) else "input"

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(
            f"no feature {name!r} in this dataset; it has: {', '.join(f.name for f in self.features)}"
        )

    @property
    def label_classes(self) -> tuple[str, ...] | None:
        """The label's class names when it is a vocabulary label (``label:
        {transform: vocabulary}``): class id ``i`` is ``label_classes[i]``, ids
        ``0..K-1`` as Keras' ``SparseCategoricalCrossentropy`` expects; else None."""
        if self.label_key is None:
            return None
        spec = next((f for f in self.features if f.name == self.label_key), None)
        classes = spec.params.get("classes") if spec is not None else None
        return tuple(classes) if classes is not None else None

    def split(self, name: str) -> SplitInfo:
        try:
            return self.splits[name]
        except KeyError:
            raise KeyError(
                f"no split {name!r} in this dataset; it has: {', '.join(self.splits)}"
            ) from None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format_version": self.format_version,
            "label_key": self.label_key,
            "compression": self.compression,
            **({"layout": self.layout} if self.layout != "features" else {}),
            "features": [f.to_json() for f in self.features],
            "splits": {
                name: {
                    "num_records": s.num_records,
                    "num_bytes": s.num_bytes,
                    "shards": [dataclasses.asdict(sh) for sh in s.shards],
                }
                for name, s in self.splits.items()
            },
        }
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False, default=str) + "\n"

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "dataset_info.json") -> DatasetInfo:
        """The typed view of a decoded ``dataset_info.json``; every field is validated.

        Raises SpecError naming the entry for anything a converter does not
        write: wrong types, shapes beyond ``MAX_FEATURE_SIZE``, negative
        counts, and file names outside the output (:func:`check_name`).
        """
        if not isinstance(d, Mapping):
            raise SpecError(f"{source}: expected a JSON object, found {type(d).__name__}")
        version = d.get("format_version")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise SpecError(f"{source}: no integer 'format_version' >= 1; is this a recordprep output?")
        if version > FORMAT_VERSION:
            raise SpecError(
                f"{source}: format_version {version} is newer than this recordprep understands "
                f"({FORMAT_VERSION}); upgrade recordprep to read it"
            )
        if _depth_problem(d):
            raise SpecError(f"{source}: nested too deeply (more than {MAX_METADATA_DEPTH} levels); "
                            f"this is not metadata recordprep wrote, re-run the conversion")
        features = _features_from_json(d.get("features"), source)
        splits = _splits_from_json(d.get("splits"), source)
        compression = d.get("compression", "NONE")
        if compression not in ("NONE", "GZIP"):
            raise SpecError(f"{source}: compression {_short(compression)} is not NONE or GZIP")
        layout = d.get("layout", "features")
        if layout not in LAYOUTS:
            raise SpecError(f"{source}: layout {_short(layout)} is not one of {LAYOUTS}; upgrade recordprep to read it")
        label_key = d.get("label_key")
        if label_key is not None and not isinstance(label_key, str):
            raise SpecError(f"{source}: label_key {_short(label_key)} must be a string or null")
        _check_listed_files(d, source)
        _check_counts(d, splits, source)
        _check_vocabulary_sizes(features, d.get("vocabularies", {}), source)
        _check_shuffle(d.get("shuffle"), source)
        core = {"format_version", "features", "label_key", "compression", "splits", "layout"}
        return cls(
            format_version=version,
            features=features,
            label_key=label_key,
            compression=compression,
            splits=splits,
            extra={k: v for k, v in d.items() if k not in core},
            layout=layout,
        )

    @classmethod
    def loads(cls, text: str | bytes, *, source: str = "dataset_info.json") -> DatasetInfo:
        try:
            d = json.loads(text)
        except RecursionError:
            raise SpecError(f"{source}: nested too deeply to parse; this is not metadata recordprep "
                            f"wrote, re-run the conversion") from None
        except ValueError as e:
            raise MetadataNotJSONError(
                f"{source}: not valid JSON ({e}); the file is damaged, re-run the conversion"
            ) from e
        return cls.from_json(d, source=source)


def _features_from_json(raw: Any, source: str) -> tuple[FeatureSpec, ...]:
    if not isinstance(raw, list):
        raise SpecError(f"{source}: 'features' must be a list, found {type(raw).__name__}; re-run the conversion")
    if len(raw) > MAX_FEATURES:
        raise SpecError(f"{source}: {len(raw)} features, more than the {MAX_FEATURES} a dataset may have")
    features = []
    for i, f in enumerate(raw):
        try:
            features.append(FeatureSpec.from_json(f))
        except (SpecError, TypeError) as e:  # TypeError: an unexpected argument layout
            raise SpecError(f"{source}: features[{i}]: {e}") from None
    seen: set[str] = set()
    for f in features:
        if f.name in seen:
            raise SpecError(f"{source}: feature {_short(f.name)} is listed twice")
        seen.add(f.name)
    return tuple(features)


def _splits_from_json(raw: Any, source: str) -> dict[str, SplitInfo]:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{source}: 'splits' must be an object of split name -> shards, "
                        f"found {type(raw).__name__}; re-run the conversion")
    splits = {}
    for name, sp in raw.items():
        where = f"{source}: split {_short(name)}"
        if not isinstance(sp, Mapping) or not isinstance(sp.get("shards"), list):
            raise SpecError(f"{where} must be an object with a 'shards' list")
        if len(sp["shards"]) > MAX_SHARDS:
            raise SpecError(f"{where}: {len(sp['shards'])} shards, more than MAX_SHARDS ({MAX_SHARDS})")
        shards = []
        for i, s in enumerate(sp["shards"]):
            at = f"{where} shard {i}"
            if not isinstance(s, Mapping):
                raise SpecError(f"{at} must be an object with file, num_records and num_bytes")
            shards.append(ShardInfo(
                file=check_name(s.get("file"), at, plain=True),
                num_records=_count(s.get("num_records"), f"{at}: num_records"),
                num_bytes=_count(s.get("num_bytes"), f"{at}: num_bytes"),
            ))
        splits[name] = SplitInfo(name=name, shards=tuple(shards))
    _check_shards_listed_once(splits, source)
    return splits


def _check_shards_listed_once(splits: Mapping[str, SplitInfo], source: str) -> None:
    """Every shard file is listed once, in one split: the converter names each shard by its
    split, index and run, so a file listed twice (readers would read its records twice) or
    in two splits (evaluation on training records) is an edited or damaged metadata file."""
    owner: dict[str, str] = {}
    for name, sp in splits.items():
        for shard in sp.shards:
            first = owner.get(shard.file)
            owner[shard.file] = name
            if first is not None:
                where = f"twice in split {_short(name)}" if first == name else \
                    f"in split {_short(first)} and in split {_short(name)}"
                raise SpecError(f"{source}: shard {_short(shard.file)} is listed {where}; readers would read "
                                f"its records twice{'' if first == name else ' (evaluation on training records)'}. "
                                f"The metadata was edited or damaged: re-run the conversion")


def _check_listed_files(d: Mapping[str, Any], source: str) -> None:
    """The other files the metadata names (vocabularies, error files, the analysis) stay inside the output."""
    vocabularies = d.get("vocabularies", {})
    if not isinstance(vocabularies, Mapping):
        raise SpecError(f"{source}: 'vocabularies' must be an object, found {type(vocabularies).__name__}")
    for name, entry in vocabularies.items():
        if not isinstance(entry, Mapping):
            raise SpecError(f"{source}: vocabulary {_short(name)} must be an object with a 'file'")
        check_name(entry.get("file"), f"{source}: vocabulary {_short(name)}")
    errors = d.get("errors", {})
    if not isinstance(errors, Mapping) or not isinstance(errors.get("files", []), list):
        raise SpecError(f"{source}: 'errors' must be an object with a 'files' list")
    for i, entry in enumerate(errors.get("files", [])):
        if not isinstance(entry, Mapping):
            raise SpecError(f"{source}: errors.files[{i}] must be an object with a 'file'")
        check_name(entry.get("file"), f"{source}: errors.files[{i}]")
    if "analysis_file" in d:
        check_name(d["analysis_file"], f"{source}: analysis_file")
    if "stats_file" in d:
        check_name(d["stats_file"], f"{source}: stats_file")


def _check_counts(d: Mapping[str, Any], splits: Mapping[str, SplitInfo], source: str) -> None:
    """Every count is an exact non-negative integer (NaN, infinity, a float, a bool or a
    negative number counts no records), and the counts say what the shards hold: a split's
    ``num_records`` and ``num_bytes`` are its shards' sums, ``counts.read`` the records
    written plus those rejected. Every tool (readers, ``inspect``, ``verify``, ``report``)
    loads the metadata through here; the SpecError names the key."""
    for name, sp in splits.items():
        for key, total in (("num_records", sp.num_records), ("num_bytes", sp.num_bytes)):
            raw = d["splits"][name].get(key, total)
            if _count(raw, f"{source}: splits.{name}.{key}") != total:
                raise SpecError(f"{source}: splits.{name}.{key} is {raw}, its shards hold {total}; the metadata was "
                                "edited or damaged: re-run the conversion")
    counts, errors, stats = d.get("counts", {}), d.get("errors", {}), d.get("statistics", {})
    objects = [("counts", counts), ("statistics", stats)]
    if isinstance(counts, Mapping):
        objects += [(f"counts.{k}", counts.get(k, {})) for k in ("written", "per_file")]
        per_file = objects[-1][1] if isinstance(objects[-1][1], Mapping) else {}  # else refused below
        objects += [(f"counts.per_file[{_short(k)}]", v) for k, v in per_file.items()]
    for key, v in objects:
        if not isinstance(v, Mapping):
            raise SpecError(f"{source}: {key} must be an object, found {_short(v)}; re-run the conversion")
    found = [(f"counts.{k}", counts[k]) for k in ("read", "errors") if k in counts]
    found += [(f"counts.written.{k}", n) for k, n in counts.get("written", {}).items()]
    found += [(f"counts.per_file[{_short(p)}].{k}", n) for p, c in counts.get("per_file", {}).items()
              for k, n in c.items()]
    found += [("errors.count", errors["count"])] if "count" in errors else []
    found += [(f"errors.files[{i}].count", e["count"]) for i, e in enumerate(errors.get("files", [])) if "count" in e]
    found += [(f"vocabularies.{k}.terms", v["terms"]) for k, v in d.get("vocabularies", {}).items() if "terms" in v]
    for key, n in found:
        _count(n, f"{source}: {key}")
    written = sum(counts.get("written", {}).values())
    if {"read", "errors", "written"} <= counts.keys() and counts["read"] != written + counts["errors"]:
        raise SpecError(f"{source}: counts.read is {counts['read']}, but {written} records were written and "
                        f"{counts['errors']} rejected; the metadata was edited or damaged: re-run the conversion")
    for name, st in stats.items():
        problems = statistics_problems(name, st) if isinstance(st, Mapping) else [f"{name!r}: not an object"]
        if problems:
            raise SpecError(f"{source}: statistics: {'; '.join(problems)}; re-run the conversion")


def _check_vocabulary_sizes(features: tuple[FeatureSpec, ...], vocabularies: Mapping[str, Any], source: str) -> None:
    """Each feature's ``vocab_size`` is what its vocabulary's term count (``vocabularies``) gives:
    the terms, plus the padding id and the OOV ids when it has them (``oov_ids``). An edited size
    would give the model an embedding smaller than the ids the shards and the serving layer hold."""
    terms = {v.get("file"): v.get("terms") for v in vocabularies.values()}
    for f in features:
        n = terms.get(f.params.get("vocabulary_file"))
        if isinstance(n, bool) or not isinstance(n, int) or "vocab_size" not in f.params:
            continue
        oov = f.params.get("oov_ids")
        reserved = 1 + len(oov) if isinstance(oov, list) else 0
        if f.params["vocab_size"] != n + reserved:
            extra = f" + {reserved} padding and OOV ids" if reserved else ""
            raise SpecError(f"{source}: feature {_short(f.name)}: vocab_size {f.params['vocab_size']} is not what its "
                            f"vocabulary {f.params['vocabulary_file']} holds ({n} terms{extra}); the metadata was "
                            f"edited or damaged: re-run the conversion")


#: Record orders of an output's shards (``shuffle.order`` in the metadata).
ORDERS = ("shuffled", "input")


def _check_shuffle(shuffle: Any, source: str) -> None:
    """``shuffle``: absent (input order), or ``{"order": "shuffled", "seed": 0..2**63-1}``
    or ``{"order": "input", "seed": null}``."""
    if shuffle is None:
        return
    if not isinstance(shuffle, Mapping) or shuffle.get("order") not in ORDERS:
        raise SpecError(f"{source}: shuffle {_short(shuffle)} must be an object with an 'order' of {ORDERS}; "
                        f"re-run the conversion")
    seed = shuffle.get("seed")
    if shuffle["order"] == "input":
        if seed is not None:
            raise SpecError(f"{source}: shuffle.seed {_short(seed)} must be null for order 'input'")
    elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise SpecError(f"{source}: shuffle.seed {_short(seed)} must be an integer 0 .. 2**63-1")


def shard_name(split: str, index: int, num_shards: int, compression: str, run_id: str = "") -> str:
    """``train-00003-of-00016-<run_id>.tfrecord.gz``: the TFDS/Beam naming, plus the run's id.

    The run id makes every run's shard names its own, so a conversion that
    replaces an output never writes a file under a name a reader of the
    replaced dataset may still open (docs/reading.md#one-dataset-per-reader).
    """
    suffix = ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"
    run = f"-{run_id}" if run_id else ""
    return f"{split}-{index:05d}-of-{num_shards:05d}{run}{suffix}"
