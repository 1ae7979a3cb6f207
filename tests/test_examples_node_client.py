"""A client that is not Python: ``examples/node_client/predict.js`` builds tf.train.Examples of raw
records with protobufjs (from the npm registry) and calls an export's ``serve_examples`` through
TensorFlow Serving's REST predict API, served by ``examples/serve_rest.py`` in a process of its own.
Its predictions equal the model's on the converter's Examples of the same records.

Skipped, with the reason, where Node.js or npm is not installed or the npm registry is unreachable.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from _ports import free_port
from test_readers_serving import (
    HASHED_SUPPORTED,
    _config,
    _model,
    _train_record,
    cli,
    converter_examples,
)
from test_readers_serving_examples import as_example_record

import readers

ROOT = Path(__file__).resolve().parents[1]
CLIENT = ROOT / "examples" / "node_client"
#: Where the test installs the client's npm packages (kept between runs).
NPM_CACHE = ROOT / ".cache" / "node_client"


def _node_client() -> Path:
    """The directory of the client's installed packages (``node_modules``), or a skip saying why not."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("Node.js and npm are not installed (apt-get install nodejs npm)")
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(CLIENT / "package.json", NPM_CACHE / "package.json")
    # A registry proxy may refuse requests for a while (HTTP 403 on the tunnel): npm retries each fetch,
    # and the whole install runs again after a pause, before the test gives up with the reason.
    for attempt in range(3):
        if (NPM_CACHE / "node_modules" / "protobufjs").is_dir():
            return NPM_CACHE
        if attempt:
            time.sleep(20)
        try:
            run = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--fetch-retries=4",
                                  "--fetch-retry-mintimeout=2000", "--fetch-retry-maxtimeout=20000"], cwd=NPM_CACHE,
                                 capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            pytest.skip("npm install timed out: is the npm registry reachable?")
    pytest.skip(f"npm install failed 3 times (is the npm registry reachable?): {run.stderr.strip()[-500:]}")


def _serve(export: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """``examples/serve_rest.py`` on a free loopback port, once it listens."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "serve_rest.py"), str(export), "--port", str(port),
                             "--model", "clicks"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    ready, _, _ = select.select([proc.stdout], [], [], 180)  # its first line, once it accepts requests
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("listening on"):
        proc.kill()
        proc.wait(timeout=30)
        raise AssertionError(f"serve_rest.py did not start: {line!r} {log.read_text()[-2000:]}")
    return proc, f"http://127.0.0.1:{port}/v1/models/clicks:predict"


def _stop(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, 9)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_a_node_client_gets_the_models_predictions_from_tf_examples(tmp_path):
    packages = _node_client()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text("".join(json.dumps(_train_record(i)) + "\n" for i in range(120)))
    (tmp_path / "features.yaml").write_text(_config(HASHED_SUPPORTED))
    out = tmp_path / "out"
    r = cli("convert", "--input", tmp_path / "in", "--config", tmp_path / "features.yaml", "--output", out,
            "--splits", "train=1", "--no-progress")
    assert r.exit_code == 0, r.output
    model = _model(readers.load_info(str(out)))
    export = tmp_path / "export"
    readers.export_serving(model, str(out), str(export))
    recs = [as_example_record(_train_record(i)) for i in range(30)] + [{}, {"num3": "seven"}]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    expected, kept, _ = converter_examples(out, recs)
    want = model({k: tf.constant(v) for k, v in expected.items() if k in {t.name for t in model.inputs}}).numpy()

    proc, url = _serve(export, tmp_path / "server.log")
    try:
        run = subprocess.run(["node", str(CLIENT / "predict.js"), url, str(export / "assets.extra" / "recordprep_config.json"),
                              str(tmp_path / "records.jsonl")], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "NODE_PATH": str(packages / "node_modules")})
    finally:
        _stop(proc)
    assert run.returncode == 0, run.stderr[-2000:]
    predictions = json.loads(run.stdout)
    errors = [p["recordprep_error"] for p in predictions]
    assert errors[-1].startswith("num3: expected a number, found str") and not any(errors[:-1]), errors
    assert kept.tolist() == list(range(len(recs) - 1))
    got = np.array([p["outputs"] for p in predictions[:-1]], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
