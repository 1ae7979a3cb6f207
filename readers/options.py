"""Tuning knobs of the readers (:class:`ReadOptions`), with defaults chosen per storage type.

``None`` in a field means "pick for the path being read":

==================  =======================  ==================================
knob                local                    remote (gs://, s3://, hdfs://, ...)
==================  =======================  ==================================
cycle_length        min(num_files, 8)        min(num_files, 16)
num_parallel_calls  min(cycle_length, CPUs)  cycle_length (reads wait on I/O)
read_buffer_bytes   1 MiB                    8 MiB; on ``gs://`` one byte more
                                             than TensorFlow's GCS block (64 MiB)
epoch_lookahead     off                      2 epochs opened early when the
                                             shards read total <= 256 MiB, else 1
==================  =======================  ==================================

Why: a local stream starts in microseconds and one or two saturate the parse;
on object stores each request waits a time to first byte and one stream gets
a fraction of the bandwidth, so throughput needs many files in flight and
large requests. ``cycle_length`` is always explicit, since ``AUTOTUNE`` picks
the core count (1-2 on small training hosts: sequential remote reads). On
``gs://`` reads one byte larger than TensorFlow's per-file GCS read block skip
that block, which TensorFlow zero-fills before every fill (unless the shared
GCS block cache is on). Memory: about ``cycle_length * read_buffer_bytes`` plus
the shuffle buffer. Details and measurements: docs/reading.md#options,
docs/remote-storage.md#gs, docs/benchmarks.md#design-readers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from stores import scheme_of

#: Same value as ``tf.data.AUTOTUNE``; repeated here so this module does not
#: need TensorFlow.
AUTOTUNE = -1

#: URL schemes that are served from memory or the local disk; every other
#: scheme (gs, s3, hdfs, viewfs, az, ...) is treated as remote.
LOCAL_SCHEMES = ("", "file", "ram")

LOCAL_CYCLE_LENGTH = 8
# Why 16 shards open on remote storage, and what smaller cycles measured: docs/benchmarks.md#design-readers.
REMOTE_CYCLE_LENGTH = 16
LOCAL_READ_BUFFER_BYTES = 1 << 20
REMOTE_READ_BUFFER_BYTES = 8 << 20
#: TensorFlow's GCS read block when no environment variable sets it
#: (``kDefaultBlockSize`` in tsl/platform/cloud/gcs_file_system.h).
GCS_DEFAULT_BLOCK_BYTES = 64 << 20
#: On remote storage, the shards a pipeline reads total at most this many bytes for the
#: default ``epoch_lookahead`` to start 2 epochs ahead instead of 1. Such an epoch is
#: short: every shard is open at once and an epoch lasts as long as its slowest
#: shard's read, which one epoch ahead cannot hide (docs/benchmarks.md#design-readers);
#: holding two epochs' reads costs at most twice this.
SMALL_REMOTE_EPOCH_BYTES = 256 << 20
#: Most epochs ``epoch_lookahead`` may start ahead of the one being read.
MAX_EPOCH_LOOKAHEAD = 4
DEFAULT_SHUFFLE_BUFFER = 10_000
DEFAULT_BLOCK_LENGTH = 64
#: ``ReadOptions.shuffle_mode`` values; the first is the default.
SHUFFLE_MODES = ("window", "buffer")
DEFAULT_STAGING_THREADS = 8
#: ``ReadOptions.service_sharding`` values (see :mod:`readers.service`); the first is the default.
SERVICE_SHARDING = ("dynamic", "static")
#: ``ReadOptions.service_compression`` values: tf.data service's ``"AUTO"`` or none.
SERVICE_COMPRESSION = ("auto", "none")


def path_scheme(path: str) -> str:
    """``"gs"`` for ``gs://b/x``, ``""`` for local paths (and ``file://``): :func:`stores.scheme_of`."""
    return scheme_of(path)


def is_remote_path(path: str) -> bool:
    """True for object-store / distributed-filesystem paths (any scheme but ``LOCAL_SCHEMES``)."""
    return path_scheme(path) not in LOCAL_SCHEMES


