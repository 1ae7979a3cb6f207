"""Conversion table: recordprep against the naive Beam pipeline and the decode limits.

Rows (each one fresh subprocess, see :mod:`bench.measure`):

``recordprep AVRO -> gzip``
    ``pipelines.job.run_convert`` with the default options (train/eval
    0.9/0.1, gzip level 2 (the default), default shard count, FnApiRunner with its default
    worker choice: one process per core above 32 MB of input) on all AVRO
    files: the headline number. Decodes each record once (the analysis pass
    leaves the prepared batches for the convert pass).
``recordprep AVRO -> gzip (--workers 1, in-process)``
    The same job in one process: the least memory; peak RSS of the default
    row sums its worker processes.
``recordprep AVRO -> none``
    The same with ``compression="none"`` (the reader table reads both).
``recordprep AVRO -> gzip (--avro-decoder fastavro)``
    The same with the Avro fast path off (every block decoded by fastavro):
    what the polars decode buys end to end.
``recordprep JSON -> gzip``
    The same records as JSON Lines.
``recordprep Parquet -> gzip``
    The same job on the same records written as Parquet (``parquet_twins``:
    polars' ``write_parquet`` of each Avro file, zstd, row groups of
    ``PARQUET_ROW_GROUP`` rows), against ``recordprep AVRO -> gzip``.
``recordprep Parquet input stage``
    ``convert.sources.iter_records`` over those Parquet files in one process
    (the fast path, each record's JSON as for the whole-record split),
    against ``limit: pyarrow Parquet decode``: ``pyarrow.parquet`` decoding
    the same files to Arrow tables, doing nothing else.
``naive Beam (AVRO -> gzip)``
    :mod:`bench.naive`: ReadFromAvro -> per-record dict -> per-record
    ``tf.train.Example`` -> WriteToTFRecord(gzip), analysis by Beam combiners as
    side inputs, same runner, same transforms (checked by ``naive.verify``).
    For ``default``/``large`` it runs on the first files only (a subset) and is
    compared per record with ``recordprep (same subset)``: recordprep run on
    exactly those files, so both pay the same fixed start-up cost per record.
``recordprep JSON input stage``
    What a worker runs on JSON before preparing: ``convert.sources.iter_records``
    over every JSON Lines file (Beam's file objects, the job's batch size and
    its GC setting), in one process. Against ``limit: JSON lines + orjson``:
    the issue's "JSON input at least half of the plain orjson parse rate".
``wide schema: Avro input stage (--avro-decoder auto|fastavro)``
    ``convert.sources.iter_records`` (with each record's JSON, as for the
    whole-record split) over one file of ``WIDE_RECORDS`` records x
    ``WIDE_FIELDS`` nullable fields, with each decoder, in one process: a
    decoder whose per-batch work grows with the square of the number of
    fields shows as a ratio far above the fastavro row (the same for every
    ``--size``).
``limit: fastavro decode`` / ``limit: polars decode`` / ``limit: JSON lines + orjson``
    Decoding every input record once, in one process, doing nothing else:
    fastavro to Python dicts, polars (``read_avro``) to a DataFrame, orjson
    per line. What a converter reading these files in one Python process with
    that decoder cannot beat (recordprep decodes once; the analysis pass
    leaves prepared batches for the convert pass).

Columns: records/s of the work phase (``run_convert`` call, pipeline run, or
decode loop: the child's interpreter start and imports excluded), CPU seconds
per 1 000 records over the same phase (user + system of the whole process, all
threads), and peak RSS summed over the process tree over its whole life.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

from bench.measure import WorkTimer, child_main

CONFIG = str(Path(__file__).resolve().parent / "features.yaml")


# ------------------------------------------------------------------ children


def _recordprep(args: argparse.Namespace) -> dict[str, Any]:
    # This process is the launcher: set up as `recordprep convert` sets up its own.
    from pipelines.local.worker import prepare_launcher

    prepare_launcher(["convert", *args.inputs, args.config, args.output])
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    shutil.rmtree(args.output, ignore_errors=True)
    opts = ConvertOptions(inputs=tuple(args.inputs), config=args.config, output=args.output,
                          compression=args.compression, overwrite=True, workers=args.workers or None,
                          layout=args.layout, avro_decoder=args.avro_decoder, order=args.order,
                          pre_fork=True)  # as the CLI: its workers forked from this launcher
    with WorkTimer() as t:
        res = run_convert(opts)
    info = res.info
    counts = info.get("counts", {})
    return {**t.to_json(), "records": counts.get("read", 0), "errors": counts.get("errors", 0),
            "written": counts.get("written", {}), "job_seconds": round(res.seconds, 3),
            "shards": {s: len(sp["shards"]) for s, sp in info.get("splits", {}).items()},
            "output_mb": round(sum(sp["num_bytes"] for sp in info.get("splits", {}).values()) / 1e6, 2)}


def _naive(args: argparse.Namespace) -> dict[str, Any]:
    from bench import naive

    shutil.rmtree(args.output, ignore_errors=True)
    with WorkTimer() as t:
        naive.run(args.inputs, args.config, args.output)
    out = Path(args.output)
    return {**t.to_json(), "records": args.records,
            "output_mb": round(sum(p.stat().st_size for p in out.glob("*.tfrecord.gz")) / 1e6, 2),
            "files_written": len(list(out.glob("*.tfrecord.gz")))}


def _naive_verify(args: argparse.Namespace) -> dict[str, Any]:
    from bench import naive

    return naive.verify(args.inputs, args.config, args.output)


def _avro_decode(args: argparse.Namespace) -> dict[str, Any]:
    import fastavro

    n = 0
    with WorkTimer() as t:
        for path in args.inputs:
            with open(path, "rb") as f:
                for _ in fastavro.reader(f):
                    n += 1
    return {**t.to_json(), "records": n}


def _polars_decode(args: argparse.Namespace) -> dict[str, Any]:
    import polars as pl

    n = 0
    with WorkTimer() as t:
        for path in args.inputs:
            n += pl.read_avro(path).height
    return {**t.to_json(), "records": n}


def _json_decode(args: argparse.Namespace) -> dict[str, Any]:
    import orjson

    n = 0
    loads = orjson.loads
    with WorkTimer() as t:
        for path in args.inputs:
            with open(path, "rb") as f:
                for line in f:
                    loads(line)
                    n += 1
    return {**t.to_json(), "records": n}


def _parquet_decode(args: argparse.Namespace) -> dict[str, Any]:
    import pyarrow.parquet as pq

    n = 0
    with WorkTimer() as t:
        for path in args.inputs:
            n += pq.read_table(path, use_threads=False).num_rows
    return {**t.to_json(), "records": n}


def _parquet_read(args: argparse.Namespace) -> dict[str, Any]:
    import polars  # noqa: F401 - imported before the timer, as in a warm worker

    from convert.sources import iter_records
    from pipelines.options import ConvertOptions

    n = 0
    with WorkTimer() as t:
        for path in args.inputs:
            with open(path, "rb") as f:
                for batch in iter_records(f, path, 0, None, ConvertOptions.batch_size, record_json=True):
                    n += len(batch.records)
    return {**t.to_json(), "records": n}


#: Rows per row group of the bench's Parquet files (``parquet_twins``).
PARQUET_ROW_GROUP = 16384


def parquet_twins(avro: list[str], root: Path) -> list[str]:
    """Each Avro file rewritten as Parquet under ``root`` (made once, kept): the same records."""
    import polars as pl

    root.mkdir(parents=True, exist_ok=True)
    out = []
    for path in avro:
        target = root / (Path(path).stem + ".parquet")
        if not target.exists():
            tmp = target.with_name(target.name + ".tmp")
            pl.read_avro(path).write_parquet(tmp, compression="zstd", row_group_size=PARQUET_ROW_GROUP)
            os.replace(tmp, target)
        out.append(str(target))
    return out


def _json_read(args: argparse.Namespace) -> dict[str, Any]:
    from apache_beam.io.filesystems import FileSystems

    from convert.sources import iter_records
    from pipelines.options import ConvertOptions
    from pipelines.unit_input import relaxed_gc

    batch_size = ConvertOptions.batch_size  # the default
    n = 0
    # As a worker reads its ranges: Beam's file object, the job's batch size,
    # the job's GC setting while a unit runs.
    with WorkTimer() as t, relaxed_gc():
        for path in args.inputs:
            with FileSystems.open(path, compression_type="uncompressed") as f:
                for batch in iter_records(f, path, 0, None, batch_size):
                    n += len(batch.records) + len(batch.bad)
    return {**t.to_json(), "records": n}


#: The wide-schema rows' file: few records, many fields. Fields, not records,
#: are what per-column work scales with; one batch of records is enough.
WIDE_RECORDS = 1000
WIDE_FIELDS = 4000


def _write_wide_avro(path: Path) -> None:
    import fastavro

    fields = [{"name": f"f{i}", "type": ["null", "long"] if i % 2 else ["null", "string"]} for i in range(WIDE_FIELDS)]
    schema = fastavro.parse_schema({"type": "record", "name": "Wide", "fields": fields})
    rows = ({f"f{i}": None if (i + r) % 5 == 0 else i * r if i % 2 else f"v{(i + r) % 7}" for i in range(WIDE_FIELDS)}
            for r in range(WIDE_RECORDS))
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        fastavro.writer(f, schema, rows, codec="deflate")
    os.replace(tmp, path)


def _wide_read(args: argparse.Namespace) -> dict[str, Any]:
    import polars  # noqa: F401 - imported before the timer, as in a warm worker

    from convert.sources import iter_records
    from pipelines.options import ConvertOptions

    path = Path(args.inputs[0])
    if not path.exists():
        _write_wide_avro(path)
    n = 0
    with WorkTimer() as t, open(path, "rb") as f:
        for batch in iter_records(f, str(path), 0, None, ConvertOptions.batch_size, avro_decoder=args.avro_decoder,
                                  record_json=True):
            n += len(batch.records)
    return {**t.to_json(), "records": n, "fields": WIDE_FIELDS}


CASES = {
    "recordprep": _recordprep,
    "naive": _naive,
    "naive-verify": _naive_verify,
    "avro-decode": _avro_decode,
    "polars-decode": _polars_decode,
    "json-decode": _json_decode,
    "json-read": _json_read,
    "parquet-decode": _parquet_decode,
    "parquet-read": _parquet_read,
    "wide-read": _wide_read,
}


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--layout", choices=("features", "packed"), default="features")
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--output", default=None)
    ap.add_argument("--compression", choices=("gzip", "none"), default="gzip")
    ap.add_argument("--records", type=int, default=0, help="records in --inputs (naive: for the rate)")
    ap.add_argument("--avro-decoder", choices=("auto", "fastavro"), default="auto")
    ap.add_argument("--workers", type=int, default=0,
                    help="recordprep --workers (0: recordprep's default choice)")
    ap.add_argument("--order", choices=("shuffled", "input"), default="shuffled", help="recordprep --order")


def main() -> None:
    child_main("one conversion measurement", _add_args, lambda a: CASES[a.case](a))



# -------------------------------------------------------------------- parent


def naive_subset(size: str, files: list[str], count: int | None = None) -> list[str]:
    """The files the naive pipeline reads: the first ``count``; by default all of
    ``small`` and ``default`` (the issue's own workload, 400k records in 16
    files: 1.7 minutes at the 2026-11-24 host's 3.8k records/s, 3.5 at the
    older host's 1.9k), the first 2 of ``large``. On a 2-file subset the
    ratio understates recordprep: its ~1 s of fixed cost (worker start-up)
    weighs on 1.8 s of work (10.25x there against 13.27x on all 16 files,
    same run)."""
    if count is None:
        count = len(files) if size in ("small", "default") else 2
    return files[:count]


#: Rows that feed a target: run ``target_repeats`` times (median), at least.
TARGET_ROWS = frozenset({"recordprep_avro_gzip", "naive", "recordprep_subset_gzip", "limit_json",
                         "recordprep_json_read", "recordprep_json_gzip"})


def run_table(size: str, manifest: dict[str, Any], *, repeats: int, log, out_root: Path,
              log_dir: Path, skip_naive: bool = False, naive_files: int | None = None,
              target_repeats: int = 1) -> dict[str, Any]:
    """Measure every conversion row; returns ``{"rows": {...}, "verify": ..., ...}``.

    Rows in ``TARGET_ROWS`` run ``max(repeats, target_repeats)`` times, the
    others ``repeats`` times (the ``once`` rows once), interleaved.
    """
    from bench import make_data
    from bench.measure import run_child

    avro = make_data.avro_files(size, manifest)
    jsonl = make_data.json_files(size, manifest)
    per_file = {str(make_data.dataset_dir(size) / f["path"]): f["records"] for f in manifest["avro"]["files"]}
    parquet = parquet_twins(avro, out_root / "parquet-input")
    subset = naive_subset(size, avro, naive_files)
    subset_records = sum(per_file[f] for f in subset)
    outputs = {
        "recordprep_avro_gzip": out_root / "recordprep-avro-gzip",
        "recordprep_avro_none": out_root / "recordprep-avro-none",
        "recordprep_avro_gzip_packed": out_root / "recordprep-avro-gzip-packed",
        "recordprep_json_gzip": out_root / "recordprep-json-gzip",
        "recordprep_parquet_gzip": out_root / "recordprep-parquet-gzip",
        "recordprep_subset_gzip": out_root / "recordprep-subset-gzip",
        "recordprep_avro_gzip_workers": out_root / "recordprep-avro-gzip-workers",
        "recordprep_avro_gzip_fastavro": out_root / "recordprep-avro-gzip-fastavro",
        "naive": out_root / "naive",
    }
    plan: list[tuple[str, str, list[str]]] = [
        ("limit_avro", "limit: fastavro decode (AVRO)", ["--case", "avro-decode", "--inputs", *avro]),
        ("limit_polars", "limit: polars decode (AVRO)", ["--case", "polars-decode", "--inputs", *avro]),
        ("limit_json", "limit: JSON lines + orjson.loads", ["--case", "json-decode", "--inputs", *jsonl]),
        ("recordprep_json_read", "recordprep JSON input stage (read + parse into batches, one process)",
         ["--case", "json-read", "--inputs", *jsonl]),
        ("recordprep_avro_gzip", "recordprep AVRO -> gzip",
         ["--case", "recordprep", "--inputs", *avro, "--output", str(outputs["recordprep_avro_gzip"])]),
        ("recordprep_json_gzip", "recordprep JSON -> gzip",
         ["--case", "recordprep", "--inputs", *jsonl, "--output", str(outputs["recordprep_json_gzip"])]),
        ("limit_parquet", "limit: pyarrow Parquet decode", ["--case", "parquet-decode", "--inputs", *parquet]),
        ("recordprep_parquet_read", "recordprep Parquet input stage (read into batches, one process)",
         ["--case", "parquet-read", "--inputs", *parquet]),
        ("recordprep_parquet_gzip", "recordprep Parquet -> gzip",
         ["--case", "recordprep", "--inputs", *parquet, "--output", str(outputs["recordprep_parquet_gzip"])]),
    ]
    if (os.cpu_count() or 1) > 1:
        plan.append(("recordprep_avro_gzip_workers", "recordprep AVRO -> gzip (--workers 1, in-process)",
                     ["--case", "recordprep", "--inputs", *avro, "--workers", "1",
                      "--output", str(outputs["recordprep_avro_gzip_workers"])]))
    if not skip_naive:
        plan.append(("naive", "naive Beam AVRO -> gzip" + ("" if subset == avro else f" ({len(subset)} of {len(avro)} files)"),
                     ["--case", "naive", "--inputs", *subset, "--records", str(subset_records),
                      "--output", str(outputs["naive"])]))
        if subset != avro:
            plan.append(("recordprep_subset_gzip", f"recordprep AVRO -> gzip (same {len(subset)} files as naive)",
                         ["--case", "recordprep", "--inputs", *subset, "--output", str(outputs["recordprep_subset_gzip"])]))
    uncompressed = ("recordprep_avro_none", "recordprep AVRO -> none (uncompressed)",
                    ["--case", "recordprep", "--inputs", *avro, "--compression", "none",
                     "--output", str(outputs["recordprep_avro_none"])])

    packed = ("recordprep_avro_gzip_packed", "recordprep AVRO -> gzip (--layout packed)",
              ["--case", "recordprep", "--inputs", *avro, "--layout", "packed",
               "--output", str(outputs["recordprep_avro_gzip_packed"])])

    fastavro_only = ("recordprep_avro_gzip_fastavro", "recordprep AVRO -> gzip (--avro-decoder fastavro)",
                     ["--case", "recordprep", "--inputs", *avro, "--avro-decoder", "fastavro",
                      "--output", str(outputs["recordprep_avro_gzip_fastavro"])])
    wide_file = str(out_root / "wide" / f"wide-{WIDE_RECORDS}x{WIDE_FIELDS}.avro")
    wide = [(f"wide_{decoder}", f"wide schema: Avro input stage ({WIDE_RECORDS:,} x {WIDE_FIELDS:,} fields, --avro-decoder {decoder})",
             ["--case", "wide-read", "--inputs", wide_file, "--avro-decoder", decoder])
            for decoder in ("auto", "fastavro")]
    once = [uncompressed, packed, fastavro_only, *wide]

    runs: dict[str, list[dict[str, Any]]] = {}
    labels: dict[str, str] = {}
    # Interleave repeats (A B C A B C ...) so a noisy minute hits every row alike.
    once_keys = {o[0] for o in once}

    def times(key: str) -> int:
        return 1 if key in once_keys else max(repeats, target_repeats) if key in TARGET_ROWS else repeats

    for rep in range(max(repeats, target_repeats)):
        for key, label, argv in plan + (once if rep == 0 else []):
            if rep >= times(key):
                continue
            labels[key] = label
            log(f"convert: {label} (run {rep + 1}/{times(key)})")
            m = run_child("bench.convert_bench", argv, log_dir=log_dir, timeout=4 * 3600)
            runs.setdefault(key, []).append(m.to_json())
            log(f"  -> {_one_line(m)}")
    verify = None
    if not skip_naive and runs.get("naive") and runs["naive"][-1]["ok"]:
        log("convert: checking the naive output is the same job (naive.verify)")
        m = run_child("bench.convert_bench", ["--case", "naive-verify", "--inputs", *subset,
                                              "--output", str(outputs["naive"])], log_dir=log_dir)
        verify = m.result if m.ok else {"ok": False, "problems": [m.error]}
        log(f"  -> {'same job' if verify.get('ok') else 'DIFFERENT: ' + '; '.join(verify.get('problems', [])[:3])}")
    rows = {key: summarize(labels[key], r) for key, r in runs.items()}
    return {"rows": rows, "verify": verify, "outputs": {k: str(v) for k, v in outputs.items()},
            "naive_files": len(subset), "total_files": len(avro), "naive_records": subset_records}


def summarize(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over the successful runs of one row."""
    ok = [r for r in runs if r["ok"]]
    row: dict[str, Any] = {"label": label, "runs": len(runs), "ok": bool(ok), "raw": runs}
    if not ok:
        row["error"] = runs[-1]["error"]
        return row
    recs = ok[0]["result"]["records"]
    rates = [r["result"]["records"] / r["result"]["work_wall_s"] for r in ok]
    cpus = [r["result"]["work_cpu_s"] / r["result"]["records"] * 1000 for r in ok]
    row.update(records=recs, records_per_s=_median(rates), cpu_s_per_1k=_median(cpus),
               peak_rss_mb=_median([r["peak_rss_mb"] for r in ok]),
               work_wall_s=_median([r["result"]["work_wall_s"] for r in ok]),
               process_wall_s=_median([r["wall_s"] for r in ok]),
               process_cpu_s=_median([r["cpu_s"] for r in ok]))
    for k in ("errors", "shards", "output_mb", "files_written", "job_seconds"):
        if k in ok[-1]["result"]:
            row[k] = ok[-1]["result"][k]
    return row


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _one_line(m) -> str:
    if not m.ok:
        return f"FAILED: {m.error} (log: {m.log})"
    r = m.result
    return (f"{r['records']:,} records in {r['work_wall_s']:.1f} s = {r['records'] / r['work_wall_s']:,.0f} records/s, "
            f"{r['work_cpu_s'] / r['records'] * 1000:.2f} CPU-s/1k, peak RSS {m.peak_rss_mb:.0f} MB")


def run_scaling(sizes: tuple[str, str], *, log, log_dir: Path,
                known: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """recordprep AVRO -> gzip on two sizes: time should grow linearly, peak memory not at all.

    ``known`` holds rows already measured in this run (the main table's
    ``recordprep AVRO -> gzip`` of the size asked for), which are reused.
    """
    from bench import make_data
    from bench.measure import run_child

    rows = dict(known or {})
    for size in sizes:
        if size in rows:
            continue
        manifest = make_data.ensure_dataset(size, log=log)
        out = make_data.dataset_dir(size) / "out" / "scaling-recordprep-avro-gzip"
        log(f"scaling: recordprep AVRO -> gzip on {size}")
        m = run_child("bench.convert_bench", ["--case", "recordprep", "--inputs", *make_data.avro_files(size, manifest),
                                              "--output", str(out)], log_dir=log_dir, timeout=4 * 3600)
        log(f"  -> {_one_line(m)}")
        rows[size] = summarize(f"recordprep AVRO -> gzip ({size})", [m.to_json()])
        shutil.rmtree(out, ignore_errors=True)
    return {"sizes": list(sizes), "rows": rows, "measured_at": time.time()}


if __name__ == "__main__":
    main()
