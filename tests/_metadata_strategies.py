"""Hypothesis strategies for file names and ``dataset_info.json`` documents, valid and hostile.

Shared by ``tests/test_readers_hostile_metadata.py`` and the ``metadata`` target of
``tests/fuzz_records.py``. Pure Python (no TensorFlow): the fuzz driver runs under a memory cap.
"""

from __future__ import annotations

import copy
import json

from hypothesis import strategies as st

from convert.spec import (
    MAX_FEATURE_SIZE,
    MAX_NAME_COMPONENT_BYTES,
    MAX_NAME_LENGTH,
    DatasetInfo,
    SpecError,
    name_problem,
)

# One path component a converter could write: letters and digits of any script, and the
# punctuation file names commonly hold; never "." or "..".
_COMPONENT = st.text(
    st.one_of(
        st.characters(categories=("L", "N")),
        st.sampled_from("._-+=,@~ #%&()[]{}'!$"),
    ),
    min_size=1,
    max_size=24,
).filter(lambda c: c not in (".", "..") and len(c.encode("utf-8")) <= MAX_NAME_COMPONENT_BYTES)

plain_names = _COMPONENT
relative_names = st.lists(_COMPONENT, min_size=1, max_size=4).map("/".join)


@st.composite
def _insert(draw, bad: st.SearchStrategy[str]):
    """A valid name with one of ``bad`` inserted at some position."""
    bad = draw(bad)
    name = draw(relative_names)
    i = draw(st.integers(0, len(name)))
    return name[:i] + bad + name[i:]


@st.composite
def _dotdot(draw):
    """``..`` as a component at the start, middle or end of a valid name."""
    parts = draw(st.lists(_COMPONENT, min_size=0, max_size=4))
    parts.insert(draw(st.integers(0, len(parts))), "..")
    return "/".join(parts)


