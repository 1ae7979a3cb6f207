"""Reader table: ``readers.train_dataset`` against the tf.data pipelines a user would write.

All rows read the **train split** of the same recordprep output (converted
twice, gzip and uncompressed), yield batches of 1 024 examples, and are
measured the same way, each in a fresh subprocess (TensorFlow's thread pools,
caches and autotuner state otherwise bleed between measurements):

``readers.train_dataset``
    ``readers.train_dataset(<out>/train-*, 1024, seed=1)`` with its defaults
    (file shuffle, parallel interleave, 10 000-record shuffle buffer, repeat,
    batch-then-parse, prefetch).
``readers.train_dataset (shuffle_mode=buffer)``
    The same with ``ReadOptions(shuffle_mode="buffer")``: tf.data's sliding
    record shuffle buffer instead of the default window shuffle (gzip only),
    to show what the default's choice buys.
``make_batched_features_dataset``
    ``tf.data.experimental.make_batched_features_dataset`` with its defaults
    (1 reader thread, 2 parser threads, 10 000-record shuffle, repeat,
    prefetch), the same shard list (from ``dataset_info.json``), the same
    ``FixedLenFeature`` spec (built from ``readers.load_info``) and label key.
    The peer the readers must beat by 2x.
``naive per-record``
    ``TFRecordDataset(files).repeat().map(parse_single_example).batch(1024)``:
    sequential, one parse call per record, no prefetch - the tutorial pipeline.
``limit: raw read``
    ``TFRecordDataset(files).repeat().batch(1024).prefetch(AUTOTUNE)`` and
    counting records: reading and (for gzip) decompressing, no parsing, no
    shuffling. Sequential on purpose: on local disk it is the fastest variant
    (``num_parallel_reads=AUTOTUNE`` measured about 3x slower per record here).
``limit: parse only``
    ``tf.io.parse_example`` (the same spec) over 16 batches of serialized
    records held in memory, mapped with ``num_parallel_calls=AUTOTUNE``: parsing
    with no I/O at all. Independent of compression.
``AVRO via from_generator``
    ``Dataset.from_generator`` over fastavro reading the *input* AVRO files,
    yielding the numeric fields only (nulls as 0; the timestamp is skipped,
    fastavro yields it as ``datetime``), then ``batch(1024)``. It does **no**
    vectorization (no vocabularies, text, arrays, normalization): it shows what
    skipping the conversion costs at training time even when doing far less.
    Independent of shard compression.

Per row: **examples/s** is the median over several windows of batches after
warm-up batches; **time to first batch** runs from the call that builds the
dataset to the first batch in hand (TensorFlow's runtime is initialized before
the clock starts, as it is in a training program that has built its model,
and the full garbage collection that importing TensorFlow leaves owing is run
then too: ~0.13 s over ~275k objects here, it otherwise lands in whichever
timed call allocates first, whatever the row);
**CPU-µs per example** is the process's CPU time (all threads) over the
measured windows divided by the examples in them; **peak RSS** is the process
tree's peak over its life (TensorFlow itself is most of it).

With ``--step-ms 5`` the loop sleeps 5 ms after every batch (a simulated
training step that leaves the CPU free, as an accelerator step does) and the
row also reports the **input-wait fraction**: time spent waiting in
``next()`` over total time. Prefetching hides input work behind the step; a
fraction near 0 means the step, not the input, sets the pace.
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.measure import child_main

BATCH = 1024
#: Warm-up: at least this many batches *and* seconds (tf.data's autotuner ramps up).
WARMUP_BATCHES, WARMUP_S = 2, 1.0
#: Measured windows: each at least this many batches *and* seconds; the median is reported.
WINDOWS, WINDOW_MIN_BATCHES, WINDOW_S = 7, 1, 0.4
PARSE_LIMIT_BATCHES = 16

CASES = ("train_dataset", "train_dataset_buffer", "mbfd", "naive", "raw", "parse", "avro_gen", "service")


# ------------------------------------------------------------------ datasets


def _shards(out_dir: str, split: str = "train"):
    """The metadata and shard paths of ``split`` (readers.load_info, or the file itself).

    Only the ``train_dataset`` row needs the readers package; the peers read
    ``dataset_info.json`` directly when it cannot be imported, so they still run.
    """
    try:
        import readers
    except Exception:  # not written yet, or mid-edit: only the train_dataset row needs it
        readers = None
    if readers is not None:
        info = readers.load_info(out_dir)
    else:
        from convert.spec import METADATA_FILENAME, DatasetInfo

        info = DatasetInfo.loads((Path(out_dir) / METADATA_FILENAME).read_text())
    paths = [_join(out_dir, s.file) for s in info.split(split).shards]
    return info, paths


def _join(root: str, name: str) -> str:
    """``root/name`` for local directories and URLs (``gs://b/out``; ``Path`` would eat a slash)."""
    if "://" in root:
        return root.rstrip("/") + "/" + name
    return str(Path(root) / name)


def _read_options():
    """``ReadOptions`` from ``$RECORDPREP_BENCH_READ_OPTIONS`` (JSON of its fields), else None.

    The remote table (:mod:`bench.remote`) measures candidate defaults this way.
    """
    raw = os.environ.get("RECORDPREP_BENCH_READ_OPTIONS")
    if not raw:
        return None
    import json

    import readers

    return readers.ReadOptions(**json.loads(raw))


def _spec(info) -> dict[str, Any]:
    import tensorflow as tf

    dt = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}
    return {f.name: tf.io.FixedLenFeature(f.shape, dt[f.dtype]) for f in info.features}


