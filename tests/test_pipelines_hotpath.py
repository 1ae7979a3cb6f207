"""The conversion hot path (pipelines.analyze, convert_pass, tempfile_format): the analysis pass leaves each unit prepared for
the convert pass (decode once), writer threads, GC thresholds; the output must
not depend on which path ran."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from _pipelines_data import make_records, without_run_id, write_dataset

from convert.config import load_config
from convert.prepare import Preparer
from pipelines.analyze import PREPARED_KEY, _MergeAnalyzers
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.plan import ByteRange, WorkUnit
from pipelines.run_files import ANALYSIS_FILENAME, ConversionFailed
from pipelines.tempfile_format import PreparedWriter, read_prepared
from pipelines.unit_input import prepare_unit

pytestmark = pytest.mark.slow


def _files(out) -> dict[str, bytes]:
    return {without_run_id(p.relative_to(out).as_posix()): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and (p.name.endswith((".tfrecord.gz", ".jsonl")) or p.parent.name == "vocab")}


def test_prepared_units_and_preparing_in_the_convert_pass_give_identical_output(tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(200), bad_json_lines=True)
    first, second = tmp_path / "first", tmp_path / "second"
    opts = dict(inputs=(str(paths["json"]),), config=str(paths["config"]), num_shards=3, max_errors=2)
    run_convert(ConvertOptions(output=str(first), **opts))
    # --analysis-from: no analysis pass, so nothing prepared; the convert pass prepares itself
    run_convert(ConvertOptions(output=str(second), analysis_from=str(first), **opts))
    a, b = _files(first), _files(second)
    assert any(k.startswith("errors/") for k in a) and sum(k.endswith(".gz") for k in a) == 6
    assert a == b
    assert not (first / ".recordprep-tmp").exists()
    assert PREPARED_KEY not in json.loads((first / ANALYSIS_FILENAME).read_text())


def test_prepared_file_round_trip_and_truncation(tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(400))
    config = load_config(str(paths["config"]))
    src = str(tmp_path / "d" / "part-0.avro")
    opts = ConvertOptions(inputs=(src,), config=str(paths["config"]), output=str(tmp_path / "o"), batch_size=10)
    unit = WorkUnit(0, (ByteRange(src, 0, None),))
    items = list(prepare_unit(unit, opts, Preparer(config)))
    assert sum(i.read for i in items) == 200 and len(items) > 1
    path = str(tmp_path / "prepared.bin")
    with PreparedWriter(path) as w:
        for it in items:
            w.write(it)
    back = list(read_prepared(path))
    assert [(i.path, i.read, i.errors) for i in back] == [(i.path, i.read, i.errors) for i in items]
    for x, y in zip(back, items, strict=True):
        np.testing.assert_array_equal(x.split, y.split)
        assert x.batch.rows == y.batch.rows and [(p.name, type(p)) for p in x.batch.parts] == [(p.name, type(p)) for p in y.batch.parts]
    data = (tmp_path / "prepared.bin").read_bytes()
    (tmp_path / "prepared.bin").write_bytes(data[:-3])
    with pytest.raises(ConversionFailed, match="truncated"):
        list(read_prepared(path))


def test_prepared_file_holds_pickles_on_local_disk_and_lz4_frames_on_remote_file_systems(tmp_path, monkeypatch):
    """LZ4 costs CPU where the page cache's copy is cheaper (a local disk); a remote
    output's temp files (bytes over the network) stay LZ4. Both read back the same."""
    from pipelines import tempfile_format

    paths = write_dataset(tmp_path / "d", make_records(200))
    config = load_config(str(paths["config"]))
    src = str(tmp_path / "d" / "part-0.avro")
    opts = ConvertOptions(inputs=(src,), config=str(paths["config"]), output=str(tmp_path / "o"), batch_size=10)
    items = list(prepare_unit(WorkUnit(0, (ByteRange(src, 0, None),)), opts, Preparer(config)))
    back = {}
    for remote in (False, True):
        path = str(tmp_path / f"prepared-{remote}.bin")
        with monkeypatch.context() as m:
            if remote:
                m.setattr(tempfile_format, "lz4_temp", lambda path: True)
            with PreparedWriter(path) as w:
                for it in items:
                    w.write(it)
            back[remote] = list(read_prepared(path))
        frame = (tmp_path / f"prepared-{remote}.bin").read_bytes()[8:]
        if remote:
            assert frame[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
        else:  # buffer count, lengths, then the pickle: its arrays out of band, after it
            k = int.from_bytes(frame[:4], "little")
            assert k > 0 and frame[4 + 8 * (k + 1)] == 0x80
    for a, b, it in zip(back[False], back[True], items, strict=True):
        assert (a.path, a.read, a.errors) == (b.path, b.read, b.errors) == (it.path, it.read, it.errors)
        np.testing.assert_array_equal(a.split, b.split)
        assert a.split.flags.writeable and b.split.flags.writeable  # as arrays unpickled in band are
        assert [(p.name, type(p)) for p in a.batch.parts] == [(p.name, type(p)) for p in b.batch.parts]


def test_merge_keeps_every_units_prepared_file_and_the_analysis():
    paths_cfg = {"label": None, "features": [{"name": "x", "transform": "zscore"}]}
    from convert.analysis import Analyzer
    from convert.config import parse_config

    c = parse_config(paths_cfg)
    fn = _MergeAnalyzers(c)
    accs = []
    for unit, xs in enumerate(([1.0, 2.0], [3.0], [])):
        a = Analyzer(c)
        a.add_records([{"x": x} for x in xs])
        accs.append(fn.add_input(fn.create_accumulator(), (unit, a, f"p{unit}" if xs else None)))
    value = fn.extract_output(fn.merge_accumulators(accs))
    out = value.json
    assert out[PREPARED_KEY] == {0: "p0", 1: "p1", 2: None}
    assert out["stats"]["x"]["count"] == 3 and out["stats"]["x"]["mean"] == 2.0


@pytest.mark.parametrize("level", [2, 6])
def test_gzip_writer_thread_writes_the_same_bytes_as_inline_gzip(tmp_path, level):
    import gzip
    import io
    import threading

    from pipelines.tempfile_format import ShardWriter, gzip_file

    chunks = [bytes([i % 251]) * (1000 + 7919 * i) for i in range(12)]
    w = ShardWriter(str(tmp_path / "a.gz"), "GZIP", level)
    assert w._bg is not None
    for c in chunks:
        w.write(c, 2)
    size = w.close()
    inline = io.BytesIO()
    with gzip_file(inline, level) as g:
        for c in chunks:
            g.write(c)
    assert (tmp_path / "a.gz").read_bytes() == inline.getvalue() and size == len(inline.getvalue())
    assert gzip.decompress(inline.getvalue()) == b"".join(chunks)  # plain gzip, whatever wrote it
    assert w.records == 24 and not any(t.name.startswith("recordprep-writer") for t in threading.enumerate())

    plain = ShardWriter(str(tmp_path / "b"), "NONE", level)
    assert plain._bg is None
    plain.write(b"xy", 1)
    assert plain.close() == 2


def test_gzip_levels_pick_their_library_and_every_level_reads_back(tmp_path):
    """1-2 are ISA-L's igzip, 0 and 3-9 zlib-ng's; whatever wrote it, plain gzip readers
    (Python's, TensorFlow's TFRecord reader) read the same records back, and a level
    writes the same bytes for the same records."""
    import gzip
    import io

    from _reference import write_records
    from isal.igzip import IGzipFile
    from zlib_ng.gzip_ng import GzipNGFile

    from pipelines.options import ConvertOptions
    from pipelines.tempfile_format import ISAL_LEVELS, gzip_file

    assert ISAL_LEVELS == (1, 2) and ConvertOptions(inputs=("x",), config="c", output="o").gzip_level in ISAL_LEVELS
    rng = np.random.default_rng(0)
    records = [bytes(rng.integers(0, 8, size=int(n), dtype=np.uint8)) + b"feature" * int(n % 5)
               for n in rng.integers(1, 400, size=3000)]
    framed_io = io.BytesIO()
    write_records(framed_io, records)
    framed = framed_io.getvalue()
    sizes = {}
    for level in range(10):
        out = io.BytesIO()
        with gzip_file(out, level) as g:
            assert isinstance(g, IGzipFile if level in (1, 2) else GzipNGFile)
            g.write(framed)
        again = io.BytesIO()
        with gzip_file(again, level) as g:
            g.write(framed)
        assert out.getvalue() == again.getvalue(), level
        assert gzip.decompress(out.getvalue()) == framed, level
        (tmp_path / f"l{level}.gz").write_bytes(out.getvalue())
        sizes[level] = len(out.getvalue())
    assert sizes[0] > sizes[1] and sizes[2] > sizes[5] >= sizes[9]

    tf = pytest.importorskip("tensorflow")
    for level in range(10):
        back = [r.numpy() for r in tf.data.TFRecordDataset(str(tmp_path / f"l{level}.gz"), compression_type="GZIP")]
        assert back == records, level


def test_gzip_writer_thread_failure_surfaces_and_abort_stops_it(tmp_path):
    from pipelines.tempfile_format import ShardWriter

    w = ShardWriter(str(tmp_path / "a.gz"), "GZIP", 1)

    def boom(data):
        raise OSError("disk full")

    w.f.write = boom
    w.write(b"x" * 10, 1)
    with pytest.raises(OSError, match="disk full"):
        for _ in range(100):  # the failure shows on a later write, or at close
            w.write(b"x", 1)
        w.close()
    w.abort()
    assert w._bg._thread is None


def test_prepared_writer_failure_surfaces_and_leaves_no_thread(tmp_path):
    import threading

    from pipelines.tempfile_format import PreparedWriter

    with pytest.raises(OSError, match="disk full"), PreparedWriter(str(tmp_path / "p.bin")) as w:
        def boom(data):
            raise OSError("disk full")

        w.f.write = boom
        for _ in range(100):  # on a later write, or when the with block ends
            w.write(b"x" * 1000)
    with pytest.raises(RuntimeError, match="unit failed"), PreparedWriter(str(tmp_path / "q.bin")) as w:
        w.write(b"y")
        raise RuntimeError("unit failed")
    assert not any(t.name.startswith("recordprep-prepared") for t in threading.enumerate())


def test_relaxed_gc_raises_thresholds_while_any_unit_runs_then_restores_them():
    import gc

    from pipelines.unit_input import relaxed_gc

    before = gc.get_threshold()
    with relaxed_gc():
        inside = gc.get_threshold()
        assert inside[0] >= 50_000 and inside[0] >= before[0]
        with relaxed_gc():  # a second unit (another thread) overlapping
            assert gc.get_threshold() == inside
        assert gc.get_threshold() == inside  # the first is still running
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), relaxed_gc():
        raise RuntimeError("unit failed")
    assert gc.get_threshold() == before


