"""The ``azfs://`` rows of the remote reader table: staged reads against Azurite (``tests/_remote_azure.py``).

The Azure twin of :mod:`bench.remote_s3`, with the same rows, measurement,
table (its ``markdown``) and command line: TensorFlow 2.21 has no Azure
file system, so ``readers`` stage ``azfs://`` shards on local disk through
azure-storage-blob; this compares that with the same shards read locally,
behind the latency proxy (time to first byte, bandwidth per connection), cold,
warm (a restart) and cold with one straggler blob.

Standalone: ``python -m bench.remote_azure --size small [--dir OUT]``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.remote import STRAGGLER_FACTOR, stand_in_servers
from bench.remote_s3 import main_for, measure


def _rows(stack: Any, out: str, train: list[Any], *, epochs: int, batch_size: int, ttfb_ms: float, mbps: float,
          log) -> dict[str, Any]:
    url = stack.url("bench/out")
    rows: dict[str, Any] = {}
    measure(f"{out}/train-*", epochs=1, batch_size=batch_size, cache_dir=None)  # TensorFlow's warm-up
    rows["local"] = measure(f"{out}/train-*", epochs=epochs, batch_size=batch_size, cache_dir=None)
    log(f"azure: local {rows['local']}")
    stack.set_latency(ttfb_ms, mbps)
    cache = Path(tempfile.mkdtemp(prefix="recordprep-azure-bench-"))
    kw = {"epochs": epochs, "batch_size": batch_size, "cache_dir": str(cache), "cache_option": "azure_cache_dir"}
    try:
        rows["azfs cold"] = measure(f"{url}/train-*", **kw)
        log(f"azure: cold {rows['azfs cold']}")
        rows["azfs warm"] = measure(f"{url}/train-*", **kw)
        log(f"azure: warm {rows['azfs warm']}")
        shutil.rmtree(cache)
        stack.set_straggler(train[0].file, factor=STRAGGLER_FACTOR)
        rows["azfs cold, 1 straggler"] = measure(f"{url}/train-*", **kw)
        log(f"azure: straggler {rows['azfs cold, 1 straggler']}")
    finally:
        stack.set_straggler(None)
        shutil.rmtree(cache, ignore_errors=True)
    return rows


def run(out: str, *, epochs: int, batch_size: int, ttfb_ms: float, mbps: float, log) -> dict[str, Any]:
    import readers

    servers = stand_in_servers("_remote_azure")
    train = readers.load_info(out).splits["train"].shards
    local = Path(out)
    with servers.AzureStack() as stack:
        stack.apply_env()
        try:
            for name in [*(s.file for s in train), "dataset_info.json", "stats.json"]:
                if (local / name).exists():
                    stack.put(f"bench/out/{name}", (local / name).read_bytes())
            log(f"azure: {len(train)} train shards, {sum(s.num_bytes for s in train) / 1e6:.1f} MB uploaded")
            rows = _rows(stack, out, train, epochs=epochs, batch_size=batch_size, ttfb_ms=ttfb_ms, mbps=mbps, log=log)
        finally:
            stack.restore_env()
    return {"ttfb_ms": ttfb_ms, "mbps": mbps, "epochs": epochs, "shards": len(train),
            "train_bytes": sum(s.num_bytes for s in train), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    return main_for(run, "azure", "azfs:// reader rows (staged) against Azurite", argv)


if __name__ == "__main__":
    sys.exit(main())
