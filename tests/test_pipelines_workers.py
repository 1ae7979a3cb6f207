"""Local worker processes: chosen by input size, same bytes as in-process."""

from __future__ import annotations

import pytest
from _pipelines_data import by_shard, make_records, write_dataset

from pipelines import job
from pipelines.job import run_convert
from pipelines.local import MULTIPROCESS_MIN_BYTES, local_workers
from pipelines.local import runner as local_runner
from pipelines.options import ConvertOptions, OptionsError


def _o(**kw) -> ConvertOptions:
    return ConvertOptions(inputs=("x",), config="c", output="o", **kw)


def test_auto_uses_cores_only_when_the_input_repays_start_up(monkeypatch):
    monkeypatch.setattr(local_runner, "_cores", lambda: 8)
    assert local_workers(_o(), MULTIPROCESS_MIN_BYTES - 1, 16) == 1
    assert local_workers(_o(), MULTIPROCESS_MIN_BYTES, 16) == 8
    assert local_workers(_o(), 10 * MULTIPROCESS_MIN_BYTES, 3) == 3  # no idle workers
    assert local_workers(_o(workers=1), 10**12, 16) == 1
    assert local_workers(_o(workers=4), 0, 1) == 4
    assert local_workers(_o(), 10**12, 16, beam_args=("--direct_num_workers=3",)) == 1  # Beam's flags decide
    with pytest.raises(OptionsError, match="--workers"):
        _o(workers=0)


@pytest.mark.slow
def test_worker_processes_write_the_same_bytes(tmp_path):
    paths = write_dataset(tmp_path / "d", make_records(400))
    res = {}
    for w in (1, 2):
        res[w] = run_convert(ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]),
                                            output=str(tmp_path / f"w{w}"), num_shards=2, workers=w))
    assert "2 worker processes" in res[2].info["runner"]
    assert res[1].info["counts"] == res[2].info["counts"]
    for split in res[1].info["splits"].values():
        for shard in split["shards"]:
            assert by_shard(tmp_path / "w1", shard["file"]).read_bytes() == by_shard(tmp_path / "w2", shard["file"]).read_bytes()


