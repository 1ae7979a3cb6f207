"""Ray Data and Petastorm beside recordprep, on the bench's Parquet twin of the Avro data set.

``bench.run`` calls :func:`run_table` after the TF Transform rows. Each row is a
fresh subprocess measured by :func:`bench.measure.run_child` (peak RSS and CPU
of the whole process tree: Ray's raylet, GCS and workers, Petastorm's reader
workers count); the peers' rows run in their own virtualenvs
(:mod:`bench.ray_data`, :mod:`bench.petastorm_peer`), each skipped with the
reason when its virtualenv cannot be built.

Conversion (the Parquet files -> gzip TFRecords, train/eval by recordprep's split rule):

``recordprep Parquet -> gzip (--workers N, beside Ray Data)``
    ``run_convert`` with default options but ``workers`` = :func:`parallelism`, the
    cores Ray gets, run just before Ray's (interleaved).
``Ray Data read_parquet -> preprocessors -> write_tfrecords``
    :mod:`bench.ray_worker` ``convert`` with ``num_cpus`` = :func:`parallelism`; its shards are then compared with recordprep's feature by feature
    (:func:`compare`).

Feeding (``model.fit`` of a trivial model, :func:`bench.peer_common.fit_rate`):

``recordprep train_dataset``
    ``readers.train_dataset`` on the train split of recordprep's shards.
``Petastorm make_petastorm_dataset`` / ``Ray Data iter_tf_batches``
    The Parquet files read every epoch, the transforms done by Keras
    preprocessing layers adapted on the train split (:mod:`bench.keras_prep`).

Break-even (:func:`bench.peers.break_even_epochs`): epochs of the train split
after which converting once (recordprep's conversion wall time) and reading
the shards has cost less than reading Parquet every epoch (plus adapting the
layers once).
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path
from typing import Any

from bench.measure import WorkTimer, child_main
from bench.peers import break_even_epochs

FEED_BATCH = 1024


# ------------------------------------------------------- project-venv children


def _recordprep_feed(args: argparse.Namespace) -> dict[str, Any]:
    import readers
    from bench.peer_common import fit_rate

    info = readers.load_info(args.output)
    names = [f.name for f in info.features if f.name != info.label_key]
    ds = readers.train_dataset(str(Path(args.output) / "train-*"), args.batch, seed=1)
    return fit_rate(ds, names, args.batch, args.seconds)


def _load(files: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    ds = tf.data.TFRecordDataset(files, compression_type="GZIP").batch(4096).map(
        lambda s: tf.io.parse_example(s, spec))
    parts = list(ds.as_numpy_iterator())
    return {k: np.concatenate([p[k] for p in parts]) if parts else np.zeros((0,)) for k in spec}


#: Features equal by construction in both jobs (no fitted statistic, same rule): the rows are
#: matched on them before the others are compared.
KEY = ("ts", "score", "duration_ms", "income", "n_items", "user_id", "item_id", "clicked", "query_len", "scores")


def compare_columns(a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each feature of two equally long, row-matched outputs: ``exact`` (the same values),
    ``close`` (floats within 1e-5 relative / 1e-6 absolute), ``relabelled`` (integer ids
    that map one to one: the same partition of the records, other numbers) or ``differs``
    (with the share of rows that differ)."""
    import numpy as np

    out = {}
    for name in a:
        x, y = a[name].reshape(len(a[name]), -1), b[name].reshape(len(b[name]), -1)
        if x.shape != y.shape:
            out[name] = {"status": "differs", "why": f"shape {x.shape} vs {y.shape}"}
        elif np.array_equal(x, y):
            out[name] = {"status": "exact"}
        elif x.dtype.kind == "f" and np.allclose(x, y, rtol=1e-5, atol=1e-6):
            out[name] = {"status": "close", "max_abs_diff": float(np.abs(x - y).max())}
        else:
            pairs = np.unique(np.stack([x.ravel(), y.ravel()], axis=1), axis=0)
            one_to_one = (x.dtype.kind == "i" and len(pairs) == len(np.unique(x)) == len(np.unique(y)))
            rows = float((x != y).any(axis=1).mean())
            out[name] = {"status": "relabelled"} if one_to_one else {"status": "differs", "rows_differ": rows}
    return out


