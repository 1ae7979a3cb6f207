"""Globally shuffled output (issue 18): every shard a uniform random sample of its
split, in random order, seeded and the same bytes whatever the runner or worker
count; ``--no-shuffle`` keeps input order."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from _pipelines_data import by_shard, make_records, without_run_id, write_dataset
from typer.testing import CliRunner

from convert.example import decode_example
from convert.spec import METADATA_FILENAME, DatasetInfo, SpecError
from convert.tfrecord import iter_records
from pipelines.cli import app
from pipelines.job import run_convert
from pipelines.options import ConvertOptions, OptionsError

SPLITS = ("train", "eval")


def _convert(data: dict, out: Path, *extra: str) -> dict:
    r = CliRunner().invoke(app, ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out),
                                 "--no-progress", *extra])
    assert r.exit_code == 0, r.output
    return json.loads((out / METADATA_FILENAME).read_text())


def _records(out: Path, split: str) -> list[list[bytes]]:
    """Each shard's serialized Examples, in file order."""
    info = json.loads((out / METADATA_FILENAME).read_text())
    shards = []
    for sh in info["splits"][split]["shards"]:
        with gzip.open(out / sh["file"], "rb") as f:
            shards.append(list(iter_records(f)))
    return shards


def _ids(records: list[bytes]) -> list[int]:
    return [int(decode_example(r)["id"][1][0]) for r in records]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(3000))