def _positive_int(name: str, value: Any, *, allow_autotune: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"ReadOptions.{name} must be an int, found {type(value).__name__} {value!r}"
        )
    if allow_autotune and value == AUTOTUNE:
        return
    if value < 1:
        extra = " or tf.data.AUTOTUNE (-1)" if allow_autotune else ""
        raise ValueError(f"ReadOptions.{name} must be >= 1{extra}, found {value}")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How the readers open, interleave, buffer and shuffle shards.

    Every field defaults to a value that suits the path being read; ``None``
    means "pick for local vs remote at build time" (see the module docstring
    and docs/reading.md#options).
    Build one with :meth:`for_path` to fix the storage type up front, or pass
    ``ReadOptions(...)`` and let the reader detect it from the pattern.

    Attributes:
      cycle_length: shards open and interleaved at once. Must be explicit
        (no AUTOTUNE, see module docstring). ``None``: 8 local / 16 remote,
        capped at the number of shards read.
      num_parallel_calls: threads reading those shards. ``None``:
        ``min(cycle_length, os.cpu_count())`` local, ``cycle_length`` remote.
        ``tf.data.AUTOTUNE`` (-1) is allowed.
      block_length: consecutive records taken from one shard before the
        interleave moves to the next (training only). They cross the
        interleave as one element, which amortizes its per-element cost
        (measured, docs/benchmarks.md#design-readers); the record shuffle
        mixes them afterwards. Use 1 with a tiny ``shuffle_buffer`` if
        record-level alternation between shards matters. Each open shard
        buffers up to ``3 * block_length`` records.
      read_buffer_bytes: ``buffer_size`` of each ``TFRecordDataset``.
        ``None``: 1 MiB local, 8 MiB remote, and on ``gs://`` one byte more
        than TensorFlow's GCS read block (:func:`gcs_block_bytes`), so reads
        bypass that zero-filled per-file block (see the module docstring).
      shuffle_buffer: records shuffled together (serialized, so memory is
        about ``shuffle_buffer * mean record size``, a few times that in
        ``window`` mode, where several windows are in flight). 0 or 1 disables record shuffling. It is capped at the
        number of records read. Checkpointing an iterator saves the buffer.
      shuffle_mode: how records are shuffled (training only).
        ``"window"`` (default): the record stream, as it leaves the
        interleave of ``cycle_length`` shards, is cut into windows of
        ``shuffle_buffer`` consecutive records and each window is permuted at
        random as one tensor (``stateless_shuffle``, seeded per window and
        epoch). Records stay in vectors from the shard reader to the parse, so
        no stage of the pipeline handles single records, which is faster than
        ``"buffer"`` (docs/benchmarks.md#readers). A record mixes only with
        the records of its window.
        ``"buffer"``: ``Dataset.shuffle(shuffle_buffer)``, tf.data's sliding
        buffer: every output is drawn from the ``shuffle_buffer`` records read
        last (plus older leftovers), so records also mix across window
        boundaries, at one tf.data element per record.
        Both keep epochs apart (shuffle before repeat) and reshuffle every
        epoch.
      shuffle_files: reshuffle the shard order every epoch (training only).
      prefetch: batches prefetched at the end; ``tf.data.AUTOTUNE`` (-1) by
        default.
      deterministic: produce the same order on every run (given a seed). Costs
        throughput: a slow shard stalls the pipeline instead of being
        overtaken. It governs the shard interleave only; the stages after it
        (shuffle, batch, parse) keep their order either way, so epochs never
        mix. ``train_dataset(deterministic=...)`` overrides it.
      verify_files: before reading, stat every shard listed in the metadata
        (in parallel on remote storage), so a missing shard, or one whose size
        differs from the metadata's ``num_bytes`` (truncated or replaced),
        fails at once with its name instead of mid-epoch.
      remote: force the local (False) or remote (True) defaults; ``None``
        detects it from the path.
      staging_threads: parallel downloads when staging ``hdfs://``,
        ``s3://`` or ``azfs://`` shards.
      hdfs_cache_dir: local directory for staged ``hdfs://`` shards; ``None``
        uses ``$RECORDPREP_HDFS_CACHE`` or ``~/.cache/recordprep/hdfs``.
      s3_cache_dir: local directory for staged ``s3://`` shards; ``None``
        uses ``$RECORDPREP_S3_CACHE`` or ``~/.cache/recordprep/s3``.
      azure_cache_dir: local directory for staged ``azfs://`` shards;
        ``None`` uses ``$RECORDPREP_AZURE_CACHE`` or
        ``~/.cache/recordprep/azure``.
      private_threadpool_size: if set, the pipeline runs on its own
        ``tf.data`` thread pool of this size instead of the shared one.
      epoch_lookahead: how many epochs to start (shuffle their shard order,
        open their shards, fill their first shuffle window) while the current
        one is still being read: ``0`` or ``False`` none, ``1`` or ``True``
        the next, up to ``MAX_EPOCH_LOOKAHEAD`` (training in ``window``
        shuffle mode, more than one epoch, no ``cache``, no ``skip_corrupt``:
        an epoch that yields nothing must end the dataset). At every epoch
        boundary the reader otherwise waits for ``cycle_length`` opens and
        first reads, one time to first byte each, with nothing buffered: a
        stall per epoch on remote storage. When every shard of an epoch is
        open at once, its slowest shard also sets how long the epoch lasts;
        a second epoch ahead reads that shard while two epochs go by
        (docs/benchmarks.md#design-readers). Epochs still never mix: an
        epoch's records wait until the one before has given its last. Costs
        each started epoch's open shards and one window of records.
        ``None``: off locally (opens are cheap there); on remote storage 2
        when the shards read total at most ``SMALL_REMOTE_EPOCH_BYTES``
        (256 MiB), else 1.
      service: a tf.data service dispatcher, ``"grpc://host:port"``: the
        training pipeline (shard reads, shuffle, batch, parse) runs on its
        workers and the trainer receives parsed batches (see
        :mod:`readers.service`). ``None``: in-process.
      service_sharding: who reads which shard through the service.
        ``"dynamic"`` (default): the dispatcher hands shards to workers as
        they ask, every shard once per epoch; workers may join or leave.
        ``"static"``: worker ``i`` of the dispatcher's fixed worker list reads
        shards ``i, i+n, ...`` (deterministic ownership; the dispatcher must be
        started with that list).
      service_job_name: trainers that pass the same name share one job: each
        batch goes to one of them (together they see each record once per
        epoch). ``None``: each trainer gets its own job.
      service_compression: ``"auto"`` (tf.data service compresses batches on
        the wire when that pays) or ``"none"``.
    """

    cycle_length: int | None = None
    num_parallel_calls: int | None = None
    block_length: int = DEFAULT_BLOCK_LENGTH
    read_buffer_bytes: int | None = None
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER
    shuffle_mode: str = SHUFFLE_MODES[0]
    shuffle_files: bool = True
    prefetch: int = AUTOTUNE
    deterministic: bool = False
    verify_files: bool = True
    remote: bool | None = None
    staging_threads: int = DEFAULT_STAGING_THREADS
    hdfs_cache_dir: str | None = None
    s3_cache_dir: str | None = None
    azure_cache_dir: str | None = None
    private_threadpool_size: int | None = None
    epoch_lookahead: bool | int | None = None
    service: str | None = None
    service_sharding: str = SERVICE_SHARDING[0]
    service_job_name: str | None = None
    service_compression: str = SERVICE_COMPRESSION[0]

    def __post_init__(self) -> None:
        if self.cycle_length == AUTOTUNE:
            raise ValueError(
                "ReadOptions.cycle_length must be an explicit number of shards: tf.data.AUTOTUNE "
                "picks the number of CPU cores (often 1-2 on training hosts), which makes remote "
                "reads sequential. Leave it None for the local/remote default, or pass e.g. 16."
            )
        _positive_int("cycle_length", self.cycle_length)
        _positive_int("num_parallel_calls", self.num_parallel_calls, allow_autotune=True)
        _positive_int("block_length", self.block_length)
        _positive_int("read_buffer_bytes", self.read_buffer_bytes)
        _positive_int("staging_threads", self.staging_threads)
        _positive_int("private_threadpool_size", self.private_threadpool_size)
        if isinstance(self.shuffle_buffer, bool) or not isinstance(self.shuffle_buffer, int):
            raise TypeError(
                f"ReadOptions.shuffle_buffer must be an int, found {self.shuffle_buffer!r}"
            )
        if self.shuffle_buffer < 0:
            raise ValueError(
                f"ReadOptions.shuffle_buffer must be >= 0 records (0 disables shuffling), "
                f"found {self.shuffle_buffer}"
            )
        if self.shuffle_mode not in SHUFFLE_MODES:
            raise ValueError(
                f"ReadOptions.shuffle_mode must be one of {', '.join(map(repr, SHUFFLE_MODES))}, "
                f"found {self.shuffle_mode!r}"
            )
        if isinstance(self.prefetch, bool) or not isinstance(self.prefetch, int):
            raise TypeError(f"ReadOptions.prefetch must be an int, found {self.prefetch!r}")
        if self.prefetch < 0 and self.prefetch != AUTOTUNE:
            raise ValueError(
                f"ReadOptions.prefetch must be >= 0 batches or tf.data.AUTOTUNE (-1), found {self.prefetch}"
            )
        for name in ("shuffle_files", "deterministic", "verify_files"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"ReadOptions.{name} must be a bool, found {getattr(self, name)!r}")
        if self.remote is not None and not isinstance(self.remote, bool):
            raise TypeError(f"ReadOptions.remote must be a bool or None, found {self.remote!r}")
        ahead = self.epoch_lookahead
        if ahead is not None and not isinstance(ahead, int):
            raise TypeError(f"ReadOptions.epoch_lookahead must be None, a bool or a number of epochs, found {ahead!r}")
        if ahead is not None and not 0 <= ahead <= MAX_EPOCH_LOOKAHEAD:
            raise ValueError(f"ReadOptions.epoch_lookahead must be 0 to {MAX_EPOCH_LOOKAHEAD} epochs, found {ahead}")
        self._check_service()

    def _check_service(self) -> None:
        if self.service is not None:
            host, sep, port = str(self.service).removeprefix("grpc://").rpartition(":")
            if (not isinstance(self.service, str) or not self.service.startswith("grpc://") or not sep
                    or not host or not port.isdigit()):
                raise ValueError(
                    f"ReadOptions.service must be a tf.data service dispatcher address 'grpc://host:port' "
                    f"(from `recordprep data-service dispatcher`), found {self.service!r}"
                )
        for name, allowed in (("service_sharding", SERVICE_SHARDING), ("service_compression", SERVICE_COMPRESSION)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"ReadOptions.{name} must be one of {', '.join(map(repr, allowed))}, found {getattr(self, name)!r}"
                )
        if self.service_job_name is not None and (not isinstance(self.service_job_name, str)
                                                  or not self.service_job_name):
            raise ValueError(f"ReadOptions.service_job_name must be a non-empty string or None, "
                             f"found {self.service_job_name!r}")
        if self.service is None and (self.service_job_name is not None
                                     or self.service_sharding != SERVICE_SHARDING[0]
                                     or self.service_compression != SERVICE_COMPRESSION[0]):
            raise ValueError("ReadOptions.service_sharding, service_job_name and service_compression apply to "
                             "reads through a tf.data service: set ReadOptions.service too (grpc://host:port)")

    @classmethod
    def for_path(cls, pattern: str, **overrides: Any) -> ReadOptions:
        """Options with the storage type detected from ``pattern``.

        ``ReadOptions.for_path("gs://bucket/out/train-*")`` gets the remote
        defaults; any field can be overridden by keyword.
        """
        overrides.setdefault("remote", is_remote_path(pattern))
        return cls(**overrides)

    def replace(self, **changes: Any) -> ReadOptions:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    # -- resolution of the "None = pick for me" fields --------------------------------

    def is_remote(self, path: str) -> bool:
        return self.remote if self.remote is not None else is_remote_path(path)

    def resolved_cycle_length(self, num_files: int, *, remote: bool) -> int:
        """Cycle length for ``num_files`` shards (never more than there are shards)."""
        want = self.cycle_length or (REMOTE_CYCLE_LENGTH if remote else LOCAL_CYCLE_LENGTH)
        return max(1, min(want, num_files))

    def resolved_num_parallel_calls(self, cycle_length: int, *, remote: bool) -> int:
        if self.num_parallel_calls is not None:
            return self.num_parallel_calls
        if remote:
            return cycle_length
        return max(1, min(cycle_length, os.cpu_count() or 1))

    def resolved_epoch_lookahead(self, *, remote: bool, read_bytes: int) -> int:
        """Epochs started ahead; ``read_bytes``: the size of the shards the pipeline reads."""
        if self.epoch_lookahead is not None:
            return int(self.epoch_lookahead)
        if not remote:
            return 0
        return 2 if read_bytes <= SMALL_REMOTE_EPOCH_BYTES else 1

    def resolved_read_buffer_bytes(self, *, remote: bool, scheme: str = "") -> int:
        """``buffer_size`` for each shard's ``TFRecordDataset``; ``scheme`` is the
        shards' URL scheme (``path_scheme``), which picks the ``gs://`` rule."""
        if self.read_buffer_bytes is not None:
            return self.read_buffer_bytes
        if not remote:
            return LOCAL_READ_BUFFER_BYTES
        block = gcs_block_bytes() if scheme == "gs" else None
        return max(REMOTE_READ_BUFFER_BYTES, block + 1) if block else REMOTE_READ_BUFFER_BYTES


def _env_uint(name: str, environ: Any) -> int | None:
    raw = environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else None


def gcs_block_bytes(environ: Any = None) -> int | None:
    """Bytes of the read block TensorFlow's GCS file system keeps per open file.

    Mirrors how ``GcsFileSystem`` reads its environment: 64 MiB by default,
    ``GCS_READAHEAD_BUFFER_SIZE_BYTES`` (deprecated) then
    ``GCS_READ_CACHE_BLOCK_SIZE_MB`` override it. ``None`` when no per-file
    block is used: with ``GCS_READ_CACHE_MAX_SIZE_MB`` > 0 files read through
    the shared block cache instead. TensorFlow reads these once, when it first
    touches GCS; set them before that.
    """
    env = os.environ if environ is None else environ
    if (_env_uint("GCS_READ_CACHE_MAX_SIZE_MB", env) or 0) > 0:
        return None
    block = GCS_DEFAULT_BLOCK_BYTES
    readahead = _env_uint("GCS_READAHEAD_BUFFER_SIZE_BYTES", env)
    if readahead is not None:
        block = readahead
    mb = _env_uint("GCS_READ_CACHE_BLOCK_SIZE_MB", env)
    if mb is not None:
        block = mb << 20
    return block


def check_positive(name: str, value: Any) -> None:
    """``value`` is a positive int (not a bool), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, found {value!r}")


@dataclasses.dataclass(frozen=True)
class TrainRequest:
    """The arguments of :func:`readers.train_dataset`, checked here in one place
    (what each means: its docstring). ``opts`` is the ``ReadOptions`` in effect
    (``options`` with ``shuffle_buffer`` and ``service`` applied), ``ordered``
    whether the element order is kept (``deterministic``, else ``opts.deterministic``).
    """

    batch_size: int
    split: str | None
    label_key: Any
    features: Any
    shuffle_buffer: int | None
    seed: int | None
    num_epochs: int | None
    cache: Any
    deterministic: bool | None
    drop_remainder: bool
    input_context: Any
    skip_corrupt: bool
    options: ReadOptions | None
    service: str | None
    opts: ReadOptions = dataclasses.field(init=False)
    ordered: bool = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        check_positive("batch_size", self.batch_size)
        if self.num_epochs is not None:
            check_positive("num_epochs", self.num_epochs)
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise TypeError(f"seed must be an int or None, found {self.seed!r}")
        if self.cache is not None and not isinstance(self.cache, str | os.PathLike):
            raise TypeError(f"cache must be None, 'memory' or a local directory, found {self.cache!r}")
        if self.options is not None and not isinstance(self.options, ReadOptions):
            raise TypeError(f"options must be a readers.ReadOptions, found {type(self.options).__name__}")
        opts = self.options or ReadOptions()
        if self.shuffle_buffer is not None:
            opts = opts.replace(shuffle_buffer=self.shuffle_buffer)
        if self.service is not None:
            opts = opts.replace(service=self.service)
        object.__setattr__(self, "opts", opts)
        object.__setattr__(self, "ordered", opts.deterministic if self.deterministic is None else bool(self.deterministic))
