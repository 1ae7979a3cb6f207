"""hdfs:// end to end against the WebHDFS stand-in of ``tests/_remote.py``: the real Beam job
reads and writes HDFS through Beam's ``HadoopFileSystem`` (the ``hdfs`` package), and
``readers`` stage the shards through WebHDFS; values are checked against a local run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _pipelines_data import make_records, shards_without_run_id, without_run_id, write_dataset
from _ports import free_port
from _remote import stats_by_file_name

from convert.spec import METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
from pipelines.remote import hdfs_beam_args

RECORDPREP = Path(sys.executable).with_name("recordprep")
NN = "hdfs://namenode:8020"


def _opts(inputs: str, config: Path, output: str, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(inputs,), config=str(config), output=output, **kw)


@pytest.fixture(scope="module")
def hdfs_dataset(remote_stack, tmp_path_factory):
    root = tmp_path_factory.mktemp("hdfs")
    paths = write_dataset(root / "data", make_records(300, seed=4))
    ns = remote_stack.hdfs_root / "hdfs-e2e"
    (ns / "in").mkdir(parents=True)
    for p in sorted((root / "data").glob("*.avro")):
        shutil.copy(p, ns / "in" / p.name)
    # What an interrupted earlier run leaves (shards and a vocabulary renamed into place,
    # no metadata): HDFS's RENAME does not replace files, the commit must.
    (ns / "out" / "vocab").mkdir(parents=True)
    (ns / "out" / ".recordprep-tmp").mkdir()  # the temp directory a killed run leaves says whose they are
    (ns / "out" / ".recordprep-tmp" / "train-00001-0a1b2c3d.tfrecord.gz").write_bytes(b"stale")
    (ns / "out" / "train-00000-of-00003.tfrecord.gz").write_bytes(b"stale")
    (ns / "out" / "vocab" / "color.txt").write_text("stale\n")
    local_out = root / "local-out"
    run_convert(_opts(str(root / "data" / "*.avro"), paths["config"], str(local_out), num_shards=3))
    return {"paths": paths, "ns": ns, "local": local_out, "url": f"{NN}/hdfs-e2e"}


@pytest.mark.slow
def test_cli_converts_hdfs_to_hdfs_like_a_local_run(hdfs_dataset, remote_stack):
    remote_stack.webhdfs_stats(reset=True)
    url = hdfs_dataset["url"]
    # Only RECORDPREP_WEBHDFS_URL (the readers' setting) is set: the Beam flags are derived.
    cli = subprocess.run(
        [str(RECORDPREP), "convert", "--input", f"{url}/in/*.avro", "--config",
         str(hdfs_dataset["paths"]["config"]), "--output", f"{url}/out", "--num-shards", "3"],
        capture_output=True, text=True, timeout=300, env=os.environ.copy(),
    )
    assert cli.returncode == 0, cli.stdout + cli.stderr
    out, local = hdfs_dataset["ns"] / "out", hdfs_dataset["local"]
    written = {without_run_id(str(p.relative_to(out))): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    expected = {without_run_id(str(p.relative_to(local))): p.read_bytes() for p in local.rglob("*") if p.is_file()}
    assert sorted(written) == sorted(expected)
    for name in written:
        if name == STATS_FILENAME:  # names its input files: the same statistics per file name
            assert stats_by_file_name(written[name]) == stats_by_file_name(expected[name])
        elif name != METADATA_FILENAME:
            assert written[name] == expected[name], name
    counts = remote_stack.webhdfs_stats()["counts"]
    assert counts.get("CREATE (datanode)", 0) > 0 and counts.get("RENAME", 0) > 0
    assert counts.get("OPEN (datanode)", 0) > 0


@pytest.mark.slow
def test_readers_on_hdfs_match_local(hdfs_dataset, remote_stack, tmp_path, monkeypatch):
    import readers
    from stores import staging as _staging

    if not (hdfs_dataset["ns"] / "out" / METADATA_FILENAME).exists():
        test_cli_converts_hdfs_to_hdfs_like_a_local_run(hdfs_dataset, remote_stack)
    monkeypatch.setattr(_staging, "_clients", {})
    monkeypatch.setenv("RECORDPREP_HDFS_CACHE", str(tmp_path / "cache"))
    url, local = hdfs_dataset["url"] + "/out", str(hdfs_dataset["local"])
    assert shards_without_run_id(readers.load_info(url + "/train-*")) == shards_without_run_id(readers.load_info(local))

    def ids(pattern):
        ds = readers.train_dataset(pattern, 16, num_epochs=1, drop_remainder=False, seed=1)
        return sorted(int(i) for f, _ in ds.as_numpy_iterator() for i in f["id"][:, 0])

    assert ids(url + "/train-*") == ids(local + "/train-*")
    remote_batches = list(readers.eval_dataset(url + "/eval-*", 32).as_numpy_iterator())
    local_batches = list(readers.eval_dataset(local + "/eval-*", 32).as_numpy_iterator())
    assert len(remote_batches) == len(local_batches) > 0
    for (rf, rl), (lf, ll) in zip(remote_batches, local_batches, strict=True):
        np.testing.assert_array_equal(rl, ll)
        for k in rf:
            np.testing.assert_array_equal(rf[k], lf[k], err_msg=k)
    staged = tmp_path / "cache" / "namenode_8020" / "hdfs-e2e" / "out"
    assert (staged / METADATA_FILENAME).exists() and list(staged.glob("train-*"))


@pytest.mark.slow
def test_inspect_and_verify_on_hdfs(hdfs_dataset, remote_stack):
    if not (hdfs_dataset["ns"] / "out" / METADATA_FILENAME).exists():
        test_cli_converts_hdfs_to_hdfs_like_a_local_run(hdfs_dataset, remote_stack)
    url = hdfs_dataset["url"] + "/out"
    for cmd in (["inspect", url, "--examples", "1"], ["verify", url]):
        res = subprocess.run([str(RECORDPREP), *cmd], capture_output=True, text=True, timeout=300,
                             env=os.environ.copy())
        assert res.returncode == 0, (cmd, res.stdout + res.stderr)
        assert ("train" if cmd[0] == "inspect" else "OK") in res.stdout


@pytest.mark.slow
def test_explicit_beam_flags_and_overwrite(hdfs_dataset, remote_stack):
    url = "hdfs://other-name/hdfs-e2e"  # the server part is ignored by Beam with --hdfs_full_urls
    opts = _opts(f"{url}/in/part-0.avro", hdfs_dataset["paths"]["config"], f"{url}/flags-out",
                 num_shards=2, beam_args=tuple(remote_stack.hdfs_beam_args()))
    assert not run_convert(opts).skipped
    assert run_convert(opts).skipped
    again = run_convert(_opts(f"{url}/in/*.avro", hdfs_dataset["paths"]["config"], f"{url}/flags-out",
                              num_shards=1, overwrite=True, beam_args=opts.beam_args))
    assert not again.skipped
    out = hdfs_dataset["ns"] / "flags-out"
    run = json.loads((out / METADATA_FILENAME).read_text())["run_id"]
    assert sorted(p.name for p in out.glob("train-*")) == [f"train-00000-of-00001-{run}.tfrecord.gz"]
    assert not (out / ".recordprep-tmp").exists()


# ------------------------------------------------------------------ flags and the stand-in server


def test_hdfs_flags_are_derived_like_the_readers(monkeypatch):
    monkeypatch.delenv("RECORDPREP_WEBHDFS_URL", raising=False)
    monkeypatch.setenv("HADOOP_USER_NAME", "alice")
    assert hdfs_beam_args(["/local/in/*.avro", "gs://b/out"], []) == []
    assert hdfs_beam_args(["hdfs://nn.example.com:8020/in/*.avro"], []) == [
        "--hdfs_host", "nn.example.com", "--hdfs_port", "9870", "--hdfs_user", "alice", "--hdfs_full_urls"]
    monkeypatch.setenv("RECORDPREP_WEBHDFS_URL", "http://gateway:50070")
    assert hdfs_beam_args([None, "hdfs://nn/out"], ["--hdfs_user=bob"]) == [
        "--hdfs_host", "gateway", "--hdfs_port", "50070", "--hdfs_full_urls"]
    given = ["--hdfs_host", "h", "--hdfs_port", "1", "--hdfs_user", "u", "--hdfs_full_urls"]
    assert hdfs_beam_args(["hdfs://nn/out"], given) == []


def test_webhdfs_stand_in_follows_hdfs_semantics(remote_stack):
    import hdfs

    client = hdfs.InsecureClient(remote_stack.webhdfs_url, user="tester")
    client.makedirs("/sem/dir")
    client.write("/sem/a.bin", data=b"0123456789")
    with pytest.raises(hdfs.HdfsError, match="already exists"):
        client.write("/sem/a.bin", data=b"again")
    client.write("/sem/a.bin", data=b"abcdefghij", overwrite=True)
    with client.write("/sem/a.bin", append=True) as w:  # streamed (chunked) like Beam's writes
        w.write(b"KLM")
    with client.read("/sem/a.bin", offset=3, length=4) as r:
        assert r.read() == b"defg"
    assert client.status("/sem/a.bin")["length"] == 13
    assert client.status("/sem/missing", strict=False) is None
    assert [name for name, _ in client.list("/sem", status=True)] == ["a.bin", "dir"]
    client.write("/sem/b.bin", data=b"b")
    with pytest.raises(hdfs.HdfsError):  # HDFS does not rename onto an existing file
        client.rename("/sem/b.bin", "/sem/a.bin")
    client.rename("/sem/b.bin", "/sem/dir")  # into an existing directory
    assert client.status("/sem/dir/b.bin")["length"] == 1
    with pytest.raises(hdfs.HdfsError, match="not empty"):
        client.delete("/sem/dir")
    assert client.delete("/sem", recursive=True) is True
    assert client.delete("/sem", recursive=True) is False


def test_wait_on_an_unreachable_or_unnamed_namenode_says_so_in_one_line(tmp_path):
    env = {**os.environ, "RECORDPREP_WEBHDFS_URL": f"http://127.0.0.1:{free_port()}"}  # nothing listens
    res = subprocess.run([str(RECORDPREP), "wait", "hdfs://nn/out", "--timeout", "0"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: cannot read hdfs://nn/out/dataset_info.json: ")
    assert "RECORDPREP_WEBHDFS_URL" in res.stderr
    env.pop("RECORDPREP_WEBHDFS_URL")
    res = subprocess.run([str(RECORDPREP), "wait", "hdfs:///out", "--timeout", "0"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "cannot tell the NameNode" in res.stderr


@pytest.mark.slow
def test_wait_on_hdfs_sees_a_complete_output_and_times_out_on_a_missing_one(hdfs_dataset, remote_stack):
    shutil.copytree(hdfs_dataset["local"], hdfs_dataset["ns"] / "waited", dirs_exist_ok=True)
    url = hdfs_dataset["url"]
    done = subprocess.run([str(RECORDPREP), "wait", f"{url}/waited", "--timeout", "60", "--poll", "0.1"],
                          capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert done.returncode == 0 and "is complete" in done.stdout, done.stdout + done.stderr
    never = subprocess.run([str(RECORDPREP), "wait", f"{url}/never", "--timeout", "0.5", "--poll", "0.1"],
                           capture_output=True, text=True, timeout=120, env=os.environ.copy())
    assert never.returncode == 1 and "still incomplete after 0.5 s" in never.stderr, never.stderr
