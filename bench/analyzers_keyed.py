"""The keyed analyzers against TF Transform's: ``label_vocabulary`` (of a category, and of a
list: ``label_vocabulary_list``), ``zscore_per_key``, ``cyclical``.

One row pair per analyzer, on the bench data (``bench/make_data.py``), each a
fresh subprocess measured by :func:`bench.measure.run_child` (work-phase time,
peak RSS of the process tree):

``recordprep <analyzer>``
    ``recordprep convert`` (``bench.convert_bench``'s ``recordprep`` case) of
    every Avro file with a config of that one feature and the label
    ``clicked`` (:data:`CASES`): the analysis pass, the conversion, gzip shards.
``TF Transform <analyzer>``
    This module's child in TF Transform's virtualenv (``bench/.peers/tft-venv``,
    :mod:`bench.tft`; never built here): ``bench.tft_worker``'s conversion job
    (read, split as recordprep splits, ``AnalyzeAndTransformDataset`` on train,
    ``TransformDataset`` on eval, gzip Examples) with this analyzer's
    ``preprocessing_fn`` (:func:`make_preprocessing_fn`):
    ``compute_and_apply_vocabulary(city, labels=clicked,
    use_adjusted_mutual_info=True, min_diff_from_avg=None, top_k=...)`` (None:
    ``tft.vocabulary``'s default, recordprep's; ``compute_and_apply_vocabulary``'s
    own is 0), the same of the list ``tags`` (a SparseTensor: each tag counts
    with its record's label, once per occurrence),
    ``scale_to_z_score_per_key(price, key=country)``, and ``tf.sin``/``tf.cos``
    of the hour of day and the day of week of ``ts``.

For ``label_vocabulary`` (and ``label_vocabulary_list``) the table also says how far the two vocabularies
agree (``agreement``): the share of TF Transform's first 100 terms among
recordprep's first 100, whether the first 10 are the same in the same order,
and ``same_as_tft_ties``: whether TF Transform's whole vocabulary is
recordprep's scores with TF Transform's tie order (by term descending, where
recordprep's is ascending; ``tft_tie_order``), which tells a difference of
formula from one of tie order alone (many terms of few records share a score).

``python -m bench.analyzers_keyed --size small [--cases cyclical ...] [--json FILE]``
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from bench.measure import child_main

HERE = Path(__file__).resolve().parent
LABEL = "label: {source: clicked, name: clicked, dtype: int64}\n"
TOP_K = 1000
#: Per analyzer: recordprep's feature config, and TF Transform's inputs (the features
#: ``bench.tft_worker.load_features`` reads; ``key`` ones are inputs only).
CASES: dict[str, dict[str, str]] = {
    "label_vocabulary": {
        "recordprep": f"features:\n  - {{name: city, transform: label_vocabulary, top_k: {TOP_K}}}\n",
        "tft": "features:\n  - {name: city, transform: label_vocabulary}\n"},
    "label_vocabulary_list": {
        "recordprep": f"features:\n  - {{name: tags, transform: label_vocabulary, max_len: 12, top_k: {TOP_K}}}\n",
        "tft": "features:\n  - {name: tags, transform: label_vocabulary}\n"},
    "zscore_per_key": {
        "recordprep": "features:\n  - {name: price, transform: zscore_per_key, key: country}\n",
        "tft": "features:\n  - {name: price, transform: zscore_per_key}\n  - {name: country, transform: key}\n"},
    "cyclical": {
        "recordprep": "features:\n  - {name: ts, transform: cyclical, unit: ms, parts: [hour, day_of_week]}\n",
        "tft": "features:\n  - {name: ts, transform: cyclical}\n"},
}
#: The ranked feature of each ``label_vocabulary`` case (its vocabulary file's name on both sides).
RANKED = {"label_vocabulary": "city", "label_vocabulary_list": "tags"}


# ------------------------------------------------------------------ TF Transform's side (its virtualenv)


def make_preprocessing_fn(case: str):
    """``feats -> preprocessing_fn`` of ``case`` with TF Transform's own analyzer (TensorFlow is
    imported when the job builds it, after Beam, in the order ``bench.tft_worker`` imports them)."""
    return lambda feats: _preprocessing_fn(case)


def _preprocessing_fn(case: str):
    import math

    import tensorflow as tf
    import tensorflow_transform as tft

    def fn(inputs: dict[str, Any]) -> dict[str, Any]:
        out = {"clicked": inputs["clicked"]}
        if case in RANKED:
            name = RANKED[case]
            ids = tft.compute_and_apply_vocabulary(
                inputs[name], top_k=TOP_K, labels=tf.cast(inputs["clicked"], tf.int64), use_adjusted_mutual_info=True,
                min_diff_from_avg=None,  # tft.vocabulary's default (recordprep's): recommended for the data's size
                num_oov_buckets=0, default_value=-1, vocab_filename=name)
            if isinstance(ids, tf.SparseTensor):  # a list: its first 12 ids (the most a record has), padding 0
                ids = tf.RaggedTensor.from_sparse(ids).to_tensor(default_value=-2, shape=[None, 12])
            out[name] = ids + 2  # recordprep's layout: 0 missing, 1 out of vocabulary
        elif case == "zscore_per_key":
            out["price"] = tft.scale_to_z_score_per_key(tf.cast(inputs["price"], tf.float32), key=inputs["country"])
        elif case == "cyclical":
            secs = tf.math.floordiv(inputs["ts"], 1000)
            hour = tf.math.floordiv(tf.math.floormod(secs, 86_400), 3600)
            dow = tf.math.floormod(tf.math.floordiv(secs, 86_400) + 3, 7)
            for part, pos, period in (("hour", hour, 24.0), ("day_of_week", dow, 7.0)):
                angle = tf.cast(pos, tf.float64) * (2.0 * math.pi / period)
                out[f"ts_{part}_sin"] = tf.cast(tf.sin(angle), tf.float32)
                out[f"ts_{part}_cos"] = tf.cast(tf.cos(angle), tf.float32)
        else:
            raise ValueError(f"no TF Transform equivalent for {case!r}")
        return out

    return fn


def _tft_child(args: argparse.Namespace) -> dict[str, Any]:
    from bench import tft_worker

    res = tft_worker._convert(args, make_fn=make_preprocessing_fn(args.case))
    vocab = Path(args.output) / "transform_fn" / "transform_fn" / "assets" / RANKED.get(args.case, "city")
    if vocab.is_file():
        res["vocabulary"] = vocab.read_text(encoding="utf-8").splitlines()[:100]
    return res


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--shards", type=int, nargs=2, default=[1, 1])
    ap.add_argument("--workers", type=int, default=1)


# ------------------------------------------------------------------ parent


def recordprep_row(case: str, inputs: list[str], root: Path, *, log=print, log_dir: Path | None = None) -> Any:
    """``recordprep convert`` of ``inputs`` with ``case``'s config, measured (a ``bench.measure.Measurement``)."""
    from bench.convert_bench import _one_line
    from bench.measure import run_child

    root.mkdir(parents=True, exist_ok=True)
    config = root / f"{case}.yaml"
    config.write_text(LABEL + CASES[case]["recordprep"])
    log(f"analyzers_keyed: recordprep {case}")
    m = run_child("bench.convert_bench", ["--case", "recordprep", "--inputs", *inputs, "--config", str(config),
                                          "--output", str(root / f"{case}-recordprep")], log_dir=log_dir or root)
    log(f"  -> {_one_line(m)}")
    return m