@pytest.fixture(scope="module")
def outputs(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("o")
    infos = {name: _convert(data, root / name, "--num-shards", "3", *extra) for name, extra in (
        ("input", ("--no-shuffle",)), ("seed0", ()), ("seed0_again", ("--seed", "0", "--force")),
        ("seed7", ("--seed", "7")))}
    return root, infos


def test_every_record_exactly_once_per_split(outputs):
    root, infos = outputs
    for split in SPLITS:
        plain = [r for sh in _records(root / "input", split) for r in sh]
        shuffled = [r for sh in _records(root / "seed0", split) for r in sh]
        assert len(shuffled) == len(plain) == infos["seed0"]["splits"][split]["num_records"] > 0
        assert Counter(shuffled) == Counter(plain)  # the same Examples, byte for byte
        assert shuffled != plain
    assert infos["seed0"]["counts"] == infos["input"]["counts"]


def test_metadata_records_the_order_and_seed(outputs):
    _, infos = outputs
    assert infos["seed0"]["shuffle"] == {"order": "shuffled", "seed": 0}
    assert infos["seed7"]["shuffle"] == {"order": "shuffled", "seed": 7}
    assert infos["input"]["shuffle"] == {"order": "input", "seed": None}
    assert DatasetInfo.from_json(infos["seed7"]).order == "shuffled"
    assert DatasetInfo.from_json(infos["input"]).order == "input"
    old = {k: v for k, v in infos["seed0"].items() if k != "shuffle"}
    assert DatasetInfo.from_json(old).order == "input"  # outputs of earlier versions
    assert infos["seed0"]["fingerprint"] not in (infos["seed7"]["fingerprint"], infos["input"]["fingerprint"])


@pytest.mark.parametrize("bad", [{"order": "random"}, {"order": "shuffled", "seed": -1}, {"order": "shuffled"},
                                 {"order": "shuffled", "seed": True}, {"order": "input", "seed": 3}, [1], "x"])
def test_hostile_shuffle_metadata_is_refused(outputs, bad):
    _, infos = outputs
    with pytest.raises(SpecError, match="shuffle"):
        DatasetInfo.from_json({**infos["seed0"], "shuffle": bad})


def test_same_seed_same_bytes_other_seed_other_order(outputs):
    root, infos = outputs
    for split in SPLITS:
        for sh in infos["seed0"]["splits"][split]["shards"]:
            assert by_shard(root / "seed0", sh["file"]).read_bytes() == by_shard(root / "seed0_again", sh["file"]).read_bytes()
        a = [r for sh in _records(root / "seed0", split) for r in sh]
        b = [r for sh in _records(root / "seed7", split) for r in sh]
        assert Counter(a) == Counter(b) and a != b


def test_no_shuffle_keeps_input_order(outputs):
    root, _ = outputs
    for split in SPLITS:
        ids = [i for sh in _records(root / "input", split) for i in _ids(sh)]
        assert ids == sorted(ids)
        shuffled = [i for sh in _records(root / "seed0", split) for i in _ids(sh)]
        assert shuffled != sorted(shuffled)


def test_each_shard_is_a_sample_of_the_whole_split(outputs):
    """Input order: shard i holds a third of the id range; shuffled: every shard spans it all, in random order."""
    root, _ = outputs
    shards = [_ids(sh) for sh in _records(root / "seed0", "train")]
    for ids in shards:
        assert min(ids) < 300 and max(ids) > 2700  # ids run 0..2999 over the input
        assert abs(np.mean(ids) - 1500) < 150
        rising = np.mean(np.diff(ids) > 0)
        assert 0.4 < rising < 0.6  # random order within the shard, not sorted runs
    sizes = [len(ids) for ids in shards]
    assert max(sizes) - min(sizes) < 0.2 * np.mean(sizes)


@pytest.mark.slow
def test_the_same_bytes_in_process_and_with_two_workers(data, tmp_path):
    infos = {}
    for w in (1, 2):
        infos[w] = run_convert(ConvertOptions(inputs=(str(data["avro"]),), config=str(data["config"]),
                                              output=str(tmp_path / f"w{w}"), num_shards=4, workers=w, seed=11)).info
    assert "2 worker processes" in infos[2]["runner"]
    for split in infos[1]["splits"].values():
        for shard in split["shards"]:
            assert by_shard(tmp_path / "w1", shard["file"]).read_bytes() == by_shard(tmp_path / "w2", shard["file"]).read_bytes()


def test_a_large_bucket_is_gathered_in_key_ranges_with_the_same_bytes(data, tmp_path, monkeypatch):
    from pipelines import shuffle

    _convert(data, tmp_path / "one", "--num-shards", "2")
    monkeypatch.setattr(shuffle, "_GATHER_BYTES", 20_000)  # several ranges per shard
    monkeypatch.setattr(shuffle, "_SPILL_BYTES", 30_000)  # several spills per unit
    info = _convert(data, tmp_path / "ranges", "--num-shards", "2")
    for split in SPLITS:
        for sh in info["splits"][split]["shards"]:
            assert by_shard(tmp_path / "one", sh["file"]).read_bytes() == by_shard(tmp_path / "ranges", sh["file"]).read_bytes()


def test_analysis_from_runs_shuffle_too(outputs, data, tmp_path):
    root, _ = outputs
    info = _convert(data, tmp_path / "reused", "--num-shards", "3", "--analysis-from", str(root / "seed0"))
    assert info["shuffle"] == {"order": "shuffled", "seed": 0}
    for split in SPLITS:  # the same analysis: the same bytes as the run that made it
        for sh in info["splits"][split]["shards"]:
            assert by_shard(tmp_path / "reused", sh["file"]).read_bytes() == by_shard(root / "seed0", sh["file"]).read_bytes()


def test_conflicting_or_ignored_flags_are_usage_errors(data, tmp_path):
    base = ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(tmp_path / "o")]
    for extra, said in ((["--no-shuffle", "--seed", "3"], "--seed"), (["--no-shuffle", "--order", "shuffled"], "--no-shuffle"),
                        (["--order", "sorted"], "--order"), (["--seed", "-1"], "--seed")):
        r = CliRunner().invoke(app, base + extra)
        assert r.exit_code == 2, (extra, r.output)
        assert said in r.output
    with pytest.raises(OptionsError, match="--seed"):
        ConvertOptions(inputs=("x",), config="c", output="o", seed=2**63)


def test_dry_run_and_inspect_show_the_order(outputs, data, tmp_path):
    root, _ = outputs
    r = CliRunner().invoke(app, ["convert", "-i", str(data["json"]), "-c", str(data["config"]), "-o", str(tmp_path / "o"),
                                 "--seed", "5", "--dry-run"])
    assert r.exit_code == 0 and "order: shuffled (seed 5)" in r.output, r.output
    r = CliRunner().invoke(app, ["inspect", str(root / "seed7"), "-n", "0"])
    assert "order shuffled (seed 7)" in r.output, r.output
    r = CliRunner().invoke(app, ["inspect", str(root / "input"), "-n", "0"])
    assert "order input" in r.output, r.output


# ------------------------------------------------------- sorted input, read back