def build(case: str, out_dir: str, avro_files: list[str], batch: int):
    import tensorflow as tf

    if case == "avro_gen":
        return _avro_generator(avro_files, batch)
    info, paths = _shards(out_dir)
    comp = "GZIP" if info.compression == "GZIP" else ""
    if case == "train_dataset":
        import readers

        return readers.train_dataset(_join(out_dir, "train-*"), batch, seed=1, options=_read_options())
    if case == "service":  # through the tf.data service dispatcher of run_service_table
        import json

        import readers

        overrides = json.loads(os.environ.get("RECORDPREP_BENCH_READ_OPTIONS") or "{}")
        return readers.train_dataset(_join(out_dir, "train-*"), batch, seed=1, options=readers.ReadOptions(
            **overrides, service=os.environ["RECORDPREP_BENCH_SERVICE"]))
    if case == "train_dataset_buffer":
        import readers

        return readers.train_dataset(_join(out_dir, "train-*"), batch, seed=1,
                                     options=readers.ReadOptions(shuffle_mode="buffer"))
    if case == "mbfd":
        if info.layout == "packed":  # the same job: parse what is on disk, then unpack (readers.parse_plan)
            import readers

            spec, unpack = readers.parse_plan(info, [f.name for f in info.features])
            label = info.label_key

            def features_and_label(parsed):
                features = unpack(parsed)
                return (features, features.pop(label)) if label else features

            ds = tf.data.experimental.make_batched_features_dataset(
                paths, batch, spec, reader=tf.data.TFRecordDataset, reader_args=[comp] if comp else None)
            return ds.map(features_and_label)
        return tf.data.experimental.make_batched_features_dataset(
            paths, batch, _spec(info), reader=tf.data.TFRecordDataset, label_key=info.label_key,
            reader_args=[comp] if comp else None)
    if case == "naive":
        spec = _spec(info)
        return (tf.data.TFRecordDataset(paths, compression_type=comp).repeat()
                .map(lambda s: tf.io.parse_single_example(s, spec)).batch(batch))
    if case == "raw":
        # Sequential: on local disk it is the fastest way to get records out (with
        # num_parallel_reads=AUTOTUNE the per-record interleave cost made it ~3x slower).
        return tf.data.TFRecordDataset(paths, compression_type=comp).repeat().batch(batch).prefetch(tf.data.AUTOTUNE)
    if case == "parse":
        spec = _spec(info)
        serialized = (tf.data.TFRecordDataset(paths, compression_type=comp).repeat()
                      .batch(batch, drop_remainder=True).take(PARSE_LIMIT_BATCHES))
        held = tf.stack(list(serialized))  # [PARSE_LIMIT_BATCHES, batch] in memory
        return (tf.data.Dataset.from_tensor_slices(held).repeat()
                .map(lambda s: tf.io.parse_example(s, spec), num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE))
    raise ValueError(f"unknown case {case!r}")


def _avro_generator(files: list[str], batch: int):
    import fastavro
    import tensorflow as tf

    from bench.make_data import NUMERIC_FIELDS

    fields = [f for f in NUMERIC_FIELDS if f != "ts"]  # fastavro yields ts as datetime
    floats = {"income", "price", "score", "rating"}

    def gen():
        for path in files:
            with open(path, "rb") as fh:
                for rec in fastavro.reader(fh):
                    yield {k: (rec[k] if rec[k] is not None else 0) for k in fields}, rec["clicked"]

    sig = ({k: tf.TensorSpec((), tf.float32 if k in floats else tf.int64) for k in fields},
           tf.TensorSpec((), tf.int64))
    return tf.data.Dataset.from_generator(gen, output_signature=sig).repeat().batch(batch).prefetch(tf.data.AUTOTUNE)


