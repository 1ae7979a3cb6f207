"""Every change recordprep makes to third-party code, each scoped to the run that needs it.

A conversion changes seven things in gRPC and Beam that neither offers as an
option (each patch's docstring says why). ``pipelines.job`` enters each one as
a context manager only for the runs that need it, and leaves it when the run
ends, failed or not, so a process that calls ``run_convert`` (a notebook, an
Airflow worker, a service) finds gRPC and Beam as it left them. Worker
processes of our own (``pipelines.local.worker``, the children of
``pipelines.local.warm``) and the ``python -m pipelines.local.loopback`` launcher keep
theirs for their lifetime (:func:`apply_for_process`).

Each patch names the library and the version range it was written and
checked against, and checks the shape of what it replaces before touching
it. When either no longer fits, entering the patch changes nothing and warns
with :class:`PatchWarning`, which the test suite turns into an error
(``filterwarnings`` in ``pyproject.toml``); ``tests/test_pipelines_patches.py``
also checks each one against the installed versions. Nested and concurrent
runs share a patch: it is applied by the first to enter and undone by the
last to leave.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any


class PatchError(RuntimeError):
    """A patch does not fit the installed library (its version or the code it replaces)."""


class PatchWarning(RuntimeWarning):
    """A patch was skipped because it does not fit the installed library (see :class:`PatchError`)."""


def _version(dist: str) -> tuple[int, ...]:
    """The leading release numbers of an installed distribution (``2.77.0rc1`` -> ``(2, 77, 0)``)."""
    parts = []
    for piece in metadata.version(dist).split("."):
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() < len(piece):
            break
    return tuple(parts)


def _show(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


class Patch:
    """One change to a library: applied by the first run to enter it, undone by the last to leave.

    Subclasses say what they change: ``_fits`` (raise :class:`PatchError`
    when the library no longer looks as the patch expects), ``_apply`` (make
    the change; returns what ``_undo`` needs to revert it).
    """

    #: Distribution whose code is patched, and the versions ``[lowest, below)`` it was written for.
    dist: str = ""
    lowest: tuple[int, ...] = ()
    below: tuple[int, ...] = ()
    #: What the patch does, for messages.
    what: str = ""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._depth = 0
        self._saved: Any = None
        self._active = False

    def check(self) -> None:
        """Raise :class:`PatchError` unless the installed library is one this patch was written for."""
        try:
            have = _version(self.dist)
        except metadata.PackageNotFoundError:
            raise PatchError(f"{self.what}: {self.dist} is not installed") from None
        if not self.lowest <= have < self.below:
            raise PatchError(f"{self.what}: written for {self.dist} >={_show(self.lowest)},<{_show(self.below)}, "
                             f"found {_show(have)}; check the patch against it (pipelines/local/patches.py) and widen the range")
        if not self._active:  # (applied, the code it replaces looks changed: by this patch)
            self._fits()

    @property
    def active(self) -> bool:
        """Whether the patch is applied now."""
        return self._active

    @contextlib.contextmanager
    def applied(self) -> Iterator[bool]:
        """Apply the patch while the block runs; yields whether it is applied.

        A patch that does not fit (:meth:`check`) is skipped with a
        :class:`PatchWarning`: the run goes on without it.
        """
        with self._lock:
            if self._depth == 0:
                try:
                    self.check()
                except PatchError as e:
                    warnings.warn(f"{e}; recordprep runs without this patch", PatchWarning, stacklevel=3)
                else:
                    self._saved = self._apply()
                    self._active = True
            self._depth += 1
            active = self._active
        try:
            yield active
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0 and self._active:
                    self._undo(self._saved)
                    self._active, self._saved = False, None

    def _fits(self) -> None:
        raise NotImplementedError

    def _apply(self) -> Any:
        raise NotImplementedError

    def _undo(self, saved: Any) -> None:
        raise NotImplementedError


_WILDCARDS = ("[::]:", "0.0.0.0:", ":")


def loopback_address(address: str) -> str:
    """``address`` with a wildcard host (``[::]``, ``0.0.0.0``, none) made ``localhost``."""
    for w in _WILDCARDS:
        if address.startswith(w):
            return "localhost:" + address[len(w):]
    return address


def _replace_attr(owner: Any, name: str, new: Any) -> Any:
    old = owner.__dict__[name] if name in vars(owner) else _MISSING
    setattr(owner, name, new)
    return old


def _restore_attr(owner: Any, name: str, new: Any, old: Any) -> None:
    """Put ``old`` back, unless someone replaced ``new`` since (then theirs stays)."""
    if vars(owner).get(name) is not new:
        return
    if old is _MISSING:
        delattr(owner, name)
    else:
        setattr(owner, name, old)


_MISSING = object()


class LoopbackBinds(Patch):
    """Beam's local gRPC servers listen on loopback only.

    The multi-process ``FnApiRunner``'s control, data, state and logging
    servers, the artifact server of ``local_job_service_main`` and
    ``worker_pool_main`` bind ``[::]:port``, i.e. every interface, with no
    option to change it, while their clients always dial ``localhost:port``.
    A conversion on a laptop or a shared host should not open ports to the
    network, so wildcard binds become ``localhost`` (127.0.0.1 and ::1) at the
    one place every server goes through, ``grpc._server._Server.add_insecure_port``.
    Explicit addresses are left alone. Needed only where Beam starts servers:
    local runs with worker processes (not in-process runs).
    """

    dist, lowest, below = "grpcio", (1, 50), (2,)
    what = "loopback-only gRPC servers (grpc._server._Server.add_insecure_port)"

    def _target(self) -> Any:
        from grpc import _server

        cls = getattr(_server, "_Server", None)
        if not isinstance(cls, type) or not callable(getattr(cls, "add_insecure_port", None)):
            raise PatchError(f"{self.what}: grpc._server._Server.add_insecure_port is gone")
        return cls

    def _fits(self) -> None:
        params = list(inspect.signature(self._target().add_insecure_port).parameters)
        if params != ["self", "address"]:
            raise PatchError(f"{self.what}: its signature is now ({', '.join(params)}), written for (self, address)")

    def _apply(self) -> Any:
        cls = self._target()
        original = cls.add_insecure_port

        @functools.wraps(original)
        def add_insecure_port(self: Any, address: str) -> int:
            return original(self, loopback_address(address))

        return add_insecure_port, _replace_attr(cls, "add_insecure_port", add_insecure_port)

    def _undo(self, saved: Any) -> None:
        _restore_attr(self._target(), "add_insecure_port", *saved)


#: Longest sleep of Beam's per-bundle state sampler while a patch is on (Beam: 200 ms).
STATE_SAMPLING_PERIOD_MS = 20


class ShortSamplerSleeps(Patch):
    """Bundles end without waiting out the state sampler's sleep.

    Every bundle starts a sampler thread that sleeps between samples, ramping
    up to 200 ms, and the bundle's end joins that thread: it waits out the
    current sleep, on average ~100 ms per bundle once the bundle ran a second
    (the sampler's own comment: "may have to wait up to sampling_period_ms").
    The sampler only times the running step for metrics; a period of
    ``STATE_SAMPLING_PERIOD_MS`` samples finer at 50 wake-ups per second.
    Beam takes the period as a constructor default, so that default is what
    changes. Needed where bundles run: in-process runs and worker processes.
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "short state-sampler sleeps (the default of StateSampler.__init__'s sampling_period_ms)"

    def _init(self) -> Any:
        from apache_beam.runners.worker import statesampler

        return statesampler.StateSampler.__init__, statesampler

    def _fits(self) -> None:
        init, statesampler = self._init()
        params = list(inspect.signature(init).parameters)
        default = getattr(statesampler, "DEFAULT_SAMPLING_PERIOD_MS", None)
        if params[-1:] != ["sampling_period_ms"] or getattr(init, "__defaults__", None) != (default,):
            raise PatchError(f"{self.what}: StateSampler.__init__ no longer ends with sampling_period_ms="
                             f"DEFAULT_SAMPLING_PERIOD_MS (found {params}, defaults {getattr(init, '__defaults__', None)})")

    def _apply(self) -> Any:
        init, _ = self._init()
        old = init.__defaults__
        init.__defaults__ = (STATE_SAMPLING_PERIOD_MS,)
        return old

    def _undo(self, saved: Any) -> None:
        init, _ = self._init()
        if init.__defaults__ == (STATE_SAMPLING_PERIOD_MS,):
            init.__defaults__ = saved


class QuietBundleTracebacks(Patch):
    """Beam's harness does not print each failed bundle's traceback to stderr.

    ``SdkHarness._execute`` prints it (``print(..., file=sys.stderr)``) before
    it logs it and sends it to the runner as the instruction's error. A local
    worker shares its stderr with ``recordprep convert``, so a run that
    rejects records showed a worker's traceback above the CLI's one-line
    error. Nothing is lost: the runner gets the same text, the CLI prints it
    with ``--verbose``. A module-level ``print`` in ``sdk_worker`` shadows the
    builtin; its only ``print`` is that one. Worker processes only.
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "quiet failed-bundle tracebacks (apache_beam.runners.worker.sdk_worker.print)"

    def _fits(self) -> None:
        from apache_beam.runners.worker import sdk_worker

        if "print" in vars(sdk_worker):
            raise PatchError(f"{self.what}: sdk_worker already defines print")
        if not hasattr(sdk_worker, "SdkHarness"):
            raise PatchError(f"{self.what}: sdk_worker.SdkHarness is gone")

    def _apply(self) -> Any:
        import sys

        from apache_beam.runners.worker import sdk_worker

        def _print(*args: Any, file: Any = None, **kw: Any) -> None:
            if file is not sys.stderr:
                print(*args, file=file, **kw)

        return _print, _replace_attr(sdk_worker, "print", _print)

    def _undo(self, saved: Any) -> None:
        from apache_beam.runners.worker import sdk_worker

        _restore_attr(sdk_worker, "print", *saved)


def _stamp(func: Any) -> tuple[Any, ...]:
    """What ``inspect.signature`` reads of a Python function: code, defaults, keyword defaults, attributes."""
    return (func.__code__, func.__defaults__, func.__kwdefaults__, *vars(func).items())


def _same_stamp(old: tuple[Any, ...], func: Any) -> bool:
    """``func`` still has the very objects ``old`` (its :func:`_stamp`) recorded."""
    attrs = vars(func)
    if len(old) != 3 + len(attrs) or old[0] is not func.__code__ or old[1] is not func.__defaults__ \
            or old[2] is not func.__kwdefaults__:
        return False
    return all(attrs.get(k, _MISSING) is v for k, v in old[3:])


class ArgspecCache(Patch):
    """Beam inspects each Python function's signature once, not once per DoFn.

    ``userstate.get_dofn_specs`` builds a ``MethodWrapper`` for every bound
    method of a DoFn (most of them ``DoFn``'s own), each calling
    ``core.get_function_args_defaults``, i.e. ``inspect.signature``. Beam does
    it for every DoFn at ``ParDo`` construction, again in ``to_runner_api``
    and in every bundle descriptor a worker builds: the signatures of the
    same few dozen functions over and over, a sizeable share of the
    launcher's CPU building and submitting the pipeline (the counts and the
    cost: docs/benchmarks.md#design-converter).

    The answer for a plain function or a method bound to any instance depends
    only on the function: its code, defaults, keyword defaults and its
    attributes (``__signature__`` and the like, which ``inspect.signature``
    reads). The cache keeps one answer per function and checks all of those
    by identity on every hit; when any differs, it asks Beam again. Anything
    else (wrappers with ``__wrapped__``, partials, callable objects, builtins)
    goes to Beam's function uncached. Callers get fresh lists. Applied where
    Beam builds DoFns: every run's launcher and our worker processes.
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "cached DoFn argument inspection (apache_beam.transforms.core.get_function_args_defaults)"

    def _fits(self) -> None:
        from apache_beam.transforms import core

        f = vars(core).get("get_function_args_defaults")
        if not inspect.isfunction(f) or list(inspect.signature(f).parameters) != ["f"]:
            raise PatchError(f"{self.what}: core.get_function_args_defaults(f) is gone or changed")
        if "get_function_args_defaults" not in core.get_function_arguments.__code__.co_names:
            raise PatchError(f"{self.what}: core.get_function_arguments no longer calls it")

    def _apply(self) -> Any:
        import types

        from apache_beam.transforms import core

        original = core.get_function_args_defaults
        cache: dict[tuple[Any, bool], tuple[tuple[Any, ...], list[Any], list[Any]]] = {}

        @functools.wraps(original)
        def get_function_args_defaults(f: Any) -> tuple[list[Any], list[Any]]:
            bound = type(f) is types.MethodType
            func = f.__func__ if bound else f
            if type(func) is not types.FunctionType or hasattr(func, "__wrapped__"):
                return original(f)
            hit = cache.get((func, bound))
            if hit is None or not _same_stamp(hit[0], func):
                args, defaults = original(f)
                hit = cache[(func, bound)] = (_stamp(func), list(args), list(defaults))
            return list(hit[1]), list(hit[2])

        return get_function_args_defaults, _replace_attr(core, "get_function_args_defaults", get_function_args_defaults)

    def _undo(self, saved: Any) -> None:
        from apache_beam.transforms import core

        _restore_attr(core, "get_function_args_defaults", *saved)


def _empty_part(inputs: Any, fired_timers: Any) -> bool:
    """A worker's share of a parallel bundle with nothing in it: no timers, every input a list of empty chunks.

    ``ParallelBundleManager`` hands each worker its partition as lists of
    encoded chunks; a whole (unpartitioned) bundle comes as Beam's buffer
    objects and is never taken for empty here.
    """
    if fired_timers:
        return False
    return all(type(v) is list and not any(len(chunk) for chunk in v) for v in inputs.values())


class EmptyBundlesSkipped(Patch):
    """A worker with no share of a stage's input is not sent an empty bundle.

    With several workers the ``FnApiRunner`` splits every stage's input over
    all of them (``ParallelBundleManager``), one bundle each, even when there
    is less input than workers: a one-element stage (the impulses, the merged
    analysis, the commit) gives every other worker an empty bundle, which it
    still has to set up (fetch the stage's descriptor, unpickle and set up
    its DoFns) and answer. An empty bundle produces nothing (no DoFn here
    emits without input, and Beam's model lets a runner skip it), so that
    worker's part gets Beam's empty answer at once. Needed where Beam runs
    worker processes (local multi-process runs).
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "no empty bundles to idle workers (fn_api_runner.fn_runner.BundleManager.process_bundle)"
    _PARAMS = ["self", "inputs", "expected_outputs", "fired_timers", "expected_output_timers", "dry_run"]

    def _fits(self) -> None:
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        manager = getattr(fn_runner, "BundleManager", None)
        parallel = getattr(fn_runner, "ParallelBundleManager", None)
        if not isinstance(manager, type) or not isinstance(parallel, type) or not issubclass(parallel, manager):
            raise PatchError(f"{self.what}: fn_runner.BundleManager/ParallelBundleManager are gone")
        params = list(inspect.signature(manager.process_bundle).parameters)
        if params != self._PARAMS:
            raise PatchError(f"{self.what}: BundleManager.process_bundle is now ({', '.join(params)}), "
                             f"written for ({', '.join(self._PARAMS)})")
        if "partition" not in parallel.process_bundle.__code__.co_names:
            raise PatchError(f"{self.what}: ParallelBundleManager.process_bundle no longer partitions its inputs")

    def _apply(self) -> Any:
        from apache_beam.portability.api import beam_fn_api_pb2
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        original = fn_runner.BundleManager.process_bundle

        @functools.wraps(original)
        def process_bundle(self: Any, inputs: Any, expected_outputs: Any, fired_timers: Any,
                           expected_output_timers: Any, dry_run: bool = False) -> Any:
            if _empty_part(inputs, fired_timers):
                return beam_fn_api_pb2.InstructionResponse(process_bundle=beam_fn_api_pb2.ProcessBundleResponse()), []
            return original(self, inputs, expected_outputs, fired_timers, expected_output_timers, dry_run)

        return process_bundle, _replace_attr(fn_runner.BundleManager, "process_bundle", process_bundle)

    def _undo(self, saved: Any) -> None:
        from apache_beam.runners.portability.fn_api_runner import fn_runner

        _restore_attr(fn_runner.BundleManager, "process_bundle", *saved)


#: ``popen(command, env)``: a process-like object serving Beam's worker start, or None to let Beam start it.
WorkerStart = Callable[[str, dict], Any]


class WorkerStarts(Patch):
    """Beam's local worker starts can be served by a hook (the pre-forked pool of ``pipelines.local.warm``).

    ``local_job_service.SubprocessSdkWorker.run`` starts each worker with
    ``subprocess.Popen(command, shell=True, env=...)`` through the module's
    ``subprocess`` name; while a hook is registered (:meth:`serving`), that
    name is a stand-in whose ``Popen`` asks the hooks first and otherwise
    starts the process as Beam would.
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "pre-forked worker starts (apache_beam.runners.portability.local_job_service.subprocess)"

    def __init__(self) -> None:
        super().__init__()
        self._hooks: list[WorkerStart] = []

    def _fits(self) -> None:
        import subprocess

        from apache_beam.runners.portability import local_job_service

        if vars(local_job_service).get("subprocess") is not subprocess:
            raise PatchError(f"{self.what}: local_job_service no longer uses the subprocess module by that name")
        run = getattr(getattr(local_job_service, "SubprocessSdkWorker", None), "run", None)
        try:
            source = inspect.getsource(run) if run is not None else ""
        except (OSError, TypeError):  # installed without sources: the name check above is all there is
            source = "subprocess.Popen("
        if "subprocess.Popen(" not in source:
            raise PatchError(f"{self.what}: SubprocessSdkWorker.run no longer starts workers with subprocess.Popen")

    def _apply(self) -> Any:
        from apache_beam.runners.portability import local_job_service

        real = local_job_service.subprocess
        hooks = self._hooks

        class _Subprocess:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            @staticmethod
            def Popen(args: Any, *a: Any, **kw: Any) -> Any:  # noqa: N802 - subprocess's name
                if isinstance(args, str) and kw.get("shell") and not a:
                    import os

                    for hook in list(hooks):
                        proc = hook(args, kw.get("env") or dict(os.environ))
                        if proc is not None:
                            return proc
                return real.Popen(args, *a, **kw)

        stand_in = _Subprocess()
        return stand_in, _replace_attr(local_job_service, "subprocess", stand_in)

    def _undo(self, saved: Any) -> None:
        from apache_beam.runners.portability import local_job_service

        _restore_attr(local_job_service, "subprocess", *saved)

    @contextlib.contextmanager
    def serving(self, hook: WorkerStart) -> Iterator[bool]:
        """While open, Beam's local worker starts go to ``hook`` first; yields whether they can."""
        with self.applied() as active:
            self._hooks.append(hook)
            try:
                yield active
            finally:
                self._hooks.remove(hook)


class AzureExists(Patch):
    """Beam's Azure file system answers ``exists`` with False for a missing blob.

    ``BlobStorageIO._blob_properties`` turns Azure's ``ResourceNotFoundError``
    into Beam's own ``BlobStorageError(code=404)``, and ``BlobStorageIO.exists``
    catches only the former, so every ``FileSystems.exists`` of a missing
    ``azfs://`` path raised ``BeamIOError`` instead of returning False: an
    input glob, an output not written yet, a lock not taken could not be
    planned. The replacement treats that 404 as "does not exist" and raises
    everything else as before. Applied for the process by
    :func:`pipelines.remote.pipeline_options` and :func:`pipelines.remote.use_paths`
    once a path is on ``azfs://`` (the launcher and ``verify``/``wait``/``inspect``
    call ``exists`` outside a run too; workers only read and write).
    """

    dist, lowest, below = "apache-beam", (2, 77), (3,)
    what = "missing azfs:// blobs do not exist (apache_beam.io.azure.blobstorageio.BlobStorageIO.exists)"

    def _fits(self) -> None:
        from apache_beam.io.azure import blobstorageio

        cls = getattr(blobstorageio, "BlobStorageIO", None)
        if cls is None or not callable(getattr(cls, "_blob_properties", None)):
            raise PatchError(f"{self.what}: BlobStorageIO._blob_properties is gone")
        if list(inspect.signature(cls.exists).parameters) != ["self", "path"]:
            raise PatchError(f"{self.what}: BlobStorageIO.exists no longer takes (self, path)")
        if not hasattr(blobstorageio, "BlobStorageError"):
            raise PatchError(f"{self.what}: blobstorageio.BlobStorageError is gone")

    def _apply(self) -> Any:
        from apache_beam.io.azure import blobstorageio

        original = blobstorageio.BlobStorageIO.exists

        @functools.wraps(original)
        def exists(self: Any, path: str) -> bool:
            try:
                return original(self, path)
            except blobstorageio.BlobStorageError as e:
                if e.code == 404:
                    return False
                raise

        cls = blobstorageio.BlobStorageIO
        return cls, exists, _replace_attr(cls, "exists", exists)

    def _undo(self, saved: Any) -> None:
        cls, *attr = saved  # no import here: a process applying it for good undoes it at shutdown
        _restore_attr(cls, "exists", *attr)


LOOPBACK_BINDS = LoopbackBinds()
SHORT_SAMPLER_SLEEPS = ShortSamplerSleeps()
QUIET_BUNDLE_TRACEBACKS = QuietBundleTracebacks()
WORKER_STARTS = WorkerStarts()
ARGSPEC_CACHE = ArgspecCache()
EMPTY_BUNDLES_SKIPPED = EmptyBundlesSkipped()
AZURE_EXISTS = AzureExists()
#: Every patch, for the checks in the tests.
ALL = (LOOPBACK_BINDS, SHORT_SAMPLER_SLEEPS, QUIET_BUNDLE_TRACEBACKS, WORKER_STARTS, ARGSPEC_CACHE,
       EMPTY_BUNDLES_SKIPPED, AZURE_EXISTS)

_FOREVER = contextlib.ExitStack()


def apply_for_process(*patches: Patch) -> list[bool]:
    """Apply ``patches`` for the rest of this process (our own worker and launcher
    processes only, never a caller's); returns whether each is applied."""
    return [_FOREVER.enter_context(p.applied()) for p in patches]


@contextlib.contextmanager
def log_records_dropped(logger: str, prefix: str) -> Iterator[None]:
    """While open, records of ``logger`` whose message starts with ``prefix`` are dropped."""

    class _Drop(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith(prefix)

    drop = _Drop()
    target = logging.getLogger(logger)
    target.addFilter(drop)
    try:
        yield
    finally:
        target.removeFilter(drop)
