"""Record shapes beyond flat records (issue 19), through the CLI and the public API.

Each shape converts on both Avro decoders (``--avro-decoder auto``, the polars
fast path, and ``fastavro``) to byte-identical shards, and ``infer`` drafts it.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import fastavro
import pytest
import yaml
from _e2e import cli
from _pipelines_data import without_run_id

from convert.records import hash_id
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
    return {without_run_id(p.name): p.read_bytes() for p in sorted(out.glob("*.tfrecord*"))}


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


# ------------------------------------------------------------ lists of records

ORDERS = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"},
    {"name": "items", "type": ["null", {"type": "array", "items": ["null", {"type": "record", "name": "Item", "fields": [
        {"name": "price", "type": ["null", "double"]},
        {"name": "sku", "type": "string"},
        {"name": "parts", "type": {"type": "array", "items": {"type": "record", "name": "P", "fields": [
            {"name": "code", "type": "string"}]}}}]}]}]},
    {"name": "commits", "type": {"type": "array", "items": {"type": "record", "name": "C", "fields": [
        {"name": "message", "type": "string"},
        {"name": "author", "type": {"type": "record", "name": "A", "fields": [{"name": "email", "type": "string"}]}}]}}},
]}


def _orders(n: int = 60) -> list[dict]:
    out = []
    for k in range(n):
        items = None if k % 7 == 3 else [
            None if j == 2 and k % 2 else {"price": None if j == 1 and k % 3 == 0 else k + j / 4, "sku": f"s{(k + j) % 5}",
                                           "parts": [{"code": f"c{(k * j + p) % 4}"} for p in range(j % 3)]}
            for j in range(k % 4)]
        commits = [{"message": f"Fix bug #{k} in module {j}", "author": {"email": f"dev{(k + j) % 3}@x.org"}}
                   for j in range(k % 3)]
        out.append({"id": k, "items": items, "commits": commits})
    return out


LIST_CONFIG = {"features": [
    {"name": "price", "source": "items[].price", "transform": "identity", "max_len": 3, "missing_indicator": True},
    {"name": "sku", "source": "items[].sku", "transform": "vocabulary", "max_len": 3},
    {"name": "sku_h", "source": "items[].sku", "transform": "hash", "buckets": 64, "max_len": 3},
    {"name": "part", "source": "items[].parts[].code", "transform": "vocabulary", "max_len": 4},
    {"name": "n_items", "source": "items", "transform": "count"},
    {"name": "n_parts", "source": "items[].parts[]", "transform": "count"},
    {"name": "email", "source": "commits[].author.email", "transform": "vocabulary", "max_len": 2},
    {"name": "msg", "source": "commits[].message", "transform": "text", "max_len": 8},
]}


def _columns(config: dict, records) -> dict:
    """The vectorized columns of ``records`` (one batch, all analyzed), through the public API."""
    import numpy as np

    from convert.analysis import Analyzer
    from convert.config import parse_config
    from convert.vectorize import Vectorizer

    cfg = parse_config(config)
    acc = Analyzer(cfg)
    acc.add_records(list(records))
    vb = Vectorizer(cfg, acc.result()).vectorize(records)
    assert not vb.rejections, vb.rejections
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, (_, v) in vb.columns.items()}, acc.result()


def _counts_written(counts: list[int]) -> list[list[float]]:
    """The column a ``count`` feature writes for ``counts`` when every record is in the training split
    (as in ``_columns``): ``n`` standardized by its mean and population std there
    (``convert.derive.SCALED``), as float32."""
    import numpy as np

    x = np.asarray(counts, dtype=np.float64)
    std = x.std() or 1.0
    return ((x - x.mean()) / std).astype(np.float32)[:, None].tolist()


def test_paths_through_lists_of_records_give_multi_valued_features():
    recs = [
        {"id": 1, "items": [{"price": 2.5, "sku": "a", "parts": [{"code": "x"}, {"code": "y"}]}, None,
                            {"price": None, "sku": "b", "parts": [{"code": "z"}]}], "commits": []},
        {"id": 2, "items": None, "commits": [{"message": "Add X", "author": {"email": "p@q"}}]},
        {"id": 3, "items": [], "commits": [{"message": "a b", "author": {"email": "p@q"}},
                                           {"message": "c", "author": {"email": "r@s"}}]},
    ]
    cols, analysis = _columns(LIST_CONFIG, recs)
    assert cols["price"] == [[2.5, 0.0, 0.0], [0.0] * 3, [0.0] * 3]  # null item and null price: fill (0)
    assert cols["price_len"] == [[3], [0], [0]] and cols["price_missing"] == [[0], [1], [0]]
    assert analysis.vocabularies["sku"] == ["a", "b"] and cols["sku"] == [[2, 3, 0], [0] * 3, [0] * 3]
    assert cols["sku_len"] == [[2], [0], [0]]  # the null item has no sku: skipped, as null list items are
    assert analysis.vocabularies["part"] == ["x", "y", "z"] and cols["part"] == [[2, 3, 4, 0], [0] * 4, [0] * 4]
    assert cols["n_items"] == _counts_written([3, 0, 0]) and cols["n_parts"] == _counts_written([3, 0, 0])
    assert analysis.vocabularies["email"] == ["p@q", "r@s"] and cols["email"] == [[0, 0], [2, 0], [2, 3]]
    assert cols["msg_len"] == [[0], [2], [3]]  # the messages' tokens in order: add, x / a, b, c


def test_lists_of_records_convert_alike_on_both_decoders(tmp_path):
    path = tmp_path / "orders.avro"
    path.write_bytes(_avro(ORDERS, _orders(), "deflate"))
    shards = convert_both(tmp_path, path, LIST_CONFIG)
    assert shards


def test_json_lists_of_records_and_lists_of_lists_convert(tmp_path):
    path = tmp_path / "events.jsonl"
    rows = [{"items": [{"price": 1.0, "sku": "a"}, {"price": 2, "sku": None}], "grid": [[1, 2], [3]]},
            {"items": None, "grid": []}, {"grid": [[], [4.5]]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows * 10))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [
        {"name": "price", "source": "items[].price", "transform": "identity", "max_len": 2},
        {"name": "sku", "source": "items[].sku", "transform": "vocabulary", "max_len": 2},
        {"name": "flat", "source": "grid[][]", "transform": "identity", "max_len": 3},
        {"name": "first", "source": "grid[0]", "transform": "identity", "max_len": 2},
        {"name": "rows", "source": "grid", "transform": "count"}]}))
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out", "--splits", "train=1")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "p", "source": "items.price", "transform": "identity", "max_len": 2},
     "write 'items[].price' for each item's"),
    ({"name": "p", "source": "items[].prize", "transform": "identity", "max_len": 2}, "did you mean 'items[].price'"),
    ({"name": "p", "source": "items[].parts", "transform": "vocabulary", "max_len": 2},
     "its items are lists: write 'items[].parts[]' to flatten them"),
    ({"name": "p", "source": "id[]", "transform": "vocabulary", "max_len": 2}, "'id' is long; [] steps into an array"),
    ({"name": "p", "source": "items[].sku", "transform": "count"}, "transform 'count' needs a list or a map"),
])
def test_the_config_check_names_bad_paths_through_lists(entry, message, tmp_path):
    path = tmp_path / "orders.avro"
    path.write_bytes(_avro(ORDERS, _orders(10)))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [entry]}))
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 2 and message in r.output, r.output


@pytest.mark.parametrize(("entry", "message"), [
    ({"name": "p", "source": "items[].price", "transform": "zscore"}, "takes one value; use vocabulary, hash"),
    ({"name": "p", "source": "items[].price", "transform": "identity"}, "set max_len"),
    ({"name": "p", "source": "items[x]", "transform": "identity", "max_len": 2}, "a bracket at 5 holds []"),
    ({"name": "p", "transform": "cross", "sources": ["items[].sku", "id"], "buckets": 8}, "takes one value per record"),
    ({"name": "p", "source": "items", "transform": "count", "max_len": 3}, "it gives one number per record"),
])
def test_config_errors_for_paths_through_lists(entry, message, tmp_path):
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [entry]}))
    path = tmp_path / "orders.avro"
    path.write_bytes(_avro(ORDERS, _orders(10)))
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out", "--dry-run")
    assert r.exit_code == 2 and message in r.output, r.output


def _attrs_and_grid_features(list_len: int, flat: dict, first: dict) -> list[dict]:
    """The features over the map ``attrs`` (keys, entries, count) and the list of lists ``grid``
    (flattened, first row) that the conversion and the columns tests both read."""
    return [
        {"name": "keys", "source": "attrs[keys]", "transform": "vocabulary", "max_len": list_len},
        {"name": "pairs", "source": "attrs[entries]", "transform": "vocabulary", "max_len": list_len},
        {"name": "n_attrs", "source": "attrs", "transform": "count"},
        {"name": "flat", "source": "grid[][]", "max_len": 4, **flat},
        {"name": "first", "source": "grid[0]", "max_len": 2, **first},
    ]


def test_serving_reads_paths_through_lists_maps_and_counts_exactly(tmp_path):
    """The serving layer gives the shards' values for features read through lists
    of records, maps and lists of lists: vocabulary, hash, numeric lists, a
    map's keys, a key's value, counts and text through lists."""
    pytest.importorskip("tensorflow")
    from test_readers_serving import check_parity

    import readers

    data = tmp_path / "orders.jsonl"
    recs = _orders(60)
    for k, r in enumerate(recs):
        r["attrs"] = None if k % 4 == 0 else {f"a{j}": j * k for j in range(k % 3)}
        r["grid"] = [[k / 3, 1.5][: 1 + j % 2] for j in range(k % 3)]
    recs += [{"id": 1, "items": "x", "commits": [{"message": 3}], "attrs": 5}]  # rejected or counted alike
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [
        {"name": "price", "source": "items[].price", "transform": "identity", "max_len": 3},
        {"name": "sku", "source": "items[].sku", "transform": "vocabulary", "max_len": 3},
        {"name": "part", "source": "items[].parts[].code", "transform": "hash", "buckets": 64, "max_len": 4},
        {"name": "email", "source": "commits[].author.email", "transform": "vocabulary", "max_len": 2},
        {"name": "msg", "source": "commits[].message", "transform": "text", "max_len": 5},
        {"name": "a1", "source": 'attrs["a1"]', "transform": "zscore"},
        {"name": "n_items", "source": "items", "transform": "count"},
        {"name": "n_parts", "source": "items[].parts[]", "transform": "count"},
        *_attrs_and_grid_features(2, flat={"transform": "log1p"}, first={"transform": "clip", "clip_max": 1.0}),
    ]}))
    out = tmp_path / "out"
    r = cli("convert", "-i", data, "-c", cfg, "-o", out, "--splits", "train=1", "--max-errors", "5")
    assert r.exit_code == 0, r.output
    check_parity(out, readers.transform_layer(str(out)), recs)


# ------------------------------------------------------------ infer drafts them


def test_infer_drafts_lists_of_records_counts_and_text_and_both_decoders_convert_it(tmp_path):
    path = tmp_path / "orders.avro"
    path.write_bytes(_avro(ORDERS, _orders(), "deflate"))
    config, text = infer(path)
    by_source = {f.get("source", f["name"]): f for f in config["features"]}
    assert by_source["items[].price"]["transform"] == "identity" and by_source["items[].price"]["max_len"] >= 2
    assert by_source["items[].sku"]["transform"] == "vocabulary" and by_source["items[].sku"]["length"] is False
    assert by_source["items[].parts[].code"]["transform"] == "vocabulary"
    assert by_source["commits[].author.email"]["transform"] == "vocabulary"
    assert by_source["commits[].message"]["transform"] == "text" and by_source["commits[].message"]["length"] is False
    # one length feature per list of records: items' is its numeric item field's <name>_len (a numeric
    # list counts null items too), commits' that of its field of ids that is never null
    assert "items" not in by_source and "skipped items: a list of records: its length is the <name>_len of items[].price" in text
    assert "commits" not in by_source and "skipped commits: a list of records: its length is the <name>_len" in text
    convert_both(tmp_path, path, config)


def test_numeric_item_fields_share_one_length_on_both_decoders(tmp_path):
    """Two numeric fields of one list's items (null items, null fields, a null list) share one
    <name>_len (length_of): both Avro decoders give equal lengths for them, and the same shards."""
    schema = {**ORDERS, "fields": [*ORDERS["fields"][:1], {"name": "items", "type": ["null", {"type": "array", "items": [
        "null", {"type": "record", "name": "Item", "fields": [{"name": "price", "type": ["null", "double"]},
                                                              {"name": "qty", "type": ["null", "long"]},
                                                              {"name": "sku", "type": "string"}]}]}]}]}
    recs = [{"id": k, "items": None if k % 7 == 3 else [
        None if j == 2 and k % 2 else {"price": None if j == 1 else k + j / 4, "qty": None if k % 5 == 0 else j,
                                       "sku": f"s{(k + j) % 5}"} for j in range(k % 5)]} for k in range(60)]
    path = tmp_path / "items.avro"
    path.write_bytes(_avro(schema, recs, "deflate"))
    config, _ = infer(path)
    by_source = {f.get("source", f["name"]): f for f in config["features"]}
    assert by_source["items[].qty"]["length_of"] == by_source["items[].price"]["name"]
    assert by_source["items[].sku"]["length"] is False and "items" not in by_source
    convert_both(tmp_path, path, config)


MAPS = {"type": "record", "name": "M", "fields": [
    {"name": "attrs", "type": ["null", {"type": "map", "values": "long"}]},
    {"name": "tags", "type": {"type": "array", "items": ["null", {"type": "map", "values": "string"}]}},
    {"name": "grid", "type": {"type": "array", "items": {"type": "array", "items": "double"}}},
]}


def _maps(n: int = 40) -> list[dict]:
    return [{"attrs": None if k % 5 == 0 else {f"a{j}": k * j for j in range(k % 4)},
             "tags": [None if j == 1 else {f"t{(k + j) % 3}": "v"} for j in range(k % 3)],
             "grid": [[k / 2, -1.0][: 1 + j % 2] for j in range(k % 3)]} for k in range(n)]


def test_maps_keys_values_by_key_and_lists_of_lists():
    recs = [{"attrs": {"color": 3, "a.b:c": 7}, "tags": [{"x": "1"}, None, {"y": "2", "x": "3"}], "grid": [[1.0], [2.0, 3.0]]},
            {"attrs": None, "tags": [], "grid": []}]
    cols, analysis = _columns({"features": [
        *_attrs_and_grid_features(3, flat={"transform": "identity"}, first={"transform": "identity"}),
        {"name": "color", "source": 'attrs["color"]', "transform": "identity", "missing_indicator": True},
        {"name": "abc", "source": "attrs['a.b:c']", "transform": "identity"},
        {"name": "tag_keys", "source": "tags[][keys]", "transform": "vocabulary", "max_len": 3},
        {"name": "last", "source": "grid[-1]", "transform": "identity", "max_len": 2},
        {"name": "rows", "source": "grid", "transform": "count"},
        {"name": "pairs_h", "source": "attrs[entries]", "transform": "hash", "buckets": 1000, "max_len": 3},
    ]}, recs)
    assert analysis.vocabularies["pairs"] == ["a.b:c\x1f7", "color\x1f3"] and cols["pairs"] == [[3, 2, 0], [0] * 3]
    assert cols["pairs_h"][0][:2] == [hash_id("color\x1f3", 1000), hash_id("a.b:c\x1f7", 1000)]
    assert analysis.vocabularies["keys"] == ["a.b:c", "color"] and cols["keys"] == [[3, 2, 0], [0] * 3]
    assert cols["color"] == [[3.0], [0.0]] and cols["color_missing"] == [[0], [1]] and cols["abc"] == [[7.0], [0.0]]
    assert cols["n_attrs"] == _counts_written([2, 0])
    assert analysis.vocabularies["tag_keys"] == ["x", "y"] and cols["tag_keys"] == [[2, 3, 2], [0] * 3]
    assert cols["flat"] == [[1.0, 2.0, 3.0, 0.0], [0.0] * 4] and cols["flat_len"] == [[3], [0]]
    assert cols["first"] == [[1.0, 0.0], [0.0, 0.0]] and cols["last"] == [[2.0, 3.0], [0.0, 0.0]]
    assert cols["rows"] == _counts_written([2, 0])


def test_infer_drafts_maps_and_lists_of_lists_and_both_decoders_convert_it(tmp_path):
    path = tmp_path / "maps.avro"
    path.write_bytes(_avro(MAPS, _maps()))
    config, text = infer(path)
    by_source = {f.get("source", f["name"]): f for f in config["features"]}
    assert by_source["attrs[keys]"]["transform"] == "vocabulary" and 'attrs["KEY"]' in text
    assert by_source["tags[][keys]"]["transform"] == "vocabulary"
    assert by_source["tags"]["transform"] == "count" and by_source["grid"]["transform"] == "count"
    assert by_source["grid[][]"]["transform"] == "identity"
    convert_both(tmp_path, path, config)


def test_infer_on_records_without_values_says_what_to_do(tmp_path):
    path = tmp_path / "nulls.avro"
    schema = {"type": "record", "name": "N", "fields": [{"name": "a", "type": "null"}, {"name": "b", "type": "null"}]}
    path.write_bytes(_avro(schema, [{"a": None, "b": None}] * 3))
    r = cli("infer", "-i", path)
    assert r.exit_code == 1 and "a: always null in the sample" in r.output and "--sample more records" in r.output
    empty = tmp_path / "empty.avro"
    empty.write_bytes(_avro(SCHEMA, []))
    r = cli("infer", "-i", empty)
    assert r.exit_code == 1 and "no records found" in r.output and "write the config by hand" in r.output, r.output


def test_infer_takes_json_objects_with_arbitrary_keys_as_maps(tmp_path):
    path = tmp_path / "events.jsonl"
    rows = [{"user": {"id": k % 7, "country": "de" if k % 2 else "fr"},
             "counters": {f"page{(k * 7 + j) % 40}": j for j in range(k % 4 + 1)}} for k in range(80)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config, text = infer(path)
    by_source = {f.get("source", f["name"]): f for f in config["features"]}
    assert by_source["counters[keys]"]["transform"] == "vocabulary", text  # a map: its keys
    assert "user.country" in by_source and not any(s.startswith("counters.page") for s in by_source)
    r = cli("convert", "-i", path, "-c", _write(tmp_path, config), "-o", tmp_path / "out", "--splits", "train=1")
    assert r.exit_code == 0, r.output


def _write(tmp_path: Path, config: dict) -> Path:
    cfg = tmp_path / "inferred.yaml"
    cfg.write_text(yaml.safe_dump(config))
    return cfg


def test_converting_records_without_fields_says_nothing_can_be_converted(tmp_path):
    path = tmp_path / "nofields.avro"
    path.write_bytes(_avro({"type": "record", "name": "E", "fields": []}, [{}, {}]))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [{"name": "x", "transform": "zscore"}]}))
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out")
    assert r.exit_code == 2 and "the records have no fields: nothing in this input can be converted" in r.output, r.output
    r = cli("infer", "-i", path)
    assert r.exit_code == 1 and "the records have no fields" in r.output and "the data you meant" in r.output, r.output


def test_count_of_a_single_value_is_one_and_of_null_or_missing_zero():
    cols, _ = _columns({"features": [{"name": "n", "source": "x", "transform": "count"}]},
                       [{"x": 5}, {"x": [1, None]}, {"x": {"a": 1, "b": 2, "c": 3}}, {"x": None}, {}])
    assert cols["n"] == _counts_written([1, 2, 3, 0, 0])


@pytest.mark.parametrize(("source", "message"), [
    ("attrs[entries]", None),
    ("grid[entries]", "'grid' is an array of an array of double; [entries] steps into a map"),
    ("attrs[entries].x", "[keys] and [entries] end a path"),
])
def test_map_entries_are_checked_against_the_schema(source, message, tmp_path):
    path = tmp_path / "maps.avro"
    path.write_bytes(_avro(MAPS, _maps(20)))
    cfg = tmp_path / "features.yaml"
    cfg.write_text(yaml.safe_dump({"features": [{"name": "p", "source": source, "transform": "vocabulary", "max_len": 2}]}))
    r = cli("convert", "-i", path, "-c", cfg, "-o", tmp_path / "out", "--dry-run")
    if message is None:
        assert r.exit_code == 0, r.output
    else:
        assert r.exit_code == 2 and message in r.output, r.output


REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"


@pytest.mark.slow
@pytest.mark.skipif(not (REALDATA / "README.md").is_file(), reason="../shared/realdata is not beside the project")
@pytest.mark.parametrize(("rel", "sources", "absent"), [
    ("apache__arrow-testing/data/avro/nullable.impala.avro",  # Spark/Impala: maps, arrays of maps and of arrays
     {"int_array_Array", "int_array_Array[][]", "int_map[keys]", "int_Map_Array", "int_Map_Array[][keys]",
      "nested_struct.C.d[][].E", "nested_struct.C.d[][].F", "nested_struct.g[keys]"}, set()),
    # arrays of (nullable) records; one length per list: the numeric item's _len (f2[].f2_2's, f4[].f4_1's), no count
    ("apache__arrow-testing/data/avro/nested_records.avro", {"f2[].f2_1", "f2[].f2_2", "f4[].f4_1"}, {"f2", "f4"}),
])
def test_real_files_with_these_shapes_infer_them_and_convert_alike_on_both_decoders(rel, sources, absent, tmp_path):
    config, text = infer(REALDATA / rel)
    drafted = {f.get("source", f["name"]) for f in config["features"]}
    assert sources <= drafted, (sorted(sources - drafted), text)
    assert not absent & drafted, (sorted(absent & drafted), text)
    convert_both(tmp_path, REALDATA / rel, config)
