"""Remote reader table: the same shards read from emulated GCS through TensorFlow's own GCS file system.

No cloud is reachable from the benchmark machine, so the train shards of a
recordprep output are uploaded to the local GCS emulator of
``tests/_remote.py`` and read as ``gs://`` by TensorFlow, through the TLS proxy
that emulates remote storage: every response waits ``--remote-ttfb-ms``
(default 100 ms) before its first byte and each connection (TensorFlow opens
one per request) is capped at ``--remote-mbps`` (default 20 MB/s). The
emulator, the proxy and the measured process share the machine's cores;
real GCS would not take CPU from the reader, so these rows are pessimistic
for every remote row alike.

Rows (each a fresh process, measured like :mod:`bench.reader_bench`):

``readers.train_dataset [local]``
    The same shards on local disk: the reader's own local rate.
``readers.train_dataset [gs://]``
    Its defaults on ``gs://`` (``ReadOptions`` remote defaults).
``make_batched_features_dataset [gs://]``
    Its defaults on the same ``gs://`` shard list: the peer.
straggler rows (issue 23; ``--skip-stragglers`` leaves them out)
    The first train shard served with 10x the time to first byte and 1/10 of
    the bandwidth (the proxy's straggler mode): ``train_dataset`` with its
    defaults, with ``deterministic=True``, and ``make_batched_features_dataset``,
    each over its own no-straggler row of the same run. Target: the defaults
    keep at least 80% of their no-straggler examples/s.
tuning rows (``--remote-tune``)
    ``train_dataset`` on ``gs://`` with one knob changed (cycle length, read
    buffer, ``GCS_READ_CACHE_BLOCK_SIZE_MB``): the measurements the remote
    defaults in :mod:`readers.options` were chosen from.

Targets (issue 4): on emulated remote storage ``train_dataset`` reads at
least 4x ``make_batched_features_dataset``'s defaults, and at least 70% of
its own local rate. The issue allows the converter's packed layout "if
[it] is needed to get there", so with a ``--layout packed`` output the table
also gives ``train_dataset`` on the packed shards over
``make_batched_features_dataset`` on the default layout's shards (what a user
without recordprep's reader reads): both readings are printed.

Standalone: ``python -m bench.remote --size small|default [--remote-tune]``
(converts the dataset first if no output is given with ``--dir``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import http.client
import importlib
import json
import ssl
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TTFB_MS = 100.0
MBPS = 20.0

#: (key, label, where, case, ReadOptions overrides, extra environment)
BASE_ROWS = (
    ("local:train_dataset", "readers.train_dataset", "local", "train_dataset", {}, {}),
    ("gs:train_dataset", "readers.train_dataset", "gs", "train_dataset", {}, {}),
    ("gs:mbfd", "make_batched_features_dataset (defaults)", "gs", "mbfd", {}, {}),
)
TUNE_ROWS = (
    ("gs:train_dataset:cycle4", "train_dataset, cycle_length=4", "gs", "train_dataset", {"cycle_length": 4}, {}),
    ("gs:train_dataset:cycle8", "train_dataset, cycle_length=8", "gs", "train_dataset", {"cycle_length": 8}, {}),
    ("gs:train_dataset:buf1m", "train_dataset, read_buffer_bytes=1 MiB", "gs", "train_dataset",
     {"read_buffer_bytes": 1 << 20}, {}),
    # The default before 2026-11-24: reads fit in TensorFlow's 64 MB GCS block, which it zero-fills
    # per opened file before filling it.
    ("gs:train_dataset:buf8m", "train_dataset, read_buffer_bytes=8 MiB (through the GCS block)", "gs",
     "train_dataset", {"read_buffer_bytes": 8 << 20}, {}),
    ("gs:train_dataset:block16", "train_dataset, GCS_READ_CACHE_BLOCK_SIZE_MB=16", "gs", "train_dataset", {},
     {"GCS_READ_CACHE_BLOCK_SIZE_MB": "16"}),
    ("gs:train_dataset:block4", "train_dataset, GCS_READ_CACHE_BLOCK_SIZE_MB=4", "gs", "train_dataset", {},
     {"GCS_READ_CACHE_BLOCK_SIZE_MB": "4"}),
)
#: Straggler rows (issue 23), on the first output only: the proxy serves one shard (the first in the
#: metadata) with STRAGGLER_FACTOR x the time to first byte and 1/STRAGGLER_FACTOR of the bandwidth.
#: (key, label, case, ReadOptions overrides, the key of the same reader's no-straggler row)
STRAGGLER_ROWS = (
    ("straggler:train_dataset", "readers.train_dataset (defaults)", "train_dataset", {}, "gs:train_dataset"),
    ("straggler:deterministic", "readers.train_dataset, deterministic=True", "train_dataset",
     {"deterministic": True}, "straggler:deterministic:base"),
    ("straggler:mbfd", "make_batched_features_dataset (defaults)", "mbfd", {}, "gs:mbfd"),
)
#: The no-straggler row deterministic=True is compared with (the other two have theirs in BASE_ROWS).
STRAGGLER_BASE_ROWS = (
    ("straggler:deterministic:base", "train_dataset, deterministic=True (no straggler)", "gs", "train_dataset",
     {"deterministic": True}, {}),
)
STRAGGLER_FACTOR = 10.0
#: Issue 23's target: train_dataset's defaults keep this share of their no-straggler examples/s.
STRAGGLER_TARGET = 0.8
TARGET_ROWS = ("local:train_dataset", "gs:train_dataset", "gs:mbfd", "straggler:train_dataset",
               "straggler:deterministic", "straggler:deterministic:base", "straggler:mbfd")
#: Warm-up and window length of every row here (the local reader table uses 1 s / 0.4 s): a
#: remote reader's first requests buffer whole shards (TensorFlow's GCS block is 64 MB), and
#: make_batched_features_dataset read 3 shards ahead and ran 5x faster than its steady state for
#: the first ~40 batches, so short windows measured that buffer, not the storage.
WARMUP_S, WINDOW_S = 4.0, 1.0
TARGET_REPEATS = 3
#: Outputs this table reads, by the reader table's names: "gzip, packed" is ``--layout packed``.
COMPRESSIONS = ("gzip", "none", "gzip, packed")


def _slug(comp: str) -> str:
    """``comp`` as a path segment of the bucket (no comma or space)."""
    return comp.replace(", ", "-")


def stand_in_servers(name: str = "_remote"):
    """A stand-in server module of ``tests/`` (``_remote``: the GCS emulator, the proxy, WebHDFS and
    :class:`RemoteStack`; ``_remote_s3``: the local S3), imported with ``tests/`` on the path as the
    test run has it (the modules import each other by name)."""
    tests = str(REPO / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    return importlib.import_module(name)


def clock_log(t0: float | None = None):
    """A ``log(msg)`` that prints each line after the seconds since ``t0`` (default: now)."""
    start = time.perf_counter() if t0 is None else t0

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - start:7.1f}s] {msg}", flush=True)

    return log


def bench_output(size: str, log) -> str:
    """The bench dataset of ``size`` converted from AVRO with gzip (made, and converted, if missing)."""
    from bench import make_data

    manifest = make_data.ensure_dataset(size, log=log)
    out = str(make_data.dataset_dir(size) / "out" / "remote_avro_gzip")
    if not (Path(out) / "dataset_info.json").exists():
        from pipelines.job import run_convert
        from pipelines.options import ConvertOptions

        log(f"converting {manifest['records']:,} records into {out}")
        run_convert(ConvertOptions(inputs=(str(make_data.dataset_dir(size) / "avro" / "*.avro"),),
                                   config=str(REPO / "bench" / "features.yaml"), output=out, overwrite=True))
    return out


def probe_link(stack, obj: str, *, repeats: int = 3) -> dict[str, float]:
    """What one stream sees through the proxy, the way TensorFlow connects (CONNECT + TLS)."""
    ctx = ssl.create_default_context(cafile=str(stack.certs["ca"]))
    ttfbs, rates = [], []
    for _ in range(repeats):
        conn = http.client.HTTPSConnection("127.0.0.1", stack.proxy.port, context=ctx, timeout=120)
        conn.set_tunnel("storage.googleapis.com", 443)
        try:
            t0 = time.perf_counter()
            conn.request("GET", f"/{stack.bucket}/{obj}", headers={"Authorization": "Bearer x"})
            resp = conn.getresponse()
            first = resp.read(1)
            t1 = time.perf_counter()
            n = len(first) + len(resp.read())
            t2 = time.perf_counter()
        finally:
            conn.close()
        ttfbs.append(t1 - t0)
        rates.append(n / max(t2 - t1, 1e-9) / 1e6)
    ttfbs.sort()
    rates.sort()
    return {"ttfb_s": round(ttfbs[len(ttfbs) // 2], 3), "stream_mbps": round(rates[len(rates) // 2], 1),
            "object_mb": round(n / 1e6, 2)}


def run_table(dirs: dict[str, str], *, log, log_dir: Path, ttfb_ms: float = TTFB_MS, mbps: float = MBPS,
              repeats: int = 1, tune: bool = False, target_repeats: int = TARGET_REPEATS,
              stragglers: bool = True) -> dict[str, Any]:
    """``dirs``: compression ("gzip"/"none") -> local recordprep output; every one is measured.

    Rows are keyed ``<compression>:<row key>``; the tuning and straggler rows
    run on the first compression only (gzip when present). Runs are
    interleaved round by round, the target rows :data:`TARGET_REPEATS` times.
    A straggler row (:data:`STRAGGLER_ROWS`) runs with the proxy's straggler
    mode on for the first train shard and off again after it.
    """
    from bench.measure import run_child
    from bench.reader_bench import BATCH, WINDOWS, _summarize

    servers = stand_in_servers()
    comps = [c for c in COMPRESSIONS if c in dirs] or list(dirs)
    log_dir.mkdir(parents=True, exist_ok=True)
    # The GCS stat cache keeps TensorFlow's defaults here (the tests set it to 0).
    with servers.RemoteStack(workdir=log_dir / "remote-servers", gcs_stat_cache_max_age=None) as stack:
        bucket = stack.storage_client().bucket(stack.bucket)
        shards: dict[str, dict[str, Any]] = {}
        for comp in comps:
            local_dir = Path(dirs[comp])
            upload = [p for p in sorted(local_dir.iterdir()) if p.is_file() and not p.name.startswith("eval-")]
            t0 = time.perf_counter()
            for p in upload:
                bucket.blob(f"bench/{_slug(comp)}/{p.name}").upload_from_filename(str(p))
            train = [p for p in upload if p.name.startswith("train-")]
            shards[comp] = {"local": str(local_dir), "gs": f"gs://{stack.bucket}/bench/{_slug(comp)}", "count": len(train),
                            "mb": round(sum(p.stat().st_size for p in train) / 1e6, 1), "first": train[0].name}
            log(f"remote: uploaded {len(upload)} files ({shards[comp]['mb']:.1f} MB of {comp} train shards) to "
                f"{shards[comp]['gs']} in {time.perf_counter() - t0:.1f} s")
        stack.set_latency(ttfb_ms, mbps)
        biggest = max(comps, key=lambda c: shards[c]["mb"] / max(1, shards[c]["count"]))
        link = probe_link(stack, f"bench/{_slug(biggest)}/{shards[biggest]['first']}")
        log(f"remote: emulating {ttfb_ms:g} ms to first byte, {mbps:g} MB/s per connection; one stream through "
            f"the proxy measured {link['ttfb_s']:.3f} s to first byte, {link['stream_mbps']:.1f} MB/s "
            f"({link['object_mb']:.1f} MB shard)")
        env = {**stack.env(), "RECORDPREP_BENCH_WARMUP_S": str(WARMUP_S),
               "RECORDPREP_BENCH_WINDOW_S": str(WINDOW_S)}
        plan = []
        straggled = {key for key, *_ in STRAGGLER_ROWS}
        for comp in comps:
            extra = (TUNE_ROWS if tune and comp == comps[0] else ())
            if stragglers and comp == comps[0]:
                extra += STRAGGLER_BASE_ROWS + tuple(
                    (key, f"{label}, 1 straggler", "gs", case, overrides, {})
                    for key, label, case, overrides, _ in STRAGGLER_ROWS)
            for row in BASE_ROWS + extra:
                plan.append((comp, row, max(repeats, target_repeats) if row[0] in TARGET_ROWS else repeats))
        runs: dict[str, list[dict[str, Any]]] = {}
        for rnd in range(max(n for *_, n in plan)):
            for comp, (key, label, where, case, overrides, extra_env), n in plan:
                if rnd >= n:
                    continue
                path = shards[comp]["gs"] if where == "gs" else shards[comp]["local"]
                row_env = {**env, **extra_env}
                if overrides:
                    row_env["RECORDPREP_BENCH_READ_OPTIONS"] = json.dumps(overrides)
                straggler = shards[comp]["first"] if key in straggled else None
                log(f"remote: {label} [{comp}, {where}{', straggler ' + straggler if straggler else ''}] "
                    f"(run {rnd + 1}/{n})")
                cpu0 = _servers_cpu(stack)
                stack.set_straggler(straggler, factor=STRAGGLER_FACTOR)
                try:
                    m = run_child("bench.reader_bench", ["--case", case, "--dir", path], log_dir=log_dir,
                                  timeout=900, env=row_env)
                finally:
                    stack.set_straggler(None)
                # What the emulator and the proxy took of the machine meanwhile (real GCS would not).
                server_cores = (_servers_cpu(stack) - cpu0) / m.wall_s if m.wall_s else 0.0
                if m.ok:
                    _overall_rate(m.result)
                runs.setdefault(f"{comp}:{key}", []).append(
                    {**m.to_json(), "label": label, "where": where, "case": case, "options": overrides,
                     "env": extra_env, "compression": comp, "step_ms": 0.0, "server_cores": round(server_cores, 2)})
                if m.ok:
                    r = m.result
                    log(f"  -> {r['examples_per_s']:,.0f} examples/s, first batch {r['time_to_first_batch_s']:.2f} s, "
                        f"{r['cpu_us_per_example']:.1f} CPU-us/example, peak RSS {m.peak_rss_mb:.0f} MB")
                else:
                    log(f"  -> FAILED: {m.error} (log: {m.log})")
        stats = stack.proxy_stats()
    rows = {}
    for key, rs in runs.items():
        row = _summarize(rs)
        row.update(where=rs[0]["where"], options=rs[0]["options"], env=rs[0]["env"],
                   server_cores=sorted(r["server_cores"] for r in rs)[len(rs) // 2])
        rows[key] = row
    out = {"rows": rows, "compressions": comps, "ttfb_ms": ttfb_ms, "mbps": mbps, "link": link,
           "shards": shards, "proxy": stats["counts"], "batch": BATCH, "warmup_s": WARMUP_S,
           "windows": {"count": WINDOWS, "seconds": WINDOW_S}}
    if stragglers:
        out["straggler"] = {"factor": STRAGGLER_FACTOR, "compression": comps[0],
                            "shards": shards[comps[0]]["count"], "file": shards[comps[0]]["first"]}
    return out


def _overall_rate(result: dict[str, Any]) -> None:
    """Make a remote row's ``examples_per_s`` all examples over the whole measured span.

    Why not the median of windows, as in the local table: on gs:// every epoch
    start stalls 0.3-1 s (each shard's first request waits for its time to first
    byte and its whole first block), every 1.5-2 s on these small splits, so
    whether a 1 s window holds a stall decides its rate. Measured on the
    uncompressed shards: the window median put ``read_buffer_bytes=1 MiB`` at
    309k examples/s, while a 15 s per-batch time series of the same
    configuration read 180k (and 201k with the defaults). The window median
    stays in the JSON.
    """
    result["examples_per_s_window_median"] = result["examples_per_s"]
    result["examples_per_s"] = round(result["examples_measured"] / result["measured_wall_s"], 1)


def _servers_cpu(stack) -> float:
    """CPU seconds (user + system) the GCS emulator and the latency proxy have used so far."""
    from bench.reader_bench import _cpu_seconds

    return _cpu_seconds((stack.gcs, stack.proxy))


def _rate(rows: dict[str, Any], key: str) -> float | None:
    r = rows.get(key)
    return r.get("examples_per_s") if r and r.get("ok") else None


def ratios(remote: dict[str, Any] | None, comp: str) -> dict[str, float | None]:
    """train_dataset on gs:// over make_batched_features_dataset on gs://, and over its local rate.

    ``packed_vs_mbfd`` (for ``comp="gzip"``): train_dataset on the packed
    shards over make_batched_features_dataset on the default layout's.
    """
    rows = (remote or {}).get("rows", {})
    gs, mbfd = _rate(rows, f"{comp}:gs:train_dataset"), _rate(rows, f"{comp}:gs:mbfd")
    local = _rate(rows, f"{comp}:local:train_dataset")
    packed = _rate(rows, f"{comp}, packed:gs:train_dataset")
    return {"remote_vs_mbfd": gs / mbfd if gs and mbfd else None,
            "remote_vs_local": gs / local if gs and local else None,
            "packed_vs_mbfd": packed / mbfd if packed and mbfd else None}


def straggler_ratios(remote: dict[str, Any] | None, comp: str) -> dict[str, float | None]:
    """Each straggler row's examples/s over its own reader's no-straggler rate (same run)."""
    rows = (remote or {}).get("rows", {})
    kept = {}
    for key, _label, _case, _overrides, base in STRAGGLER_ROWS:
        slow, fast = _rate(rows, f"{comp}:{key}"), _rate(rows, f"{comp}:{base}")
        kept[key.split(":", 1)[1]] = slow / fast if slow and fast else None
    return kept


def straggler_markdown(remote: dict[str, Any] | None) -> list[str]:
    """The straggler rows' summary: what each reader keeps, and issue 23's target."""
    info = (remote or {}).get("straggler")
    if not info:
        return []
    comp = remote["compressions"][0]
    kept = straggler_ratios(remote, comp)
    f = info["factor"]
    lines = ["", f"Stragglers ({comp}, {info['shards']} shards): one shard (`{info['file']}`) served with {f:g}x "
             f"the time to first byte and 1/{f:g} of the bandwidth; each reader against its own no-straggler "
             "rate in the same run.", "",
             "| reader | examples/s kept with one straggler | target |", "|---|---:|---:|"]
    labels = {key.split(":", 1)[1]: label for key, label, *_ in STRAGGLER_ROWS}
    for name, ratio in kept.items():
        shown = "—" if ratio is None else f"{ratio:.0%}"
        target = ""
        if name == "train_dataset":
            met = ratio is not None and ratio >= STRAGGLER_TARGET
            target = f"≥ {STRAGGLER_TARGET:.0%} ({'MET' if met else 'NOT MET'})"
        lines.append(f"| {labels[name]} | {shown} | {target} |")
    return lines


def markdown(remote: dict[str, Any] | None) -> list[str]:
    if not remote:
        return ["_remote reader table not run_"]
    rows = remote["rows"]
    link = remote["link"]
    shards = "; ".join(f"{c}: {s['count']} shards, {s['mb']} MB" for c, s in remote["shards"].items())
    lines = [
        f"The train split's shards ({shards}) in the local GCS emulator, read as `gs://` by TensorFlow's GCS "
        f"file system through the latency proxy of `tests/_remote.py`: {remote['ttfb_ms']:g} ms before the first "
        f"byte of every response, {remote['mbps']:g} MB/s per connection (one stream measured: "
        f"{link['ttfb_s']:.2f} s to first byte, {link['stream_mbps']:.1f} MB/s). Batch {remote['batch']}; "
        f"examples/s = all examples of {remote['windows']['count']} consecutive windows of ≥ {remote['windows']['seconds']:g} s over their whole span, after {remote['warmup_s']:g} s of warm-up (longer than the local table's, to get past what the first requests buffer; not the median of windows as there, since the stall at each epoch's start decides a window's rate); fresh process per row. The "
        "emulator and the proxy (TLS, pacing) run on the same cores as the reader, which real GCS would not: "
        "*emulator + proxy cores* is their CPU time during the row over the row's wall time (interpreter start "
        "included, so it understates their share while data flows).", "",
        "| row | shards | storage | examples/s | time to first batch (s) | CPU-µs / example | cores busy | emulator + proxy cores | peak RSS (MB) | runs |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows.values():
        where = "local disk" if r["where"] == "local" else "gs:// (emulated)"
        if not r["ok"]:
            lines.append(f"| {r['label']} | {r['compression']} | {where} | FAILED: {r.get('error')} | | | | | | {r['runs']} |")
            continue
        servers = f"{r['server_cores']:.2f}" if r["where"] == "gs" and r.get("server_cores") is not None else "—"
        lines.append(f"| {r['label']} | {r['compression']} | {where} | {r['examples_per_s']:,.0f} | "
                     f"{r['time_to_first_batch_s']:.2f} | {r['cpu_us_per_example']:.1f} | {r['cpu_cores_used']:.2f} | "
                     f"{servers} | {r['peak_rss_mb']:,.0f} | {r['runs']} |")
    lines += ["", "| ratio | measured | target |", "|---|---:|---:|"]
    for comp in remote["compressions"]:
        q = ratios(remote, comp)
        vs_mbfd = "—" if q["remote_vs_mbfd"] is None else f"{q['remote_vs_mbfd']:.2f}x"
        vs_local = "—" if q["remote_vs_local"] is None else f"{q['remote_vs_local']:.0%}"
        lines += [f"| readers.train_dataset / make_batched_features_dataset, both on gs:// ({comp}) | {vs_mbfd} | ≥ 4.00x |",
                  f"| readers.train_dataset on gs:// / on local disk ({comp}) | {vs_local} | ≥ 70% |"]
        if q["packed_vs_mbfd"] is not None:
            lines.append(f"| readers.train_dataset on `--layout packed` shards / make_batched_features_dataset on the "
                         f"default layout's shards, both on gs:// ({comp}) | {q['packed_vs_mbfd']:.2f}x | ≥ 4.00x |")
    return lines + straggler_markdown(remote)


def main(argv: list[str] | None = None) -> int:
    from bench import make_data

    ap = argparse.ArgumentParser(description="remote reader table only (emulated gs://)")
    ap.add_argument("--size", choices=sorted(make_data.SIZES), default="small")
    ap.add_argument("--dir", nargs="*", default=None,
                    help="existing recordprep outputs to read (default: convert the bench dataset, gzip)")
    ap.add_argument("--remote-ttfb-ms", type=float, default=TTFB_MS)
    ap.add_argument("--remote-mbps", type=float, default=MBPS)
    ap.add_argument("--remote-tune", action="store_true", help="also the one-knob tuning rows")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--skip-stragglers", action="store_true", help="leave the straggler rows out")
    args = ap.parse_args(argv)
    log = clock_log()
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    log_dir = make_data.DATA_ROOT / "logs" / f"{stamp}-remote-{args.size}"
    dirs: dict[str, str] = {}
    for d in args.dir or []:
        info = json.loads((Path(d) / "dataset_info.json").read_text())
        comp = "gzip" if info.get("compression") == "GZIP" else "none"
        dirs[comp + (", packed" if info.get("layout") == "packed" else "")] = d
    if not dirs:
        dirs["gzip"] = bench_output(args.size, log)
    remote = run_table(dirs, log=log, log_dir=log_dir, ttfb_ms=args.remote_ttfb_ms,
                       mbps=args.remote_mbps, repeats=args.repeats, tune=args.remote_tune,
                       stragglers=not args.skip_stragglers)
    md = "\n".join(markdown(remote))
    print()
    print(md)
    results = REPO / "bench" / "results"
    results.mkdir(parents=True, exist_ok=True)
    name = args.size if not args.dir else "custom"
    (results / f"{stamp}-remote-{name}.json").write_text(json.dumps(remote, indent=1, default=str) + "\n")
    (results / f"latest-remote-{name}.md").write_text(f"# Remote reader table: `{' '.join(args.dir or [args.size])}`\n\n{md}\n")
    return 0 if all(r["ok"] for r in remote["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
