"""Finding and reading ``dataset_info.json``; Keras inputs from it; waiting for it.

A recordprep output directory is complete exactly when its
``dataset_info.json`` exists: the converter writes it last and atomically.
Everything here takes either the output directory or a shard pattern inside
it (``out/train-*``, ``gs://b/out/train-*.tfrecord.gz``); the metadata is
always looked up in the pattern's directory, and the shard list comes from
the metadata, never from a glob (an object-store listing can be incomplete or
include files of an unfinished re-run).

Nothing in this module needs TensorFlow for local paths, except
:func:`keras_inputs`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from convert import lockfile as _lockfile
from convert import spec as _spec
from convert.spec import (
    METADATA_FILENAME,
    DatasetInfo,
    FeatureSpec,
    MetadataNotJSONError,
    ShardInfo,
    SpecError,
)
from readers import _io
from readers.errors import (
    DatasetDeadError,
    DatasetFailedError,
    DatasetIncompleteError,
    ShardSelectionError,
)

logger = logging.getLogger("readers")

_GLOB_CHARS = frozenset("*?[")

#: Written by a conversion that failed instead of the metadata (``convert.spec``).
FAILURE_FILENAME: str = _spec.FAILURE_FILENAME

# dtype names in the spec -> names tf/keras accept.
TF_DTYPE_NAMES = {"float32": "float32", "int64": "int64", "string": "string"}

#: Shortest pause between two checks while waiting: a smaller ``poll`` would
#: spin on the file system (each check is a stat or a read, maybe remote).
MIN_POLL_SECONDS = 0.01


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a user-supplied path points: the output directory and an optional file glob."""

    root: str
    glob: str | None

    @property
    def metadata_path(self) -> str:
        return _io.join(self.root, METADATA_FILENAME)

    @property
    def failure_path(self) -> str:
        return _io.join(self.root, FAILURE_FILENAME)

    @property
    def lock_path(self) -> str:
        return _io.join(self.root, _lockfile.LOCK_FILENAME)


def locate(path_or_pattern: str) -> Location:
    """Split ``out/train-*`` into root ``out`` and glob ``train-*``.

    A last component with a wildcard or ``.tfrecord`` in it is a shard
    pattern, ``dataset_info.json`` is the metadata itself, anything else is
    the output directory. Only local paths are stat'ed (so that directories
    whose names contain ``[`` or ``*`` work); remote paths need no I/O here.
    """
    if isinstance(path_or_pattern, os.PathLike):
        path_or_pattern = os.fspath(path_or_pattern)
    if not isinstance(path_or_pattern, str) or not path_or_pattern:
        raise TypeError(f"expected a path or shard pattern string, found {path_or_pattern!r}")
    path = path_or_pattern
    if path.endswith("/") and not path.endswith("://"):
        path = path.rstrip("/")
    head, tail = _io.split(path)
    if not _io.path_scheme(path) and os.path.isdir(path):
        return Location(path, None)  # an existing local directory, whatever its name
    literal_head = not _io.path_scheme(head) and os.path.isdir(head)
    if not literal_head and any(c in _GLOB_CHARS for c in head.partition("://")[2] or head):
        raise ShardSelectionError(
            f"{path_or_pattern!r}: wildcards are only supported in the file-name part "
            f"(e.g. out/train-*), because the metadata is looked up in that one directory"
        )
    if tail == METADATA_FILENAME:
        return Location(head, None)
    if any(c in _GLOB_CHARS for c in tail) or ".tfrecord" in tail:
        return Location(head, tail)
    return Location(path, None)


def incomplete_message(root: str, metadata_path: str) -> str:
    where = (
        f"{root} does not exist (or is not reachable)"
        if not _safe_isdir(root)
        else f"there is no {METADATA_FILENAME} in {root}"
    )
    return (
        f"{where}. A recordprep output is complete only once {METADATA_FILENAME} is written "
        f"(last, atomically), so the conversion has not finished, or it failed. "
        f"Wait for it with readers.wait_for_dataset({root!r}, timeout=...) or "
        f"`recordprep wait {root}`; if the job failed, check its logs and the error output, "
        f"then re-run it. (Expected file: {metadata_path})"
    )


