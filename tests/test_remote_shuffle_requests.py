"""The shuffle's requests on gs:// (issue 38): counted by the latency proxy of
``tests/_remote.py`` (Beam reaching the emulator through it). Each unit's
scatter file holds a bucket's frames back to back; consecutive units are
merged into groups until a bucket of a group is at least ``_FAN_IN_READ_BYTES``;
every read is one ranged GET of exactly what it needs; and the shards are the
same bytes as a local run's (no fan-in there) whatever the grouping."""

from __future__ import annotations

import pytest
from _pipelines_data import make_records, without_run_id, write_dataset

from pipelines import shuffle
from pipelines.job import run_convert
from pipelines.options import ConvertOptions

pytestmark = pytest.mark.slow

SPLITS = 2  # train, eval
SHARDS = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("requests")
    data = write_dataset(root / "data", make_records(3000, seed=11))
    opts = {"inputs": (str(data["avro"]),), "config": str(data["config"]), "num_shards": SHARDS, "batch_size": 100}
    local = root / "local"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(shuffle, "_SPILL_BYTES", 16 << 10)
        run_convert(ConvertOptions(output=str(local), **opts))
    return opts, local


@pytest.mark.parametrize("fan_in_bytes", [1, 10 << 10, 1 << 20], ids=["units-alone", "pairs", "one-group"])
def test_scatter_reads_follow_the_formula_and_shards_are_the_same_bytes(dataset, remote_stack, monkeypatch,
                                                                        fan_in_bytes):
    opts, local = dataset
    monkeypatch.setattr(shuffle, "_SPILL_BYTES", 16 << 10)  # several spills per unit, as at scale
    monkeypatch.setattr(shuffle, "_FAN_IN_READ_BYTES", fan_in_bytes)
    written: list[dict] = []
    close = shuffle.Scatter.close

    def recording_close(self, input_bytes):
        written.append(close(self, input_bytes))
        return written[-1]

    monkeypatch.setattr(shuffle.Scatter, "close", recording_close)
    gathered_from: dict[int, dict] = {}  # what the gather read: the groups' (or units') files
    write_shard = shuffle._GatherShard._write_shard

    def recording_write_shard(self, shard, results):
        gathered_from.update((r["unit"], r) for r in results)
        return write_shard(self, shard, results)

    monkeypatch.setattr(shuffle._GatherShard, "_write_shard", recording_write_shard)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", remote_stack.env(counted=True)["STORAGE_EMULATOR_HOST"])
    out = f"requests/{fan_in_bytes}"
    remote_stack.proxy_stats(reset=True)
    run_convert(ConvertOptions(output=f"gs://{remote_stack.bucket}/{out}", **opts))
    counts = remote_stack.proxy_stats()["counts"]

    units = [{"unit": int(r["path"].split("scatter-")[1][:5]), "scatter": r} for r in written]
    # One index entry per (unit, bucket) however many spills: a block listing the spills' frames.
    assert all(len(e) == 1 and e[0][4] > 2 for r in written for e in r["index"].values())
    of = shuffle.fan_in_groups([(u["unit"], shuffle._scatter_bytes(u)) for u in units], SHARDS * SPLITS)
    groups = [[u for u in units if of[u["unit"]] == g] for g in sorted(set(of.values()))]
    merged = [u for g in groups if len(g) > 1 for u in g]
    # The formula: a merged unit's file is read whole (one GET: each is under _READ_BYTES), then
    # one GET per (group, split, bucket); no byte is read twice within a pass.
    expected_gets = len(merged) + sum(len({b for u in g for b in u["scatter"]["index"]}) for g in groups)
    # (one per unit of a group and bucket: not as many as the units' spills)
    assert counts["GET range scatter"] == expected_gets
    assert len(gathered_from) == len(groups)
    gathered = sum(shuffle._scatter_bytes(g) for g in gathered_from.values())
    assert counts["bytes_out range scatter"] == gathered + sum(shuffle._scatter_bytes(u) for u in merged)
    assert len(groups) == {1: len(units), 10 << 10: len(units) // 2, 1 << 20: 1}[fan_in_bytes]

    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    shards = sorted(local.glob("*.tfrecord.gz"))
    assert len(shards) == SHARDS * SPLITS
    remote = _remote_shards(bucket, out)
    for p in shards:
        assert remote[without_run_id(p.name)].download_as_bytes() == p.read_bytes(), p.name

    out_bytes = sum(p.stat().st_size for p in shards)
    gathers = expected_gets - len(merged)
    print(f"\n{fan_in_bytes}: requests {counts['requests']} ({counts['requests'] / (out_bytes / 1e9):,.0f} per GB "
          f"written), scatter reads {counts['GET range scatter']}, gather reads {gathers} averaging "
          f"{gathered / gathers:,.0f} bytes")


def test_blocks_larger_than_a_read_are_read_in_pieces_with_the_same_bytes(dataset, remote_stack, monkeypatch):
    opts, local = dataset
    monkeypatch.setattr(shuffle, "_SPILL_BYTES", 16 << 10)
    monkeypatch.setattr(shuffle, "_READ_BYTES", 4 << 10)  # under a block: header, then runs of frames
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", remote_stack.env(counted=True)["STORAGE_EMULATOR_HOST"])
    remote_stack.proxy_stats(reset=True)
    run_convert(ConvertOptions(output=f"gs://{remote_stack.bucket}/requests/pieces", **opts))
    counts = remote_stack.proxy_stats()["counts"]
    assert counts["GET range of 4096 bytes"] > 0  # the merge's reads of whole files, in pieces
    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    remote = _remote_shards(bucket, "requests/pieces")
    for p in sorted(local.glob("*.tfrecord.gz")):
        assert remote[without_run_id(p.name)].download_as_bytes() == p.read_bytes(), p.name


def _remote_shards(bucket, prefix: str) -> dict:
    """The output's shard blobs by name less the run id (each run names its shards apart)."""
    return {without_run_id(b.name.rsplit("/", 1)[-1]): b for b in bucket.list_blobs(prefix=f"{prefix}/")
            if b.name.endswith(".tfrecord.gz") and "/" not in b.name[len(prefix) + 1:]}
