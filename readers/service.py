"""Training input through TensorFlow's tf.data service, and its servers.

When the trainer's own CPUs cannot read, shuffle and parse fast enough, the
input pipeline runs on a pool of CPU hosts: a **dispatcher** hands work to
**workers**, which run it and stream parsed batches to the trainers over gRPC.
``readers.train_dataset(..., service="grpc://host:port")`` builds that
pipeline; ``recordprep data-service dispatcher|worker`` start the servers
(:func:`serve_dispatcher`, :func:`serve_worker`).

Contract (details: docs/data-service.md):

- Workers run :func:`readers.train_dataset`'s pipeline for all epochs in
  one job (shard shuffle, interleave with the damage check, record shuffle,
  batch, parse); the trainer re-cuts batches to ``batch_size`` and
  prefetches. Epochs meet at their boundaries (a window may hold the end of
  one and the start of the next). Workers must reach the shards under the
  trainer's path.
- ``service_sharding="dynamic"``: each shard read once per epoch by whichever
  worker asks; a lost worker's claimed, unsent records are lost for that
  epoch, never repeated. ``"static"``: worker ``i`` of the dispatcher's list
  reads shards ``i, i+n, ...``; a lost one's are read again from their start
  when it returns (repeats, no loss). Every finite epoch after a loss, and the
  open one unless the lost worker had sent the end of its part, waits for a
  worker back at its address (TensorFlow keeps its tasks, with no timeout);
  ``num_epochs=None`` trains on (dynamic): docs/data-service.md#worker-loss.
- Kept: the shard checks, the damage message, ``skip_corrupt``, the label
  split, ``features``, packed layouts. Not kept: cardinality, a reproducible
  order, iterator checkpoints; ``cache`` and ``input_context`` are refused.
- The servers are reachable on loopback only unless ``bind`` says otherwise
  (they have no authentication), refuse a port another process listens on,
  and stop on SIGTERM/SIGINT at any point; a worker whose dispatcher does not
  answer within ``start_timeout_s`` fails naming it (:mod:`readers._service_net`).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from readers import _service_net as _net
from readers._service_net import DispatcherUnreachable, PortInUse
from readers.info import ShardSelection
from readers.options import ReadOptions, TrainRequest
from readers.parsing import parse_batches, plain
from readers.shards import open_shards, paths_scheme, read_shard_fn, shard_list, tf_options

__all__ = ["DispatcherUnreachable", "PortInUse", "ServerInterrupted", "serve_dispatcher", "serve_worker",
           "train_dataset"]

logger = logging.getLogger("readers")

_POLICIES = {"dynamic": "DYNAMIC", "static": "FILE"}


def train_dataset(sel: ShardSelection, plan: Any, label: str | None, req: TrainRequest) -> tf.data.Dataset:
    """:func:`readers.train_dataset` through the tf.data service at ``opts.service`` (see the module docstring and docs/data-service.md)."""
    cache, opts, batch_size = req.cache, req.opts, req.batch_size
    if cache is not None:
        raise ValueError(f"cache={cache!r} cannot be used with ReadOptions.service: the pipeline runs on the "
                         "service's workers, which read the shards every epoch; leave cache=None")
    if req.input_context is not None:
        raise ValueError("input_context cannot be used with ReadOptions.service: the service shards the data "
                         "itself; trainers that should split one epoch between them share a "
                         "ReadOptions.service_job_name")
    worker_side = _worker_pipeline(sel, plan, label, batch_size=batch_size, seed=req.seed, deterministic=req.ordered,
                                   skip_corrupt=req.skip_corrupt, num_epochs=req.num_epochs, opts=opts)
    svc = tf.data.experimental.service
    batches = worker_side.apply(svc.distribute(
        processing_mode=getattr(svc.ShardingPolicy, _POLICIES[opts.service_sharding]),
        service=opts.service,
        job_name=opts.service_job_name,
        compression="AUTO" if opts.service_compression == "auto" else None,
    ))
    # The epochs repeat on the workers, in one job: a job per epoch (a repeat here) costs each
    # worker a pipeline start-up per epoch, which dominated small epochs (docs/benchmarks.md#design-readers).
    batches = batches.rebatch(batch_size, drop_remainder=req.drop_remainder)
    logger.info("train_dataset: split %r of %s through tf.data service %s (sharding=%s, job_name=%s, "
                "compression=%s)", sel.split, sel.root, opts.service, opts.service_sharding,
                opts.service_job_name, opts.service_compression)
    return batches.prefetch(opts.prefetch)


def _worker_pipeline(sel: ShardSelection, plan: Any, label: str | None, *, batch_size: int, seed: int | None,
                     deterministic: bool, skip_corrupt: bool, num_epochs: int | None,
                     opts: ReadOptions) -> tf.data.Dataset:
    """``num_epochs`` epochs (None: forever) of parsed batches, as a worker runs them.

    The same stages as the in-process reader, with two differences the
    service needs: no cardinality is stated (each worker yields only its part
    of the epoch), and window mode permutes each window with a seeded
    ``tf.random.shuffle`` instead of zipping a ``Dataset.random`` seed stream
    in: static (``FILE``) sharding must trace the pipeline back to one file
    list, and a second source breaks that.
    """
    paths, counts, _remote, cycle_length, parallel, buffer_bytes = open_shards(
        sel, list(sel.shards), opts, skip_corrupt)
    read = read_shard_fn(sel.info.compression, buffer_bytes, skip_corrupt=skip_corrupt,
                              block=opts.block_length, scheme=paths_scheme(paths))
    files = shard_list(paths, counts)
    if opts.shuffle_files and len(paths) > 1:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    # The shard list repeats (reshuffled each epoch): under dynamic sharding the dispatcher
    # hands out every shard num_epochs times; the epochs meet at their boundary (a worker's
    # window may hold the end of one and the start of the next).
    files = files.repeat(num_epochs)
    records = files.interleave(read, cycle_length=cycle_length, block_length=1, num_parallel_calls=parallel,
                               deterministic=deterministic)
    buffer = min(opts.shuffle_buffer, sum(counts))
    if opts.shuffle_mode == "window":
        if buffer > 1:
            records = records.rebatch(buffer).map(plain(lambda window: tf.random.shuffle(window, seed=seed)))
        batches = records.rebatch(batch_size)
    else:
        records = records.unbatch()
        if buffer > 1:
            records = records.shuffle(buffer, seed=seed)
        batches = records.batch(batch_size)
    batches = parse_batches(batches, plan, label, opts.prefetch)
    return batches.with_options(tf_options(sharded_by_reader=True, opts=opts))


# --------------------------------------------------------------------------- servers

SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: Default of ``--start-timeout``: how long a worker waits for its dispatcher to answer.
START_TIMEOUT_S = 60.0

#: How long a server may take to stop on SIGTERM before the process exits anyway (a trainer
#: still attached can hold TensorFlow's stop).
STOP_TIMEOUT_S = 10.0


class ServerInterrupted(Exception):
    """SIGTERM or SIGINT stopped a server before it was up; ``exit_code`` is the shell's 128 + signal."""

    def __init__(self, signum: int, message: str) -> None:
        self.exit_code = 128 + signum
        super().__init__(message)


