"""The runner of one conversion, and what a local one sets up in this process while the run lasts.

The default runner is Beam's in-process ``FnApiRunner``, chosen explicitly:
``DirectRunner`` first tries to download the Prism runner binary, which hangs
or fails on an offline or firewalled machine. Any other runner comes from the
Beam flags passed through (``-- --runner DataflowRunner ...``), one of
``pipelines.options.SUPPORTED_RUNNERS`` (the options refuse the others: the
job needs outputs from ``finish_bundle`` and side inputs that wait for their
whole input, which not every runner gives). A local
``FnApiRunner`` runs its bundles in this process (one worker) or in worker
processes (``python -m pipelines.local.worker``), pre-forked from this one
when asked and safe (:mod:`pipelines.local.warm`).

:func:`runner_for` is the one entry the job calls: it chooses the runner,
applies the patches the run needs (:mod:`pipelines.local.patches`), freezes
the launcher's heap and forks the workers while it is open, and undoes all of
it when it closes, whether the run returned or raised. Beam is imported only
when it opens, and the job's modules when they are used:
``python -m pipelines.local.worker`` imports this package before it sets
its process up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pipelines.local import patches
from pipelines.local.progress import PROGRESS_DIR, ProgressReporter, run_passes
from pipelines.local.warm import WarmPool, frozen_heap
from pipelines.local.worker import command as worker_command
from pipelines.local.worker import schemes_of

if TYPE_CHECKING:  # pragma: no cover
    from pipelines.options import ConvertOptions

#: Below this much input, starting worker processes (each loads Beam) costs
#: more than a second core gains (docs/benchmarks.md#design-converter).
MULTIPROCESS_MIN_BYTES = 32 * 1024 * 1024

#: Beam warns that ``direct_num_workers`` > 1 wants a multi-process running
#: mode; ours is multi-process through its own worker environment. Dropped
#: while such a run goes (``patches.log_records_dropped``).
_MODE_WARNING = ("apache_beam.runners.portability.fn_api_runner.fn_runner", "If direct_num_workers is not equal to 1")


@dataclasses.dataclass(frozen=True)
class Work:
    """What the runner needs to know of the job it runs.

    ``total_bytes``: the input's size; ``num_units``: its work units;
    ``paths``: every path the workers open (inputs, output, a reused
    analysis), whose file systems they load; ``tmp_dir``: the output's temp
    directory, where a local run's units report their progress, or None for
    no progress lines.
    """

    total_bytes: int
    num_units: int
    paths: tuple[str, ...]
    tmp_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class _Choice:
    """The runner of a run and what its set-up needs to know.

    ``runner``: an FnApiRunner, or None for the runner the Beam flags name;
    ``local``: a local runner; ``in_process``: bundles run in this process
    (no worker processes, no gRPC servers); ``workers``: worker processes of
    our FnApiRunner (1: none); ``command``: their start command.
    """

    runner: Any
    args: list[str]
    runner_name: str | None
    local: bool
    in_process: bool
    workers: int
    command: str | None

    def label(self, warm: WarmPool | None) -> str:
        """The runner as the metadata names it."""
        if self.runner_name is not None:
            return self.runner_name
        if self.in_process:
            return "FnApiRunner (local, in-process)"
        return f"FnApiRunner (local, {self.workers} worker processes{', pre-forked' if warm else ''})"


@dataclasses.dataclass(frozen=True)
class Runner:
    """The runner a run builds its pipeline for (:func:`runner_for`).

    ``beam_runner``: the runner to hand ``beam.Pipeline`` (None: the one the
    Beam flags name); ``args``: the pipeline's Beam flags; ``label``: the
    runner as the metadata names it; ``in_process``: bundles run in this
    process; ``workers``: worker processes of a local run (1: in-process, or
    a remote runner).
    """

    beam_runner: Any
    args: list[str]
    label: str
    in_process: bool
    workers: int
    warm: WarmPool | None
    progress: ProgressReporter | None

    @property
    def pre_forked(self) -> int:
        """How many of the workers were forked from this process."""
        return self.warm.handed if self.warm is not None else 0

    def run(self, pipeline: Any) -> None:
        """Run ``pipeline`` to its end, printing progress lines and serving worker starts from the pool."""
        with (self.progress or contextlib.nullcontext()), \
                (self.warm.serving_beam() if self.warm else contextlib.nullcontext()):
            pipeline.run().wait_until_finish()


@contextlib.contextmanager
def runner_for(opts: ConvertOptions, beam_args: Sequence[str], runner_name: str | None, work: Work) -> Iterator[Runner]:
    """The runner of a run of ``opts``, set up while open; every change it made to this process undone on close.

    ``beam_args``: the run's Beam flags (derived and staging ones included);
    ``runner_name``: the runner they name, None for ours. When it opens, the
    pre-forked workers (``opts.pre_fork``) are forked: a caller starts its own
    threads only after that.
    """
    choice = _choose(opts, list(beam_args), runner_name, work)
    pre_fork = opts.pre_fork and choice.command is not None
    with contextlib.ExitStack() as scope:
        for patch in _run_patches(choice, pre_fork):
            scope.enter_context(patch)
        scope.enter_context(frozen_heap())
        # Before any thread starts: the workers fork from this process (pipelines/local/warm.py).
        warm = WarmPool.start(choice.workers, choice.command) if pre_fork and choice.command else None
        if warm is not None:
            scope.callback(warm.close)  # dismissed whatever happens from here
        progress = None
        if choice.local and work.tmp_dir is not None:
            progress = ProgressReporter(os.path.join(work.tmp_dir, PROGRESS_DIR), work.total_bytes,
                                        run_passes(bool(opts.analysis_from), opts.shuffle_seed is not None))
        yield Runner(choice.runner, choice.args, choice.label(warm), choice.in_process, choice.workers, warm, progress)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def beam_sets_workers(beam_args: Sequence[str]) -> bool:
    """The Beam flags choose the local runner's workers themselves."""
    from pipelines.options import beam_flag

    return any(beam_flag(beam_args, f) is not None for f in ("--direct_num_workers", "--direct_running_mode"))