def compare(recordprep_out: str, peer_out: str) -> dict[str, Any]:
    """recordprep's shards against a peer's (gzip TFRecords under ``<peer_out>/<split>/``), split by
    split: record counts, then each feature (:func:`compare_columns`) after sorting both on :data:`KEY`."""

    import readers
    from bench.reader_bench import _spec

    info = readers.load_info(recordprep_out)
    spec = _spec(info)
    result: dict[str, Any] = {"splits": {}, "features": {}}
    for split in ("train", "eval"):
        mine = _load(sorted(glob.glob(str(Path(recordprep_out) / f"{split}-*"))), spec)
        theirs = _load(sorted(glob.glob(str(Path(peer_out) / split / "*"))), spec)
        n, m = len(mine["clicked"]), len(theirs["clicked"])
        result["splits"][split] = {"recordprep": n, "peer": m}
        if n != m or n == 0:
            continue
        i, j = _order(mine), _order(theirs)
        for name, res in compare_columns({k: v[i] for k, v in mine.items()},
                                         {k: v[j] for k, v in theirs.items()}).items():
            prev = result["features"].get(name)
            if prev is None or (prev["status"] != "differs" and res["status"] != prev["status"]):
                result["features"][name] = res
    return result


def _order(d: dict[str, Any]) -> Any:
    """Row order of ``d`` sorted on :data:`KEY` (``KEY[0]`` first), every column of a list feature a key."""
    import numpy as np

    n = len(d[KEY[0]])
    cols = [d[k].reshape(n, -1)[:, j] for k in KEY for j in range(d[k].reshape(n, -1).shape[1])]
    return np.lexsort(cols[::-1])


def _compare(args: argparse.Namespace) -> dict[str, Any]:
    with WorkTimer() as t:
        res = compare(args.output, args.peer_output)
    return {**res, **t.to_json()}


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=("recordprep-feed", "compare"), required=True)
    ap.add_argument("--output", required=True, help="recordprep's output directory")
    ap.add_argument("--peer-output", default=None, help="compare: the peer's output directory")
    ap.add_argument("--batch", type=int, default=FEED_BATCH)
    ap.add_argument("--seconds", type=float, default=10.0)


def main() -> None:
    child_main("recordprep's side of a Ray Data / Petastorm row", _add_args,
               lambda a: _recordprep_feed(a) if a.case == "recordprep-feed" else _compare(a))


# ------------------------------------------------------------------- parent


