"""A stand-in for TensorFlow Serving's REST predict API, for trying clients without it.

    python examples/serve_rest.py EXPORT_DIR [--port 8501] [--model NAME]

Serves ``POST /v1/models/NAME:predict`` (and ``/v1/models/NAME/versions/N:predict``)
in TF Serving's row format: ``{"signature_name": ..., "instances": [...]}`` where
an instance is ``{input: value}`` (or the bare value for a one-input
signature), binary strings as ``{"b64": ...}``; it answers ``{"predictions": [...]}``,
one ``{output: value}`` per row (the bare value for a one-output signature),
or ``{"error": ...}`` with status 400. Only TensorFlow is needed, not recordprep.
The first line on stdout is ``listening on http://HOST:PORT`` once it accepts requests.
It is a test and demo tool, not a server for production: use TensorFlow Serving there.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import tensorflow as tf

_PATH = re.compile(r"^/v1/models/([^/:]+)(?:/versions/\d+)?:predict$")


def _value(x: Any) -> Any:
    """A JSON value with TF Serving's ``{"b64": ...}`` binary strings decoded."""
    if isinstance(x, dict) and set(x) == {"b64"}:
        return base64.b64decode(x["b64"])
    if isinstance(x, list):
        return [_value(y) for y in x]
    return x


def _json(x: Any) -> Any:
    """A tensor's value as JSON: strings as text, bytes that are not UTF-8 as ``{"b64": ...}``."""
    if isinstance(x, np.ndarray):
        return [_json(y) for y in x]
    if isinstance(x, bytes):
        return _text(x)
    return x.item() if isinstance(x, np.generic) else x


def _text(b: bytes) -> Any:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(b).decode("ascii")}


def predict(fn: Any, body: dict[str, Any]) -> dict[str, Any]:
    """TF Serving's row-format predict of ``body`` with the concrete function ``fn``."""
    spec = fn.structured_input_signature[1]
    rows = body.get("instances")
    if not isinstance(rows, list):
        raise ValueError('the body needs "instances": a list (the row format)')
    if len(spec) == 1 and not all(isinstance(r, dict) and set(r) == set(spec) for r in rows):
        rows = [{next(iter(spec)): r} for r in rows]
    args = {}
    for name, s in spec.items():
        values = [_value(r[name]) for r in rows]
        args[name] = tf.constant(np.array(values, dtype=object if s.dtype == tf.string else s.dtype.as_numpy_dtype))
    out = {k: v.numpy() for k, v in fn(**args).items()}
    if len(out) == 1:
        return {"predictions": _json(next(iter(out.values())))}
    return {"predictions": [{k: _json(v[i]) for k, v in out.items()} for i in range(len(rows))]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export_dir")
    ap.add_argument("--port", type=int, default=8501)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--model", default=None, help="model name in the URL (default: any)")
    args = ap.parse_args(argv)
    loaded = tf.saved_model.load(args.export_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            m = _PATH.match(self.path)
            if not m or (args.model and m.group(1) != args.model):
                return self._send(404, {"error": f"no model at {self.path}"})
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                name = body.get("signature_name", "serving_default")
                if name not in loaded.signatures:
                    raise ValueError(f"no signature {name!r}; the model has {sorted(loaded.signatures)}")
                self._send(200, predict(loaded.signatures[name], body))
            except (ValueError, KeyError, TypeError, tf.errors.InvalidArgumentError) as e:
                self._send(400, {"error": f"{type(e).__name__}: {e}"})

        def _send(self, status: int, doc: dict[str, Any]) -> None:
            data = json.dumps(doc).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"listening on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