def _safe_isdir(path: str) -> bool:
    try:
        return _io.isdir(path)
    except Exception:  # only used to word a message
        return True


def failed_error(
    location: Location, read: Callable[[str], bytes | None] | None = None
) -> DatasetFailedError | None:
    """The converter's failure report for this output, if it left one.

    ``read`` returns a file's bytes or None when it does not exist
    (default: this package's file layer). A report that exists but cannot be
    read or parsed (empty, garbage) still means the run failed; its reason is
    then "unreadable failure report".
    """
    try:
        data = (read or _io.read_bytes)(location.failure_path)
    except (IsADirectoryError, PermissionError):  # it exists: the run failed, the reason is lost
        data = b""
    except Exception:  # noqa: BLE001 - unreachable now (network): the marker only improves the message
        return None
    if data is None:
        return None
    try:
        reason = json.loads(data).get("reason") or "no reason recorded"
        reason = reason if isinstance(reason, str) else json.dumps(reason)[:1000]
    except (ValueError, AttributeError, RecursionError):
        reason = "unreadable failure report"
    return DatasetFailedError(
        f"the conversion into {location.root} failed: {reason} (from {location.failure_path}; "
        f"there is no {METADATA_FILENAME}, so nothing was committed). Fix the cause and re-run "
        f"the conversion; a successful run removes the failure report.",
        reason,
    )


def _file_in_the_way(root: str) -> str | None:
    """The local file that stands where ``root`` or one of its parents should be a directory, if any.

    Remote paths are not checked (no I/O for them here).
    """
    if _io.path_scheme(root) and not root.startswith("file://"):
        return None
    path = os.path.abspath(_io.strip_file_scheme(root))
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def _read_metadata(read: Callable[[str], bytes | None], location: Location) -> bytes | None:
    """The metadata's bytes, None if absent; SpecError if the name is taken by a directory."""
    try:
        return read(location.metadata_path)
    except IsADirectoryError:
        raise SpecError(
            f"{location.metadata_path} is a directory, not a file: {location.root} is not a "
            f"recordprep output (or was damaged); re-run the conversion"
        ) from None


def _load_at(location: Location) -> DatasetInfo:
    text = _read_metadata(_io.read_bytes, location)
    if text is None:
        failed = failed_error(location)
        if failed is not None:
            raise failed
        raise DatasetIncompleteError(incomplete_message(location.root, location.metadata_path))
    return DatasetInfo.loads(text, source=location.metadata_path)


def load_info(path_or_pattern: str) -> DatasetInfo:
    """Read the ``DatasetInfo`` of an output directory or of a shard pattern in it.

    Args:
      path_or_pattern: ``out``, ``out/dataset_info.json``, ``out/train-*``,
        ``gs://bucket/out/train-*.tfrecord.gz``, ``hdfs://nn:8020/out``, ...

    A class label's (``transform: vocabulary``) class names are
    ``info.label_classes`` (class id ``i`` is ``label_classes[i]``), for the
    model's output layer.

    Raises:
      DatasetIncompleteError: no metadata (conversion unfinished or failed);
        :class:`DatasetFailedError` when the converter left a failure report.
      SpecError: the metadata is damaged or from a newer recordprep.
    """
    return _load_at(locate(path_or_pattern))


@dataclasses.dataclass(frozen=True)
class ShardSelection:
    """The shards one reader call reads, resolved against the metadata."""

    info: DatasetInfo
    root: str
    split: str
    shards: tuple[ShardInfo, ...]

    @property
    def paths(self) -> list[str]:
        return [_io.join(self.root, s.file) for s in self.shards]

    @property
    def num_records(self) -> int:
        return sum(s.num_records for s in self.shards)


