"""The text analyzers (``ngrams``, ``bag_of_words``, ``tfidf``) against TF Transform's, time and memory.

``python -m bench.analyzers_text [--size small] [--analyzers ngrams tfidf ...]``

For each analyzer, on the bench data's free-text ``query`` field (``bench.make_data``:
Zipf words over a 30,000-word vocabulary, 1-24 tokens a record) and its label:

``recordprep``
    ``run_convert`` (``bench.convert_bench``'s ``recordprep`` case) of a config with the
    one feature (:data:`FEATURES`) and the label: AVRO in, train/eval gzip shards out.
``TF Transform``
    ``bench.tft_worker``'s ``convert`` case (AVRO in, the same split rule, analysis on
    the train split, gzip ``tf.train.Example`` shards in the counts recordprep wrote)
    with the preprocessing_fn a TF Transform user writes for the same feature
    (:func:`make_tft_fn`): the tokens as recordprep's (ASCII lower case, split at
    :data:`TEXT_DELIMITERS_RE`), then ``tft.ngrams`` + ``tft.compute_and_apply_vocabulary``,
    ``tft.bag_of_words`` + ``tft.vocabulary`` of every n-gram + ``tft.apply_vocabulary``, or
    ``tft.compute_and_apply_vocabulary`` + ``tft.tfidf``; each padded to ``max_len``. It runs
    with TF Transform's virtualenv (``bench.tft``), which this module never builds: without
    it, those rows say so.

Each row is one child process measured by ``bench.measure.run_child`` (work-phase
records/s and CPU, the process tree's peak RSS); outputs and logs go to
``bench/data/analyzers-text/<size>/``. Results go to
``bench/results/analyzers_text-<size>.json`` (git-ignored) and the table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
#: ``convert.records.TEXT_DELIMITERS_RE`` (the peer virtualenv has no recordprep; a test keeps them equal).
TEXT_DELIMITERS_RE = "[\\x00-\\x2f\\x3a-\\x40\\x5b-\\x5e\\x60\\x7b-\\x7f]+"
#: The feature each analyzer's row converts, besides the label ``clicked``.
FEATURES: dict[str, dict[str, Any]] = {
    "ngrams": {"name": "query_ngrams", "source": "query", "transform": "ngrams", "ngram_range": [1, 2],
               "max_len": 32, "top_k": 20000},
    "bag_of_words": {"name": "query_bow", "source": "query", "transform": "bag_of_words", "max_len": 16,
                     "top_k": 20000},
    "tfidf": {"name": "query_tfidf", "source": "query", "transform": "tfidf", "max_len": 16, "top_k": 20000},
}
LABEL = {"source": "clicked", "dtype": "int64"}


def write_config(analyzer: str, path: Path) -> Path:
    """The one-feature config of ``analyzer`` (JSON, which YAML reads) at ``path``."""
    path.write_text(json.dumps({"label": LABEL, "features": [FEATURES[analyzer]]}, indent=1) + "\n")
    return path


# ----------------------------------------------------- TF Transform's side (peer virtualenv)


def make_tft_fn(feats: list[dict[str, Any]]) -> Any:
    """The preprocessing_fn of ``feats`` (``bench.tft_worker.load_features`` of a :func:`write_config` file)."""
    import tensorflow as tf
    import tensorflow_transform as tft

    def pad(sparse: Any, n: int, default: Any) -> Any:
        return tf.RaggedTensor.from_sparse(sparse).to_tensor(default_value=default, shape=[None, n])

    def fn(inputs: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for f in feats:
            name, x = f["name"], inputs[f["name"]]
            if f["transform"] == "label":
                out[name] = x
                continue
            text = tf.strings.lower(x)
            tokens = tf.strings.split(tf.strings.regex_replace(text, TEXT_DELIMITERS_RE, " ")).to_sparse()
            lo, hi = f.get("ngram_range", (1, 1))
            grams = tft.ngrams(tokens, (lo, hi), f.get("separator", " ")) if hi > 1 else tokens
            zero = tf.constant(0, tf.int64)
            n = f["max_len"]
            if f["transform"] == "ngrams":
                ids = tft.compute_and_apply_vocabulary(grams, top_k=f.get("top_k"), num_oov_buckets=1,
                                                       vocab_filename=name)
                out[name] = pad(ids, n, zero)
                out[f"{name}_len"] = tf.minimum(tf.RaggedTensor.from_sparse(ids).row_lengths(), n)
            elif f["transform"] == "bag_of_words":
                vocab = tft.vocabulary(grams, top_k=f.get("top_k"), vocab_filename=name)
                bag = tft.bag_of_words(tokens, (lo, hi), f.get("separator", " "))
                out[name] = pad(tft.apply_vocabulary(bag, vocab, num_oov_buckets=1), n, zero)
            else:
                ids = tft.compute_and_apply_vocabulary(grams, top_k=f.get("top_k"), num_oov_buckets=1,
                                                       vocab_filename=name)
                index, weight = tft.tfidf(ids, tft.get_num_buckets_for_transformed_feature(ids))
                out[name] = pad(index, n, zero)
                out[f"{name}_weights"] = pad(weight, n, tf.constant(0.0, tf.float32))
        return out

    return fn


def _tft_case(args: argparse.Namespace) -> dict[str, Any]:
    from bench import tft_worker

    return tft_worker._convert(args, make_fn=make_tft_fn)


# ------------------------------------------------------------------ recordprep's side


def _recordprep_case(args: argparse.Namespace) -> dict[str, Any]:
    from bench import convert_bench

    return convert_bench.CASES["recordprep"](argparse.Namespace(
        inputs=args.inputs, config=args.config, output=args.output, compression="gzip", workers=args.workers,
        layout="features", avro_decoder="auto", order="shuffled"))


CASES = {"recordprep": _recordprep_case, "tft": _tft_case}


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=sorted(CASES), required=True)
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--shards", type=int, nargs=2, default=(1, 1), metavar=("TRAIN", "EVAL"))
    ap.add_argument("--workers", type=int, default=0)


# ------------------------------------------------------------------------ parent


def run(avro: list[str], records: int, analyzers: list[str], *, work: Path, log=print,
        tft_python: str | None = None) -> dict[str, Any]:
    """Each analyzer's recordprep row, then its TF Transform row (with ``tft_python``, the peer
    virtualenv's interpreter; without it the row is ``{"skipped": why}``)."""
    from bench.convert_bench import _one_line, summarize
    from bench.measure import run_child
    from bench.tft import VENV, _workers_for

    work.mkdir(parents=True, exist_ok=True)
    workers = _workers_for(avro)
    rows: dict[str, Any] = {}
    for a in analyzers:
        config = write_config(a, work / f"{a}.json")
        log(f"analyzers_text: recordprep {a}")
        m = run_child("bench.analyzers_text", ["--case", "recordprep", "--inputs", *avro, "--config", str(config),
                                               "--output", str(work / f"{a}-recordprep")], log_dir=work)
        log(f"  -> {_one_line(m)}")
        rows[a] = {"recordprep": summarize(f"recordprep {a}", [m.to_json()])}
        if tft_python is None:
            rows[a]["tft"] = {"skipped": "TF Transform's virtualenv is not built (python -m bench.tft --setup)"}
            continue
        shards = m.result.get("shards") or {}
        log(f"analyzers_text: TF Transform {a}")
        t = run_child("bench.analyzers_text", [
            "--case", "tft", "--inputs", *avro, "--config", str(config), "--output", str(work / f"{a}-tft"),
            "--shards", str(shards.get("train", 1)), str(shards.get("eval", 1)), "--workers", str(workers)],
            log_dir=work, python=tft_python, env={"PYTHONPATH": str(HERE.parent), "VIRTUAL_ENV": str(VENV)})
        log(f"  -> {_one_line(t)}")
        rows[a]["tft"] = summarize(f"TF Transform {a}", [t.to_json()])
    return {"records": records, "workers": workers, "rows": rows}