def test_convert_unit_emits_each_result_after_the_next_unit_and_at_bundle_end(tmp_path):
    import threading

    from apache_beam.pvalue import TaggedOutput
    from apache_beam.utils.windowed_value import WindowedValue

    from convert.analysis import Analyzer
    from pipelines.analyze import AnalysisValue
    from pipelines.convert_pass import STATS_TAG, _ConvertUnit

    paths = write_dataset(tmp_path / "d", make_records(120))
    config = load_config(str(paths["config"]))
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.avro"))
    opts = ConvertOptions(inputs=tuple(files), config=str(paths["config"]), output=str(tmp_path / "o"), order="input")
    a = Analyzer(config)
    a.add_records(make_records(120))
    analysis = AnalysisValue(a.result().to_json())  # no prepared units: the convert pass prepares
    fn = _ConvertUnit(config, opts, 2)
    fn.start_bundle()
    assert list(fn.process(WorkUnit(0, (ByteRange(files[0], 0, None),)), analysis)) == []
    first = list(fn.process(WorkUnit(1, (ByteRange(files[1], 0, None),)), analysis))
    # Each unit: its result, then its statistics on the MergeStats output, keyed for the combine.
    assert [type(o) for o in first] == [dict, TaggedOutput] and first[1].tag == STATS_TAG
    assert first[0]["unit"] == 0 and "stats" not in first[0]
    last = list(fn.finish_bundle())
    assert [type(o) for o in last] == [WindowedValue, TaggedOutput]
    assert last[0].value["unit"] == 1
    for r, tagged in ((first[0], first[1].value), (last[0].value, last[1].value.value)):
        assert sum(sh["records"] for sh in r["shards"].values()) == 60
        assert all(os.path.getsize(sh["tmp"]) == sh["bytes"] for sh in r["shards"].values())
        key, (unit, stats) = tagged
        assert key is None and unit == r["unit"] and sum(stats.rows) == 60

    fn.start_bundle()
    assert list(fn.process(WorkUnit(0, (ByteRange(files[0], 0, None),)), analysis)) == []
    with pytest.raises(OSError):  # the next unit fails: the pending one's writer threads stop too
        list(fn.process(WorkUnit(1, (ByteRange(str(tmp_path / "missing.avro"), 0, None),)), analysis))
    assert fn._pending is None
    assert not any(t.name.startswith("recordprep-writer") for t in threading.enumerate())


def test_analysis_side_input_is_weighed_once_not_walked_by_beams_state_cache(monkeypatch):
    """Beam's state cache weighs each loaded side input with objsize; the analysis
    carries its weight (measured once) and the cache's walk stops at it."""
    import pickle

    from apache_beam.runners.worker import statecache

    from pipelines.analyze import AnalysisValue

    analysis = {"vocabularies": {"q": [f"term{i}" for i in range(5000)]}, "stats": {"x": {"mean": 1.0}}}
    value = pickle.loads(pickle.dumps(AnalysisValue(analysis)))  # as a worker receives it
    assert value.json == analysis
    walked = statecache.get_deep_size(analysis)
    assert walked / 2 < value.weight < walked * 2  # the estimate is of the walk's order
    seen = []
    real = statecache._get_referents_func

    def counting(*objs):
        seen.extend(objs)
        return real(*objs)

    monkeypatch.setattr(statecache, "_get_referents_func", counting)
    weighed = statecache.get_deep_size(value)
    assert len(seen) <= 1  # the wrapper only, not the 5 000 terms
    assert weighed >= walked / 2  # the cache still accounts for the whole analysis
