"""Record shapes beyond flat records (issue 19), through the CLI and the public API.

Each shape converts on both Avro decoders (``--avro-decoder auto``, the polars
fast path, and ``fastavro``) to byte-identical shards, and ``infer`` drafts it.
"""

from __future__ import annotations

import copy
import io
from pathlib import Path

import fastavro
import pytest
import yaml
from _e2e import cli

from convert.sources import iter_avro, read_avro_schema


def _avro(schema, records, codec: str = "null", metadata: dict | None = None) -> bytes:
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(copy.deepcopy(schema)), records, codec=codec, metadata=metadata,
                    sync_interval=80)
    return buf.getvalue()


def _with_binary_meta(data: bytes, marker: bytes = b"XXXXXXXX") -> bytes:
    """``data`` with the header metadata value ``marker`` replaced by bytes that are not UTF-8 (same length)."""
    i = data.index(marker)
    return data[:i] + bytes([0xFF, 0xFE, 0x80, 0x81, 0x00, 0xC3, 0x28, 0xA0])[: len(marker)] + data[i + len(marker):]


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*.tfrecord*"))}


def convert_both(tmp_path: Path, data_path: Path, config: dict | str, *extra: str) -> dict[str, bytes]:
    """Convert with each Avro decoder; asserts both succeed with byte-identical shards, returns them."""
    cfg = tmp_path / "features.yaml"
    cfg.write_text(config if isinstance(config, str) else yaml.safe_dump(config))
    got = {}
    for decoder in ("auto", "fastavro"):
        out = tmp_path / f"out-{decoder}"
        r = cli("convert", "-i", data_path, "-c", cfg, "-o", out, "--avro-decoder", decoder, "--splits", "train=1",
                *extra)
        assert r.exit_code == 0, r.output
        got[decoder] = _shards(out)
    assert got["auto"] and got["auto"] == got["fastavro"]
    return got["auto"]


def infer(path: Path, *extra: str) -> tuple[dict, str]:
    r = cli("infer", "-i", path, *extra)
    assert r.exit_code == 0, r.output
    return yaml.safe_load(r.stdout), r.stdout


# ------------------------------------------------------------ header metadata


SCHEMA = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}, {"name": "s", "type": "string"}]}


@pytest.mark.parametrize("codec", ["null", "deflate"])
def test_binary_header_metadata_converts_on_both_decoders(codec, tmp_path):
    recs = [{"a": i, "s": "xyz"[i % 3]} for i in range(50)]
    data = _with_binary_meta(_avro(SCHEMA, recs, codec, metadata={"writer.sync.bits": "XXXXXXXX"}))
    with pytest.raises(UnicodeDecodeError):
        fastavro.reader(io.BytesIO(data))  # what fastavro alone does with it
    path = tmp_path / "binmeta.avro"
    path.write_bytes(data)
    assert read_avro_schema(io.BytesIO(data), str(path))["fields"][0]["name"] == "a"
    for decoder in ("auto", "fastavro"):
        batches = list(iter_avro(io.BytesIO(data), str(path), decoder=decoder))
        assert [r for b in batches for r in b.records] == recs
        assert [o for b in batches for o in b.offsets] == [o for b in iter_avro(io.BytesIO(_avro(SCHEMA, recs, codec, metadata={"writer.sync.bits": "XXXXXXXX"})), "x", decoder=decoder) for o in b.offsets]
    config, _ = infer(path)
    assert {f["name"] for f in config["features"]} == {"a", "s"}
    convert_both(tmp_path, path, config)


def test_schema_metadata_that_is_not_utf8_still_fails_naming_the_file(tmp_path):
    data = _avro(SCHEMA, [{"a": 1, "s": "x"}])
    i = data.index(b'"record"')
    bad = data[:i + 1] + b"\xff" + data[i + 2:]  # inside avro.schema
    path = tmp_path / "badschema.avro"
    path.write_bytes(bad)
    r = cli("infer", "-i", path)
    assert r.exit_code == 1 and "badschema.avro" in r.output, r.output


# ------------------------------------------------------------ non-record schemas


@pytest.mark.parametrize(("schema", "data", "transform"), [
    ("long", [1, 5, -3, 7, 2**40], "zscore"),
    ({"type": "array", "items": "string"}, [["a", "b"], [], ["c"], ["a"]], "vocabulary"),
    (["null", "string", "long"], ["a", None, 3, "b", "a"], "hash"),
    ({"type": "enum", "name": "E", "symbols": ["X", "Y"]}, ["X", "Y", "X"], "vocabulary"),
])
def test_data_that_are_not_records_are_one_field_named_value(schema, data, transform, tmp_path):
    path = tmp_path / "values.avro"
    path.write_bytes(_avro(schema, data))
    assert [r for b in iter_avro(io.BytesIO(path.read_bytes()), "v") for r in b.records] == [{"value": v} for v in data]
    config, text = infer(path)
    assert [(f["name"], f["transform"]) for f in config["features"]] == [("value", transform)], text
    convert_both(tmp_path, path, config)