def select_shards(
    path_or_pattern: str, split: str | None = None, *, info: DatasetInfo | None = None
) -> ShardSelection:
    """Resolve a directory (+ ``split``) or a shard pattern to the listed shards it names.

    A pattern is matched with ``fnmatch`` against the file names in the
    metadata. It must select shards of a single split (or ``split`` must say
    which one); a directory needs ``split`` unless the dataset has only one.
    Shards with zero records are dropped.
    """
    location = locate(path_or_pattern)
    if info is None:
        info = _load_at(location)
    if split is not None and split not in info.splits:
        raise ShardSelectionError(
            f"no split {split!r} in {location.metadata_path}; it has: {', '.join(info.splits) or 'none'}"
        )
    candidates = [split] if split is not None else list(info.splits)
    if location.glob is None:
        if len(candidates) != 1:
            raise ShardSelectionError(
                f"{path_or_pattern!r} is an output directory with splits "
                f"{', '.join(info.splits)}; say which to read with split='...' "
                f"or a shard pattern such as {_io.join(location.root, candidates[0] + '-*')!r}"
            )
        chosen = candidates[0]
        shards = tuple(info.splits[chosen].shards)
    else:
        matched = {
            name: tuple(
                s for s in info.splits[name].shards if fnmatch.fnmatchcase(s.file, location.glob)
            )
            for name in candidates
        }
        matched = {k: v for k, v in matched.items() if v}
        if not matched:
            examples = [s.file for name in candidates for s in info.splits[name].shards[:1]]
            raise ShardSelectionError(
                f"pattern {location.glob!r} matches none of the shards listed in "
                f"{location.metadata_path} (compression {info.compression}; shards are named like "
                f"{', '.join(examples) or '(no shards)'}). Use e.g. "
                f"{_io.join(location.root, (candidates[0] if candidates else 'train') + '-*')!r}"
            )
        if len(matched) > 1:
            raise ShardSelectionError(
                f"pattern {location.glob!r} matches shards of several splits ({', '.join(matched)}); "
                f"narrow the pattern (e.g. {next(iter(matched))}-*) or pass split='...'"
            )
        chosen, shards = next(iter(matched.items()))
    nonempty = tuple(s for s in shards if s.num_records > 0)
    if not nonempty:
        raise ShardSelectionError(
            f"split {chosen!r} in {location.metadata_path} has no records in the selected shards "
            f"({len(shards)} shard(s), all empty); check the conversion's error output"
        )
    return ShardSelection(info=info, root=location.root, split=chosen, shards=nonempty)


def label_and_features(
    info: DatasetInfo,
    label_key: str | None,
    features: Iterable[str] | None,
) -> tuple[str | None, list[FeatureSpec]]:
    """Validate the label / feature subset a reader was asked for.

    Returns the label key (or None) and the specs of the non-label features,
    in metadata order (or in the caller's order when a subset is given).
    """
    names = [f.name for f in info.features]
    if label_key is not None and label_key not in names:
        raise KeyError(
            f"label_key {label_key!r} is not a feature of this dataset; it has: {', '.join(names)}"
        )
    if features is None:
        # Every model input: not the requested label, and not the dataset's own
        # label either (with label_key=None the caller wants features only).
        excluded = {label_key, info.label_key}
        return label_key, [f for f in info.features if f.name not in excluded and f.role != "label"]
    if isinstance(features, str):
        raise TypeError(f"features must be a list of names, found the string {features!r}")
    wanted = list(dict.fromkeys(features))
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise KeyError(
            f"feature(s) {', '.join(map(repr, unknown))} not in this dataset; it has: {', '.join(names)}"
        )
    if label_key is not None and label_key in wanted:
        raise ValueError(
            f"{label_key!r} is the label (returned as the second element); leave it out of "
            f"features=, or pass label_key=None to get it as a feature"
        )
    return label_key, [info.feature(n) for n in wanted]


def keras_inputs(info: DatasetInfo, features: Sequence[str] | None = None) -> dict[str, Any]:
    """``{name: tf.keras.Input(shape, dtype, name)}`` for every non-label feature.

    Shapes are the stored fixed shapes (scalars are ``(1,)``), so the inputs
    match what :func:`readers.train_dataset` yields and can be concatenated
    directly (after casting the int64 / string ones as the model needs).

    Args:
      info: from :func:`load_info`.
      features: a subset (in this order); default all features except the
        label (``info.label_key``).
    """
    import tensorflow as tf

    _, specs = label_and_features(info, None, features)
    return {
        f.name: tf.keras.Input(shape=tuple(f.shape), dtype=TF_DTYPE_NAMES[f.dtype], name=f.name)
        for f in specs
    }


