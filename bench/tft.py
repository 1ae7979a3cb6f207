"""TF Transform, the peer a TFX user would pick instead: its own virtualenv and its rows.

``python -m bench.tft --setup`` builds (or checks) the peer virtualenv;
``bench.run`` calls :func:`run_table` after the conversion table.

The virtualenv (:data:`VENV`, ``bench/.peers/tft-venv``, git-ignored) holds
``tensorflow-transform`` with the TensorFlow and Beam it pins
(``bench/tft_requirements.txt``, every package pinned by
``bench/tft_constraints.txt``), created with ``python3.11 -m venv`` and pip
from the package registry. It never enters the project's ``.venv``; it is
re-created only when those two files change (their hash is in its stamp
file). If it cannot be built (no network, no wheel), :func:`run_table` returns
the reason and the bench goes on without these rows.

Rows (each a fresh subprocess measured by :func:`bench.measure.run_child`;
the TF Transform ones run ``bench/tft_worker.py`` with the peer's interpreter):

``recordprep AVRO -> gzip (beside TF Transform)``
    ``run_convert`` with default options on every AVRO file, as the
    conversion table's headline row; run ``target_repeats`` times, the first
    run just before TF Transform's (interleaved), median reported.
``TF Transform AnalyzeAndTransformDataset AVRO -> gzip``
    :mod:`bench.tft_worker` ``convert``: the same input files, the same
    split rule and analysed split (train), the equivalent preprocessing_fn,
    gzip tf.train.Example shards in the counts recordprep wrote, the worker
    processes recordprep chose for that input. Run once (each run costs a
    minute or more at ``default`` size).
``TF Transform transform_features_layer``
    The layer of that run's ``transform_fn``: batches of 1,024 parsed raw
    records and single records inside a ``tf.function``.
``recordprep serving layer``
    The same measurement with recordprep's own layer
    (``readers.transform_layer`` of the recordprep row's output) in the
    project's virtualenv, on the same records (see :func:`_recordprep_layer`);
    a row saying "not available yet" where ``readers`` has no such layer or
    it refuses the output. It also times the demo's model (``examples/train.py``)
    alone on converted batches and exported with the layer (``export_serving``):
    ``model_batch_ms``, ``export_batch_ms``, ``export_overhead``, and ``export_added_per_layer``: what the
    export adds to the model's batch latency over the layer's own batch latency (``batch_median_ms``).

The layer rows run ``target_repeats`` times too, interleaved with the
conversions (median reported).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.measure import child_main

HERE = Path(__file__).resolve().parent
VENV = HERE / ".peers" / "tft-venv"
REQUIREMENTS = HERE / "tft_requirements.txt"
CONSTRAINTS = HERE / "tft_constraints.txt"
STAMP = VENV / ".bench-stamp.json"
CONFIG = str(HERE / "features.yaml")
#: pip's whole install, generously: about a minute with a warm cache, several on a cold one.
INSTALL_TIMEOUT_S = 1800
LAYER_BATCH = 1024


class PeerUnavailable(Exception):
    """The peer virtualenv cannot be built or used; the message says why."""


def _requirements_hash() -> str:
    h = hashlib.sha256()
    for p in (REQUIREMENTS, CONSTRAINTS):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _python311() -> str:
    found = shutil.which("python3.11")
    if found:
        return found
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    raise PeerUnavailable("python3.11 is not on PATH (TF Transform 1.21's wheels are built for it)")


def venv_python() -> Path:
    return VENV / "bin" / "python"


def read_stamp() -> dict[str, Any] | None:
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
    if stamp.get("requirements") != _requirements_hash() or not venv_python().exists():
        return None
    return stamp


def ensure_venv(log=print) -> dict[str, Any]:
    """Build the peer virtualenv unless an up-to-date one is there; return its stamp
    (versions, install seconds). Raises :class:`PeerUnavailable` with the reason."""
    stamp = read_stamp()
    if stamp is not None:
        return stamp
    shutil.rmtree(VENV, ignore_errors=True)
    VENV.parent.mkdir(parents=True, exist_ok=True)
    log_path = VENV.parent / "tft-venv-install.log"
    log(f"tft: building the peer virtualenv {VENV} (tensorflow-transform, TensorFlow, Beam; pip log: {log_path})")
    t0 = time.perf_counter()
    steps = [[_python311(), "-m", "venv", str(VENV)],
             [str(venv_python()), "-m", "pip", "install", "--upgrade", "pip"],
             [str(venv_python()), "-m", "pip", "install", "-r", str(REQUIREMENTS), "-c", str(CONSTRAINTS)]]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    with open(log_path, "w") as out:
        for cmd in steps:
            try:
                rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    timeout=INSTALL_TIMEOUT_S).returncode
            except (OSError, subprocess.TimeoutExpired) as e:
                rc, out_err = -1, f"{type(e).__name__}: {e}"
                out.write(out_err + "\n")
            if rc != 0:
                shutil.rmtree(VENV, ignore_errors=True)
                tail = " | ".join(log_path.read_text(errors="replace").strip().splitlines()[-3:])
                raise PeerUnavailable(f"building the TF Transform virtualenv failed at `{' '.join(cmd[-4:])}` "
                                      f"(exit {rc}): {tail} (full log: {log_path})")
    seconds = time.perf_counter() - t0
    probe = ("import importlib.metadata as m, platform, json; print(json.dumps({d: m.version(d) for d in "
             "('tensorflow-transform', 'tensorflow', 'apache-beam', 'tfx-bsl')} | {'python': platform.python_version()}))")
    try:
        versions = json.loads(subprocess.run([str(venv_python()), "-c", probe], capture_output=True, text=True,
                                             env=env, timeout=120, check=True).stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise PeerUnavailable(f"the TF Transform virtualenv was built but does not run: {e}") from e
    stamp = {"requirements": _requirements_hash(), "install_seconds": round(seconds, 1),
             "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": versions}
    STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
    log(f"tft: peer virtualenv ready in {seconds:.0f} s: {versions}")
    return stamp


# ------------------------------------------------------- project-venv child


def _recordprep_layer(args: argparse.Namespace) -> dict[str, Any]:
    """recordprep's serving layer (``readers.transform_layer``) measured as
    TF Transform's is (:func:`bench.tft_worker.measure_layer`), on the same
    records as JSON decodes them (the input's JSON Lines twin, same order)."""
    import orjson

    import readers

    if not hasattr(readers, "transform_layer"):
        return {"unavailable": "not available yet: readers has no serving layer (readers.transform_layer)"}
    import tensorflow as tf

    from bench.tft_worker import measure_layer

    need = LAYER_BATCH * args.num_batches
    with open(args.inputs[0], "rb") as f:
        records = [orjson.loads(line) for _, line in zip(range(need), f, strict=False)]
    try:
        layer = readers.transform_layer(args.output)
    except readers.SpecError as e:  # e.g. the output's format predates the in-graph hash and tokenizer
        return {"unavailable": f"not available yet: readers.transform_layer refuses the bench output: {e}"}

    def tensors(recs: list[Any]) -> dict[str, tf.Tensor]:
        return {k: tf.constant(v) for k, v in layer.encode(recs).items()}

    batches = [tensors(records[i * LAYER_BATCH:(i + 1) * LAYER_BATCH]) for i in range(args.num_batches)]
    singles = [tensors(records[i:i + 1]) for i in range(args.singles)]

    # As TF Transform's row: the concrete function of the layer's serving signature.
    fn = tf.function(lambda x: layer(x), input_signature=[layer.input_signature]).get_concrete_function()
    result = measure_layer(fn, fn, batches, singles, args.seconds)
    export = _export_overhead(layer, batches, args)
    for p in ("", "big_"):  # the export's added latency in units of the layer's own, measured above
        export[f"{p}export_added_per_layer"] = ((export[f"{p}export_batch_ms"] - export[f"{p}model_batch_ms"])
                                                / result["batch_median_ms"])
    return {**result, **export}


def _demo_build_model() -> Any:
    """``examples/train.py``'s ``build_model`` (the demo's model builder)."""
    examples = str(HERE.parent / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    from train import build_model

    return build_model


def realistic_model(info: Any) -> Any:
    """A ranking model of a realistic size for the bench schema, built as the demo's: 32-wide
    embeddings of every id feature, an MLP 512-256-128 -> 1 (DLRM's small top MLP)."""
    return _demo_build_model()(info, embedding_dim=32, hidden=(512, 256, 128))


def _concrete(model: Any, sig: dict[str, Any]) -> Any:
    import tensorflow as tf

    return tf.function(lambda x: model(x, training=False), input_signature=[sig]).get_concrete_function()


def _export_overhead(layer: Any, batches: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The exported SavedModel (raw inputs -> layer -> model) against the model alone on the
    converted features, batches of 1,024: what ``export_serving`` adds to a model's own batch
    latency, for the demo's model (``examples/train.py``'s ``build_model``, keys ``model_*``,
    ``export_*``) and for :func:`realistic_model` (``big_model_*``, ``big_export_*``). Both
    called as TF Serving runs them: the model as the concrete function of its input
    signature, the export as its loaded ``serving_default`` signature."""
    import tempfile

    import tensorflow as tf

    import readers
    from bench.tft_worker import measure_layer

    build_model = _demo_build_model()
    info = readers.load_info(args.output)
    features = [layer.transform(x)[0] for x in batches]
    out: dict[str, Any] = {}
    for prefix, build in (("", build_model), ("big_", realistic_model)):
        tf.keras.utils.set_random_seed(0)
        model = build(info)
        names = [t.name for t in model.inputs]
        sig = {n: tf.TensorSpec([None, *features[0][n].shape[1:]], features[0][n].dtype) for n in names}
        model_fn = _concrete(model, sig)
        mine = [{n: x[n] for n in names} for x in features]
        with tempfile.TemporaryDirectory() as d:
            readers.export_serving(model, layer, f"{d}/model")
            serve = tf.saved_model.load(f"{d}/model").signatures["serving_default"]
            m = measure_layer(model_fn, model_fn, mine, mine[:1], args.seconds)

            def call(x, serve=serve):
                return serve(**x)

            e = measure_layer(call, call, batches, batches[:1], args.seconds)
        out.update({f"{prefix}model_batch_ms": m["batch_median_ms"], f"{prefix}export_batch_ms": e["batch_median_ms"],
                    f"{prefix}export_overhead": e["batch_median_ms"] / m["batch_median_ms"] - 1,
                    f"{prefix}model_batch_cpu_ms": m["batch_cpu_ms"], f"{prefix}export_batch_cpu_ms": e["batch_cpu_ms"],
                    f"{prefix}export_overhead_cpu": e["batch_cpu_ms"] / m["batch_cpu_ms"] - 1})
    return out


def _add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--case", choices=("recordprep-layer",), required=True)
    ap.add_argument("--inputs", nargs="+", required=True)
    ap.add_argument("--output", required=True, help="the recordprep output whose analysis the layer embeds")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--num-batches", type=int, default=8)
    ap.add_argument("--singles", type=int, default=64)


# ------------------------------------------------------------------ parent


def _workers_for(avro: list[str]) -> int:
    """The worker processes ``recordprep convert`` picks for these files (pipelines.local.local_workers)."""
    from pipelines.local import MULTIPROCESS_MIN_BYTES

    total = sum(os.path.getsize(p) for p in avro)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 1 if total < MULTIPROCESS_MIN_BYTES else max(1, min(cores, len(avro)))


def run_table(size: str, manifest: dict[str, Any], *, log, log_dir: Path, out_root: Path,
              target_repeats: int = 1, tft_convert_repeats: int = 1) -> dict[str, Any]:
    """The TF Transform rows and recordprep beside them; ``{"skipped": reason}`` without the peer.

    TF Transform's conversion runs ``tft_convert_repeats`` times (each a minute
    or more at ``default``), interleaved with recordprep's; every other row
    ``target_repeats`` times. Each row's figure is the median of its runs."""
    from bench import convert_bench, make_data
    from bench.measure import run_child

    try:
        stamp = ensure_venv(log=log)
    except PeerUnavailable as e:
        log(f"tft: SKIPPED: {e}")
        return {"skipped": str(e), "rows": {}}
    avro = make_data.avro_files(size, manifest)
    workers = _workers_for(avro)
    outs = {"recordprep": out_root / "tft-beside-recordprep", "tft": out_root / "tft-convert"}
    # The repo root only (for bench.*), not the caller's PYTHONPATH: nothing of the project's environment.
    peer_env = {"PYTHONPATH": str(HERE.parent), "VIRTUAL_ENV": str(VENV)}
    runs: dict[str, list[dict[str, Any]]] = {}
    labels = {
        "recordprep_convert": "recordprep AVRO -> gzip (beside TF Transform)",
        "tft_convert": f"TF Transform AnalyzeAndTransformDataset AVRO -> gzip ({workers} worker process"
                       f"{'es' if workers > 1 else ''})",
        "tft_layer": f"TF Transform transform_features_layer (batch {LAYER_BATCH:,} / one record)",
        "recordprep_layer": f"recordprep serving layer (batch {LAYER_BATCH:,} / one record)",
    }

    def measure(key: str, module: str, argv: list[str], python: str | None = None, timeout: float = 1800) -> Any:
        log(f"tft: {labels[key]} (run {len(runs.get(key, [])) + 1})")
        m = run_child(module, argv, log_dir=log_dir, timeout=timeout, python=python,
                      env=peer_env if python else None)
        runs.setdefault(key, []).append(m.to_json())
        log(f"  -> {_one_line(m)}")
        return m

    # Interleaved (R T Tl Rl R T Tl Rl ...): TF Transform's conversion in the
    # first tft_convert_repeats rounds, every other row in each of target_repeats.
    shards: dict[str, int] | None = None
    tft_ok = False
    unavailable = None
    rounds = max(1, target_repeats)  # of every row but TF Transform's conversion
    for rep in range(max(rounds, tft_convert_repeats)):
        if rep < rounds:
            m = measure("recordprep_convert", "bench.convert_bench",
                        ["--case", "recordprep", "--inputs", *avro, "--output", str(outs["recordprep"])],
                        timeout=4 * 3600)
            if m.ok and shards is None:
                shards = m.result.get("shards") or {}
        if rep == 0 or (tft_ok and rep < tft_convert_repeats):
            counts = [str((shards or {}).get(s, 1)) for s in ("train", "eval")]
            tft_ok = measure("tft_convert", "bench.tft_worker",
                             ["--case", "convert", "--inputs", *avro, "--config", CONFIG, "--output", str(outs["tft"]),
                              "--shards", *counts, "--workers", str(workers)], python=str(venv_python()),
                             timeout=3600).ok
            _discard_if_lossy(runs["tft_convert"][-1], manifest["records"], log)
        if rep >= rounds:
            continue
        if tft_ok:
            measure("tft_layer", "bench.tft_worker",
                    ["--case", "layer", "--inputs", avro[0], "--config", CONFIG,
                     "--transform-dir", str(outs["tft"] / "transform_fn")], python=str(venv_python()))
        elif rep == 0:
            runs["tft_layer"] = [{"ok": False, "error": "no transform_fn: the TF Transform conversion failed",
                                  "result": {}}]
        if unavailable is None:  # once readers says it has no layer, it will not have one on the next run
            rp = measure("recordprep_layer", "bench.tft", ["--case", "recordprep-layer", "--inputs",
                                                           make_data.json_files(size, manifest)[0],
                                                           "--output", str(outs["recordprep"])])
            unavailable = rp.result.get("unavailable") if rp.ok else None
    rows = {k: convert_bench.summarize(labels[k], v) for k, v in runs.items() if k.endswith("_convert")}
    for k in ("tft_layer", "recordprep_layer"):
        rows[k] = _layer_row(labels[k], runs[k])
    if unavailable:
        rows["recordprep_layer"] = {"label": labels["recordprep_layer"], "ok": False, "unavailable": True,
                                    "error": unavailable, "runs": 1, "raw": runs["recordprep_layer"]}
    return {"rows": rows, "workers": workers, "peer": stamp, "shards": shards}


def _discard_if_lossy(run: dict[str, Any], records: int, log) -> None:
    """Mark a finished conversion run that wrote other than ``records`` records as
    failed (its rate would not be the same job's); its error says how many. Its
    ``transform_fn`` is still TF Transform's, so the layer rows keep it."""
    written = run.get("result", {}).get("records")
    if run.get("ok") and written != records:
        run["ok"] = False
        run["error"] = (f"wrote {written:,} of the {records:,} input records ({run['result'].get('written')}); "
                        f"the run is left out of the medians")
        log(f"  -> DISCARDED: {run['error']}")


def _layer_row(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median over the successful runs of a layer row."""
    from bench.convert_bench import _median

    ok = [r for r in runs if r["ok"] and not r["result"].get("unavailable")]
    row: dict[str, Any] = {"label": label, "runs": len(runs), "ok": bool(ok), "raw": runs}
    if not ok:
        row["error"] = runs[-1].get("error")
        return row
    row.update({k: _median([r["result"][k] for r in ok]) for k in (
        "batch_median_ms", "batch_records_per_s", "single_median_ms", "single_p90_ms") + tuple(
        k for k in ("batch_cpu_ms", "single_cpu_ms") if all(k in r["result"] for r in ok))},
        peak_rss_mb=_median([r["peak_rss_mb"] for r in ok]),
        **{k: ok[-1]["result"][k] for k in ("batch", "batch_calls", "single_calls", "outputs")})
    for k in (f"{p}{k}" for p in ("", "big_") for k in (  # recordprep's row only
            "model_batch_ms", "export_batch_ms", "export_overhead", "export_added_per_layer",
            "model_batch_cpu_ms", "export_batch_cpu_ms", "export_overhead_cpu")):
        if all(k in r["result"] for r in ok):
            row[k] = _median([r["result"][k] for r in ok])
    return row


def _one_line(m) -> str:
    if not m.ok:
        return f"FAILED: {m.error} (log: {m.log})"
    r = m.result
    if r.get("unavailable"):
        return r["unavailable"]
    if "batch_median_ms" in r:
        return (f"batch of {r['batch']:,}: {r['batch_median_ms']:.2f} ms median ({r['batch_records_per_s']:,.0f} "
                f"records/s); one record: {r['single_median_ms']:.2f} ms median; peak RSS {m.peak_rss_mb:.0f} MB")
    from bench.convert_bench import _one_line as convert_line

    return convert_line(m)


def main() -> None:
    if "--setup" in sys.argv[1:]:
        ap = argparse.ArgumentParser(description="build (or check) the TF Transform peer virtualenv")
        ap.add_argument("--setup", action="store_true", required=True)
        ap.parse_args()
        try:
            stamp = ensure_venv()
        except PeerUnavailable as e:
            print(f"TF Transform peer unavailable: {e}", file=sys.stderr)
            sys.exit(1)
        print(f"{VENV}: {stamp['versions']} (built {stamp['built']} in {stamp['install_seconds']} s)")
        return
    child_main("recordprep's side of a TF Transform row", _add_args, _recordprep_layer)


if __name__ == "__main__":
    main()