#: Names that must be refused wherever the metadata lists a file.
hostile_names = st.one_of(
    st.sampled_from([
        "", ".", "..", "/", "./x", "x/", "a//b", "x/./y", "../../x.sh", "/abs/path.sh", "/etc/shadow",
        "~/../../x", "C:\\x", "C:x", "\\\\server\\share\\x", "..\\..\\x", "gs://b/x", "file:///etc/passwd",
        "x\x00y", "a/..", "//x", "...//x", "x/../../y",
    ]),
    relative_names.map(lambda n: "/" + n),
    _dotdot(),
    st.tuples(st.sampled_from(["gs", "hdfs", "file", "s3", "http", "viewfs", "x"]), relative_names)
    .map(lambda t: f"{t[0]}://{t[1]}"),
    _insert(st.sampled_from(["\\", "\x00", "\n", "\r", "\x1b", "\x7f", ":", "//", "/./", "/../", "\ud800"])),
    st.text(st.characters(categories=("L",)), min_size=MAX_NAME_COMPONENT_BYTES // 2 + 1, max_size=300)
    .filter(lambda c: len(c.encode("utf-8")) > MAX_NAME_COMPONENT_BYTES),
    st.integers(MAX_NAME_LENGTH // 100 + 1, 20).map(lambda n: "/".join(["a" * 100] * n)),
    st.one_of(st.none(), st.integers(), st.floats(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
              st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2)),
)

#: Names that are hostile only for shards: a relative path with a directory.
nested_names = st.lists(_COMPONENT, min_size=2, max_size=4).map("/".join)


def valid_metadata() -> dict:
    """A small metadata document as the converter writes it (two splits, a vocabulary, a class label, errors)."""
    return {
        "format_version": 1,
        "label_key": "y",
        "compression": "GZIP",
        "features": [
            {"name": "x", "dtype": "float32", "shape": [1], "default": 0.0, "source": "x",
             "transform": "zscore", "params": {"stats": {"mean": 1.0, "std": 2.0}}, "role": "feature"},
            {"name": "tags", "dtype": "int64", "shape": [8], "default": 0, "source": "tags",
             "transform": "vocabulary", "params": {"vocab_size": 12, "vocabulary_file": "vocab/tags.txt",
                                                  "pad_id": 0, "oov_ids": [1]}, "role": "feature"},
            {"name": "y", "dtype": "int64", "shape": [1], "default": 0, "source": "y", "transform": "label",
             "params": {"classes": ["no", "yes"], "vocab_size": 2, "vocabulary_file": "vocab/y.txt"}, "role": "label"},
        ],
        "splits": {
            "train": {"num_records": 30, "num_bytes": 300, "shards": [
                {"file": "train-00000-of-00002.tfrecord.gz", "num_records": 20, "num_bytes": 200},
                {"file": "train-00001-of-00002.tfrecord.gz", "num_records": 10, "num_bytes": 100}]},
            "eval": {"num_records": 5, "num_bytes": 50, "shards": [
                {"file": "eval-00000-of-00001.tfrecord.gz", "num_records": 5, "num_bytes": 50}]},
        },
        "counts": {"read": 36, "errors": 1},
        "errors": {"count": 1, "files": [{"file": "errors/errors-00000-of-00001.jsonl", "count": 1}]},
        "vocabularies": {"tags": {"file": "vocab/tags.txt", "terms": 10}, "y": {"file": "vocab/y.txt", "terms": 2}},
        "statistics": {"x": {"mean": 1.0, "std": 2.0}},
        "analysis_file": "analysis.json",
    }


def _paths(doc, prefix=()):
    """Every (path, value) in ``doc``, containers included."""
    yield prefix, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8,
)

_NAME_SLOTS = [
    ("splits", "train", "shards", 0, "file"),
    ("splits", "eval", "shards", 0, "file"),
    ("vocabularies", "tags", "file"),
    ("errors", "files", 0, "file"),
    ("analysis_file",),
    ("features", 1, "params", "vocabulary_file"),
]

_SHAPES = st.one_of(
    st.lists(st.integers(-3, 2**40), min_size=0, max_size=10),
    st.lists(st.sampled_from([10**9, MAX_FEATURE_SIZE, MAX_FEATURE_SIZE + 1, 2**16, 2**31, 0, -1]), max_size=4),
    _JSON,
)


def _set(doc, path, value):
    """``doc[path] = value`` when the path still exists (an earlier mutation may have replaced it)."""
    try:
        for key in path[:-1]:
            doc = doc[key]
        doc[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass


@st.composite
def metadata_texts(draw) -> str:
    """``dataset_info.json`` text: a valid document with a few hostile mutations, or deeply nested JSON."""
    kind = draw(st.sampled_from(["names", "shapes", "types", "counts", "mixed", "mixed", "deep"]))
    if kind == "deep":
        depth = draw(st.integers(10, 200_000))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        inner = json.dumps(valid_metadata()) if draw(st.booleans()) else "1"
        where = draw(st.sampled_from(["top", "features", "extra"]))
        nested = opener * depth + inner + closer * depth
        if where == "top":
            return nested
        doc = valid_metadata()
        key = "features" if where == "features" else "config"
        return json.dumps(doc)[:-1] + f', "{key}x": 0, "{key}": ' + nested + "}"
    doc = copy.deepcopy(valid_metadata())
    for _ in range(draw(st.integers(1, 3))):
        what = kind if kind != "mixed" else draw(st.sampled_from(["names", "shapes", "types", "counts"]))
        if what == "names":
            _set(doc, draw(st.sampled_from(_NAME_SLOTS)), draw(st.one_of(hostile_names, relative_names)))
        elif what == "shapes":
            _set(doc, ("features", draw(st.integers(0, 2)), "shape"), draw(_SHAPES))
        elif what == "counts":
            shard = draw(st.sampled_from([("splits", "train", "shards", 1), ("splits", "eval", "shards", 0)]))
            key = draw(st.sampled_from(["num_records", "num_bytes"]))
            _set(doc, (*shard, key), draw(st.one_of(st.integers(-(2**70), 2**70), _JSON)))
        else:
            paths = [p for p, _ in _paths(doc) if p]
            _set(doc, draw(st.sampled_from(paths)), draw(_JSON))
    return json.dumps(doc)


def metadata_target(text: str) -> None:
    """The property: metadata text loads into a DatasetInfo that respects every limit, or is a SpecError.

    Anything else (another exception, a RecursionError, a huge allocation under the fuzz
    driver's memory cap) fails it.
    """
    try:
        info = DatasetInfo.loads(text)
    except SpecError:
        return
    for f in info.features:
        assert 1 <= f.size <= MAX_FEATURE_SIZE, f
    for split in info.splits.values():
        for shard in split.shards:
            assert name_problem(shard.file, plain=True) is None, shard
            assert shard.num_records >= 0 and shard.num_bytes >= 0, shard
    listed = [v.get("file") for v in info.extra.get("vocabularies", {}).values()]
    listed += [e.get("file") for e in info.extra.get("errors", {}).get("files", [])]
    listed += [info.extra["analysis_file"]] if "analysis_file" in info.extra else []
    assert all(name_problem(n) is None for n in listed), listed
    assert DatasetInfo.loads(info.dumps()) == info  # what the readers hand to staging reads back