def check_wait_arguments(
    timeout: float | None,
    poll: float,
    stale_after: float | None = None,
    *,
    names: tuple[str, str, str] = ("timeout", "poll", "stale_after"),
) -> None:
    """ValueError unless ``timeout`` is None or finite and >= 0, ``poll`` finite and >= MIN_POLL_SECONDS,
    and ``stale_after`` None or finite and > 0.

    A NaN timeout would never expire and a NaN or zero poll would never sleep,
    so they are refused rather than waited on. ``names`` word the message
    (the CLI passes its option names).
    """
    if timeout is not None and not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout >= 0):
        raise ValueError(f"{names[0]} must be a finite number of seconds >= 0, found {timeout!r}")
    if not (isinstance(poll, int | float) and math.isfinite(poll) and poll >= MIN_POLL_SECONDS):
        raise ValueError(f"{names[1]} must be a finite number of seconds >= {MIN_POLL_SECONDS}, found {poll!r}")
    if stale_after is not None and not (
        isinstance(stale_after, int | float) and math.isfinite(stale_after) and stale_after > 0
    ):
        raise ValueError(f"{names[2]} must be a finite number of seconds > 0, found {stale_after!r}")


class _LockWatch:
    """Reads the output's lock while waiting and tells when the run holding it is dead.

    A lock's age comes from its heartbeat; a lock without a readable one is
    judged by how long its exact bytes have stayed the same, as seen from
    here (a read does not give the object's own time on every file layer).
    """

    def __init__(self, location: Location, read: Callable[[str], bytes | None],
                 stale_after: float | None, stale_after_name: str):
        self.location = location
        self.read = read
        self.stale_after = stale_after
        self.name = stale_after_name
        self.data: bytes | None = None
        self.since = 0.0

    def dead(self) -> DatasetDeadError | None:
        try:
            data = self.read(self.location.lock_path)
        except Exception:  # noqa: BLE001 - unreachable now (network): judged at the next check
            return None
        if data is None:  # not started yet, or finished and its metadata is next
            self.data = None
            return None
        if data != self.data:
            self.data, self.since = data, time.time()
        lock = _lockfile.parse_lock(data, self.since)
        owner = lock.get("owner") if isinstance(lock.get("owner"), dict) else {}
        period = lock.get("heartbeat_seconds")
        if (self.stale_after is not None and isinstance(period, int | float) and self.stale_after <= period
                and not _lockfile.owner_gone(owner)):
            raise ValueError(
                f"{self.name} {self.stale_after:g} s is not longer than the heartbeat period of the "
                f"conversion writing {self.location.root} ({period:g} s): a live run would look dead "
                f"between two heartbeats. Use a larger value, or leave it out (the run's own limit, "
                f"{_lockfile.stale_bound(lock):g} s)."
            )
        reason = _lockfile.why_dead(lock, stale_after=self.stale_after)
        if not reason:
            return None
        started, host, pid = (str(owner.get(k) or "?")[:100] for k in ("started", "host", "pid"))  # untrusted
        verdict = "is dead" if _lockfile.owner_gone(owner) else "appears dead"
        run = f"the conversion into {self.location.root} started at {started} on {host} (pid {pid})"
        return DatasetDeadError(
            f"{run} {verdict}: {reason}; it left no {METADATA_FILENAME} and no failure report "
            f"(killed, or its machine was lost). Re-run the conversion: it takes over the dead run's "
            f"lock ({self.location.lock_path}) without --overwrite.",
            f"{run} {verdict}: {reason}",
            lock,
        )


