"""Every registered input format (convert.formats) implements the whole
interface, detects its own files (the bundled examples and test data),
reads a small file of the shared test records back through ``iter_batches``
whole and in byte ranges, and converts through the job to the same shards as
every other format.

A format joins the registry with its cases here: ``_SAMPLES`` (its files in
the repository) and ``_WRITERS`` (a small file of ``make_records``); a
registered format without them, or without a hook, fails these tests.
"""

from __future__ import annotations

import glob
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _pipelines_data import CONFIG, SCHEMA, make_records, without_run_id

from convert import formats
from convert.formats import BatchOptions, SourceFormat, format_of
from convert.sources import detect_format, iter_records

ROOT = Path(__file__).resolve().parents[1]

#: Files in the repository that are in each format (globs from the checkout's root).
_SAMPLES = {
    "avro": ["examples/data/*.avro"],
    "json": ["examples/data/*.jsonl"],
    "parquet": ["tests/data/parquet/*.parquet"],
}

#: ``_pipelines_data.SCHEMA`` as Arrow types.
_ARROW = pa.schema([
    pa.field("id", pa.int64(), nullable=False), ("x", pa.float64()), ("color", pa.string()),
    ("tags", pa.list_(pa.string())), ("text", pa.string()), ("user", pa.struct([("name", pa.string())])),
    ("y", pa.int32()),
])


def _avro(path: Path, records: list[dict]) -> None:
    with open(path, "wb") as f:
        fastavro.writer(f, SCHEMA, records, codec="deflate", sync_interval=400)  # several blocks


def _json(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _parquet(path: Path, records: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(records, schema=_ARROW), path, row_group_size=9)  # several row groups


#: How each format's test file of ``make_records`` is written, and the name it gets.
_WRITERS: dict[str, tuple[str, Callable[[Path, list[dict]], None]]] = {
    "avro": ("part.avro", _avro),
    "json": ("part.jsonl", _json),
    "parquet": ("part.parquet", _parquet),
}

_HOOKS = ("detect", "read_schema", "splittable", "iter_batches", "error_position")


def _read(fmt: SourceFormat, f: IO[bytes], path: str, start: int, end: int | None, **kw: Any) -> list[dict]:
    return [dict(r) for batch in fmt.iter_batches(f, path, start, end, BatchOptions(batch_size=7, **kw))
            for r in batch.records]


def test_the_registry_names_each_format_once_with_its_test_cases():
    names = formats.names()
    assert names and len(set(names)) == len(names)
    assert set(names) == set(_SAMPLES) == set(_WRITERS), "a registered format needs its cases in this module"
    assert all(formats.get(n).name == n for n in names)
    with pytest.raises(KeyError):
        formats.get("no-such-format")


@pytest.mark.parametrize("name", formats.names())
def test_every_format_implements_every_hook(name):
    fmt = formats.get(name)
    assert isinstance(fmt, SourceFormat) and not type(fmt).__abstractmethods__
    for hook in _HOOKS:
        assert getattr(type(fmt), hook) is not getattr(SourceFormat, hook), f"{name} lacks {hook}"
    assert fmt.suffixes and all(s.startswith(".") and s == s.lower() for s in fmt.suffixes)
    assert set(fmt.suffixes) <= set(formats.suffixes())


def test_a_format_without_a_hook_cannot_be_made():
    class Partial(SourceFormat):
        name, suffixes = "partial", (".partial",)

        def detect(self, path: str, head: bytes) -> bool:
            return False

    with pytest.raises(TypeError, match="abstract"):
        Partial()  # type: ignore[abstract]


@pytest.mark.parametrize("name", formats.names())
def test_each_format_detects_its_own_files(name):
    paths = sorted(p for pattern in _SAMPLES[name] for p in glob.glob(str(ROOT / pattern)))
    assert paths, f"no sample files of {name}"
    for path in paths:
        head = Path(path).read_bytes()[:4]
        assert format_of(path, head).name == name == detect_format(path, head), path
        # By the magic bytes alone, whatever the name, where the format has them:
        by_magic = [f.name for f in map(formats.get, formats.names()) if f.detect("data", head)]
        assert by_magic in ([name], []), (path, by_magic)
        if by_magic:
            assert format_of("data", head).name == name


@pytest.mark.parametrize("name", formats.names())
def test_each_format_round_trips_a_small_file_whole_and_in_ranges(tmp_path, name):
    records = make_records(60)
    filename, write = _WRITERS[name]
    path = tmp_path / filename
    write(path, records)
    data = path.read_bytes()
    fmt = format_of(str(path), data[:4])
    assert fmt.name == name
    assert _read(fmt, io.BytesIO(data), str(path), 0, None) == records
    assert _read(fmt, io.BytesIO(data), str(path), 0, None, columns=("id", "y")) in (
        records, [{"id": r["id"], "y": r["y"]} for r in records])  # formats may decode the others too
    if fmt.splittable(str(path), data[:4096], BatchOptions()):
        cuts = [0, len(data) // 3, 2 * len(data) // 3, None]
        pieces = [_read(fmt, io.BytesIO(data), str(path), lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]
        assert [r for piece in pieces for r in piece] == records
        assert sum(1 for piece in pieces if piece) > 1, "the ranges split no file"
    schema = fmt.read_schema(io.BytesIO(data), str(path))
    if schema is not None:
        assert {f["name"] for f in schema["fields"]} == set(records[0])
    batch = next(iter(iter_records(io.BytesIO(data), str(path))))
    position = fmt.error_position(batch.indexes[-1])
    assert batch.kind == name and all(isinstance(k, str) and isinstance(v, int) for k, v in position.items())


@pytest.mark.slow
def test_every_format_converts_to_the_same_shards(tmp_path):
    from convert.splits import Splits
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    records = make_records(200)
    config = tmp_path / "features.yaml"
    config.write_text(CONFIG)
    outputs = {}
    for name, (filename, write) in _WRITERS.items():
        (tmp_path / name).mkdir()
        write(tmp_path / name / filename, records)
        out = tmp_path / f"out-{name}"
        res = run_convert(ConvertOptions(inputs=(str(tmp_path / name / filename),), config=str(config),
                                         output=str(out), num_shards=1,
                                         splits=Splits.parse("train=0.8,eval=0.2", "user.name")))
        assert res.info["counts"]["read"] == len(records), name
        outputs[name] = {without_run_id(p.relative_to(out).as_posix()): p.read_bytes()
                         for p in sorted(out.rglob("*")) if p.is_file() and ".tfrecord" in p.name}
    first, *rest = outputs.values()
    assert first
    for name, shards in zip(list(outputs)[1:], rest, strict=True):
        assert shards == first, name
