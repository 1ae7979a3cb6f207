"""The on-disk contract between the converter and the readers.

A finished output directory holds sharded TFRecord files of ``tf.train.Example``
(``{split}-{i:05d}-of-{n:05d}.tfrecord[.gz]``), vocabulary files, the error
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
from collections.abc import Mapping
from typing import Any

#: Newest metadata version this code reads and writes. 1: one Feature per
#: column. 2: adds ``layout``; ``"packed"`` outputs are written as version 2 so
#: that older readers refuse them with "upgrade recordprep" instead of failing
#: to parse; ``"features"`` outputs are still written as version 1.
FORMAT_VERSION = 2
METADATA_FILENAME = "dataset_info.json"
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

#: Example dtypes a feature can have on disk; they map 1:1 to the three
#: ``tf.train.Feature`` lists (float_list, int64_list, bytes_list).
DTYPES = ("float32", "int64", "string")


class SpecError(ValueError):
    """The metadata is missing, malformed, or from an unsupported version."""


#: How features are laid out in each Example. ``"features"``: one Feature per
#: column (what ``tf.io.parse_example`` users expect). ``"packed"``: every
#: float32 column concatenated into one float_list Feature and every int64
#: column into one int64_list Feature (keys ``PACKED_KEYS``; string columns
#: keep their own Feature); readers slice them back. Parsing then handles two
#: Features instead of dozens: on the bench's 27 features, 2.9 instead of 23
#: CPU-us per example in ``parse_example`` and 172 instead of 619 bytes per
#: record before compression.
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
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    default: Any = None
    source: str | None = None
    transform: str = "identity"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    role: str = "feature"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SpecError(
                f"feature {self.name!r}: dtype {self.dtype!r} is not one of {DTYPES}"
            )
        if any((not isinstance(d, int)) or d < 0 for d in self.shape):
            raise SpecError(f"feature {self.name!r}: shape {self.shape!r} must be non-negative ints")
        object.__setattr__(self, "shape", tuple(self.shape))

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
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: (tuple(v) if k == "shape" else v) for k, v in d.items() if k in known})


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

    def feature(self, name: str) -> FeatureSpec:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(
            f"no feature {name!r} in this dataset; it has: {', '.join(f.name for f in self.features)}"
        )

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
        if not isinstance(d, Mapping):
            raise SpecError(f"{source}: expected a JSON object, found {type(d).__name__}")
        version = d.get("format_version")
        if not isinstance(version, int):
            raise SpecError(f"{source}: no integer 'format_version'; is this a recordprep output?")
        if version > FORMAT_VERSION:
            raise SpecError(
                f"{source}: format_version {version} is newer than this recordprep understands "
                f"({FORMAT_VERSION}); upgrade recordprep to read it"
            )
        try:
            features = tuple(FeatureSpec.from_json(f) for f in d["features"])
            splits = {
                name: SplitInfo(
                    name=name,
                    shards=tuple(
                        ShardInfo(file=s["file"], num_records=int(s["num_records"]),
                                  num_bytes=int(s["num_bytes"]))
                        for s in sp["shards"]
                    ),
                )
                for name, sp in d["splits"].items()
            }
            compression = d.get("compression", "NONE")
        except (KeyError, TypeError) as e:
            raise SpecError(f"{source}: malformed metadata ({e!r}); re-run the conversion") from e
        if compression not in ("NONE", "GZIP"):
            raise SpecError(f"{source}: compression {compression!r} is not NONE or GZIP")
        layout = d.get("layout", "features")
        if layout not in LAYOUTS:
            raise SpecError(f"{source}: layout {layout!r} is not one of {LAYOUTS}; upgrade recordprep to read it")
        core = {"format_version", "features", "label_key", "compression", "splits", "layout"}
        return cls(
            format_version=version,
            features=features,
            label_key=d.get("label_key"),
            compression=compression,
            splits=splits,
            extra={k: v for k, v in d.items() if k not in core},
            layout=layout,
        )

    @classmethod
    def loads(cls, text: str | bytes, *, source: str = "dataset_info.json") -> DatasetInfo:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise SpecError(f"{source}: not valid JSON ({e}); the file is damaged, re-run the conversion") from e
        return cls.from_json(d, source=source)


def shard_name(split: str, index: int, num_shards: int, compression: str) -> str:
    """``train-00003-of-00016.tfrecord.gz``: the TFDS/Beam naming readers expect."""
    suffix = ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"
    return f"{split}-{index:05d}-of-{num_shards:05d}{suffix}"