def _tft_row(case: str, inputs: list[str], root: Path, shards: dict[str, int], *, log, log_dir: Path) -> Any:
    from bench.convert_bench import _one_line
    from bench.measure import run_child
    from bench.tft import VENV, _workers_for, venv_python

    config = root / f"{case}-tft.yaml"
    config.write_text(LABEL + CASES[case]["tft"])
    log(f"analyzers_keyed: TF Transform {case}")
    m = run_child("bench.analyzers_keyed", ["--case", case, "--inputs", *inputs, "--config", str(config),
                                            "--output", str(root / f"{case}-tft"),
                                            "--shards", str(shards.get("train", 1)), str(shards.get("eval", 1)),
                                            "--workers", str(_workers_for(inputs))],
                  log_dir=log_dir, python=str(venv_python()), timeout=3600,
                  env={"PYTHONPATH": str(HERE.parent), "VIRTUAL_ENV": str(VENV)})
    log(f"  -> {_one_line(m)}")
    return m


def agreement(recordprep_terms: list[str], tft_terms: list[str]) -> dict[str, Any]:
    """How far two ranked vocabularies agree: the share of the second's first 100 terms among the
    first's first 100, and whether their first 10 are the same terms in the same order."""
    a, b = recordprep_terms[:100], tft_terms[:100]
    return {"top100_shared": round(len(set(a) & set(b)) / max(1, len(b)), 3), "top10_same_order": a[:10] == b[:10]}


