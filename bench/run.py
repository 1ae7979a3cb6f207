"""``python -m bench.run --size small|default|large``: the whole benchmark (``make bench``).

1. Generate (or reuse) the standard dataset ``bench/data/<size>/`` (:mod:`bench.make_data`).
2. Conversion table (:mod:`bench.convert_bench`): recordprep on AVRO (gzip and
   uncompressed) and JSON, the naive Beam pipeline, the decode limits; then
   ``naive.verify`` checks the naive output is the same job.
3. TF Transform rows (:mod:`bench.tft`, in the peer's own virtualenv, built on
   demand): its conversion beside recordprep's, its serving layer beside
   recordprep's; skipped with the reason when the peer cannot be installed.
3b. Ray Data and Petastorm rows (:mod:`bench.parquet_peers`, each peer in its own
   virtualenv, built on demand): conversion of the Parquet twin beside
   recordprep's, feeding Keras from Parquet beside ``train_dataset``, break-even
   epochs; a peer that cannot be installed is skipped with the reason.
4. Reader table (:mod:`bench.reader_bench`) on the two recordprep outputs.
5. Shuffle quality (:mod:`bench.shuffle_quality`): how far batches of input
   sorted by time are from random ones, recordprep's shuffled output against
   ``--no-shuffle``, ``make_batched_features_dataset`` and an ideal permutation.
6. Analysis memory vs distinct terms (:mod:`bench.analysis_memory`): the same
   records with 10x the distinct ids, peak RSS of the launcher and of each
   worker; the largest may grow at most 1.3x.
7. With ``--size large`` or ``--scaling``: recordprep on default vs large.
8. Results: ``bench/results/<timestamp>-<size>.json`` (raw, git-ignored) and
   ``bench/results/latest-<size>.md`` (tables, ratios, targets), also printed.

Every measurement is a fresh subprocess (:mod:`bench.measure`). Logs of each
child go to ``bench/data/logs/<timestamp>-<size>/``.
"""

from __future__ import annotations

import argparse
import compileall
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import (
    analysis_memory,
    convert_bench,
    make_data,
    parquet_peers,
    reader_bench,
    remote,
    report,
    shuffle_quality,
    tft,
)

RESULTS = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import psutil

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "nproc": os.cpu_count(), "cpu_model": model, "ram_gb": psutil.virtual_memory().total / 2**30,
        "platform": platform.platform(), "python": platform.python_version(),
        "beam": version("apache-beam"), "tensorflow": version("tensorflow-cpu") if version("tensorflow-cpu") != "not installed" else version("tensorflow"),
        "fastavro": version("fastavro"), "numpy": version("numpy"),
        "commit": git("rev-parse", "--short", "HEAD") or "unknown", "dirty": bool(git("status", "--porcelain")),
        "loadavg_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def _naive_files(value: str | None, manifest: dict[str, Any]) -> int | None:
    if value is None:
        return None
    if value == "all":
        return int(manifest["files"])
    if not value.isdigit() or int(value) < 1:
        raise SystemExit(f"--naive-files must be a positive number of files or 'all', found {value!r}")
    return int(value)