def _feed_row(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    from bench.convert_bench import _median

    ok = [r for r in runs if r["ok"]]
    row: dict[str, Any] = {"label": label, "runs": len(runs), "ok": bool(ok), "raw": runs}
    if not ok:
        row["error"] = runs[-1].get("error")
        return row
    row.update(examples_per_s=_median([r["result"]["examples_per_s"] for r in ok]),
               peak_rss_mb=_median([r["peak_rss_mb"] for r in ok]),
               setup_s=_median([r["result"].get("adapt_s", 0.0) + r["result"].get("init_s", 0.0) for r in ok]))
    return row


def parallelism() -> int:
    """The cores both conversions get (recordprep ``--workers``, Ray ``num_cpus``) and the feeding
    rows' reader workers: the cores this process may run on, at least 2. With ``num_cpus=1`` Ray
    Data's hash aggregation (``StandardScaler``'s fit) waits for a CPU its other tasks hold, forever."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(2, cores)


def run_table(size: str, manifest: dict[str, Any], *, log, log_dir: Path, out_root: Path,
              skip_ray: bool = False, skip_petastorm: bool = False, repeats: int = 1,
              feed_seconds: float = 10.0) -> dict[str, Any]:
    """Every row of the module docstring, ``repeats`` times each (interleaved, median reported);
    a peer whose virtualenv cannot be built is ``{"skipped": reason}`` in ``peers``."""
    from bench import convert_bench, make_data, petastorm_peer, ray_data
    from bench.measure import run_child
    from bench.peers import PeerUnavailable
    avro = make_data.avro_files(size, manifest)
    parquet = convert_bench.parquet_twins(avro, out_root / "parquet-input")
    cores = parallelism()
    outs = {"recordprep": out_root / "recordprep-beside-ray", "ray": out_root / "ray-convert"}
    peers: dict[str, Any] = {}
    for key, peer, skip in (("ray", ray_data.VENV, skip_ray), ("petastorm", petastorm_peer.VENV, skip_petastorm)):
        if skip:
            peers[key] = {"skipped": f"--skip-{key}"}
            continue
        try:
            peers[key] = peer.ensure(log=log)
        except PeerUnavailable as e:
            log(f"{peer.label}: SKIPPED: {e}")
            peers[key] = {"skipped": str(e)}
    ready = {k for k, v in peers.items() if "skipped" not in v}
    runs: dict[str, list[dict[str, Any]]] = {}

    def measure(key: str, module: str, argv: list[str], venv=None, timeout: float = 3600) -> Any:
        log(f"parquet peers: {key} (run {len(runs.get(key, [])) + 1})")
        m = run_child(module, argv, log_dir=log_dir, timeout=timeout, python=str(venv.python) if venv else None,
                      env=venv.child_env() if venv else None)
        runs.setdefault(key, []).append(m.to_json())
        log(f"  -> {'ok' if m.ok else 'FAILED: ' + str(m.error)} (wall {m.wall_s:.1f} s, peak RSS {m.peak_rss_mb:.0f} MB)")
        return m

    feed = ["--batch", str(FEED_BATCH), "--seconds", str(feed_seconds)]
    for _ in range(max(1, repeats)):
        measure("recordprep_convert", "bench.convert_bench",
                ["--case", "recordprep", "--inputs", *parquet, "--workers", str(cores),
                 "--output", str(outs["recordprep"])], timeout=4 * 3600)
        if "ray" in ready:
            measure("ray_convert", "bench.ray_worker", ["--case", "convert", "--inputs", *parquet, "--output",
                                                        str(outs["ray"]), "--cpus", str(cores)], ray_data.VENV,
                    timeout=4 * 3600)
        measure("recordprep_feed", "bench.parquet_peers", ["--case", "recordprep-feed", "--output",
                                                           str(outs["recordprep"]), *feed])
        if "petastorm" in ready:
            measure("petastorm_feed", "bench.petastorm_worker",
                    ["--case", "feed", "--inputs", *parquet, "--flat-dir", str(out_root / "parquet-flat"),
                     "--workers", str(cores), *feed], petastorm_peer.VENV)
        if "ray" in ready:
            measure("ray_feed", "bench.ray_worker", ["--case", "feed", "--inputs", *parquet, "--cpus", str(cores),
                                                     *feed], ray_data.VENV)
    labels = {"recordprep_convert": f"recordprep Parquet -> gzip (--workers {cores}, beside Ray Data)",
              "ray_convert": f"Ray Data read_parquet -> preprocessors -> write_tfrecords (num_cpus={cores})",
              "recordprep_feed": "recordprep train_dataset on its shards",
              "petastorm_feed": "Petastorm make_petastorm_dataset on Parquet + Keras preprocessing layers",
              "ray_feed": "Ray Data iter_tf_batches on Parquet + Keras preprocessing layers"}
    rows = {k: convert_bench.summarize(labels[k], v) if k.endswith("_convert") else _feed_row(labels[k], v)
            for k, v in runs.items()}
    comparison = None
    if rows.get("ray_convert", {}).get("ok") and rows["recordprep_convert"].get("ok"):
        log("parquet peers: comparing Ray Data's shards with recordprep's")
        m = run_child("bench.parquet_peers", ["--case", "compare", "--output", str(outs["recordprep"]),
                                              "--peer-output", str(outs["ray"])], log_dir=log_dir)
        comparison = m.result if m.ok else {"error": m.error}
    table = {"rows": rows, "peers": peers, "cores": cores, "comparison": comparison}
    table["break_even"] = break_even(table)
    return table


def break_even(table: dict[str, Any]) -> dict[str, Any]:
    """Break-even epochs of "convert once with recordprep, then read its shards" against each
    Parquet feeding row: a number, ``None`` (never) or the reason it is not measured."""
    rows = table.get("rows", {})
    conv, mine = rows.get("recordprep_convert") or {}, rows.get("recordprep_feed") or {}
    out: dict[str, Any] = {}
    for key in ("petastorm_feed", "ray_feed"):
        peer = rows.get(key) or {}
        if not (conv.get("ok") and mine.get("ok") and peer.get("ok")):
            out[key] = {"epochs": None, "why": "a row it needs did not run or failed"}
            continue
        train = (conv.get("raw") or [{}])[-1].get("result", {}).get("written", {}).get("train") or conv["records"]
        epochs = break_even_epochs(conv["work_wall_s"], int(train), mine["examples_per_s"], peer["examples_per_s"],
                                   peer.get("setup_s", 0.0))
        bare = break_even_epochs(conv["work_wall_s"], int(train), mine["examples_per_s"], peer["examples_per_s"])
        out[key] = {"epochs": epochs, "epochs_without_setup": bare, "convert_s": conv["work_wall_s"],
                    "examples_per_epoch": int(train),
                    "why": None if epochs is not None else "the converted shards feed no faster"}
    return out


def ratios(table: dict[str, Any] | None) -> dict[str, float | None]:
    """recordprep / peer for each target of this table (None where a row is missing)."""
    from bench.report import _ratio, _row_get

    rows = (table or {}).get("rows", {})
    g = lambda k, f: _row_get(rows, k, f)  # noqa: E731
    be = (table or {}).get("break_even", {})
    worst = [be.get(k, {}).get("epochs") for k in ("petastorm_feed", "ray_feed") if rows.get(k, {}).get("ok")]
    return {
        "ray_convert_rate": _ratio(g("recordprep_convert", "records_per_s"), g("ray_convert", "records_per_s")),
        "ray_convert_rss": _ratio(g("recordprep_convert", "peak_rss_mb"), g("ray_convert", "peak_rss_mb")),
        "petastorm_feed_rate": _ratio(g("recordprep_feed", "examples_per_s"), g("petastorm_feed", "examples_per_s")),
        "ray_feed_rate": _ratio(g("recordprep_feed", "examples_per_s"), g("ray_feed", "examples_per_s")),
        "parquet_break_even": max(worst) if worst and None not in worst else None,
    }


def notes(table: dict[str, Any] | None) -> dict[str, str]:
    """Why a target of this table has no value: not run, a peer skipped, or a row failed."""
    keys = {"ray_convert_rate": "ray", "ray_convert_rss": "ray", "petastorm_feed_rate": "petastorm",
            "ray_feed_rate": "ray", "parquet_break_even": None}
    if table is None:
        return dict.fromkeys(keys, "Ray Data / Petastorm rows not run (--skip-ray and --skip-petastorm)")
    out = {}
    for key, peer in keys.items():
        skipped = [f"{p}: {table['peers'][p]['skipped']}" for p in ([peer] if peer else ["petastorm", "ray"])
                   if "skipped" in table["peers"].get(p, {})]
        out[key] = ("skipped: " + "; ".join(skipped)) if skipped else "a row it needs failed (see its table)"
    return out


def markdown(table: dict[str, Any] | None) -> list[str]:
    from bench.report import _conversion_rows, _fmt_value, _num

    if table is None:
        return ["_not run (--skip-ray and --skip-petastorm)_"]
    lines = []
    for key, p in table["peers"].items():
        lines.append(f"- {key}: " + (f"skipped: {p['skipped']}" if "skipped" in p else
                                     f"`bench/.peers/{key}-venv`: " + ", ".join(f"{d} {v}" for d, v in p["versions"].items())
                                     + f" (built {p['built']})"))
    rows = table["rows"]
    lines += ["", f"Conversion of the Parquet twin on {table['cores']} core(s):", "",
              "| row | records | records/s | CPU-s / 1k records | peak RSS (MB) | runs |", "|---|---:|---:|---:|---:|---:|"]
    lines += _conversion_rows(rows, ("recordprep_convert", "ray_convert"))
    lines += ["", f"Feeding `model.fit` (trivial model, batches of {FEED_BATCH:,}):", "",
              "| row | examples/s | one-off set-up (s) | peak RSS (MB) | runs |", "|---|---:|---:|---:|---:|"]
    for key in ("recordprep_feed", "petastorm_feed", "ray_feed"):
        r = rows.get(key)
        if r is None:
            continue
        if not r["ok"]:
            lines.append(f"| {r['label']} | FAILED: {r.get('error')} | | | {r['runs']} |")
            continue
        lines.append(f"| {r['label']} | {_num(r['examples_per_s'])} | {r['setup_s']:.1f} | {_num(r['peak_rss_mb'])} "
                     f"| {r['runs']} |")
    lines += ["", "| ratio / break-even | measured |", "|---|---:|"]
    names = {"ray_convert_rate": "recordprep / Ray Data conversion, records/s",
             "ray_convert_rss": "recordprep / Ray Data conversion, peak RSS",
             "petastorm_feed_rate": "recordprep / Petastorm feeding, examples/s",
             "ray_feed_rate": "recordprep / Ray Data feeding, examples/s"}
    lines += [f"| {names[k]} | {_fmt_value(v, 'x')} |" for k, v in ratios(table).items() if k in names]
    for key, be in table.get("break_even", {}).items():
        what = f"{be['epochs']:.2f} epochs" if be.get("epochs") is not None else f"— ({be.get('why')})"
        if be.get("epochs_without_setup") is not None:
            what += f" ({be['epochs_without_setup']:.2f} without the peer's one-off set-up)"
        lines.append(f"| break-even against {key.removesuffix('_feed')}: convert once vs read Parquet each epoch "
                     f"| {what} |")
    cmp_ = table.get("comparison")
    if cmp_:
        lines.append("")
        if cmp_.get("error"):
            lines.append(f"Comparison of Ray Data's shards with recordprep's FAILED: {cmp_['error']}")
        else:
            by: dict[str, list[str]] = {}
            for name, res in cmp_["features"].items():
                by.setdefault(res["status"], []).append(name)
            counts = "; ".join(f"{s}: recordprep {c['recordprep']:,}, Ray {c['peer']:,}" for s, c in cmp_["splits"].items())
            lines.append(f"Ray Data's shards against recordprep's (records matched on the rule-defined features): "
                         f"{counts}. " + "; ".join(f"**{s}**: {', '.join(sorted(v))}" for s, v in sorted(by.items())) + ".")
    return lines


if __name__ == "__main__":
    main()
