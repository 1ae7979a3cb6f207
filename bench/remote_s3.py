"""The ``s3://`` rows of the remote reader table: staged reads against the local S3 of ``tests/_remote_s3.py``.

TensorFlow 2.21 has no S3 file system, so ``readers`` stage ``s3://`` shards
on local disk (``stores.staging``) and read them there. This measures what
that costs against the same shards read locally, behind the latency proxy
(``--remote-ttfb-ms``, ``--remote-mbps`` per connection, as for ``gs://`` in
:mod:`bench.remote`): time to first batch and examples/s over ``--epochs``
epochs (after one unmeasured local pass: TensorFlow's warm-up), with a cold staging directory, a warm one (a restart), and a cold one
with one straggler (the first train shard served with 10x the time to first
byte and 1/10 of the bandwidth). The streamed reference is ``gs://`` in
:mod:`bench.remote` (TensorFlow's GCS file system through the same proxy).

Standalone: ``python -m bench.remote_s3 --size small [--dir OUT]``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.remote import (
    MBPS,
    REPO,
    STRAGGLER_FACTOR,
    TTFB_MS,
    bench_output,
    clock_log,
    stand_in_servers,
)


def measure(pattern: str, *, epochs: int, batch_size: int, cache_dir: str | None,
            cache_option: str = "s3_cache_dir") -> dict[str, Any]:
    """Time to first batch and examples/s over ``epochs`` (the clock starts before the dataset is built);
    ``cache_option`` names the ``ReadOptions`` field ``cache_dir`` goes to (the store's staging directory)."""
    import readers

    opts = readers.ReadOptions(**{cache_option: cache_dir}) if cache_dir else readers.ReadOptions()
    start = time.perf_counter()
    ds = readers.train_dataset(pattern, batch_size, num_epochs=epochs, drop_remainder=False, seed=1, options=opts)
    first = None
    n = 0
    for features, _ in ds:
        if first is None:
            first = time.perf_counter() - start
        n += int(next(iter(features.values())).shape[0])
    total = time.perf_counter() - start
    return {"first_batch_s": round(first or 0.0, 3), "seconds": round(total, 3), "examples": n,
            "examples_per_s": round(n / total)}


def run(out: str, *, epochs: int, batch_size: int, ttfb_ms: float, mbps: float, log) -> dict[str, Any]:
    import readers

    servers = stand_in_servers("_remote_s3")
    info = readers.load_info(out)
    train = info.splits["train"].shards
    rows: dict[str, Any] = {}
    with servers.S3Stack() as stack:
        stack.apply_env()
        try:
            local = Path(out)
            for shard in [*train, None]:
                name = shard.file if shard else "dataset_info.json"
                stack.client().put_object(Bucket=stack.bucket, Key=f"bench/out/{name}",
                                          Body=(local / name).read_bytes())
            for stats in ("stats.json",):
                if (local / stats).exists():
                    stack.client().put_object(Bucket=stack.bucket, Key=f"bench/out/{stats}",
                                              Body=(local / stats).read_bytes())
            url = f"s3://{stack.bucket}/bench/out"
            log(f"s3: {len(train)} train shards, {sum(s.num_bytes for s in train) / 1e6:.1f} MB uploaded")
            measure(f"{out}/train-*", epochs=1, batch_size=batch_size, cache_dir=None)  # TensorFlow's warm-up
            rows["local"] = measure(f"{out}/train-*", epochs=epochs, batch_size=batch_size, cache_dir=None)
            log(f"s3: local {rows['local']}")
            stack.set_latency(ttfb_ms, mbps)
            cache = Path(tempfile.mkdtemp(prefix="recordprep-s3-bench-"))
            try:
                rows["s3 cold"] = measure(f"{url}/train-*", epochs=epochs, batch_size=batch_size, cache_dir=str(cache))
                log(f"s3: cold {rows['s3 cold']}")
                rows["s3 warm"] = measure(f"{url}/train-*", epochs=epochs, batch_size=batch_size, cache_dir=str(cache))
                log(f"s3: warm {rows['s3 warm']}")
                shutil.rmtree(cache)
                stack.set_straggler(train[0].file, factor=STRAGGLER_FACTOR)
                rows["s3 cold, 1 straggler"] = measure(f"{url}/train-*", epochs=epochs, batch_size=batch_size,
                                                       cache_dir=str(cache))
                log(f"s3: straggler {rows['s3 cold, 1 straggler']}")
            finally:
                stack.set_straggler(None)
                shutil.rmtree(cache, ignore_errors=True)
        finally:
            stack.restore_env()
    return {"ttfb_ms": ttfb_ms, "mbps": mbps, "epochs": epochs, "shards": len(train),
            "train_bytes": sum(s.num_bytes for s in train), "rows": rows}


def markdown(result: dict[str, Any]) -> list[str]:
    local = result["rows"]["local"]["examples_per_s"]
    lines = [f"{result['shards']} train shards, {result['train_bytes'] / 1e6:.1f} MB, {result['epochs']} epochs; "
             f"{result['ttfb_ms']:g} ms to first byte, {result['mbps']:g} MB/s per connection",
             "", "| reader | time to first batch | examples/s | vs local |", "|---|---:|---:|---:|"]
    for key, row in result["rows"].items():
        lines.append(f"| train_dataset [{key}] | {row['first_batch_s']:.2f} s | {row['examples_per_s']:,} | "
                     f"{row['examples_per_s'] / local:.0%} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    return main_for(run, "s3", "s3:// reader rows (staged) against a local S3", argv)


def main_for(run_rows, store: str, description: str, argv: list[str] | None) -> int:
    """The command line of a store's rows: ``run_rows`` (this module's :func:`run` or a twin) on the
    bench dataset, converted first if needed; the table printed, the figures in
    ``bench/results/latest-remote-<store>.json``."""
    from bench import make_data

    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--size", choices=sorted(make_data.SIZES), default="small")
    ap.add_argument("--dir", default=None, help="an existing recordprep output (default: convert the bench dataset)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--remote-ttfb-ms", type=float, default=TTFB_MS)
    ap.add_argument("--remote-mbps", type=float, default=MBPS)
    args = ap.parse_args(argv)
    log = clock_log()
    out = args.dir or bench_output(args.size, log)
    result = run_rows(out, epochs=args.epochs, batch_size=args.batch_size, ttfb_ms=args.remote_ttfb_ms,
                      mbps=args.remote_mbps, log=log)
    md = "\n".join(markdown(result))
    print()
    print(md)
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"latest-remote-{store}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