def _compile_bytecode() -> None:
    """Write recordprep's bytecode before any row runs, as ``pip install`` does.

    The peers run from site-packages, compiled at install; recordprep runs from
    this checkout, where ``PYTHONDONTWRITEBYTECODE`` (or a read-only tree) would
    make every row's processes compile its modules again, a cost an installed
    recordprep does not pay.
    """
    root = Path(__file__).resolve().parent.parent
    for package in ("convert", "pipelines", "readers", "stores", "bench"):
        compileall.compile_dir(str(root / package), quiet=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="recordprep benchmarks against peers measured in the same run")
    ap.add_argument("--size", choices=sorted(make_data.SIZES), default="default")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per conversion and reader row (interleaved; the median is reported)")
    ap.add_argument("--scaling", action="store_true", help="also run the default-vs-large scaling row")
    ap.add_argument("--step-ms", type=float, default=5.0, help="simulated training step per batch (0: skip those rows)")
    ap.add_argument("--skip-conversion", action="store_true",
                    help="leave the conversion table out, and with it every table that reads its outputs (readers, "
                         "remote, tf.data service): e.g. the TF Transform or Ray Data / Petastorm rows alone")
    ap.add_argument("--skip-naive", action="store_true", help="leave the naive Beam pipeline out")
    ap.add_argument("--naive-files", default=None, metavar="N|all",
                    help="input files the naive pipeline reads (default: all of them at small and default size, the "
                         "issue's workload, ~2-4 minutes per run at default size; the first 2 at large size)")
    ap.add_argument("--tft-convert-repeats", type=int, default=1, metavar="N",
                    help="runs of TF Transform's conversion, interleaved with recordprep's (each a minute or more at "
                         "`default`; default 1); its ratios then compare medians over N runs")
    ap.add_argument("--skip-tft", action="store_true",
                    help="leave the TF Transform rows out (they build bench/.peers/tft-venv on first use)")
    ap.add_argument("--skip-ray", action="store_true",
                    help="leave the Ray Data rows out (they build bench/.peers/ray-venv on first use)")
    ap.add_argument("--skip-petastorm", action="store_true",
                    help="leave the Petastorm row out (it builds bench/.peers/petastorm-venv on first use)")
    ap.add_argument("--feed-seconds", type=float, default=10.0, metavar="S",
                    help="measured seconds of each feeding row of the Ray Data / Petastorm table (default 10)")
    ap.add_argument("--skip-analysis-memory", action="store_true",
                    help="leave the analysis memory vs distinct terms rows out (two conversions, 2 workers)")
    ap.add_argument("--skip-readers", action="store_true", help="leave the reader table out")
    ap.add_argument("--skip-shuffle", action="store_true",
                    help="leave the shuffle-quality rows out (two conversions and five one-epoch reads, about a "
                         "minute at default size)")
    ap.add_argument("--skip-service", action="store_true",
                    help="leave the tf.data service rows (a local dispatcher with 1 and 2 workers) out")
    ap.add_argument("--skip-remote", action="store_true",
                    help="leave the remote reader tables (emulated gs://, bench/remote.py; s3://, bench/remote_s3.py; azfs://, bench/remote_azure.py) out")
    ap.add_argument("--remote-ttfb-ms", type=float, default=remote.TTFB_MS,
                    help="emulated time to first byte of every gs:// response")
    ap.add_argument("--remote-mbps", type=float, default=remote.MBPS, help="emulated MB/s per gs:// connection")
    ap.add_argument("--remote-tune", action="store_true",
                    help="add the one-knob tuning rows (cycle length, buffers, GCS block size) to the remote table")
    args = ap.parse_args(argv)
    _compile_bytecode()

    started = _dt.datetime.now(_dt.UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    log_dir = make_data.DATA_ROOT / "logs" / f"{stamp}-{args.size}"
    t0 = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    results: dict[str, Any] = {"size": args.size, "started": started.isoformat(timespec="seconds"),
                               "command": "python -m bench.run " + " ".join(argv if argv is not None else sys.argv[1:]),
                               "machine": machine_info(), "notes": []}
    log(f"machine: {results['machine']['nproc']} cores, {results['machine']['cpu_model']}, "
        f"load {results['machine']['loadavg_start']}")
    manifest = make_data.ensure_dataset(args.size, log=log)
    results["dataset"] = {"records": manifest["records"], "files": manifest["files"],
                          "generator_version": manifest["generator_version"],
                          "avro_mb": manifest["avro"]["bytes"] / 1e6, "json_mb": manifest["json"]["bytes"] / 1e6}

    out_root = make_data.dataset_dir(args.size) / "out"
    # `small` is the quick look (a few minutes): the target rows run once instead
    # of three times; use --repeats for medians.
    target_repeats = 1 if args.size == "small" else reader_bench.TARGET_REPEATS
    if args.skip_conversion:
        conv: dict[str, Any] = {"rows": {}, "outputs": {}}
        results["notes"].append("conversion table not run (--skip-conversion), nor the tables reading its outputs")
    else:
        conv = convert_bench.run_table(args.size, manifest, repeats=args.repeats, log=log, out_root=out_root,
                                       log_dir=log_dir, skip_naive=args.skip_naive,
                                       naive_files=_naive_files(args.naive_files, manifest),
                                       target_repeats=target_repeats)
        results["conversion"] = conv
    if not args.skip_tft:
        results["tft"] = tft.run_table(args.size, manifest, log=log, log_dir=log_dir, out_root=out_root,
                                       tft_convert_repeats=args.tft_convert_repeats,
                                       target_repeats=target_repeats)

    if not (args.skip_ray and args.skip_petastorm):
        try:
            results["parquet_peers"] = parquet_peers.run_table(
                args.size, manifest, log=log, log_dir=log_dir, out_root=out_root, skip_ray=args.skip_ray,
                skip_petastorm=args.skip_petastorm, repeats=target_repeats, feed_seconds=args.feed_seconds)
        except Exception as e:  # the other tables still count
            results["notes"].append(f"Ray Data / Petastorm rows failed: {type(e).__name__}: {e}")
            log(f"Ray Data / Petastorm rows FAILED: {e}")

    if not (args.skip_readers or args.skip_conversion):
        dirs = {}
        for comp, key in (("gzip", "recordprep_avro_gzip"), ("none", "recordprep_avro_none"),
                          ("gzip, packed", "recordprep_avro_gzip_packed")):
            if conv["rows"].get(key, {}).get("ok"):
                dirs[comp] = conv["outputs"][key]
        if dirs:
            results["readers"] = reader_bench.run_table(dirs, make_data.avro_files(args.size, manifest), log=log,
                                                        log_dir=log_dir, step_ms=args.step_ms, repeats=args.repeats,
                                                        target_repeats=target_repeats)
        else:
            results["notes"].append("reader table skipped: no recordprep output to read (conversions failed)")
        if dirs and not args.skip_remote:
            try:
                results["remote"] = remote.run_table(dirs, log=log, log_dir=log_dir, ttfb_ms=args.remote_ttfb_ms,
                                                     mbps=args.remote_mbps, repeats=args.repeats,
                                                     tune=args.remote_tune, target_repeats=target_repeats)
            except Exception as e:  # servers missing or broken: the other tables still count
                results["notes"].append(f"remote reader table failed: {type(e).__name__}: {e}")
                log(f"remote reader table FAILED: {e}")
            if "gzip" in dirs:
                from bench import remote_s3

                try:
                    results["remote_s3"] = remote_s3.run(dirs["gzip"], epochs=5, batch_size=1024, log=log,
                                                         ttfb_ms=args.remote_ttfb_ms, mbps=args.remote_mbps)
                except Exception as e:  # moto missing or broken: the other tables still count
                    results["notes"].append(f"s3:// reader rows failed: {type(e).__name__}: {e}")
                    log(f"s3:// reader rows FAILED: {e}")
                from bench import remote_azure

                try:
                    results["remote_azure"] = remote_azure.run(dirs["gzip"], epochs=5, batch_size=1024, log=log,
                                                               ttfb_ms=args.remote_ttfb_ms, mbps=args.remote_mbps)
                except Exception as e:  # Node.js or the npm registry missing: the other tables still count
                    results["notes"].append(f"azfs:// reader rows failed: {type(e).__name__}: {e}")
                    log(f"azfs:// reader rows FAILED: {e}")
            from bench import remote_convert

            try:  # requests per GB of a gs:// -> gs:// conversion, for two shard counts
                results["remote_convert"] = remote_convert.run(args.size, ttfb_ms=args.remote_ttfb_ms,
                                                               mbps=args.remote_mbps)
            except Exception as e:  # servers missing or broken: the other tables still count
                results["notes"].append(f"remote conversion rows failed: {type(e).__name__}: {e}")
                log(f"remote conversion rows FAILED: {e}")
        if "gzip" in dirs and not args.skip_service:
            try:
                results["service"] = reader_bench.run_service_table(dirs["gzip"], log=log, log_dir=log_dir,
                                                                    repeats=target_repeats)
            except Exception as e:  # the other tables still count
                results["notes"].append(f"tf.data service rows failed: {type(e).__name__}: {e}")
                log(f"tf.data service rows FAILED: {e}")

    if not args.skip_analysis_memory:
        try:
            results["analysis_memory"] = analysis_memory.run_table(args.size, log=log,
                                                                   root=out_root / "analysis-memory")
            if not results["analysis_memory"]["ok"]:
                am = results["analysis_memory"]
                results["notes"].append(f"analysis memory grew {am['largest_ratio']}x for 10x the distinct ids "
                                        f"(target <= {analysis_memory.MAX_RATIO}x the model's {am['model_ratio']}x)")
        except Exception as e:  # the other tables still count
            results["notes"].append(f"analysis memory rows failed: {type(e).__name__}: {e}")
            log(f"analysis memory rows FAILED: {e}")

    if not args.skip_shuffle:
        results["shuffle"] = shuffle_quality.run_table(args.size, log=log, log_dir=log_dir,
                                                       out_root=out_root / "shuffle-quality")

    if args.size == "large" or args.scaling:
        known = {}
        if args.size in ("default", "large") and conv["rows"].get("recordprep_avro_gzip", {}).get("ok"):
            known[args.size] = conv["rows"]["recordprep_avro_gzip"]
        results["scaling"] = convert_bench.run_scaling(("default", "large"), log=log, log_dir=log_dir, known=known)

    results["finished"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    results["machine"]["loadavg_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results["elapsed_s"] = round(time.perf_counter() - t0, 1)
    results["targets"] = report.evaluate_targets(results)
    others = [run["others_cores"] for table in ("conversion", "readers", "remote", "parquet_peers")
              for row in (results.get(table) or {}).get("rows", {}).values() for run in row.get("raw", [])]
    if others:
        results["machine"]["others_cores"] = {"median": sorted(others)[len(others) // 2], "max": max(others)}
        if max(others) > 0.2:
            results["notes"].append(
                f"The machine was shared: while rows ran, other processes used a median of "
                f"{sorted(others)[len(others) // 2]:.2f} and at most {max(others):.2f} of its "
                f"{results['machine']['nproc']} cores (per-row values in the JSON, `others_cores`). Absolute "
                "rates are lower and noisier than on an idle machine; compare the ratios, which pit rows of "
                "the same run against each other.")
    RESULTS.mkdir(parents=True, exist_ok=True)
    raw_path = RESULTS / f"{stamp}-{args.size}.json"
    raw_path.write_text(json.dumps(results, indent=1, default=str) + "\n")
    md = report.markdown(results)
    (RESULTS / f"latest-{args.size}.md").write_text(md + "\n")
    print()
    print(md)
    log(f"done in {results['elapsed_s']:.0f} s: {raw_path.relative_to(RESULTS.parent.parent)}, "
        f"bench/results/latest-{args.size}.md")
    failed = [k for k, r in {**conv["rows"], **(results.get("readers") or {}).get("rows", {}),
                             **(results.get("remote") or {}).get("rows", {}),
                             **{f"tft:{k}": r for k, r in (results.get("tft") or {}).get("rows", {}).items()},
                             **{f"parquet peers:{k}": r
                                for k, r in (results.get("parquet_peers") or {}).get("rows", {}).items()}}.items()
              if not r.get("ok") and not r.get("unavailable")]
    if (results.get("shuffle") or {}).get("error"):
        failed.append("shuffle quality")
    if failed:
        log(f"rows that failed: {', '.join(failed)} (see their logs under {log_dir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
