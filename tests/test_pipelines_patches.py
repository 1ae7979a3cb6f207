"""The changes a run makes to gRPC and Beam (pipelines/local/patches.py): each fits the
installed library, is on only while a run needs it, and is undone when the run
ends, failed or not, so the calling process finds both as it left them."""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import logging
import subprocess
import sys
import warnings

import pytest
from _pipelines_data import by_shard, make_records, write_dataset

from pipelines.job import run_convert
from pipelines.local import patches as _patches
from pipelines.local.runner import _MODE_WARNING
from pipelines.options import ConvertOptions
from pipelines.run_files import ConversionFailed


def _state() -> dict:
    """What the patches change, as this process has it now."""
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.worker import sdk_worker, statesampler
    from apache_beam.transforms import core
    from grpc import _server

    return {
        "get_function_args_defaults": core.get_function_args_defaults,
        "BundleManager.process_bundle": vars(fn_runner.BundleManager).get("process_bundle"),
        "add_insecure_port": vars(_server._Server).get("add_insecure_port"),
        "sampler_defaults": statesampler.StateSampler.__init__.__defaults__,
        "sdk_worker.print": vars(sdk_worker).get("print"),
        "local_job_service.subprocess": local_job_service.subprocess,
        "fn_runner filters": list(logging.getLogger(_MODE_WARNING[0]).filters),
    }