def _sorted_input(root: Path, files: int = 16, per_file: int = 500) -> dict:
    """JSON Lines files sorted by ``t`` (as time-partitioned data is), ``f`` the file's number."""
    root.mkdir(parents=True)
    for k in range(files):
        lines = [json.dumps({"t": k * per_file + i, "f": k, "y": i % 2}) for i in range(per_file)]
        (root / f"part-{k:02d}.jsonl").write_text("\n".join(lines) + "\n")
    cfg = root.parent / "sorted.yaml"
    cfg.write_text("label: {source: y, dtype: int64}\nfeatures:\n  - {name: t, transform: identity}\n"
                   "  - {name: f, transform: identity}\n")
    return {"json": root, "config": cfg}


def _batch_quality(out: Path, batch: int = 64) -> tuple[float, float]:
    """(std of per-batch means of t / what iid batches give, mean share of input files per batch) over one epoch
    of ``train_dataset`` with a shuffle window much smaller than the data (as for any large dataset). Read with
    ``deterministic=True``: the default interleave's order follows thread timing, which moves the figures by run."""
    import readers

    ds = readers.train_dataset(str(out), batch, seed=1, num_epochs=1, shuffle_buffer=256, deterministic=True)
    means, shares, ts = [], [], []
    for x, _ in ds:
        t = x["t"].numpy().ravel()
        ts.append(t)
        means.append(t.mean())
        shares.append(len(set(x["f"].numpy().ravel().tolist())))
    all_t = np.concatenate(ts)
    iid = all_t.std() / np.sqrt(batch)
    return float(np.std(means) / iid), float(np.mean(shares) / 16)


@pytest.mark.slow
def test_batches_of_sorted_input_are_fair_samples(tmp_path):
    data = _sorted_input(tmp_path / "sorted")
    _convert(data, tmp_path / "shuffled", "--num-shards", "4", "--splits", "train=1")
    _convert(data, tmp_path / "plain", "--num-shards", "4", "--splits", "train=1", "--no-shuffle")
    spread, share = _batch_quality(tmp_path / "shuffled")
    assert spread < 1.5 and share > 0.9, (spread, share)
    spread, share = _batch_quality(tmp_path / "plain")  # the layout before the shuffle
    assert spread > 2 and share < 0.5, (spread, share)


# ------------------------------------------------------------ killed with -9


def _cmd(data: dict, out: Path) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "convert", "-i", str(data["json"]), "-c", str(data["config"]),
            "-o", str(out), "--num-shards", "4", "--batch-size", "200", "--no-progress"]