def local_workers(opts: ConvertOptions, total_bytes: int, num_units: int, beam_args: Sequence[str] = ()) -> int:
    """Worker processes for a local run: ``opts.workers`` if given; else one
    per core (at most one per work unit) when the input repays their start-up.
    Beam flags ``--direct_num_workers``/``--direct_running_mode`` win."""
    if beam_sets_workers(beam_args):
        return 1  # the user's Beam flags decide; leave them untouched
    if opts.workers is not None:
        return opts.workers
    if total_bytes < MULTIPROCESS_MIN_BYTES:
        return 1
    return max(1, min(_cores(), num_units))


def _multiprocess_runner(fn_api_runner: Any, command: str) -> Any:
    """An FnApiRunner whose workers are ``python -m pipelines.local.worker`` processes.

    The same as ``--direct_running_mode multi_processing`` (which hard-codes
    Beam's own worker command) with our worker entry point: less memory per
    worker, loopback-only gRPC (see :mod:`pipelines.local.worker`); ``command``
    (``worker_command``) names the file systems of every path the workers
    open, so they load only those. A :class:`~pipelines.local.warm.WarmPool` may
    serve these starts with forked children instead.
    """
    from apache_beam.transforms.environments import SubprocessSDKEnvironment

    return fn_api_runner(default_environment=SubprocessSDKEnvironment.from_command_string(command))


def _choose(opts: ConvertOptions, args: list[str], runner_name: str | None, work: Work) -> _Choice:
    """The runner and its Beam flags; changes nothing in this process."""
    from pipelines.staging import LOCAL_RUNNERS

    local = runner_name is None or runner_name.split(".")[-1] in LOCAL_RUNNERS
    if runner_name is not None:
        return _Choice(None, args, runner_name, local, False, 1, None)
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    workers = local_workers(opts, work.total_bytes, work.num_units, beam_args=opts.beam_args)
    runner: Any = FnApiRunner()
    command = None
    if workers > 1:
        command = worker_command(schemes_of(work.paths))
        runner = _multiprocess_runner(FnApiRunner, command)
        args = [*args, "--direct_num_workers", str(workers)]
    in_process = workers == 1 and not beam_sets_workers(opts.beam_args)
    return _Choice(runner, args, None, local, in_process, workers, command)


def _run_patches(choice: _Choice, pre_fork: bool) -> list[contextlib.AbstractContextManager[Any]]:
    """The patches (:mod:`pipelines.local.patches`) this run needs, entered for its duration only.

    Worker processes started by Beam apply their own; pre-forked ones
    inherit the launcher's, so those are on before the pool forks.
    """
    needed: list[contextlib.AbstractContextManager[Any]] = [patches.ARGSPEC_CACHE.applied()]  # the launcher builds DoFns
    if not choice.local:
        return needed
    if not choice.in_process:  # Beam's gRPC servers for its worker processes live in this process
        needed.append(patches.LOOPBACK_BINDS.applied())
        needed.append(patches.EMPTY_BUNDLES_SKIPPED.applied())
    if choice.in_process or choice.runner_name is not None or pre_fork:  # bundles run here, or in forks of it
        needed.append(patches.SHORT_SAMPLER_SLEEPS.applied())
    if choice.command is not None:
        needed.append(patches.log_records_dropped(*_MODE_WARNING))
    return needed
