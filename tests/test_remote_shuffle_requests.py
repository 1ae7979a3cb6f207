"""The shuffle's requests on gs:// (issue 38): counted by the latency proxy of
``tests/_remote.py`` (Beam reaching the emulator through it), each scatter
byte read once, one ranged read per (unit, split, bucket), and the shards the
same bytes as a local run's."""

from __future__ import annotations

import pytest
from _pipelines_data import make_records, write_dataset
from _remote import remote_stack  # noqa: F401 - the session fixture

from pipelines import transforms
from pipelines.job import run_convert
from pipelines.options import ConvertOptions

pytestmark = pytest.mark.slow


def test_each_scatter_byte_is_read_once_in_one_read_per_unit_and_bucket(remote_stack, tmp_path, monkeypatch):  # noqa: F811
    data = write_dataset(tmp_path / "data", make_records(3000, seed=11))
    monkeypatch.setattr(transforms, "_SPILL_BYTES", 16 << 10)  # many spills per unit, as at scale
    written: list[dict] = []
    close = transforms._Scatter.close

    def recording_close(self, input_bytes):
        result = close(self, input_bytes)
        written.append(result)
        return result

    monkeypatch.setattr(transforms._Scatter, "close", recording_close)
    opts = {"inputs": (str(data["avro"]),), "config": str(data["config"]), "num_shards": 4, "batch_size": 100}
    local = tmp_path / "local"
    run_convert(ConvertOptions(output=str(local), **opts))
    written.clear()

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", remote_stack.env(counted=True)["STORAGE_EMULATOR_HOST"])
    remote_stack.proxy_stats(reset=True)
    run_convert(ConvertOptions(output=f"gs://{remote_stack.bucket}/requests/out", **opts))
    counts = remote_stack.proxy_stats()["counts"]

    spans = [frames for r in written for frames in r["index"].values()]
    assert sum(len(f) for f in spans) > 2 * len(spans)  # several spills per (unit, bucket)
    scatter_bytes = sum(fr[1] for frames in spans for fr in frames)
    # The formula: one ranged GET per (unit, split, bucket) span (each under _READ_BYTES),
    # and every byte read once (no read-ahead past the span).
    assert counts["GET range scatter"] == len(spans)
    assert counts["bytes_out range scatter"] == scatter_bytes
    bucket = remote_stack.storage_client().bucket(remote_stack.bucket)
    for p in sorted(local.glob("*.tfrecord.gz")):
        assert bucket.blob(f"requests/out/{p.name}").download_as_bytes() == p.read_bytes(), p.name
    out_bytes = sum(p.stat().st_size for p in local.glob("*.tfrecord.gz"))
    print(f"scatter GETs {counts['GET scatter']}, requests {counts['requests']}, per GB written {counts['requests'] / (out_bytes / 1e9):.0f}; "
          f"scatter reads {counts['GET range scatter']} averaging {scatter_bytes / len(spans):.0f} bytes")