def _kill_when(proc: subprocess.Popen, tmp: Path, pattern: str, timeout: float = 120) -> bool:
    """SIGKILL the run's process group once ``tmp`` holds a file matching ``pattern``; False if it ended first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if tmp.is_dir() and any(tmp.glob(pattern)):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return True
        time.sleep(0.002)
    proc.wait(timeout=30)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("point", ["scatter-*.bin", "train-*.tfrecord.gz"])  # scattering, then gathering
def test_killed_while_shuffling_leaves_nothing_complete_and_the_rerun_completes(tmp_path, point):
    import readers

    data = write_dataset(tmp_path / "d", make_records(6000))
    ref = tmp_path / "ref"
    subprocess.run(_cmd(data, ref), check=True, capture_output=True, timeout=300)
    out = tmp_path / "out"
    proc = subprocess.Popen(_cmd(data, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if not _kill_when(proc, out / ".recordprep-tmp", point):
        pytest.skip("the run finished before the kill point")
    assert not (out / METADATA_FILENAME).exists()
    with pytest.raises(Exception, match="(?i)incomplete|not finished|dataset_info"):
        readers.load_info(str(out))
    r = subprocess.run(_cmd(data, out), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert not (out / ".recordprep-tmp").exists()
    shards = sorted(f.name for f in ref.glob("*.tfrecord.gz"))
    assert [without_run_id(n) for n in shards] == sorted(without_run_id(f.name) for f in out.glob("*.tfrecord.gz"))
    for name in shards:
        assert by_shard(out, name).read_bytes() == (ref / name).read_bytes(), name


def test_a_failed_unit_stops_the_scatter_threads_of_the_pending_one(tmp_path):
    import threading

    from convert.analysis import Analyzer
    from convert.config import load_config
    from pipelines.analyze import AnalysisValue
    from pipelines.convert_pass import _ConvertUnit
    from pipelines.plan import ByteRange, WorkUnit

    paths = write_dataset(tmp_path / "d", make_records(120))
    config = load_config(str(paths["config"]))
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.avro"))
    (tmp_path / "o" / ".recordprep-tmp").mkdir(parents=True)
    opts = ConvertOptions(inputs=tuple(files), config=str(paths["config"]), output=str(tmp_path / "o"))
    a = Analyzer(config)
    a.add_records(make_records(120))
    analysis = AnalysisValue(a.result().to_json())
    fn = _ConvertUnit(config, opts, 3)
    fn.start_bundle()
    assert list(fn.process(WorkUnit(0, (ByteRange(files[0], 0, None),)), analysis)) == []
    [done, _] = [o.value for o in fn.finish_bundle()]  # its result, then its statistics (TaggedOutput)
    assert done["shards"] is None and sum(n for frames in done["scatter"]["index"].values() for _, _, n, _ in frames) == 60
    fn.start_bundle()
    assert list(fn.process(WorkUnit(0, (ByteRange(files[0], 0, None),)), analysis)) == []
    with pytest.raises(OSError):
        list(fn.process(WorkUnit(1, (ByteRange(str(tmp_path / "missing.avro"), 0, None),)), analysis))
    assert fn._pending is None
    assert not any(t.name.startswith("recordprep-scatter") for t in threading.enumerate())


def test_a_failed_shard_surfaces_after_the_other_shards_threads_stopped(tmp_path):
    import threading

    from pipelines.run_files import ConversionFailed
    from pipelines.shuffle import _GatherShard

    (tmp_path / "o" / ".recordprep-tmp").mkdir(parents=True)
    bad = tmp_path / "scatter-00000.bin"
    bad.write_bytes(b"not lz4")
    opts = ConvertOptions(inputs=("x",), config="c", output=str(tmp_path / "o"))
    results = [{"unit": 0, "scatter": {"path": str(bad), "index": {g: [(0, 7, 1, 10)] for g in range(4)}}}]
    fn = _GatherShard(opts, 2, parallel=2)
    fn.setup()
    fn.start_bundle()
    with pytest.raises(ConversionFailed, match="truncated or damaged"):
        for shard in (0, 1):
            list(fn.process(shard, results))
        list(fn.finish_bundle())
    assert fn._running == []
    assert not any(t.name.startswith("recordprep-writer") for t in threading.enumerate())
    fn.teardown()
    assert not any(t.name.startswith("recordprep-gather") for t in threading.enumerate())


# ------------------------------------------------- progress, temp files on disk


def _one_unit(tmp_path: Path, records: int = 120, **opts_kw):
    """A config, options and analysis for converting ``part-0.avro`` of a small dataset as unit 0."""
    from convert.analysis import Analyzer
    from convert.config import load_config
    from pipelines.analyze import AnalysisValue

    paths = write_dataset(tmp_path / "d", make_records(records))
    config = load_config(str(paths["config"]))
    files = sorted(str(p) for p in (tmp_path / "d").glob("*.avro"))
    (tmp_path / "o" / ".recordprep-tmp").mkdir(parents=True)
    opts = ConvertOptions(inputs=tuple(files), config=str(paths["config"]), output=str(tmp_path / "o"), **opts_kw)
    a = Analyzer(config)
    a.add_records(make_records(records))
    return config, opts, files, AnalysisValue(a.result().to_json())


def _convert_unit(config, opts, unit, analysis, num_shards: int) -> dict:
    from pipelines.convert_pass import _ConvertUnit

    fn = _ConvertUnit(config, opts, num_shards)
    fn.start_bundle()
    assert list(fn.process(unit, analysis)) == []
    [done, _] = [o.value for o in fn.finish_bundle()]  # its result, then its statistics (TaggedOutput)
    return done


def test_the_gather_reports_records_written_and_the_input_bytes_they_stand_for(tmp_path):
    from pipelines.local.progress import GATHER, PROGRESS_DIR, read_totals
    from pipelines.plan import ByteRange, WorkUnit
    from pipelines.shuffle import _GatherShard

    config, opts, files, analysis = _one_unit(tmp_path, progress=True)
    root = tmp_path / "o" / ".recordprep-tmp" / PROGRESS_DIR
    root.mkdir()  # the launcher's reporter makes it
    units = [WorkUnit(i, (ByteRange(f, 0, None),)) for i, f in enumerate(files)]
    results = [_convert_unit(config, opts, u, analysis, 2) for u in units]
    fn = _GatherShard(opts, 2)
    fn.setup()
    fn.start_bundle()
    shards = [*(r for s in (0, 1) for r in fn.process(s, results)), *(wv.value for wv in fn.finish_bundle())]
    fn.teardown()
    written = sum(sp["records"] for sh in shards for sp in sh["shards"].values())
    assert written == 120
    assert sorted(p.name for p in root.glob("gather-*.json")) == ["gather-00000.json", "gather-00001.json"]
    records, nbytes = read_totals(str(root), (GATHER,))[GATHER]
    assert records == written
    assert abs(nbytes - sum(os.path.getsize(f) for f in files)) <= 4  # rounded per write


def test_a_local_run_prints_the_gather_pass_only_when_shuffling(data, tmp_path, monkeypatch):
    import functools
    import io

    import pipelines.job as job
    import pipelines.local.runner
    from pipelines import shuffle
    from pipelines.local.progress import ProgressReporter

    slow = shuffle._gathered

    def gathered(sources, spill):  # a gather slow enough for the reporter to see it
        for piece in slow(sources, spill):
            time.sleep(0.1)
            yield piece

    monkeypatch.setattr(shuffle, "_gathered", gathered)
    monkeypatch.setattr(shuffle, "_GATHER_CHUNK", 100)
    texts = {}
    for order in ("shuffled", "input"):
        stream = io.StringIO()
        monkeypatch.setattr(pipelines.local.runner, "ProgressReporter", functools.partial(ProgressReporter, interval=0.02, stream=stream))
        job.run_convert(ConvertOptions(inputs=(str(data["avro"]),), config=str(data["config"]), output=str(tmp_path / order),
                                       num_shards=2, workers=1, progress=True, order=order))
        texts[order] = stream.getvalue()
    gather_lines = [ln for ln in texts["shuffled"].splitlines() if "gather: " in ln]
    assert gather_lines, texts["shuffled"]
    assert int(gather_lines[-1].split("gather: ")[1].split(" records")[0].replace(",", "")) > 0
    assert "convert: " in texts["input"] and "gather" not in texts["input"]


def test_the_convert_pass_removes_each_prepared_file_once_read_and_a_retry_prepares_again(tmp_path):
    from pipelines.analyze import PREPARED_KEY, AnalysisValue, _AnalyzeUnit
    from pipelines.plan import ByteRange, WorkUnit

    config, opts, files, analysis = _one_unit(tmp_path)
    unit = WorkUnit(0, (ByteRange(files[0], 0, None),))
    [(_, _, prepared, _)] = list(_AnalyzeUnit(config, opts).process(unit))
    assert os.path.exists(prepared)
    with_file = AnalysisValue({**analysis.json, PREPARED_KEY: {0: prepared}})
    first = _convert_unit(config, opts, unit, with_file, 3)
    assert not os.path.exists(prepared)  # read to the end: removed
    retried = _convert_unit(config, opts, unit, with_file, 3)  # a retried unit: prepares from the input again
    assert first["per_file"] == retried["per_file"]
    assert first["scatter"]["index"] == retried["scatter"]["index"]
    assert Path(first["scatter"]["path"]).read_bytes() == Path(retried["scatter"]["path"]).read_bytes()


def test_no_prepared_file_outlives_the_convert_pass_and_no_key_range_file_its_shard(data, tmp_path, monkeypatch):
    """Disk: the prepared files are gone before the gather starts; a shard's key-range file once the shard is written."""
    from pipelines import shuffle

    seen: list[tuple[list[str], bool]] = []
    real = shuffle._gathered

    def gathered(sources, spill):
        tmp = Path(spill).parent
        before = sorted(p.name for p in tmp.glob("prepared-*"))
        yield from real(sources, spill)
        seen.append((before, os.path.exists(spill)))

    monkeypatch.setattr(shuffle, "_gathered", gathered)
    monkeypatch.setattr(shuffle, "_GATHER_BYTES", 20_000)  # several key ranges per shard: a key-range file each
    job_opts = ConvertOptions(inputs=(str(data["avro"]),), config=str(data["config"]), output=str(tmp_path / "o"),
                              num_shards=2, workers=1)
    run_convert(job_opts)
    assert len(seen) == 4  # 2 shards x 2 splits
    assert all(before == [] and not left for before, left in seen), seen