def wait_for_metadata(
    location: Location,
    timeout: float | None,
    poll: float,
    read: Callable[[str], bytes | None] | None = None,
    *,
    stale_after: float | None = None,
    names: tuple[str, str, str] = ("timeout", "poll", "stale_after"),
) -> DatasetInfo:
    """The loop behind :func:`wait_for_dataset` and ``recordprep wait``, on any file layer.

    ``read(path)`` returns the file's bytes or None when it does not exist
    (default: this package's layer; the CLI passes Beam's, which needs no
    TensorFlow). Metadata that is not valid JSON may be a file being replaced:
    polling goes on until the deadline. Metadata that parses but is not valid
    recordprep metadata, or a directory in its place, raises SpecError at once,
    as does a local file where the output directory (or a parent) should be.
    While there is no metadata and no failure report, the output's lock is
    read: a dead run's raises :class:`DatasetDeadError` (see
    :func:`wait_for_dataset`); no lock means not started yet.
    """
    check_wait_arguments(timeout, poll, stale_after, names=names)
    read = read or _io.read_bytes
    watch = _LockWatch(location, read, stale_after, names[2])
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    last_problem = ""
    next_log = start + 60.0
    while True:
        blocker = _file_in_the_way(location.root)
        if blocker is not None:  # no conversion can write there: waiting would not help
            raise SpecError(
                f"{blocker} is a file, not a directory: no conversion can write {location.root}; "
                f"check the path (or remove the file)"
            )
        data = _read_metadata(read, location)
        if data is not None:
            try:  # other SpecErrors (parsed, and wrong): waiting would not help
                info = DatasetInfo.loads(data, source=location.metadata_path)
            except MetadataNotJSONError as e:
                last_problem = f" (it exists but is not valid JSON yet: {e.__cause__})"
            else:
                logger.info(
                    "dataset ready: %s (waited %.1f s)",
                    location.metadata_path,
                    time.monotonic() - start,
                )
                return info
        else:
            failed = failed_error(location, read) or watch.dead()
            if failed is not None:
                raise failed
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            err = TimeoutError(
                f"{location.metadata_path} did not appear within {timeout:g} s{last_problem}: the "
                f"conversion writing {location.root} is still running, or it failed. Check the "
                f"conversion job and its error output; wait longer with a larger timeout "
                f"(timeout=None waits indefinitely)."
            )
            err.problem = last_problem  # for the CLI's shorter message
            raise err
        if now >= next_log:
            logger.info("still waiting for %s (%.0f s so far)", location.metadata_path, now - start)
            next_log = now + 60.0
        sleep = poll if deadline is None else min(poll, max(0.0, deadline - now))
        time.sleep(sleep)


def wait_for_dataset(
    path_or_pattern: str, timeout: float | None, *, poll: float = 5.0, stale_after: float | None = None
) -> DatasetInfo:
    """Block until the output's ``dataset_info.json`` exists and parses; return it.

    Use it to start training as soon as a conversion finishes (the metadata
    is written last, so once it parses every shard is in place).

    Args:
      path_or_pattern: the output directory or a shard pattern in it.
      timeout: seconds to wait (finite, >= 0); ``None`` waits indefinitely.
      poll: seconds between checks (finite, >= ``MIN_POLL_SECONDS``; each
        check is one stat/read, cheap on gs://).
      stale_after: a conversion whose lock's heartbeat is older than this
        (seconds, longer than its heartbeat period) is dead; default: the
        limit the run recorded in its lock (``convert.lockfile``). A run on
        this host whose process is gone is dead at once.

    Raises:
      ValueError: a NaN, infinite or negative timeout, poll or stale_after,
        or a stale_after not longer than the heartbeat period of the run
        whose lock is found (a live run would look dead between beats).
      TimeoutError: the metadata did not appear (or stayed unreadable) in time.
      DatasetFailedError: the converter reported that it failed
        (``_FAILURE.json``, even an unreadable one); raised at once, like
        ``recordprep wait``.
      DatasetDeadError: (a DatasetFailedError) the conversion died without a
        report: killed, or its machine lost; the message names its host,
        pid and start time.
      SpecError: it appeared but is from a newer recordprep or is not a
        recordprep metadata file (waiting longer would not help).
    """
    return wait_for_metadata(locate(path_or_pattern), timeout, poll, stale_after=stale_after)


__all__ = [
    "SpecError",
    "keras_inputs",
    "load_info",
    "locate",
    "select_shards",
    "wait_for_dataset",
]
