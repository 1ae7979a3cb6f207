"""Remote conversion row: requests and bytes of a conversion from and to emulated ``gs://`` (issue 38).

The bench dataset's Avro files are uploaded to the GCS emulator of
``tests/_remote.py`` and converted ``gs://`` -> ``gs://`` by the CLI, with
Beam reaching the emulator through the latency proxy
(``RemoteStack.env(counted=True)``), which counts every request and byte by
the kind of object it names. Printed per run: wall time, requests (all, and
the shuffle's ranged reads with their average size), bytes in and out, and
requests per GB written (the output's shard bytes).

Standalone: ``python -m bench.remote_convert --size small [--num-shards 4 16] [--ttfb-ms 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def convert_row(stack: Any, gs_in: str, shards: int, ttfb_ms: float, mbps: float) -> dict[str, Any]:
    out = f"gs://{stack.bucket}/bench-convert/{shards}"
    env = {**os.environ, **stack.env(counted=True)}
    stack.set_latency(ttfb_ms, mbps)
    stack.proxy_stats(reset=True)
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pipelines.cli", "convert", "-i", f"{gs_in}/*.avro",
                        "-c", str(REPO / "bench" / "features.yaml"), "-o", out, "--num-shards", str(shards),
                        "--no-progress", "--overwrite"], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    counts = stack.proxy_stats()["counts"]
    stack.set_latency(0, 0)
    if r.returncode:
        raise RuntimeError(f"conversion failed: {r.stderr[-2000:]}")
    blobs = stack.storage_client().list_blobs(stack.bucket, prefix=f"bench-convert/{shards}/")
    written = sum(b.size for b in blobs if ".tfrecord" in b.name)
    reads = counts.get("GET range scatter", 0)
    return {"shards": shards, "seconds": seconds, "written_bytes": written, "requests": counts["requests"],
            "requests_per_gb_written": counts["requests"] / (written / 1e9),
            "scatter_reads": reads, "scatter_read_avg_bytes": counts.get("bytes_out range scatter", 0) / max(1, reads),
            "bytes_in": counts.get("bytes_in", 0), "bytes_out": counts.get("bytes_out", 0), "counts": counts}


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    lines = [f"{meta['records']:,} records ({meta['input_mb']:.1f} MB of Avro) converted gs:// → gs:// through the "
             f"latency proxy ({meta['ttfb_ms']:g} ms to first byte):", "",
             "| shards (= units) | time (s) | MB written | requests | requests / GB written | shuffle reads | "
             "avg shuffle read (KB) | MB in | MB out |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['shards']} | {r['seconds']:.1f} | {r['written_bytes'] / 1e6:.1f} | {r['requests']:,} | "
                     f"{r['requests_per_gb_written']:,.0f} | {r['scatter_reads']:,} | {r['scatter_read_avg_bytes'] / 1e3:,.0f} | "
                     f"{r['bytes_in'] / 1e6:.1f} | {r['bytes_out'] / 1e6:.1f} |")
    return lines


def run(size: str, *, num_shards: tuple[int, ...] = (4, 16), ttfb_ms: float = 20.0, mbps: float = 0.0) -> dict[str, Any]:
    """Convert the bench dataset of ``size`` gs:// -> gs:// once per shard count: ``{"meta", "rows"}``."""
    from bench import make_data
    from bench.remote import stand_in_servers

    RemoteStack = stand_in_servers().RemoteStack

    manifest = make_data.ensure_dataset(size)
    avro = make_data.dataset_dir(size) / "avro"
    with RemoteStack() as stack:
        gs_in = stack.upload_dir(avro, "bench-in")
        rows = [convert_row(stack, gs_in, n, ttfb_ms, mbps) for n in num_shards]
    meta = {"records": manifest["records"], "input_mb": sum(p.stat().st_size for p in avro.glob("*.avro")) / 1e6,
            "ttfb_ms": ttfb_ms}
    return {"meta": meta, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    from bench import make_data

    ap = argparse.ArgumentParser(description="requests of a conversion from and to emulated gs://")
    ap.add_argument("--size", choices=sorted(make_data.SIZES), default="small")
    ap.add_argument("--num-shards", type=int, nargs="+", default=[4, 16])
    ap.add_argument("--ttfb-ms", type=float, default=20.0)
    ap.add_argument("--mbps", type=float, default=0.0)
    args = ap.parse_args(argv)
    result = run(args.size, num_shards=tuple(args.num_shards), ttfb_ms=args.ttfb_ms, mbps=args.mbps)
    print("\n".join(markdown(result["rows"], result["meta"])))
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"latest-remote-convert-{args.size}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