def _stop_on_signals(stop: threading.Event | None) -> tuple[threading.Event, list[int]]:
    """``stop``, set by SIGTERM or SIGINT from now on, and the list of the signals received:
    installed before anything binds, so a signal at any point stops the server cleanly."""
    stop = stop or threading.Event()
    received: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        received.append(signum)
        stop.set()

    for sig in SIGNALS:
        signal.signal(sig, handler)
    return stop, received


def _interrupted(received: list[int], what: str) -> ServerInterrupted:
    signum = received[0] if received else signal.SIGTERM
    return ServerInterrupted(signum, f"recordprep data-service {what}: stopped by {signal.Signals(signum).name} "
                                     "before it was up")


def _start_holding_the_gil(start: Callable[[], Any]) -> Any:
    """``start()``, TensorFlow's server start, which holds the GIL until it returns: Python signal
    handlers cannot run meanwhile, so SIGTERM and SIGINT end the process (their default action)
    until it returns. Nothing is served yet then, so nothing is cut short."""
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    try:
        return start()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _wait_for_stop(stop: threading.Event, shadows: _net.Shadows | None) -> None:
    """Block until ``stop`` is set (signal handlers run in the main thread, between waits),
    shadowing addresses the host gains meanwhile."""
    ticks = 0
    while not stop.wait(0.5):
        ticks += 1
        if shadows is not None and ticks % 4 == 0:
            shadows.refresh()


