"""Local worker processes: chosen by input size, same bytes as in-process."""

from __future__ import annotations

import pytest
from _pipelines_data import make_records, write_dataset

from pipelines import job
from pipelines.job import MULTIPROCESS_MIN_BYTES, local_workers, run_convert
from pipelines.options import ConvertOptions, OptionsError


def _o(**kw) -> ConvertOptions:
    return ConvertOptions(inputs=("x",), config="c", output="o", **kw)


def test_auto_uses_cores_only_when_the_input_repays_start_up(monkeypatch):
    monkeypatch.setattr(job, "_cores", lambda: 8)
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
            assert (tmp_path / "w1" / shard["file"]).read_bytes() == (tmp_path / "w2" / shard["file"]).read_bytes()