def table(results: dict[str, Any]) -> list[str]:
    """The results as Markdown rows: per analyzer and side, records/s, CPU-s per 1k records, peak RSS."""
    lines = ["| analyzer | side | records/s | CPU-s / 1k records | peak RSS MB |", "|---|---|---:|---:|---:|"]
    for a, sides in results["rows"].items():
        for side, label in (("recordprep", "recordprep"), ("tft", "TF Transform")):
            r = sides.get(side) or {}
            if r.get("ok"):
                lines.append(f"| {a} | {label} | {r['records_per_s']:,.0f} | {r['cpu_s_per_1k']:.2f} | "
                             f"{r['peak_rss_mb']:,.0f} |")
            else:
                lines.append(f"| {a} | {label} | {r.get('skipped') or r.get('error') or 'not run'} | | |")
    return lines


def main() -> None:
    if "--case" in sys.argv[1:]:
        from bench.measure import child_main

        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        try:
            child_main("one text analyzer measurement", _add_args, lambda a: CASES[a.case](a))
        except SystemExit as e:  # the result is written: skip teardown, where TF and Beam threads may crash
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.code if isinstance(e.code, int) else 1)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="small")
    ap.add_argument("--analyzers", nargs="+", choices=sorted(FEATURES), default=list(FEATURES))
    args = ap.parse_args()
    from bench import make_data, tft

    manifest = make_data.ensure_dataset(args.size)
    stamp = tft.read_stamp()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    results = run(make_data.avro_files(args.size, manifest), manifest["records"], args.analyzers,
                  work=make_data.DATA_ROOT / "analyzers-text" / args.size, tft_python=str(tft.venv_python()) if stamp else None)
    results.update(size=args.size, started=started, loadavg=os.getloadavg(), peer=stamp)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"analyzers_text-{args.size}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