def _stop_within(server: Any, echo: Callable[[str], None], what: str) -> None:
    stopper = threading.Thread(target=server.stop, daemon=True)
    stopper.start()
    stopper.join(STOP_TIMEOUT_S)
    if stopper.is_alive():
        echo(f"recordprep data-service {what}: did not stop within {STOP_TIMEOUT_S:g} s (clients attached); exiting")
        sys.stdout.flush()
        os._exit(0)


def _claim(port: int, where: _net.Bind) -> tuple[int, _net.Shadows | None]:
    """``port`` (0: a free one) if no other process listens on it (else :class:`PortInUse`), with the
    shadow listeners that keep a server there reachable only as ``where`` says (:mod:`readers._service_net`)."""
    port = _net.claim_port(port)
    return port, None if where.everywhere else _net.Shadows(port, where.address)


def _listen(port: int, shadows: _net.Shadows | None, start: Callable[[int], Any]) -> Any:
    """``start(port)``'s server, checked to be alone on ``port``; the shadows are closed if it fails."""
    try:
        try:
            server = _start_holding_the_gil(lambda: start(port))
        except RuntimeError as e:
            if "Could not start gRPC server" not in str(e):  # gRPC's bind failed: the port, taken since
                raise
            raise _net.PortInUse(f"could not listen on port {port} ({e}): another process took it "
                                 "meanwhile? Pass another --port") from None
        try:
            _net.check_sole_listener(port)
        except _net.PortInUse:
            server.stop()
            raise
    except BaseException:
        if shadows is not None:
            shadows.close()
        raise
    return server


def _serve_until_stopped(server: Any, shadows: _net.Shadows | None, stop: threading.Event,
                         echo: Callable[[str], None], what: str) -> None:
    try:
        _wait_for_stop(stop, shadows)
    finally:
        _stop_within(server, echo, what)
        if shadows is not None:
            shadows.close()
    echo(f"recordprep data-service {what}: stopped")


def _check_port(port: int) -> None:
    if port < 0 or port > 65535:
        raise ValueError(f"--port must be 0..65535, found {port}")


def serve_dispatcher(port: int, *, bind: str = "127.0.0.1", work_dir: str | None = None,
                     worker_addresses: Sequence[str] = (), worker_timeout_s: float | None = None,
                     echo: Callable[[str], None] = print, stop: threading.Event | None = None) -> None:
    """Run a tf.data service dispatcher on ``port`` (0: a free one) until SIGTERM/SIGINT (or ``stop``).

    ``bind``: the address it is reachable at (default loopback only;
    ``0.0.0.0``: every interface, with no authentication). ``work_dir``:
    journal the dispatcher's state there (fault-tolerant mode: a restarted
    dispatcher resumes its jobs). ``worker_addresses``: the fixed worker list
    that ``service_sharding="static"`` needs, exactly as the workers advertise
    themselves (``host:port``). ``worker_timeout_s``: how long a silent worker
    counts as alive (TensorFlow's default when None); a worker found lost
    keeps its tasks, so epochs still wait for a worker back at its address
    (docs/data-service.md, "Worker loss"). Raises ``ValueError`` for bad
    arguments, :class:`PortInUse` if another process listens on the port,
    :class:`ServerInterrupted` if a signal came before it was up.
    """
    _check_port(port)
    if worker_timeout_s is not None and worker_timeout_s <= 0:
        raise ValueError(f"--worker-timeout-s must be > 0, found {worker_timeout_s:g}")
    for address in worker_addresses:
        host, sep, wport = address.rpartition(":")
        if not sep or not host or not wport.isdigit():
            raise ValueError(f"--worker-address must be host:port (as the worker advertises itself), found {address!r}")
    where = _net.parse_bind(bind)
    config: dict[str, Any] = {}
    if work_dir:
        config.update(work_dir=str(work_dir), fault_tolerant_mode=True)
    if worker_addresses:
        config["worker_addresses"] = list(worker_addresses)
    if worker_timeout_s is not None:
        config["worker_timeout_ms"] = int(worker_timeout_s * 1000)
    stop, received = _stop_on_signals(stop)
    svc = tf.data.experimental.service
    port, shadows = _claim(port, where)
    server = _listen(port, shadows, lambda p: svc.DispatchServer(svc.DispatcherConfig(port=p, **config)))
    if stop.is_set():
        _stop_within(server, echo, "dispatcher")
        raise _interrupted(received, "dispatcher")
    bound = _port_of(server.target)
    host = where.address or socket.gethostname()
    mode = f"fault-tolerant, journal in {work_dir}" if work_dir else "not fault-tolerant: pass --work-dir to be"
    static = f"; static sharding over {', '.join(worker_addresses)}" if worker_addresses else ""
    echo(f"recordprep data-service dispatcher: listening on port {bound} ({where.describe()}); trainers use "
         f"service='grpc://{_host(host)}:{bound}', workers --dispatcher {_host(host)}:{bound} ({mode}{static})")
    _serve_until_stopped(server, shadows, stop, echo, "dispatcher")