def test_worker_entry_point_skips_unused_connectors_and_keeps_gcs(tmp_path):
    """What ``python -m pipelines.local.worker`` sets up before Beam's worker runs."""
    import json
    import subprocess
    import sys

    from pipelines.local import patches as _patches
    from pipelines.local import worker as _worker

    probe = (
        "import json, sys\n"
        "from pipelines.local import worker as _worker\n"
        "_worker.prepare()\n"
        "import apache_beam.runners.worker.sdk_worker_main, pipelines.convert_pass, pipelines.commit\n"
        "from apache_beam.runners.worker import statesampler\n"
        "from apache_beam.utils.counters import CounterFactory\n"
        "from apache_beam.io.filesystems import FileSystems\n"
        "from pipelines.local import patches as _patches\n"
        "print(json.dumps({'loaded': [m for m in _worker.UNUSED_MODULES if sys.modules.get(m) is not None],\n"
        "                  'gcs': type(FileSystems.get_filesystem('gs://bucket/x')).__name__,\n"
        "                  'malloc': _worker._tune_malloc(),\n"
        "                  'loopback': _patches.LOOPBACK_BINDS.active,\n"
        "                  'sampling_ms': statesampler.StateSampler('p', CounterFactory()).sampling_period_ms}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []  # BigQuery, MongoDB and pyarrow stay out of the worker
    assert got["gcs"] == "GCSFileSystem"  # Cloud Storage still loads on demand
    assert got["loopback"]
    assert got["sampling_ms"] == _patches.STATE_SAMPLING_PERIOD_MS < 200  # bundles end without a 200 ms wait
    if sys.platform.startswith("linux"):
        assert got["malloc"]
    assert _worker.command().endswith("-m pipelines.local.worker --recordprep-schemes=azfs,gs,hdfs,s3")
    assert _worker.command(_worker.schemes_of(["/data/x.avro", "gs://b/in/*.avro"])).endswith("--recordprep-schemes=gs")
    # Without prepare(), Beam loads them: the probe would catch a Beam that stopped doing so.
    plain = subprocess.run([sys.executable, "-c", "import sys, apache_beam; print('pyarrow' in sys.modules)"],
                           capture_output=True, text=True, timeout=120, check=True)
    assert plain.stdout.strip().splitlines()[-1] == "True"


def test_a_local_job_without_remote_paths_loads_no_remote_file_system(tmp_path):
    """Workers (and the CLI's launcher) of a local run on local paths load neither
    Cloud Storage, HDFS nor Dataflow's API client; a path's scheme brings its file system back."""
    import json
    import subprocess
    import sys

    from pipelines.local import worker as _worker

    probe = (
        "import json, sys\n"
        "from pipelines.local import worker as _worker\n"
        "_worker.prepare(sys.argv[1].split(',') if sys.argv[1] else [])\n"
        "import apache_beam.runners.worker.sdk_worker_main, pipelines.convert_pass, pipelines.commit\n"
        "from apache_beam.io.filesystems import FileSystems\n"
        "def fs(p):\n"
        "    try:\n"
        "        return type(FileSystems.get_filesystem(p)).__name__\n"
        "    except ValueError as e:\n"
        "        return 'none'\n"
        "print(json.dumps({'gs': fs('gs://b/x'), 'hdfs': fs('hdfs://h/x'), 's3': fs('s3://b/x'), 'azfs': fs('azfs://a/c/x'),\n"
        "                  'local': fs('/tmp/x'),\n"
        "                  'dataflow': sys.modules.get('google.cloud.dataflow') is not None}))\n"
    )
    for schemes, want in (("", {"gs": "none", "hdfs": "none", "s3": "none", "azfs": "none"}),
                          ("gs", {"gs": "GCSFileSystem", "hdfs": "none", "s3": "none", "azfs": "none"}),
                          ("s3", {"gs": "none", "hdfs": "none", "s3": "S3FileSystem", "azfs": "none"}),
                          ("azfs", {"gs": "none", "hdfs": "none", "s3": "none", "azfs": "BlobStorageFileSystem"})):
        out = subprocess.run([sys.executable, "-c", probe, schemes], capture_output=True, text=True, timeout=120, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert {k: got[k] for k in want} == want and got["local"] == "LocalFileSystem" and not got["dataflow"]

    assert _worker.schemes_of(["-i", "hdfs://nn/x/*.avro", "-o", "/out"]) == {"hdfs"}
    assert _worker.schemes_of(["-i", "s3://b/x/*.avro", "-o", "/out"]) == {"s3"}
    assert _worker.schemes_of(["-i", "azfs://a/c/x/*.avro", "-o", "/out"]) == {"azfs"}
    # the launcher: a local convert only; Dataflow and other commands keep everything
    for argv, applies in ((["convert", "-i", "x"], True), (["convert", "-i", "x", "--", "--runner", "DirectRunner"], True),
                          (["convert", "-i", "x", "--", "--runner=DataflowRunner"], False), (["infer", "-i", "x"], False)):
        code = f"import sys; from pipelines.local import worker as _worker; print(_worker.prepare_launcher({argv!r}), 'google.cloud.dataflow' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
        assert out.stdout.split() == [str(applies), str(applies)]  # applied: marked absent (a None entry)


def _run_cli(src, out, env_extra, workers=2):
    import os
    import subprocess
    import sys

    env = {**os.environ, **env_extra}
    cmd = [sys.executable, "-m", "pipelines.cli", "convert", "--input", str(src["avro"]), "--config",
           str(src["config"]), "--output", str(out), "--num-shards", "2", "--workers", str(workers)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow
def test_pre_forked_workers_write_the_same_bytes_as_started_ones(tmp_path):
    """The CLI forks its workers from the launcher (pipelines/local/warm.py) and hands
    every one of them to Beam; the output is byte for byte what workers started by
    Beam write, and no worker is left behind."""
    import gzip
    import json

    src = write_dataset(tmp_path / "d", make_records(400))
    warm_out = _run_cli(src, tmp_path / "warm", {})
    cold_out = _run_cli(src, tmp_path / "cold", {"RECORDPREP_WARM_WORKERS": "0"})
    warm = json.loads((tmp_path / "warm" / "dataset_info.json").read_text())
    cold = json.loads((tmp_path / "cold" / "dataset_info.json").read_text())
    assert warm["runner"].endswith("2 worker processes, pre-forked)")
    assert cold["runner"].endswith("2 worker processes)")
    assert "2 worker processes, 2 pre-forked)" in warm_out, warm_out  # the pool served both
    assert "2 worker processes, 0 pre-forked)" in cold_out, cold_out
    assert warm["counts"] == cold["counts"]
    for split in warm["splits"].values():
        for shard in split["shards"]:
            a, b = (by_shard(tmp_path / d, shard["file"]) for d in ("warm", "cold"))
            opener = gzip.open if shard["file"].endswith(".gz") else open
            with opener(a, "rb") as fa, opener(b, "rb") as fb:
                assert fa.read() == fb.read(), shard["file"]


def test_warm_pool_serves_only_its_command_and_dismisses_the_rest():
    """Children a run does not use exit when the pool closes (no orphans, no
    zombies); a command that is not the pool's is left to Beam."""
    import subprocess
    import sys

    probe = (
        "import os, sys\n"
        "from pipelines.local.warm import WarmPool\n"
        "pool = WarmPool.start(2, 'the-worker-command')\n"
        "assert pool is not None\n"
        "pids = [pid for pid, _ in pool._idle]\n"
        "assert pool.popen('another command', dict(os.environ)) is None\n"
        "pool.close()\n"
        "for pid in pids:\n"
        "    try:\n"
        "        os.waitpid(pid, os.WNOHANG)\n"
        "    except ChildProcessError:\n"
        "        continue\n"
        "    sys.exit(f'child {pid} was not reaped')\n"
        "print('ok', pool.handed)\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "0"], r.stdout + r.stderr


def test_warm_pool_is_off_where_forking_is_unsafe():
    """In a fresh process (this one has threads and polars): forking is allowed
    single-threaded without polars, and refused after each of them or with the switch off."""
    import subprocess
    import sys

    probe = (
        "import json, os, sys, threading\n"
        "from pipelines.local import warm as _warm\n"
        "got = {'fresh': _warm.can_fork()}\n"
        "os.environ[_warm.ENV_SWITCH] = '0'\n"
        "got['switched_off'] = _warm.can_fork()\n"
        "del os.environ[_warm.ENV_SWITCH]\n"
        "stop = threading.Event()\n"
        "t = threading.Thread(target=stop.wait)\n"
        "t.start()\n"
        "got['another_thread'] = _warm.can_fork()\n"
        "stop.set()\n"
        "t.join()\n"
        "got['thread_gone'] = _warm.can_fork()\n"
        "import polars\n"
        "got['polars'] = _warm.can_fork()\n"
        "got['pool'] = _warm.WarmPool.start(2, 'cmd') is not None\n"
        "print(json.dumps(got))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    got = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    linux = sys.platform.startswith("linux")
    assert got == {"fresh": linux, "switched_off": False, "another_thread": False, "thread_gone": linux,
                   "polars": False, "pool": False}


@pytest.mark.slow
def test_pre_forked_workers_report_rejected_records_like_started_ones(tmp_path):
    """A failing run (rejected records, no tolerance) ends the same way with
    pre-forked workers: exit code 1, the same closing error line, the same error output,
    and no worker traceback (Beam's harness prints one to the stderr it shares with the CLI)."""
    import json
    import os
    import subprocess
    import sys

    src = write_dataset(tmp_path / "d", make_records(400))
    part = sorted((tmp_path / "d").glob("*.jsonl"))[0]
    bad = dict(make_records(1)[0], x="not a number")
    part.write_text(part.read_text() + json.dumps(bad) + "\n")
    results = {}
    for mode in ("1", "0"):
        out = tmp_path / f"out{mode}"
        cmd = [sys.executable, "-m", "pipelines.cli", "convert", "--input", str(src["json"]), "--config",
               str(src["config"]), "--output", str(out), "--num-shards", "2", "--workers", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "RECORDPREP_WARM_WORKERS": mode})
        errors = [json.loads(line) for p in sorted((out / "errors").glob("*")) for line in p.read_text().splitlines()]
        last = r.stderr.strip().splitlines()[-1].replace(str(out), "OUT")
        results[mode] = (r.returncode, last, [(e["line"], e["field"], e["reason"]) for e in errors])
        assert r.returncode == 1 and last.startswith("error: 1 of 401 records were rejected"), r.stderr[-3000:]
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert results["1"] == results["0"] and len(results["1"][2]) == 1


def test_frozen_heap_freezes_while_open_and_leaves_a_callers_freeze_alone():
    """The run's objects are out of the cyclic GC while it runs (its full collections, and
    its forked children's, skip the launcher's heap); the caller's process gets its GC
    back as it was: unfrozen, or frozen by the caller as the caller left it."""
    import gc

    from pipelines.local.warm import frozen_heap

    if gc.get_freeze_count():
        pytest.skip("this test process already froze objects")
    with frozen_heap():
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("a failed run")
    assert gc.get_freeze_count() == 0

    gc.freeze()  # the caller's own freeze
    try:
        theirs = gc.get_freeze_count()
        with frozen_heap():
            assert gc.get_freeze_count() == theirs
        assert gc.get_freeze_count() == theirs
    finally:
        gc.unfreeze()


def test_a_run_leaves_the_callers_gc_unfrozen(tmp_path, monkeypatch):
    import gc

    if gc.get_freeze_count():
        pytest.skip("this test process already froze objects")
    seen = []
    real = job._build_pipeline
    monkeypatch.setattr(job, "_build_pipeline", lambda *a, **k: (seen.append(gc.get_freeze_count()), real(*a, **k))[1])
    paths = write_dataset(tmp_path / "d", make_records(50))
    run_convert(ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]), output=str(tmp_path / "out"),
                               num_shards=1, workers=1))
    assert seen and seen[0] > 0  # frozen while the run builds and runs its pipeline
    assert gc.get_freeze_count() == 0
