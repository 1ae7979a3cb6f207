"""Test helpers for the readers suite: small recordprep outputs written with TensorFlow.

Loaded by the ``tests/test_readers_*.py`` files by path (pytest runs in
importlib mode, where test modules cannot import their siblings).

Every record carries its id in the ``count`` feature, so tests can check
exactly which records a pipeline produced. Values are a pure function of the
id (:func:`expected_values`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import tensorflow as tf

from convert.spec import (
    FORMAT_VERSION,
    METADATA_FILENAME,
    DatasetInfo,
    FeatureSpec,
    ShardInfo,
    SplitInfo,
    shard_name,
)

FEATURES = (
    FeatureSpec(
        "num",
        "float32",
        (1,),
        default=0.0,
        source="a.num",
        transform="standardize",
        params={"mean": 1.0, "std": 2.0},
    ),
    FeatureSpec("vec", "float32", (4,), default=0.0, source="a.vec"),
    FeatureSpec("count", "int64", (1,), default=0, source="a.count"),
    FeatureSpec(
        "ids",
        "int64",
        (8,),
        default=0,
        source="a.tags",
        transform="vocabulary",
        params={"vocabulary_file": "vocab/tags.txt", "size": 10, "pad": 0},
    ),
    FeatureSpec("raw", "string", (1,), default="", source="a.raw"),
    FeatureSpec("label", "int64", (1,), default=0, source="y", role="label"),
)

TRAIN_SHARDS = (13, 9, 11, 7)  # 40 records
EVAL_SHARDS = (6, 4)  # 10 records
EVAL_ID_OFFSET = 1000


def expected_values(i: int) -> dict[str, np.ndarray]:
    n_ids = i % 8
    return {
        "num": np.array([i * 0.5], np.float32),
        "vec": np.array([i, i + 0.25, i + 0.5, i + 0.75], np.float32),
        "count": np.array([i], np.int64),
        "ids": np.array([(i % 9) + 1] * n_ids + [0] * (8 - n_ids), np.int64),
        "raw": np.array([f"rec-{i}".encode()], object),
        "label": np.array([i % 3], np.int64),
    }


def example_bytes(i: int) -> bytes:
    feats = {}
    for name, value in expected_values(i).items():
        if value.dtype == np.float32:
            feats[name] = tf.train.Feature(float_list=tf.train.FloatList(value=value.tolist()))
        elif value.dtype == np.int64:
            feats[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=value.tolist()))
        else:
            feats[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=list(value)))
    return tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString()


@dataclasses.dataclass
class Output:
    """A written test output directory."""

    root: Path
    info: DatasetInfo
    ids: dict[str, list[list[int]]]  # split -> shard -> record ids (file order)

    def shard_path(self, split: str, index: int) -> Path:
        return self.root / self.info.splits[split].shards[index].file

    def all_ids(self, split: str) -> list[int]:
        return [i for shard in self.ids[split] for i in shard]


def write_output(
    root: Path,
    splits: Mapping[str, Sequence[int]] | None = None,
    *,
    compression: str = "NONE",
    label_key: str | None = "label",
    format_version: int = FORMAT_VERSION,
    write_metadata: bool = True,
) -> Output:
    """Write shards of ``splits`` (name -> records per shard) and the metadata (last)."""
    splits = splits if splits is not None else {"train": TRAIN_SHARDS, "eval": EVAL_SHARDS}
    root.mkdir(parents=True, exist_ok=True)
    options = tf.io.TFRecordOptions(compression_type="GZIP" if compression == "GZIP" else "")
    split_infos: dict[str, SplitInfo] = {}
    ids: dict[str, list[list[int]]] = {}
    for split_index, (split, sizes) in enumerate(splits.items()):
        next_id = EVAL_ID_OFFSET * split_index
        shards = []
        ids[split] = []
        for shard_index, size in enumerate(sizes):
            name = shard_name(split, shard_index, len(sizes), compression)
            shard_ids = list(range(next_id, next_id + size))
            next_id += size
            with tf.io.TFRecordWriter(str(root / name), options=options) as writer:
                for i in shard_ids:
                    writer.write(example_bytes(i))
            shards.append(
                ShardInfo(file=name, num_records=size, num_bytes=os.path.getsize(root / name))
            )
            ids[split].append(shard_ids)
        split_infos[split] = SplitInfo(name=split, shards=tuple(shards))
    info = DatasetInfo(
        format_version=format_version,
        features=FEATURES,
        label_key=label_key,
        compression=compression,
        splits=split_infos,
        extra={"config": {"test": True}},
    )
    if write_metadata:
        (root / METADATA_FILENAME).write_text(info.dumps())
    return Output(root=root, info=info, ids=ids)


def ids_of(batches: Iterable, *, labelled: bool = True) -> list[int]:
    """Record ids, in order, from a dataset of (features, label) or features batches."""
    out: list[int] = []
    for batch in batches:
        features = batch[0] if labelled else batch
        out.extend(int(v) for v in features["count"].numpy()[:, 0])
    return out


def flip_byte(path: Path, fraction: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * fraction)] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path, size: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:size])


def record_boundary(path: Path, records: int) -> int:
    """Byte offset after ``records`` records of an uncompressed TFRecord file."""
    offset = 0
    data = path.read_bytes()
    for _ in range(records):
        length = int.from_bytes(data[offset : offset + 8], "little")
        offset += 8 + 4 + length + 4
    return offset
