"""Reading a split's shards: the shard list as tensors, each shard's records
in blocks (damage found while reading named by shard), the shards checked
against the metadata and staged when remote, and the ``tf.data.Options``
every reader sets. The in-process readers (``readers.dataset``) and the
tf.data service's worker pipeline (``readers.service``) build on these.
"""

from __future__ import annotations

import concurrent.futures
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from convert.spec import (
    METADATA_FILENAME,
)
from readers import _io
from readers.errors import ShardMismatchError, ShardNotFoundError
from readers.info import ShardSelection
from readers.options import ReadOptions
from readers.parsing import plain
from stores import staging, store_for

logger = logging.getLogger("readers")

def _glob_escape(path: str) -> str:
    """``path`` as a ``tf.io.matching_files`` pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", path)


def shard_tensors(paths: Sequence[str], counts: Sequence[int]) -> tuple[tf.Tensor, ...]:
    """``(paths, glob-escaped paths, num_records)``: one row per shard."""
    return (
        tf.constant(list(paths), tf.string),
        tf.constant([_glob_escape(p) for p in paths], tf.string),
        tf.constant(list(counts), tf.int64),
    )


def shard_list(paths: Sequence[str], counts: Sequence[int]) -> tf.data.Dataset:
    """``(path, glob-escaped path, num_records)`` per shard: the input of :func:`read_shard_fn`."""
    return tf.data.Dataset.from_tensor_slices(shard_tensors(paths, counts))


def _tfrecords(files: tf.Tensor, compression_type: str, buffer_bytes: int) -> tf.data.Dataset:
    """The records of ``files`` (a vector), read one file after the other.

    ``tf.data.TFRecordDataset`` reads a vector of names through a traced
    ``flat_map``; the op under it takes the vector directly. Two of those
    traces per shard function were a measurable share of the time to the
    first batch (docs/benchmarks.md#design-readers), so the op's dataset class is used when this
    TensorFlow has it.
    """
    private = _private_tfrecord_class()
    if private is not None:
        try:
            return private(filenames=files, compression_type=compression_type, buffer_size=buffer_bytes)
        except TypeError as e:  # its parameters were renamed (keywords: a reordering cannot pass one as another)
            logger.debug("private _TFRecordDataset unusable (%s); using TFRecordDataset", e)
    return tf.data.TFRecordDataset(files, compression_type=compression_type, buffer_size=buffer_bytes)


def _private_tfrecord_class() -> Any:
    try:
        from tensorflow.python.data.ops.readers import _TFRecordDataset
    except ImportError:
        return None
    return _TFRecordDataset


#: Schemes whose file system opens a missing object without an error (the first
#: read fails instead, and TFRecordDataset moves past a file on read errors), so
#: the reader needs no existence check before opening a shard: checked for gs://
#: against the emulated GCS of tests/_remote.py (test_remote_gcs.py).
_OPENS_MISSING_FILES = ("gs",)


def paths_scheme(paths: Sequence[str]) -> str:
    """The URL scheme of the shards (one output directory, so one scheme); ``""`` locally."""
    return _io.path_scheme(paths[0]) if paths else ""


@plain
def _on_early_end(
    path: tf.Tensor, listed: tf.Tensor, chunk_sizes: tf.Tensor, present: tf.Tensor, skip_corrupt: bool
) -> tf.Tensor:
    """A shard that ended before its ``listed`` records: fail naming it and the likely cause,
    or with ``skip_corrupt`` report it on stderr. ``chunk_sizes`` are what a second read got;
    ``present`` is whether the file still exists."""
    readable = tf.reduce_sum(chunk_sizes)
    counts = tf.strings.join(
        [
            "read ",
            tf.strings.as_string(tf.minimum(readable, listed)),
            " of the ",
            tf.strings.as_string(listed),
            f" records {METADATA_FILENAME} lists",
        ]
    )
    cause = tf.where(
        present,
        tf.where(
            readable >= listed,
            "a second read got all of them, so the failure was probably a transient read error",
            "the rest is corrupt, truncated or unreadable, and TFRecord reading cannot resume "
            "inside a file",
        ),
        "the file does not exist: its output was replaced by another conversion (or the file deleted) "
        "while this dataset was reading it; rebuild the dataset to read the new output",
    )
    if skip_corrupt:
        line = ["recordprep: skip_corrupt: skipped the rest of damaged shard ", path]
        tf.print(tf.strings.join([*line, ": ", counts, "; ", cause]), output_stream=sys.stderr)
        return path
    message = tf.strings.join(
        [
            "recordprep: shard ",
            path,
            " is damaged: ",
            counts,
            "; ",
            cause,
            ". If TensorFlow reported a read error it is logged above as a warning ('Error "
            "raised with error message ...'). Re-run the conversion (or restore the file), or "
            "pass skip_corrupt=True to train without the rest of it.",
        ]
    )
    tf.debugging.Assert(tf.constant(False), [message], summarize=1)
    return path


def read_shard_fn(compression: str, buffer_bytes: int, skip_corrupt: bool, block: int,
                   scheme: str = ""):
    """``(path, escaped, num_records) -> blocks of up to `block` records``, noticing early ends.

    Records leave a shard in blocks (vectors) so the interleave, whose
    per-element synchronization is the costliest per-record step of the
    pipeline, handles one element per block (docs/benchmarks.md#design-readers);
    ``rebatch`` later cuts the blocks into windows or batches.

    The shard is read as ``records ++ tail``, limited to ``num_records``
    records. A complete shard fills the limit, so ``tail`` is never touched
    and costs nothing. A shard that ends early (any read error ends the
    stream: ``ignore_errors`` after ``TFRecordDataset``, which moves past the
    file on error) pulls one element from ``tail``, which counts what a
    second read of the file gets (only on failure, with dataset ops only:
    ``Dataset.reduce`` would make the pipeline stateful, and stateful
    pipelines cannot be checkpointed) and then either fails with a message
    naming the file or, with ``skip_corrupt``, reports it and yields nothing.

    ``scheme`` is the shards' URL scheme (``""`` locally): whether a missing
    shard must be found before it is opened (see ``read``).
    """
    compression_type = "GZIP" if compression == "GZIP" else ""
    check_before_open = scheme not in _OPENS_MISSING_FILES

    @plain
    def read(path: tf.Tensor, escaped: tf.Tensor, num_records: tf.Tensor) -> tf.data.Dataset:
        # ignore_errors retries a file that fails to *open* forever (TFRecordDataset
        # only moves past a file on read errors), so a missing file is left out
        # here: one stat, through a glob of the path with its metacharacters escaped.
        # The stat is the first element of the shard's own pipeline, not an op of
        # this function: the interleave calls this function for one shard after
        # another in a single thread, so a stat here (a request on gs://) serialized
        # every shard open (docs/benchmarks.md#design-readers); inside the pipeline it runs in the interleave's
        # parallel workers.
        # The glob's result is the file vector itself: [path], or [] once it is gone.
        # On gs:// a missing object fails at its first read, not at the open, so the
        # early-end check below catches it: there the glob (a listing request, one
        # time to first byte before the shard's own requests could start, at
        # every epoch's start) is left out.
        if not check_before_open:
            return records(path, escaped, num_records, tf.reshape(path, [1]))
        presence = tf.data.Dataset.from_tensors(escaped).map(plain(tf.io.matching_files))
        return presence.flat_map(plain(lambda files: records(path, escaped, num_records, files)))

    def records(path: tf.Tensor, escaped: tf.Tensor, num_records: tf.Tensor,
                files: tf.Tensor) -> tf.data.Dataset:

        def open_records(log: bool) -> tf.data.Dataset:
            return _tfrecords(files, compression_type, buffer_bytes).ignore_errors(log_warning=log)

        # The tail: one element, the sizes of 1024-record chunks of a second read.
        recount = (
            open_records(False).batch(1024).map(plain(lambda b: tf.size(b, out_type=tf.int64)))
        )
        recount = recount.concatenate(tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)))
        # Whether the file exists is asked again here, on the failure path only.
        tail = recount.batch(1 << 40).map(
            plain(lambda sizes: _on_early_end(
                path, num_records, sizes, tf.size(tf.io.matching_files(escaped)) > 0, skip_corrupt))
        )
        tail = tail.skip(1)  # runs the check, yields nothing (a filter would trace one more function)
        return open_records(True).concatenate(tail).take(num_records).batch(block)

    return read


def _verify_shards(
    paths: Sequence[str],
    listed_bytes: Sequence[int],
    *,
    remote: bool,
    threads: int,
    skip_corrupt: bool,
) -> None:
    """Stat every shard before reading: missing ones and size mismatches fail at once, by name.

    ``num_bytes`` in the metadata is the shard's size on disk (what
    ``recordprep verify`` checks too), so a truncated or replaced file shows
    up here without reading it. With ``skip_corrupt`` a size mismatch is only
    logged (the read-time check then skips what cannot be read).
    """
    if remote and len(paths) > 1:
        with concurrent.futures.ThreadPoolExecutor(
            max_workers=min(32, max(1, threads), len(paths))
        ) as pool:
            sizes = list(pool.map(_io.size, paths))
    else:
        sizes = [_io.size(p) for p in paths]
    missing = [p for p, size in zip(paths, sizes, strict=True) if size is None]
    if missing:
        shown = "\n  ".join(missing[:10]) + ("\n  ..." if len(missing) > 10 else "")
        raise ShardNotFoundError(
            f"{len(missing)} of the {len(paths)} shard(s) listed in {METADATA_FILENAME} do not exist:\n"
            f"  {shown}\nEither another conversion replaced the output after its metadata was read "
            f"(build the dataset again to read the new one), or the output was partly deleted. "
            f"Re-run the conversion (or restore the files)."
        )
    wrong = [
        f"{p}: {size} bytes on disk, {METADATA_FILENAME} says {want}"
        for p, size, want in zip(paths, sizes, listed_bytes, strict=True)
        if want > 0 and size != want
    ]
    if wrong:
        shown = "\n  ".join(wrong[:10]) + ("\n  ..." if len(wrong) > 10 else "")
        if skip_corrupt:
            logger.warning(
                "skip_corrupt=True: %d shard(s) differ in size from the metadata and "
                "will be read as far as possible:\n  %s",
                len(wrong),
                shown,
            )
            return
        raise ShardMismatchError(
            f"{len(wrong)} shard(s) differ in size from {METADATA_FILENAME}:\n  {shown}\n"
            f"They were truncated or replaced after the conversion finished. Re-run the "
            f"conversion (or restore the files); skip_corrupt=True trains on what is readable."
        )


def _stage_if_needed(sel: ShardSelection, shards: Sequence[Any], opts: ReadOptions) -> str:
    if not _io.is_staged(sel.root):
        return sel.root
    cache_root = None
    cache_dir = getattr(opts, f"{store_for(sel.root).cache_name}_cache_dir")
    if cache_dir:
        from pathlib import Path

        cache_root = Path(cache_dir).expanduser()
    return staging.stage(
        sel.root,
        [s.file for s in shards],
        sel.info.dumps().encode("utf-8"),
        cache_root=cache_root,
        threads=opts.staging_threads,
    )


def open_shards(sel: ShardSelection, shards: Sequence[Any], opts: ReadOptions, skip_corrupt: bool):
    """Where to read ``shards`` and how: ``(paths, counts, remote, cycle_length,
    num_parallel_calls, read_buffer_bytes)``. HDFS and S3 shards are staged to local
    disk first (then read as local); shard files are checked against the
    metadata when ``opts.verify_files``."""
    remote = opts.is_remote(sel.root)
    root = _stage_if_needed(sel, shards, opts)
    if root != sel.root:
        remote = False  # staged: read from local disk
    paths = [_io.join(root, s.file) for s in shards]
    counts = [s.num_records for s in shards]
    if opts.verify_files:
        _verify_shards(paths, [s.num_bytes for s in shards], remote=remote,
                       threads=opts.staging_threads, skip_corrupt=skip_corrupt)
    cycle_length = opts.resolved_cycle_length(len(paths), remote=remote)
    parallel = opts.resolved_num_parallel_calls(cycle_length, remote=remote)
    scheme = paths_scheme(paths) if remote else ""
    return paths, counts, remote, cycle_length, parallel, opts.resolved_read_buffer_bytes(remote=remote, scheme=scheme)


def tf_options(*, sharded_by_reader: bool, opts: ReadOptions) -> tf.data.Options:
    o = tf.data.Options()
    # Only the shard interleave may overtake (it states its own `deterministic`):
    # every other stage, including maps that map_parallelization makes parallel,
    # keeps its order, so epochs stay apart in both shuffle modes.
    o.deterministic = True
    o.autotune.enabled = True
    o.experimental_optimization.map_parallelization = True
    o.experimental_optimization.parallel_batch = True
    o.experimental_distribute.auto_shard_policy = (
        tf.data.experimental.AutoShardPolicy.OFF
        if sharded_by_reader
        else tf.data.experimental.AutoShardPolicy.DATA
    )
    if opts.private_threadpool_size:
        o.threading.private_threadpool_size = opts.private_threadpool_size
    return o


