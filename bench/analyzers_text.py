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
    # Every term in the vocabulary (no top_k): TF Transform weights its OOV bucket, recordprep writes none,
    # so only then are the weights of every document comparable (``weights_agree``).
    "tfidf": {"name": "query_tfidf", "source": "query", "transform": "tfidf", "max_len": 16},
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
    from bench.tft_worker import add_convert_args

    ap.add_argument("--case", choices=sorted(CASES), required=True)
    add_convert_args(ap)  # --workers 0: recordprep's own choice


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
                                               "--output", str(work / f"{a}-recordprep"), "--workers", "0"],
                      log_dir=work)
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
        if a == "tfidf" and m.ok and t.ok:
            rows[a]["weights_agree"] = weights_agree(work / f"{a}-recordprep", work / f"{a}-tft", FEATURES[a]["name"])
            log(f"  -> tf-idf weights against TF Transform's: {rows[a]['weights_agree']}")
    return {"records": records, "workers": workers, "rows": rows}


def weights_agree(ours: Path, theirs: Path, name: str) -> dict[str, Any]:
    """How recordprep's tf-idf weights compare with TF Transform's, document by document: ids are
    numbered differently (TF Transform's from 0, ties in another order) and records shuffled, so
    each document is its terms (ids read back through each side's vocabulary file) with their
    weights, matched by its set of terms. ``identical``: the share of documents whose weights are
    the same float32 bits; ``max_ulps``: the largest difference of one weight, in float32 units in
    the last place, where a set of terms has one document's weights on each side; ``with_oov``: documents TF Transform weights an out-of-vocabulary bucket in
    (recordprep writes none), left out of the comparison."""
    import collections

    import numpy as np
    import tensorflow as tf

    def docs(out: Path, vocab: list[str], first: int) -> collections.Counter:
        found: collections.Counter = collections.Counter()
        for rec in tf.data.TFRecordDataset([str(p) for p in sorted(out.glob("*.tfrecord.gz"))], compression_type="GZIP"):
            feats = tf.train.Example.FromString(rec.numpy()).features.feature
            ids, w = feats[name].int64_list.value, feats[f"{name}_weights"].float_list.value
            terms = [vocab[i - first] if 0 <= i - first < len(vocab) else None for i in ids]
            # A term's weight is never 0 (its tf and idf are positive): 0 is padding (TF Transform's id 0 too).
            pairs = [(t, np.float32(x).view(np.uint32).item()) for t, x in zip(terms, w, strict=True) if x != 0]
            found[tuple(sorted(pairs, key=lambda p: (p[0] is None, p[0] or "", p[1])))] += 1
        return found

    mine = docs(ours, (ours / "vocab" / f"{name}.txt").read_text().split("\n")[:-1], 2)
    peer = docs(theirs, (theirs / "transform_fn" / "transform_fn" / "assets" / name).read_text().split("\n")[:-1], 0)

    def by_terms(found: collections.Counter) -> dict[tuple, collections.Counter]:
        out: dict[tuple, collections.Counter] = collections.defaultdict(collections.Counter)
        for d, n in found.items():
            out[tuple(t for t, _ in d)][tuple(b for _, b in d)] += n
        return out

    ours_by, theirs_by = by_terms(mine), by_terms(peer)
    with_oov = sum(n for d, n in peer.items() if any(t is None for t, _ in d))
    same = compared = ulps = 0
    for key, weights in theirs_by.items():
        if None in key or key not in ours_by:
            continue
        compared += min(sum(weights.values()), sum(ours_by[key].values()))
        same += sum((weights & ours_by[key]).values())
        if len(weights) == len(ours_by[key]) == 1:  # one document's weights on each side (not "a b a" and "a b b")
            ulps = max(ulps, *(abs(a - b) for a, b in zip(next(iter(weights)), next(iter(ours_by[key])), strict=True)))
    return {"documents": sum(peer.values()), "with_oov": with_oov, "compared": compared,
            "identical": same / compared if compared else 0.0, "max_ulps": ulps}


def table(results: dict[str, Any]) -> list[str]:
    """The results as Markdown rows: per analyzer and side, records/s, CPU-s per 1k records, peak RSS
    (and tf-idf's ``weights_agree`` after the table)."""
    lines = ["| analyzer | side | records/s | CPU-s / 1k records | peak RSS MB |", "|---|---|---:|---:|---:|"]
    for a, sides in results["rows"].items():
        for side, label in (("recordprep", "recordprep"), ("tft", "TF Transform")):
            r = sides.get(side) or {}
            if r.get("ok"):
                lines.append(f"| {a} | {label} | {r['records_per_s']:,.0f} | {r['cpu_s_per_1k']:.2f} | "
                             f"{r['peak_rss_mb']:,.0f} |")
            else:
                lines.append(f"| {a} | {label} | {r.get('skipped') or r.get('error') or 'not run'} | | |")
    agree = results["rows"].get("tfidf", {}).get("weights_agree")
    if agree is not None:
        lines.append(f"\ntf-idf weights against TF Transform's: {agree['identical']:.2%} of {agree['compared']:,} "
                     f"documents the same bits, the others within {agree['max_ulps']} ulp ({agree['with_oov']:,} "
                     f"documents with an out-of-vocabulary term, which only TF Transform weights, not compared)")
    return lines


def main() -> None:
    if "--case" in sys.argv[1:]:
        from bench.tft_worker import peer_child_main

        peer_child_main("one text analyzer measurement", _add_args, lambda a: CASES[a.case](a))
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