def serve_worker(dispatcher: str, port: int, *, bind: str = "127.0.0.1", advertise: str | None = None,
                 heartbeat_s: float | None = None, start_timeout_s: float = START_TIMEOUT_S,
                 echo: Callable[[str], None] = print, stop: threading.Event | None = None) -> None:
    """Run a tf.data service worker on ``port`` (0: a free one), registered with ``dispatcher`` (``host:port``).

    ``bind``: as for :func:`serve_dispatcher`. ``advertise``: the host name
    or address the dispatcher gives trainers to reach this worker (default:
    the ``bind`` address, or this host's name when bound to every interface);
    with ``port`` 0 the port is filled in once bound. ``heartbeat_s``: how
    often the worker reports to the dispatcher (TensorFlow's default when
    None). ``start_timeout_s``: how long to wait for the dispatcher to answer
    before raising :class:`DispatcherUnreachable` (TensorFlow alone retries
    forever). Other errors as for :func:`serve_dispatcher`.
    """
    target = dispatcher.removeprefix("grpc://")
    host, sep, dport = target.rpartition(":")
    if not sep or not host or not dport.isdigit():
        raise ValueError(f"--dispatcher must be host:port of `recordprep data-service dispatcher`, found {dispatcher!r}")
    _check_port(port)
    if heartbeat_s is not None and heartbeat_s <= 0:
        raise ValueError(f"--heartbeat-s must be > 0, found {heartbeat_s:g}")
    if not start_timeout_s > 0:
        raise ValueError(f"--start-timeout must be > 0, found {start_timeout_s:g}")
    where = _net.parse_bind(bind)
    advertise = advertise or (_host(where.address) if where.address else socket.gethostname())
    config: dict[str, Any] = {"dispatcher_address": target, "worker_address": f"{advertise}:%port%"}
    if heartbeat_s is not None:
        config["heartbeat_interval_ms"] = int(heartbeat_s * 1000)
    stop, received = _stop_on_signals(stop)
    deadline = time.monotonic() + start_timeout_s
    port, shadows = _claim(port, where)  # a taken port fails before any wait
    echo(f"recordprep data-service worker: waiting up to {start_timeout_s:g} s for dispatcher {target}")
    try:
        if not _net.wait_for_dispatcher(target, start_timeout_s, stop):
            raise _interrupted(received, f"worker (waiting for dispatcher {target})")
    except BaseException:
        if shadows is not None:
            shadows.close()
        raise
    echo(f"recordprep data-service worker: dispatcher {target} answered; registering")
    svc = tf.data.experimental.service
    # TensorFlow's start registers with the dispatcher and retries that forever, holding the GIL:
    # the dispatcher answered just now, and if it goes away before the registration, faulthandler's
    # C watchdog (no GIL needed) ends the process with code 1 when the start timeout runs out.
    faulthandler.dump_traceback_later(max(1.0, deadline - time.monotonic()), exit=True)
    try:
        server = _listen(port, shadows, lambda p: svc.WorkerServer(svc.WorkerConfig(port=p, **config)))
    finally:
        faulthandler.cancel_dump_traceback_later()
    if stop.is_set():
        _stop_within(server, echo, "worker")
        raise _interrupted(received, "worker")
    bound = _port_of(server._address)  # no public accessor for a port picked by the OS
    echo(f"recordprep data-service worker: listening on port {bound} ({where.describe()}) as {advertise}:{bound}, "
         f"registered with dispatcher {target}")
    _serve_until_stopped(server, shadows, stop, echo, "worker")


def _host(address: str) -> str:
    """``address`` as the host part of ``host:port`` (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def _port_of(address: str) -> int:
    return int(str(address).rsplit(":", 1)[1])