def test_scatter_frames_are_raw_on_local_disk_lz4_on_remote_file_systems_and_gather_the_same(tmp_path, monkeypatch):
    """A local disk's scatter and key-range files hold the frames as they are (no LZ4 CPU);
    a remote output's stay LZ4 (their bytes cross the network), in one block per bucket.
    The gathered shard is the same."""
    from pipelines import shuffle, tempfile_format
    from pipelines.plan import ByteRange, WorkUnit

    monkeypatch.setattr(shuffle, "_SPILL_BYTES", 8_000)  # several frames per unit
    gathered = {}
    for remote in (False, True):
        root = tmp_path / ("remote" if remote else "local")
        with monkeypatch.context() as m:
            if remote:
                m.setattr(tempfile_format, "lz4_temp", lambda path: True)
            config, opts, files, analysis = _one_unit(root, records=600, batch_size=50)
            results = [_convert_unit(config, opts, WorkUnit(i, (ByteRange(f, 0, None),)), analysis, 1)
                       for i, f in enumerate(files)]
            for r in results:
                entries = [fr for fs in r["scatter"]["index"].values() for fr in fs]
                assert os.path.getsize(r["scatter"]["path"]) == sum(e[1] for e in entries)
                if remote:  # one block per bucket: a header listing its frames (20 bytes each), then the LZ4 frames
                    assert all(len(fs) == 1 and fs[0][4] > 1 for fs in r["scatter"]["index"].values())
                    first = 4 + 20 * entries[0][4]
                else:
                    assert all(size == 4 + 12 * n + raw for _, size, n, raw in entries)
                    first = 0
                with open(r["scatter"]["path"], "rb") as f:
                    f.seek(first)
                    assert (f.read(4) == b"\x04\x22\x4d\x18") is remote  # LZ4 frame magic
            sources = [(r["scatter"]["path"], r["scatter"]["index"][0]) for r in results]  # the train bucket
            m.setattr(shuffle, "_GATHER_BYTES", 20_000)  # key ranges through a spill file too
            m.setattr(shuffle, "_GATHER_CHUNK", 16)
            spill = str(root / "o" / ".recordprep-tmp" / "gather.bin")
            gathered[remote] = [piece for piece, _ in shuffle._gathered(sources, spill)]
    assert len(gathered[False]) > 1 and gathered[False] == gathered[True]