def _rows(element) -> int:
    import tensorflow as tf

    x = element
    while not isinstance(x, tf.Tensor):
        x = x[0] if isinstance(x, tuple | list) else next(iter(x.values()))
    return int(x.shape[0])


# -------------------------------------------------------------------- child


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import psutil
    import tensorflow as tf

    # Initialize TensorFlow's runtime first (eager context, thread pools, tf.data)
    # and import what the row uses, as a training program has done by the time it
    # builds its input pipeline: the clock then measures building and first batch.
    _ = tf.constant(1) + 1
    next(iter(tf.data.Dataset.range(1).map(lambda x: x + 1)))
    try:  # every row but avro_gen reads the shard list through readers.load_info
        import readers

        _ = readers.train_dataset  # resolves the lazy import of readers.dataset
    except Exception as e:
        if args.case.startswith("train_dataset"):
            raise RuntimeError(f"the readers package is not importable ({type(e).__name__}: {e}); "
                               "this row needs readers.train_dataset") from e
    # Pay the full collection TensorFlow's import leaves pending (a program pays it
    # building its model); measured to land inside the first timed build otherwise.
    gc.collect()

    proc = psutil.Process()

    def cpu() -> float:
        t = proc.cpu_times()
        return t.user + t.system

    step = args.step_ms / 1000.0
    t0 = time.perf_counter()
    ds = build(args.case, args.dir, args.avro, args.batch)
    it = iter(ds)
    first = next(it)
    ttfb = time.perf_counter() - t0
    examples = _rows(first)
    if step:
        time.sleep(step)

    def window(min_batches: int, min_s: float) -> tuple[int, float, float]:
        """(examples, seconds, seconds waiting in next()) of one window."""
        n = b = 0
        wait = 0.0
        ws = time.perf_counter()
        while b < min_batches or time.perf_counter() - ws < min_s:
            a = time.perf_counter()
            batch = next(it)
            wait += time.perf_counter() - a
            n += _rows(batch)
            b += 1
            if step:
                time.sleep(step)
        return n, time.perf_counter() - ws, wait

    # bench/remote.py lengthens both: remote rows must get past what the first requests
    # buffered (a whole shard per open file) to show the storage's steady state.
    warmup_s = float(os.environ.get("RECORDPREP_BENCH_WARMUP_S", WARMUP_S))
    window_s = float(os.environ.get("RECORDPREP_BENCH_WINDOW_S", WINDOW_S))
    window(WARMUP_BATCHES, warmup_s)
    rates, waits = [], []
    n_total = 0
    cpu0, tw0 = cpu(), time.perf_counter()
    for _ in range(WINDOWS):
        n, dt, wait = window(WINDOW_MIN_BATCHES, window_s)
        rates.append(n / dt)
        waits.append(wait / dt)
        n_total += n
    cpu_used, wall = cpu() - cpu0, time.perf_counter() - tw0
    rates.sort()
    waits.sort()
    return {
        "case": args.case, "batch": examples, "time_to_first_batch_s": round(ttfb, 4),
        "examples_per_s": round(rates[len(rates) // 2], 1), "window_rates": [round(r, 1) for r in rates],
        "cpu_us_per_example": round(cpu_used / n_total * 1e6, 3), "examples_measured": n_total,
        "measured_wall_s": round(wall, 3), "cpu_cores_used": round(cpu_used / wall, 2),
        "step_ms": args.step_ms, "input_wait_fraction": round(waits[len(waits) // 2], 4),
        "threads": proc.num_threads(), "cpu_count": os.cpu_count(),
    }


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=CASES, required=True)
    ap.add_argument("--dir", required=True, help="recordprep output directory")
    ap.add_argument("--avro", nargs="*", default=[], help="input AVRO files (avro_gen)")
    ap.add_argument("--batch", type=int, default=BATCH)
    ap.add_argument("--step-ms", type=float, default=0.0)


def main() -> None:
    child_main("one reader measurement", _add_args, _measure)



# -------------------------------------------------------------------- parent


LABELS = {
    "train_dataset": "readers.train_dataset",
    "train_dataset_buffer": "readers.train_dataset (shuffle_mode=buffer)",
    "mbfd": "make_batched_features_dataset (defaults)",
    "naive": "naive per-record (map parse_single_example)",
    "raw": "limit: raw read (TFRecordDataset, batched)",
    "parse": "limit: parse only (parse_example, in memory)",
    "avro_gen": "AVRO via from_generator (numeric fields only)",
}


#: Rows the targets and the main ratios are computed from: measured at least this many
#: times (interleaved, median), because one run on a shared 2-core machine can be off by 1.5x.
TARGET_CASES = ("train_dataset", "train_dataset_buffer", "mbfd", "raw")
TARGET_REPEATS = 3


def run_table(dirs: dict[str, str], avro_files: list[str], *, log, log_dir: Path,
              step_ms: float = 5.0, repeats: int = 1, target_repeats: int = TARGET_REPEATS) -> dict[str, Any]:
    """``dirs``: compression ("gzip"/"none") -> recordprep output directory.

    Every row runs ``repeats`` times, the rows of :data:`TARGET_CASES` at least
    :data:`TARGET_REPEATS` times; runs are interleaved round by round
    (A B C ... A B ...) so a noisy minute hits every row alike.
    """
    from bench.measure import run_child

    plan: list[tuple[str, str, str, float, int]] = []  # key, case, compression, step, runs
    target_runs = max(repeats, target_repeats)
    for comp in ("gzip", "none", "gzip, packed"):
        if comp not in dirs:
            continue
        # The packed layout (an option): only the rows that show what it changes.
        cases = ("train_dataset", "mbfd", "raw") if comp == "gzip, packed" else ("train_dataset", "mbfd", "naive", "raw")
        if comp == "gzip":  # what the default window shuffle buys over tf.data's shuffle buffer
            cases += ("train_dataset_buffer",)
        for case in cases:
            plan.append((f"{case}:{comp}", case, comp, 0.0, target_runs if case in TARGET_CASES else repeats))
    any_comp = "none" if "none" in dirs else "gzip"
    plan.append(("parse", "parse", any_comp, 0.0, repeats))
    plan.append(("avro_gen", "avro_gen", any_comp, 0.0, repeats))
    if "gzip" in dirs and step_ms:
        for case in ("train_dataset", "mbfd", "naive"):
            plan.append((f"{case}:gzip:step", case, "gzip", step_ms, repeats))
    runs: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(max(p[4] for p in plan)):
        for key, case, comp, step, n in plan:
            if rnd >= n:
                continue
            label = LABELS[case] + (f" + {step:g} ms step" if step else "")
            log(f"reader: {label} [{comp if case not in ('parse', 'avro_gen') else '-'}] (run {rnd + 1}/{n})")
            argv = ["--case", case, "--dir", dirs[comp], "--step-ms", str(step)]
            if case == "avro_gen":
                argv += ["--avro", *avro_files]
            m = run_child("bench.reader_bench", argv, log_dir=log_dir, timeout=900)
            runs.setdefault(key, []).append({**m.to_json(), "label": label, "compression": comp, "case": case,
                                             "step_ms": step})
            if m.ok:
                r = m.result
                log(f"  -> {r['examples_per_s']:,.0f} examples/s, first batch {r['time_to_first_batch_s']:.2f} s, "
                    f"{r['cpu_us_per_example']:.1f} CPU-us/example, peak RSS {m.peak_rss_mb:.0f} MB"
                    + (f", input wait {r['input_wait_fraction']:.0%}" if step else ""))
            else:
                log(f"  -> FAILED: {m.error} (log: {m.log})")
    return {"rows": {k: _summarize(v) for k, v in runs.items()}, "batch": BATCH, "step_ms": step_ms,
            "warmup": {"batches": WARMUP_BATCHES, "seconds": WARMUP_S},
            "windows": {"count": WINDOWS, "min_batches": WINDOW_MIN_BATCHES, "seconds": WINDOW_S}}


#: Worker counts of the tf.data service rows (issue 23).
SERVICE_WORKERS = (1, 2)


def run_service_table(out_dir: str, *, log, log_dir: Path, repeats: int = 1,
                      workers: Sequence[int] = SERVICE_WORKERS) -> dict[str, Any]:
    """``train_dataset`` in-process against the same reads through a local tf.data service
    dispatcher with 1 and 2 workers (``recordprep data-service`` processes on 127.0.0.1).

    The measured (trainer) process's own CPU per example is the point on a small
    machine: the workers share its cores, so total examples/s cannot rise, but the
    trainer's share of the input work moves to the workers. Rows run interleaved.
    """
    import signal
    import subprocess
    import sys

    from bench.measure import run_child

    recordprep = str(Path(sys.executable).with_name("recordprep"))

    def start(args: list[str]) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([recordprep, "data-service", *args], stdout=subprocess.PIPE, text=True,
                                stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        for line in proc.stdout:
            if "listening on port" in line:
                return proc, int(line.split("listening on port ")[1].split()[0])
        raise RuntimeError(f"recordprep data-service {args[0]} did not come up (exit {proc.wait()})")

    runs: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(repeats):
        for n in (0, *workers):
            key = "in-process" if n == 0 else f"service:{n}"
            label = "readers.train_dataset, in-process" if n == 0 else f"readers.train_dataset via tf.data service, {n} worker(s)"
            procs: list[subprocess.Popen] = []
            env = {}
            try:
                if n:
                    dispatcher, port = start(["dispatcher", "--port", "0"])
                    procs.append(dispatcher)
                    for _ in range(n):
                        procs.append(start(["worker", "--dispatcher", f"127.0.0.1:{port}", "--port", "0",
                                            "--advertise", "127.0.0.1"])[0])
                    env["RECORDPREP_BENCH_SERVICE"] = f"grpc://127.0.0.1:{port}"
                log(f"service: {label} (run {rnd + 1}/{repeats})")
                cpu0 = _cpu_seconds(procs[1:])
                m = run_child("bench.reader_bench", ["--case", "service" if n else "train_dataset", "--dir", out_dir],
                              log_dir=log_dir, timeout=900, env=env)
                # The workers' CPU over the row's wall time (their start-up excluded, the trainer's included).
                workers_cores = (_cpu_seconds(procs[1:]) - cpu0) / m.wall_s if m.wall_s else 0.0
            finally:
                for proc in reversed(procs):
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
            runs.setdefault(key, []).append({**m.to_json(), "label": label, "compression": "", "case": key,
                                             "step_ms": 0.0, "workers_cores": round(workers_cores, 2)})
            if m.ok:
                log(f"  -> {m.result['examples_per_s']:,.0f} examples/s, trainer "
                    f"{m.result['cpu_us_per_example']:.1f} CPU-us/example")
            else:
                log(f"  -> FAILED: {m.error} (log: {m.log})")
    rows = {}
    for key, rs in runs.items():
        rows[key] = _summarize(rs)
        rows[key]["workers_cores"] = sorted(r["workers_cores"] for r in rs)[len(rs) // 2]
    return {"rows": rows, "dir": out_dir}


def _cpu_seconds(procs: Sequence[Any]) -> float:
    """CPU seconds (user + system) the processes ``procs`` have used so far."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            t = psutil.Process(proc.pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def service_markdown(table: dict[str, Any] | None) -> list[str]:
    """The tf.data service rows: examples/s and the trainer's own CPU per example, against in-process."""
    if not table:
        return ["_tf.data service rows not run_"]
    rows = table["rows"]
    base = rows.get("in-process", {})
    lines = [f"`{table['dir']}` (train split), batch {BATCH}: `train_dataset` in the measured process, and the same "
             "reads through a local tf.data service dispatcher with 1 and 2 workers (`recordprep data-service` "
             "processes on 127.0.0.1, sharing the machine's cores with the trainer). *Trainer CPU-µs / example* is "
             "the measured (trainer) process's own CPU time only.", "",
             "| row | examples/s | vs in-process | trainer CPU-µs / example | trainer cores busy | workers' cores busy | runs |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows.values():
        if not r["ok"]:
            lines.append(f"| {r['label']} | FAILED: {r.get('error')} | | | | | {r['runs']} |")
            continue
        vs = f"{r['examples_per_s'] / base['examples_per_s']:.2f}x" if base.get("ok") else "—"
        workers = f"{r['workers_cores']:.2f}" if r["case"] != "in-process" else "—"
        lines.append(f"| {r['label']} | {r['examples_per_s']:,.0f} | {vs} | {r['cpu_us_per_example']:.2f} | "
                     f"{r['cpu_cores_used']:.2f} | {workers} | {r['runs']} |")
    return lines


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["ok"]]
    first = runs[0]
    row: dict[str, Any] = {"label": first["label"], "compression": first["compression"], "case": first["case"],
                           "step_ms": first["step_ms"], "runs": len(runs), "ok": bool(ok), "raw": runs}
    if not ok:
        row["error"] = runs[-1]["error"]
        return row

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2

    for k in ("examples_per_s", "time_to_first_batch_s", "cpu_us_per_example", "input_wait_fraction",
              "cpu_cores_used"):
        row[k] = med([r["result"][k] for r in ok])
    row["peak_rss_mb"] = med([r["peak_rss_mb"] for r in ok])
    return row


if __name__ == "__main__":
    main()