def _listens_on(port: int) -> set[str]:
    import psutil

    return {c.laddr.ip for c in psutil.Process().net_connections("inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _wildcard_bind_addresses() -> set[str]:
    """Where a gRPC server asked for ``[::]:0`` listens."""
    import grpc

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    port = server.add_insecure_port("[::]:0")
    server.start()
    try:
        return _listens_on(port)
    finally:
        server.stop(None)


def _is_loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    return (getattr(a, "ipv4_mapped", None) or a).is_loopback


class _Spy:
    """Counts how often a patch was applied, and applies it."""

    def __init__(self, patch: _patches.Patch):
        self.calls, self._apply = 0, patch._apply

    def __call__(self):
        self.calls += 1
        return self._apply()


def _spy(monkeypatch, patch: _patches.Patch) -> _Spy:
    spy = _Spy(patch)
    monkeypatch.setattr(patch, "_apply", spy)
    return spy


def test_each_patch_fits_the_installed_library():
    """A gRPC or Beam upgrade that moves what a patch replaces fails here (and
    every run would warn with PatchWarning, an error in the test suite)."""
    for patch in _patches.ALL:
        patch.check()
        assert not patch.active


def test_a_patch_outside_its_version_range_is_skipped_with_a_warning(monkeypatch):
    before = _state()
    monkeypatch.setattr(_patches, "_version", lambda dist: (99, 0))
    with pytest.raises(_patches.PatchError, match=r"written for grpcio >=1\.50,<2, found 99\.0"):
        _patches.LOOPBACK_BINDS.check()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _patches.LOOPBACK_BINDS.applied() as active:
            assert not active and _state() == before
    assert [w.category for w in caught] == [_patches.PatchWarning]
    assert "runs without this patch" in str(caught[0].message)


def test_a_patch_whose_target_changed_is_refused(monkeypatch):
    from apache_beam.runners.worker import sdk_worker, statesampler

    monkeypatch.setattr(sdk_worker, "print", print, raising=False)
    with pytest.raises(_patches.PatchError, match="already defines print"):
        _patches.QUIET_BUNDLE_TRACEBACKS.check()
    monkeypatch.setattr(statesampler.StateSampler.__init__, "__defaults__", (500,))
    with pytest.raises(_patches.PatchError, match="sampling_period_ms"):
        _patches.SHORT_SAMPLER_SLEEPS.check()


def test_nested_entries_apply_once_and_the_last_exit_undoes():
    from apache_beam.runners.worker import statesampler

    before = _state()
    with _patches.SHORT_SAMPLER_SLEEPS.applied() as outer:
        assert outer and statesampler.StateSampler.__init__.__defaults__ == (_patches.STATE_SAMPLING_PERIOD_MS,)
        with _patches.SHORT_SAMPLER_SLEEPS.applied() as inner:
            assert inner
        assert _patches.SHORT_SAMPLER_SLEEPS.active  # the outer run still needs it
    assert _state() == before and not _patches.SHORT_SAMPLER_SLEEPS.active


def test_worker_starts_go_to_the_hook_only_while_it_serves():
    import subprocess as real

    from apache_beam.runners.portability import local_job_service

    served = []

    def hook(command, env):
        served.append(command)
        return "a process" if command == "mine" else None

    with _patches.WORKER_STARTS.serving(hook) as active:
        assert active
        assert local_job_service.subprocess.Popen("mine", shell=True, env={}) == "a process"
        p = local_job_service.subprocess.Popen("exit 3", shell=True, env={})  # not the hook's: started as usual
        assert p.wait() == 3
        assert local_job_service.subprocess.PIPE == real.PIPE
    assert served == ["mine", "exit 3"]
    assert local_job_service.subprocess is real


def _opts(paths, out, **kw) -> ConvertOptions:
    return ConvertOptions(inputs=(str(paths.get("input", paths["avro"])),), config=str(paths["config"]),
                          output=str(out), num_shards=2, **kw)


@pytest.mark.slow
def test_a_grpc_server_started_after_a_multi_process_run_listens_where_it_asked(tmp_path, monkeypatch):
    """The run bound Beam's servers to loopback; a server this process starts after it binds ``[::]``."""
    wide = [a for a in _wildcard_bind_addresses() if not _is_loopback(a)]
    if not wide:
        pytest.skip("this machine binds [::] on loopback only")
    before = _state()
    loopback = _spy(monkeypatch, _patches.LOOPBACK_BINDS)
    paths = write_dataset(tmp_path / "d", make_records(300))
    result = run_convert(_opts(paths, tmp_path / "out", workers=2))
    assert result.workers == 2 and result.pre_forked == 0  # the API does not fork unless asked (pre_fork)
    assert loopback.calls == 1  # the run needed it...
    assert _state() == before  # ...and left nothing behind
    addrs = _wildcard_bind_addresses()
    assert [a for a in addrs if not _is_loopback(a)], f"a server asked for [::] listens only on {addrs}"


def test_an_in_process_run_leaves_grpc_alone_and_undoes_the_rest(tmp_path, monkeypatch):
    before = _state()
    loopback = _spy(monkeypatch, _patches.LOOPBACK_BINDS)
    sampler = _spy(monkeypatch, _patches.SHORT_SAMPLER_SLEEPS)
    paths = write_dataset(tmp_path / "d", make_records(200))
    result = run_convert(_opts(paths, tmp_path / "out", workers=1))
    assert (result.workers, result.pre_forked) == (1, 0)
    assert loopback.calls == 0 and sampler.calls == 1
    assert _state() == before


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_run_undoes_its_patches(tmp_path, monkeypatch, workers):
    before = _state()
    sampler = _spy(monkeypatch, _patches.SHORT_SAMPLER_SLEEPS)
    loopback = _spy(monkeypatch, _patches.LOOPBACK_BINDS)
    paths = write_dataset(tmp_path / "d", make_records(200))
    part = sorted((tmp_path / "d").glob("*.jsonl"))[0]
    part.write_text(part.read_text() + json.dumps(dict(make_records(1)[0], x="not a number")) + "\n")
    with pytest.raises(ConversionFailed, match="rejected"):
        run_convert(_opts({**paths, "input": paths["json"]}, tmp_path / "out", workers=workers))
    assert (loopback.calls, sampler.calls) == ((0, 1) if workers == 1 else (1, 0))
    assert _state() == before


_PRE_FORKED_RUN = """
import json, sys
from pipelines.job import run_convert
from pipelines.options import ConvertOptions
src, config, out, pre_fork = sys.argv[1:]
r = run_convert(ConvertOptions(inputs=(src,), config=config, output=out, num_shards=2, workers=2,
                               pre_fork=pre_fork == "1"))
from apache_beam.runners.portability import local_job_service
import subprocess
print(json.dumps({"workers": r.workers, "pre_forked": r.pre_forked, "runner": r.info["runner"],
                  "subprocess_restored": local_job_service.subprocess is subprocess}))
"""


@pytest.mark.slow
def test_pre_fork_is_opt_in_for_the_api_and_serves_every_worker(tmp_path):
    """In a fresh process (single-threaded, polars not loaded: forking is safe)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("workers are forked on Linux only")
    paths = write_dataset(tmp_path / "d", make_records(300))
    got = {}
    for mode in ("0", "1"):
        r = subprocess.run([sys.executable, "-c", _PRE_FORKED_RUN, str(paths["avro"]), str(paths["config"]),
                            str(tmp_path / f"out{mode}"), mode], capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        got[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["0"] == {"workers": 2, "pre_forked": 0, "runner": "FnApiRunner (local, 2 worker processes)",
                        "subprocess_restored": True}
    assert got["1"] == {"workers": 2, "pre_forked": 2, "runner": "FnApiRunner (local, 2 worker processes, pre-forked)",
                        "subprocess_restored": True}


_IMPORT_PROBE = r"""
import importlib, json, logging, os, pkgutil, signal, socket, sys, threading, warnings

ours = ("convert", "readers", "pipelines", "stores")
names = sorted(m.name for pkg in ours for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."))
# Third-party modules first (TensorFlow, Beam, polars, ...): what they do on import is theirs.
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception:
        pass


def loggers():
    out = {}
    for name, lg in [("", logging.getLogger()), *logging.Logger.manager.loggerDict.items()]:
        if isinstance(lg, logging.Logger):
            out[name] = [lg.level, [repr(h) for h in lg.handlers], [repr(f) for f in lg.filters], lg.propagate, lg.disabled]
    return out


def state():
    sigs = {}
    for s in signal.valid_signals():
        try:
            sigs[str(s)] = repr(signal.getsignal(s))
        except (ValueError, OSError):
            pass
    return {"environ": dict(os.environ), "sys.path": list(sys.path), "warnings": [repr(f) for f in warnings.filters],
            "signals": sigs, "loggers": loggers(), "logging.disable": logging.root.manager.disable,
            "excepthook": repr(sys.excepthook), "recursionlimit": sys.getrecursionlimit(),
            "socket timeout": socket.getdefaulttimeout(), "threads": threading.active_count(), "cwd": os.getcwd(),
            "umask": os.umask(os.umask(0o22))}


before = state()
for name in names:
    importlib.import_module(name)
after = state()
changed = {}
for key in before:
    if key == "loggers":  # loggers created on import are fine; settings changed or set on one are not
        default = [logging.NOTSET, [], [], True, False]
        diff = {n: v for n, v in after[key].items() if before[key].get(n, default) != v}
        if diff:
            changed[key] = diff
    elif before[key] != after[key]:
        changed[key] = {"before": before[key], "after": after[key]}
print(json.dumps({"imported": names, "changed": changed}, default=repr))
"""

_THIRD_PARTY_PROBE = r"""
import importlib, json, pkgutil, sys
ours = ("convert", "readers", "pipelines", "stores")
for pkg in ours:
    for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
        importlib.import_module(m.name)
print(json.dumps(sorted(n for n, m in sys.modules.items() if m is not None and n.split(".")[0] not in ours)))
"""


@pytest.mark.slow
def test_importing_every_module_changes_no_process_wide_setting():
    """Environment, sys.path, warnings filters, signal handlers and logging
    are as they were after importing every convert/readers/pipelines module."""
    third = subprocess.run([sys.executable, "-c", _THIRD_PARTY_PROBE], capture_output=True, text=True,
                           timeout=300, check=True)
    modules = json.loads(third.stdout.strip().splitlines()[-1])
    r = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *modules], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert {"pipelines.cli", "pipelines.local.patches", "readers.dataset", "convert.vectorize"} <= set(got["imported"])
    assert got["changed"] == {}


def test_the_cli_help_says_what_it_sets_up_in_its_process():
    from typer.testing import CliRunner

    from pipelines.cli import app

    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for part in ("logging", "SIGTERM and Ctrl-C handlers", "unused connectors", "RECORDPREP_WARM_WORKERS=0",
                 "TF_CPP_MIN_LOG_LEVEL=2 and TF_ENABLE_ONEDNN_OPTS=0", "unless the environment sets them"):
        assert part in text, part


class _Fn:
    def process(self, element, scale=2, *args, key=None):
        return element

    def other(self, a, b=3):
        return a


def test_the_argspec_cache_answers_as_beam_and_asks_again_when_a_function_changes():
    """Cached answers equal Beam's for every instance of a class; a changed
    function (defaults, code, an attribute inspect reads) is inspected again."""
    import functools
    import inspect

    from apache_beam.transforms import core

    original = core.get_function_args_defaults
    calls = []

    def counting(f):
        calls.append(f)
        return original(f)

    before = _state()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(core, "get_function_args_defaults", counting)
        with _patches.ARGSPEC_CACHE.applied() as active:
            assert active
            cached = core.get_function_args_defaults
            assert cached is not counting
            a, b = _Fn(), _Fn()
            want = original(a.process)
            assert want == (["element", "scale"], [2])
            assert cached(a.process) == want and cached(b.process) == want and len(calls) == 1
            got = cached(a.process)
            got[0].append("mutated")  # callers get their own lists
            assert cached(b.process) == want and len(calls) == 1
            assert cached(_Fn.process) == original(_Fn.process) == (["self", "element", "scale"], [2])
            assert len(calls) == 2  # the unbound function is its own entry

            _Fn.other.__defaults__ = (4,)
            assert cached(a.other) == (["a", "b"], [4])
            _Fn.other.__defaults__ = (5,)
            assert cached(a.other) == (["a", "b"], [5])  # changed defaults: asked again
            n = len(calls)
            _Fn.other.__signature__ = inspect.signature(lambda self, c, d=7: None)
            assert cached(a.other) == (["c", "d"], [7])  # an attribute inspect reads
            del _Fn.other.__signature__
            _Fn.other.__code__ = (lambda self, x: x).__code__
            _Fn.other.__defaults__ = None
            assert cached(a.other) == (["x"], [])  # new code
            assert len(calls) == n + 2

            part = functools.partial(lambda x, y=1: x, 3)
            assert cached(part) == original(part) and cached(part) == original(part)
            assert calls.count(part) == 2  # not a plain function: never cached
        assert core.get_function_args_defaults is counting  # undone
    assert _state() == before


def test_an_idle_workers_empty_share_of_a_bundle_is_answered_without_it(monkeypatch):
    """Only a worker's partition with no element and no timer is skipped; whole bundles never are."""
    from apache_beam.portability.api import beam_fn_api_pb2
    from apache_beam.runners.portability.fn_api_runner import execution, fn_runner

    sent = []

    def to_the_worker(self, inputs, expected_outputs, fired_timers, expected_output_timers, dry_run=False):
        sent.append(inputs)
        return "the worker's answer", ["split"]

    monkeypatch.setattr(fn_runner.BundleManager, "process_bundle", to_the_worker)
    before = _state()
    manager = object.__new__(fn_runner.BundleManager)
    empty = beam_fn_api_pb2.InstructionResponse(process_bundle=beam_fn_api_pb2.ProcessBundleResponse())
    with _patches.EMPTY_BUNDLES_SKIPPED.applied() as active:
        assert active
        for nothing in ({"in": []}, {"in": [b""]}, {"a": [b"", b""], "b": []}):
            assert manager.process_bundle(nothing, {}, {}, {}) == (empty, [])
        assert sent == []
        for something in ({"in": [b"\x01x"]}, {"a": [b""], "b": [b"", b"\x01y"]},
                          {"whole": execution.ListBuffer(None)}):  # Beam's buffer: an unpartitioned bundle
            assert manager.process_bundle(something, {}, {}, {}) == ("the worker's answer", ["split"])
        assert manager.process_bundle({"in": []}, {}, {"timer": [b"t"]}, {}) == ("the worker's answer", ["split"])
        assert len(sent) == 4
    assert _state() == before


@pytest.mark.slow
def test_a_multi_process_run_skips_empty_shares_and_writes_the_same_bytes(tmp_path, monkeypatch):
    """One work unit for two workers: every stage leaves one worker without input."""
    skipped = []
    real = _patches._empty_part

    def spy(inputs, fired_timers):
        empty = real(inputs, fired_timers)
        skipped.append(empty)
        return empty

    monkeypatch.setattr(_patches, "_empty_part", spy)
    paths = write_dataset(tmp_path / "d", make_records(300))
    opts = {w: ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]), output=str(tmp_path / f"w{w}"),
                              num_shards=1, workers=w) for w in (1, 2)}
    one = run_convert(opts[1])
    assert skipped == []  # in-process: nothing to skip
    two = run_convert(opts[2])
    assert two.workers == 2 and skipped.count(True) >= 4 and skipped.count(False) >= 4, skipped
    assert one.info["counts"] == two.info["counts"]
    for split in one.info["splits"].values():
        for shard in split["shards"]:
            assert (by_shard(tmp_path / "w1", shard["file"]).read_bytes()
                    == by_shard(tmp_path / "w2", shard["file"]).read_bytes())  # names differ by their run id