@pytest.mark.parametrize("ranges", [1, 8])
def test_a_gathering_shard_holds_one_key_range_not_its_bucket(tmp_path, monkeypatch, ranges):
    """Python-level peak of gathering one bucket: about its size when it fits in ``_GATHER_BYTES``
    (no second copy of it), about ``_GATHER_BYTES`` when it is split into key ranges."""
    import tracemalloc

    from pipelines import shuffle
    from pipelines.plan import ByteRange, WorkUnit

    config, opts, files, analysis = _one_unit(tmp_path, records=3000, batch_size=100)
    monkeypatch.setattr(shuffle, "_SPILL_BYTES", 8_000)  # many small frames, as a large unit has
    monkeypatch.setattr(shuffle, "_GATHER_CHUNK", 16)
    results = [_convert_unit(config, opts, WorkUnit(i, (ByteRange(f, 0, None),)), analysis, 1) for i, f in enumerate(files)]
    sources = [(r["scatter"]["path"], r["scatter"]["index"][0]) for r in results]  # the train bucket
    bucket = sum(fr[3] for _, frames in sources for fr in frames)
    monkeypatch.setattr(shuffle, "_GATHER_BYTES", bucket // ranges + 1)
    spill = str(tmp_path / "o" / ".recordprep-tmp" / "gather.bin")
    tracemalloc.start()
    try:
        n = sum(k for _, k in shuffle._gathered(sources, spill))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == sum(fr[2] for _, frames in sources for fr in frames)
    assert peak < 1.7 * bucket / ranges + 100_000, (peak, bucket)  # + file buffers and the like
    assert not os.path.exists(spill)


def test_eval_dataset_of_shuffled_output_has_a_fixed_order_and_known_cardinality(outputs):
    import math

    import readers

    root, infos = outputs
    n = infos["seed0"]["splits"]["eval"]["num_records"]
    first = readers.eval_dataset(str(root / "seed0" / "eval-*"), 64)
    assert int(first.cardinality()) == math.ceil(n / 64)
    ids = [int(i) for x, _ in first for i in x["id"].numpy().ravel()]
    again = [int(i) for x, _ in readers.eval_dataset(str(root / "seed0" / "eval-*"), 64) for i in x["id"].numpy().ravel()]
    assert ids == again == [i for sh in _records(root / "seed0", "eval") for i in _ids(sh)]  # shard by shard, file order
    assert len(ids) == n and ids != sorted(ids)  # the seeded shuffle's order, the same on every read