def tft_tie_order(inputs: list[str], top_k: int = TOP_K, name: str = "city") -> list[str]:
    """recordprep's ``label_vocabulary`` of ``name`` (``city``, or the list ``tags``) on ``inputs``'
    training split (the converter's reader, split and counts), ties broken as TF Transform breaks
    them: by term descending."""
    import numpy as np

    from convert.analysis import Analyzer
    from convert.config import parse_config
    from convert.prepare import Preparer
    from convert.sources import iter_records
    from convert.splits import Splits

    feature = {"name": name, "transform": "label_vocabulary", **({"max_len": 12} if name == "tags" else {})}
    config = parse_config({"label": {"source": "clicked", "dtype": "int64"}, "features": [feature]})
    acc, prep, splits = Analyzer(config), Preparer(config), Splits()
    for path in inputs:
        with open(path, "rb") as fh:
            for batch in iter_records(fh, path, record_json=True):
                pb = prep.prepare(batch.records, analyze=True)
                train = splits.assign(batch.records) == 0
                train[list(pb.bad)] = False
                acc.add_prepared(pb, train)
    f, counts = config.features[0], acc.ranked[name]
    f = type(f)(**{**f.__dict__, "top_k": None})
    ranked = transform_of_label_vocabulary().rank(f, counts, counts.classes, None)
    ranked.sort(key=lambda ts: ts[0], reverse=True)
    ranked.sort(key=lambda ts: ts[1], reverse=True)  # stable: score descending, ties by term descending
    return [t for t, _ in ranked[:top_k]] if np.isfinite(top_k) else [t for t, _ in ranked]


def transform_of_label_vocabulary() -> Any:
    from convert.transforms import get

    return get("label_vocabulary")


def run_table(size: str = "small", cases: list[str] | None = None, *, log=print,
              out_root: Path | None = None) -> dict[str, Any]:
    """Both rows of each analyzer in ``cases`` (all by default); TF Transform's are skipped, with
    the reason, when its virtualenv is not built (``python -m bench.tft --setup`` builds it)."""
    from bench import make_data
    from bench.convert_bench import summarize
    from bench.tft import read_stamp

    out_root = out_root or Path(os.environ.get("TMPDIR", "/tmp")) / "recordprep-analyzers-keyed"
    manifest = make_data.ensure_dataset(size, log=log)
    avro = make_data.avro_files(size, manifest)
    peer = read_stamp()
    rows: dict[str, Any] = {}
    for case in cases or list(CASES):
        rp = recordprep_row(case, avro, out_root, log=log, log_dir=out_root / "logs")
        row = {"recordprep": summarize(f"recordprep {case}", [rp.to_json()])}
        if peer is None:
            row["tft"] = {"label": f"TF Transform {case}", "ok": False,
                          "error": "no TF Transform virtualenv (python -m bench.tft --setup builds it)"}
        else:
            shards = rp.result.get("shards") or {}
            tf_m = _tft_row(case, avro, out_root, shards, log=log, log_dir=out_root / "logs")
            row["tft"] = summarize(f"TF Transform {case}", [tf_m.to_json()])
            name = RANKED.get(case, "city")
            vocab = out_root / f"{case}-recordprep" / "vocab" / f"{name}.txt"
            if tf_m.ok and "vocabulary" in tf_m.result and vocab.is_file():
                row["agreement"] = agreement(vocab.read_text(encoding="utf-8").splitlines(), tf_m.result["vocabulary"])
                tft_vocab = out_root / f"{case}-tft" / "transform_fn" / "transform_fn" / "assets" / name
                row["agreement"]["same_as_tft_ties"] = (
                    tft_tie_order(avro, name=name) == tft_vocab.read_text(encoding="utf-8").splitlines())
        rows[case] = row
    return {"size": size, "records": manifest["records"], "rows": rows}


def markdown(table: dict[str, Any]) -> str:
    """The table as ``docs/benchmarks.md`` shows it."""
    lines = ["| analyzer | tool | records/s | CPU-s / 1k records | peak RSS |", "|---|---|---:|---:|---:|"]
    for case, row in table["rows"].items():
        for key in ("recordprep", "tft"):
            r = row[key]
            tool = "recordprep" if key == "recordprep" else "TF Transform"
            if not r.get("ok"):
                lines.append(f"| `{case}` | {tool} | failed: {r.get('error')} | | |")
                continue
            lines.append(f"| `{case}` | {tool} | {r['records_per_s']:,.0f} | {r['cpu_s_per_1k']:.2f} | "
                         f"{r['peak_rss_mb']:,.0f} MB |")
    return "\n".join(lines)


def main() -> None:
    import sys

    if "--case" in sys.argv[1:]:
        # Ended with os._exit once the result is written: this job's interpreter teardown
        # crashes in the garbage collector (a TensorFlow or Beam finalizer), a segfault that
        # would mark a finished row failed.
        try:
            child_main("TF Transform's side of a keyed-analyzer row", _add_args, _tft_child)
        except SystemExit as e:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES))
    ap.add_argument("--json", help="also write the table here")
    args = ap.parse_args()
    table = run_table(args.size, args.cases)
    print(markdown(table))
    for case, row in table["rows"].items():
        if "agreement" in row:
            print(f"{case}: {row['agreement']}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2, default=str))


if __name__ == "__main__":
    main()
