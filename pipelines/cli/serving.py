"""The commands that serve what a dataset was made with: ``export`` (a SavedModel for TF Serving) and
``data-service dispatcher|worker`` (tf.data service servers). They load TensorFlow, after hiding its
start-up log lines (:func:`pipelines.cli.base.quiet_tensorflow`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipelines.cli.base import echo, fail, quiet_tensorflow

#: readers' defaults (``readers._serving_limits``), in MB of 2**20 bytes; a test keeps them equal.
DEFAULT_MAX_REQUEST_MB = 16.0
DEFAULT_MAX_RECORD_MB = 1.0
_MAX_REQUEST_HELP = ("Most MB (2**20 bytes) of inputs one request may hold (strings' bytes, 8 per number or 4 per "
                     "kind/length): a larger request fails with InvalidArgumentError before any work on it. "
                     "Bounds the server's memory per call.")
_MAX_RECORD_HELP = ("Most MB of strings one record may hold (the bytes of its serialized Example for "
                    "serve_examples): a larger record is rejected in recordprep_error, the others in its batch "
                    "convert.")


def export(
    output: Annotated[str, typer.Argument(help="The recordprep output the model was trained on (its analysis is embedded).")],
    model: Annotated[Path, typer.Argument(help="The trained Keras model file (.keras or .h5), taking the output's features by name.")],
    export_dir: Annotated[str, typer.Argument(help="Where to write the serving SavedModel (must not exist).")],
    trust_model_code: Annotated[bool, typer.Option(help="Load Python code inside the model file (Lambda layers): only for a model you wrote.")] = False,
    max_request_mb: Annotated[float, typer.Option(help=_MAX_REQUEST_HELP)] = DEFAULT_MAX_REQUEST_MB,
    max_record_mb: Annotated[float, typer.Option(help=_MAX_RECORD_HELP)] = DEFAULT_MAX_RECORD_MB,
) -> None:
    """Write a SavedModel for TF Serving that applies the converter's transforms exactly to raw records (docs/serving.md).

    Two signatures, same outputs: serving_default takes the packed fields (kinds, numbers, terms, ...);
    serve_examples takes 'examples', serialized tf.train.Example protos of the raw records (keyed by
    source path), for clients in any language. A request of the wrong shape fails naming the input; a
    malformed Example or a record over --max-record-mb is rejected in its row only.
    """
    from pipelines.options import OptionsError, input_cap_bytes

    try:
        max_request_bytes = input_cap_bytes("--max-request-mb", max_request_mb)
        max_record_bytes = input_cap_bytes("--max-record-mb", max_record_mb)
    except OptionsError as e:
        fail(str(e), code=2)
    if max_record_bytes > max_request_bytes:
        fail(f"--max-record-mb ({max_record_mb:g}) is over --max-request-mb ({max_request_mb:g}): a record is part "
             f"of a request", code=2)
    if not model.exists():
        fail(f"model {model}: no such file", code=2)
    quiet_tensorflow()
    from readers import exists

    if exists(export_dir):
        fail(f"{export_dir} exists; export into a new directory (TF Serving reads one version per directory)", code=2)
    import tensorflow as tf  # only this command needs TensorFlow

    import readers.encoder  # noqa: F401  (registers feature_encoder's layers, which a model file may hold)
    from readers import SpecError, example_keys, export_serving, transform_layer

    try:
        layer = transform_layer(output)
    except (SpecError, OSError) as e:
        fail(str(e))
    try:
        keras_model = tf.keras.models.load_model(model, safe_mode=not trust_model_code)
    except Exception as e:  # Keras raises many types for a file it cannot load
        hint = " (add --trust-model-code to load Lambda layers of a model you wrote)" if "safe_mode" in str(e) else ""
        fail(f"cannot load the model {model}: {str(e).splitlines()[0] if str(e) else type(e).__name__}{hint}")
    try:
        export_serving(keras_model, layer, export_dir, max_request_bytes=max_request_bytes,
                       max_record_bytes=max_record_bytes)
    except (ValueError, TypeError, tf.errors.OpError) as e:
        fail(f"cannot export {model} with the transforms of {output}: {e}")
    inputs = ", ".join(layer.wire.input_names())
    keys = ", ".join(example_keys(layer.config, layer.wire).values())
    echo(f"exported {model} with the transforms of {output} to {export_dir}\nserving_default inputs: {inputs}\n"
         f"serve_examples input: examples (tf.train.Example features: {keys})")



_BIND_HELP = ("Address to be reachable at: 127.0.0.1 (loopback only), an address of this host (it and loopback), "
              "or 0.0.0.0 for every interface. The servers have no authentication: bind beyond loopback only on a "
              "private network (docs/data-service.md#ports).")


def _serve(run, *args, **kwargs) -> None:  # noqa: ANN001 - readers.service.serve_*
    from readers import service

    try:
        run(*args, echo=typer.echo, **kwargs)
    except (ValueError, service.PortInUse) as e:
        fail(str(e), 2)
    except service.ServerInterrupted as e:
        fail(str(e), e.exit_code)
    except service.DispatcherUnreachable as e:
        fail(str(e), 1)
    except Exception as e:  # noqa: BLE001 - TensorFlow's own message
        fail(f"{type(e).__name__}: {e}")


def data_service_dispatcher(
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one. A port another process listens on is refused.")] = 5050,
    bind: Annotated[str, typer.Option(help=_BIND_HELP)] = "127.0.0.1",
    work_dir: Annotated[str | None, typer.Option(help="Directory (local or gs://) for the dispatcher's journal: fault-tolerant mode, a restarted dispatcher resumes its jobs.")] = None,
    worker_address: Annotated[list[str] | None, typer.Option("--worker-address", help="host:port of each worker, as it advertises itself (repeat): the fixed worker list that ReadOptions(service_sharding='static') needs.")] = None,
    worker_timeout_s: Annotated[float | None, typer.Option(help="Seconds without a heartbeat after which a worker counts as lost (TensorFlow's default if not given); a lost worker keeps its tasks: epochs wait for a worker back at its address (docs/data-service.md).", show_default=False)] = None,
) -> None:
    """Run a tf.data service dispatcher: it hands shards to the workers and tells trainers where to fetch batches."""
    quiet_tensorflow()
    from readers import service  # TensorFlow, only for this command

    _serve(service.serve_dispatcher, port, bind=bind, work_dir=work_dir,
           worker_addresses=tuple(worker_address or ()), worker_timeout_s=worker_timeout_s)


def data_service_worker(
    dispatcher: Annotated[str, typer.Option(help="host:port of the dispatcher.")],
    port: Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one. A port another process listens on is refused.")] = 5051,
    bind: Annotated[str, typer.Option(help=_BIND_HELP)] = "127.0.0.1",
    advertise: Annotated[str | None, typer.Option(help="Host name or address trainers reach this worker at (default: the --bind address, or this host's name with --bind 0.0.0.0).", show_default=False)] = None,
    heartbeat_s: Annotated[float | None, typer.Option(help="Seconds between heartbeats to the dispatcher (TensorFlow's default if not given).", show_default=False)] = None,
    start_timeout: Annotated[float, typer.Option(help="Seconds to wait for the dispatcher to answer at start; then exit 1 naming it (a supervisor restarts the worker).")] = 60.0,
) -> None:
    """Run a tf.data service worker: it runs the input pipelines the dispatcher assigns and streams parsed batches to trainers."""
    quiet_tensorflow()
    from readers import service  # TensorFlow, only for this command

    _serve(service.serve_worker, dispatcher, port, bind=bind, advertise=advertise, heartbeat_s=heartbeat_s,
           start_timeout_s=start_timeout)
