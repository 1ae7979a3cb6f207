"""``tf.data`` pipelines over recordprep outputs: :func:`train_dataset` and :func:`eval_dataset`.

Contract:

- The shard list comes from ``dataset_info.json``, filtered by the pattern,
  never from a glob of the storage; every shard is checked to exist with its
  listed size before reading (``ReadOptions.verify_files``).
- Training: shard order reshuffled every epoch, ``cycle_length`` shards
  interleaved in blocks of ``block_length`` records, records shuffled
  (``shuffle_mode`` window or buffer) *before* the repeat, so epochs never mix;
  then batch, one vectorized parse per batch, label split, prefetch. Only the
  shard interleave may reorder (``deterministic=False``); seeded runs with
  ``deterministic=True`` reproduce exactly, and iterators can be checkpointed.
- ``input_context`` shards by file (pipeline ``i`` of ``n`` reads shards
  ``i, i+n, ...``), falling back to record-level sharding with a warning when
  there are fewer shards than pipelines.
- A shard that yields fewer records than the metadata lists (corrupt,
  truncated, deleted mid-read) fails the pipeline with
  ``tf.errors.InvalidArgumentError`` "recordprep: shard <path> is damaged: read
  K of the N records ..." (a ``tf.data`` graph can raise only its own ops'
  errors), or with ``skip_corrupt`` is reported and its rest dropped.
- Evaluation: shards in metadata order, one deterministic pass.

The stages, their order and why, damaged-shard handling, remote storage and
checkpoint sizes are documented in docs/reading.md.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from convert.spec import (
    METADATA_FILENAME,
    PACKED_KEYS,
    DatasetInfo,
    FeatureSpec,
    SpecError,
)
from readers import _io, _staging
from readers.errors import ShardMismatchError, ShardNotFoundError
from readers.info import ShardSelection, label_and_features, select_shards
from readers.options import ReadOptions

logger = logging.getLogger("readers")

_TF_DTYPES = {"float32": tf.float32, "int64": tf.int64, "string": tf.string}
_NP_DTYPES = {"float32": np.float32, "int64": np.int64, "string": object}


class _FromMetadata:
    """Default of ``label_key``: use ``dataset_info.json``'s ``label_key``."""

    def __repr__(self) -> str:
        return "<label_key from dataset_info.json>"


FROM_METADATA: Any = _FromMetadata()


# --------------------------------------------------------------------------- parsing


def _fixed_len_feature(spec: FeatureSpec) -> tf.io.FixedLenFeature:
    dtype = _TF_DTYPES[spec.dtype]
    if spec.default is None:
        return tf.io.FixedLenFeature(spec.shape, dtype)
    values = np.asarray(spec.default, dtype=_NP_DTYPES[spec.dtype])
    if values.size == 1 and spec.size != 1:
        values = np.full(spec.shape, values.reshape(()).item(), dtype=_NP_DTYPES[spec.dtype])
    elif values.size != spec.size:
        raise SpecError(
            f"feature {spec.name!r}: default has {values.size} value(s) but shape {spec.shape} "
            f"needs {spec.size} (or one to broadcast); the metadata is inconsistent, re-run the conversion"
        )
    return tf.io.FixedLenFeature(spec.shape, dtype, default_value=values.reshape(spec.shape))


def feature_spec(info: DatasetInfo, names: Sequence[str]) -> dict[str, tf.io.FixedLenFeature]:
    """The ``tf.io.parse_example`` spec for ``names`` (fixed shapes, metadata defaults)."""
    return {name: _fixed_len_feature(info.feature(name)) for name in names}


# The functions given to tf.data below use no Python control flow on tensors,
# so AutoGraph is switched off for them: converting them is source transformation
# at every dataset build, most of the time to first batch (docs/benchmarks.md#design-readers).
_plain = tf.autograph.experimental.do_not_convert


def parse_plan(info: DatasetInfo, names: Sequence[str]) -> tuple[dict[str, tf.io.FixedLenFeature], Any]:
    """How to get ``names`` out of a batch of serialized Examples.

    Returns ``(spec, unpack)``: the ``tf.io.parse_example`` spec of what is on
    disk, and a function from that parse's result to one tensor per name
    (shape ``(batch, *feature.shape)``). With the ``features`` layout the spec
    is :func:`feature_spec` and ``unpack`` returns its input; with ``packed``
    the spec holds the packed Features (``convert.spec.PACKED_KEYS``) and
    ``unpack`` slices each feature out of them.
    """
    slices = info.packing
    if slices is None:
        return feature_spec(info, names), (lambda parsed: parsed)
    where = {name: (dtype, i) for dtype, parts in slices.items() for i, (name, _, _) in enumerate(parts)}
    spec: dict[str, tf.io.FixedLenFeature] = {}
    for name in names:
        if name in where:
            dtype = where[name][0]
            spec[PACKED_KEYS[dtype]] = tf.io.FixedLenFeature([sum(w for *_, w in slices[dtype])], _TF_DTYPES[dtype])
        else:
            spec[name] = _fixed_len_feature(info.feature(name))
    shapes = {name: info.feature(name).shape for name in names}

    def unpack(parsed: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        # One split per packed Feature (not a slice per feature): fewer ops to
        # trace, so building the pipeline stays quick.
        pieces = {dtype: tf.split(parsed[PACKED_KEYS[dtype]], [w for *_, w in slices[dtype]], axis=1)
                  for dtype in slices if PACKED_KEYS[dtype] in parsed}
        out = {}
        for name in names:
            if name not in where:
                out[name] = parsed[name]
                continue
            t = pieces[where[name][0]][where[name][1]]
            out[name] = t if len(shapes[name]) == 1 else tf.reshape(t, [-1, *shapes[name]])
        return out

    return spec, unpack


def _parse_fixed(serialized: tf.Tensor, spec: dict[str, tf.io.FixedLenFeature]) -> dict[str, tf.Tensor]:
    """``tf.io.parse_example(serialized, spec)`` for a spec of ``FixedLenFeature``s only.

    The same ``ParseExampleV2`` op that function builds, called directly so
    that features without a default share one empty default per dtype: its
    wrapper makes a graph constant per feature, a measurable share of the
    time to the first batch (docs/benchmarks.md#design-readers). Same results
    (tests/test_readers_dataset.py compares the two).
    """
    keys = sorted(spec)
    # One constant per distinct default, already in the feature's shape
    # (tf.constant reshapes it): a reshape per feature was 2 more graph ops each.
    consts: dict[tuple[Any, ...], tf.Tensor] = {}
    defaults = []
    for k in keys:
        f = spec[k]
        if f.default_value is None:
            key: tuple[Any, ...] = (f.dtype, None)
            if key not in consts:
                consts[key] = tf.constant([], f.dtype)
        else:
            value = np.asarray(f.default_value, f.dtype.as_numpy_dtype).reshape(f.shape)
            raw = repr(value.tolist()) if value.dtype == object else value.tobytes()
            key = (f.dtype, value.shape, raw)
            if key not in consts:
                consts[key] = tf.constant(value, f.dtype)
        defaults.append(consts[key])
    no_keys = tf.constant([], tf.string)
    out = tf.raw_ops.ParseExampleV2(
        serialized=serialized,
        names=no_keys,
        sparse_keys=no_keys,
        dense_keys=tf.constant(keys, tf.string),
        ragged_keys=no_keys,
        dense_defaults=defaults,
        num_sparse=0,
        sparse_types=[],
        ragged_value_types=[],
        ragged_split_types=[],
        dense_shapes=[spec[k].shape for k in keys],
    )
    return dict(zip(keys, out.dense_values, strict=True))


def _make_parse_fn(plan: tuple[dict[str, tf.io.FixedLenFeature], Any], label_key: str | None):
    parse_spec, unpack = plan

    @_plain
    def parse(serialized: tf.Tensor):
        parsed = unpack(_parse_fixed(serialized, parse_spec))
        if label_key is None:
            return parsed
        label = parsed.pop(label_key)
        return parsed, label

    return parse


def _parse_batches(batches: tf.data.Dataset, plan: tuple[dict[str, tf.io.FixedLenFeature], Any],
                   label: str | None, prefetch: int) -> tf.data.Dataset:
    """Parse each batch of serialized records with one vectorized parse (the
    batch-then-parse form of map-and-batch), then prefetch: the tail both
    readers share.

    The parse keeps batch order even for ``deterministic=False`` reads: every
    batch costs the same to parse, so overtaking buys nothing here, while
    reordered batches would carry records of the next epoch ahead of the
    current one's last batches (shuffle before repeat must keep epochs apart).
    """
    batches = batches.map(_make_parse_fn(plan, label), num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return batches.prefetch(prefetch)


def _permute_windows(windows: tf.data.Dataset, seed: int | None) -> tf.data.Dataset:
    """Each window permuted at random as one tensor (``ReadOptions.shuffle_mode="window"``).

    One vectorized permutation per window replaces tf.data's per-record
    shuffle buffer. It is stateless, seeded by a ``Dataset.random`` stream
    zipped in *after* the repeat: one stream per iterator, so seeded runs
    reproduce, every window of every epoch gets its own seed, and the stream's
    position is part of an iterator checkpoint (a stream inside the repeat is
    re-created each epoch, and its per-epoch reseeding does not survive a
    restore).
    """
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip(windows, seeds).map(
        _plain(lambda records, s: tf.random.experimental.stateless_shuffle(records, s))
    )


def _glob_escape(path: str) -> str:
    """``path`` as a ``tf.io.matching_files`` pattern that matches only itself."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", path)


def _shard_tensors(paths: Sequence[str], counts: Sequence[int]) -> tuple[tf.Tensor, ...]:
    """``(paths, glob-escaped paths, num_records)``: one row per shard."""
    return (
        tf.constant(list(paths), tf.string),
        tf.constant([_glob_escape(p) for p in paths], tf.string),
        tf.constant(list(counts), tf.int64),
    )


def _shard_list(paths: Sequence[str], counts: Sequence[int]) -> tf.data.Dataset:
    """``(path, glob-escaped path, num_records)`` per shard: the input of :func:`_read_shard_fn`."""
    return tf.data.Dataset.from_tensor_slices(_shard_tensors(paths, counts))


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


def _scheme(paths: Sequence[str]) -> str:
    """The URL scheme of the shards (one output directory, so one scheme); ``""`` locally."""
    return _io.path_scheme(paths[0]) if paths else ""


@_plain
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


def _read_shard_fn(compression: str, buffer_bytes: int, skip_corrupt: bool, block: int,
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

    @_plain
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
        presence = tf.data.Dataset.from_tensors(escaped).map(_plain(tf.io.matching_files))
        return presence.flat_map(_plain(lambda files: records(path, escaped, num_records, files)))

    def records(path: tf.Tensor, escaped: tf.Tensor, num_records: tf.Tensor,
                files: tf.Tensor) -> tf.data.Dataset:

        def open_records(log: bool) -> tf.data.Dataset:
            return _tfrecords(files, compression_type, buffer_bytes).ignore_errors(log_warning=log)

        # The tail: one element, the sizes of 1024-record chunks of a second read.
        recount = (
            open_records(False).batch(1024).map(_plain(lambda b: tf.size(b, out_type=tf.int64)))
        )
        recount = recount.concatenate(tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)))
        # Whether the file exists is asked again here, on the failure path only.
        tail = recount.batch(1 << 40).map(
            _plain(lambda sizes: _on_early_end(
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
    cache_dir = {"hdfs": opts.hdfs_cache_dir, "viewfs": opts.hdfs_cache_dir, "s3": opts.s3_cache_dir,
                 "azfs": opts.azure_cache_dir}[_io.path_scheme(sel.root)]
    if cache_dir:
        from pathlib import Path

        cache_root = Path(cache_dir).expanduser()
    return _staging.stage(
        sel.root,
        [s.file for s in shards],
        sel.info.dumps().encode("utf-8"),
        cache_root=cache_root,
        threads=opts.staging_threads,
    )


def _open_shards(sel: ShardSelection, shards: Sequence[Any], opts: ReadOptions, skip_corrupt: bool):
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
    scheme = _scheme(paths) if remote else ""
    return paths, counts, remote, cycle_length, parallel, opts.resolved_read_buffer_bytes(remote=remote, scheme=scheme)


def _tf_options(*, sharded_by_reader: bool, opts: ReadOptions) -> tf.data.Options:
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


def _resolve_label(info: DatasetInfo, label_key: Any, features: Sequence[str] | None):
    key = info.label_key if isinstance(label_key, _FromMetadata) else label_key
    if key is not None and not isinstance(key, str):
        raise TypeError(f"label_key must be a feature name or None, found {key!r}")
    return label_and_features(info, key, features)


def _check_positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, found {value!r}")


def _cache_filename(cache_dir: str, sel: ShardSelection, paths: Sequence[str], extra: str) -> str:
    h = hashlib.sha256()
    for part in (sel.root, sel.split, sel.info.dumps(), extra, *paths):
        h.update(part.encode("utf-8"))
        h.update(b"\x00")
    return _io.join(cache_dir, f"{sel.split}-{h.hexdigest()[:16]}")


def _cache(records: tf.data.Dataset, cache: Any, sel: ShardSelection, paths: Sequence[str],
           extra: str) -> tf.data.Dataset:
    """``records`` cached in memory (``"memory"``) or in a file under the directory ``cache``."""
    if cache == "memory":
        return records.cache()
    cache_dir = os.fspath(cache)
    if _io.path_scheme(cache_dir):
        logger.warning("cache=%r is not a local directory; a remote cache is slow", cache_dir)
        tf.io.gfile.makedirs(cache_dir)
    else:
        os.makedirs(cache_dir, exist_ok=True)
    filename = _cache_filename(cache_dir, sel, paths, extra)
    if _io.exists(filename + "_0.lockfile"):
        logger.warning(
            "cache lock file %s_0.lockfile exists: another process is writing this cache, or "
            "one crashed while writing it. If none is running, delete the lock file.",
            filename,
        )
    logger.info("caching serialized records of split %r in %s.*", sel.split, filename)
    return records.cache(filename)


def _epochs_with_lookahead(paths: Sequence[str], counts: Sequence[int], one_pass, *,
                           num_epochs: int | None, seed: int | None, shuffle_files: bool,
                           window: int, ahead: int) -> tf.data.Dataset:
    """Epoch after epoch, the next ``ahead`` already started (``ReadOptions.epoch_lookahead``).

    Each epoch is its own pipeline (shard order, ``one_pass``, the cut into
    ``window``-record windows), made from one element of a seeded
    ``Dataset.random`` stream: seeded runs reproduce, every epoch and every
    new iterator reshuffles, and the stream's position is part of an iterator
    checkpoint. The shard order is a stateless permutation: a
    ``Dataset.shuffle`` inside the epoch's function cannot be checkpointed
    (its seed generator is stateful), which is also why buffer mode keeps
    ``repeat()``. The epochs go through an ordered interleave of one slot that
    prepares ``ahead`` input elements ahead: the next epochs open their shards
    and fill their first window in the background (their shards' first reads
    go on meanwhile), and each epoch's records follow the last of the one
    before. ``repeat()`` starts the next epoch only once the current one is
    exhausted, with nothing buffered.
    """
    shard_tensors = _shard_tensors(paths, counts)

    def epoch(seeds: tf.Tensor) -> tf.data.Dataset:
        columns = shard_tensors
        if shuffle_files:
            order = tf.random.experimental.stateless_shuffle(tf.range(len(paths)), seeds)
            columns = tuple(tf.gather(c, order) for c in columns)
        records = one_pass(tf.data.Dataset.from_tensor_slices(columns))
        return records.rebatch(window) if window else records

    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    if num_epochs is not None:
        seeds = seeds.take(num_epochs)
    return _in_order_interleave(seeds, _plain(epoch), cycle_length=1, block_length=1,
                                num_parallel_calls=1, buffer_output_elements=1,
                                prefetch_input_elements=ahead)


def _describe(kind: str, sel: ShardSelection, n_files: int, n_records: int, **kv: Any) -> None:
    logger.info(
        "%s: split %r of %s, %d shard(s), %d records (%s); %s",
        kind,
        sel.split,
        sel.root,
        n_files,
        n_records,
        sel.info.compression,
        ", ".join(f"{k}={v}" for k, v in kv.items()),
    )


#: eval_dataset reads records in blocks of this many, and each open shard
#: reads up to _EVAL_READAHEAD_BLOCKS blocks ahead of the consumer.
_EVAL_BLOCK = 256
_EVAL_READAHEAD_BLOCKS = 2


def _in_order_interleave(files, read, *, cycle_length, block_length, num_parallel_calls,
                         buffer_output_elements=_EVAL_READAHEAD_BLOCKS, prefetch_input_elements=None):
    """Shards in metadata order, each whole, while the next ones are already open and reading.

    A deterministic interleave whose ``block_length`` covers a whole shard
    emits shard 0 entirely, then shard 1, ... (when a shard ends, the cycle
    moves on and its slot takes the next shard). ``Dataset.interleave`` would
    let every open shard buffer ``2 * block_length + 1`` elements, i.e. whole
    shards in memory, so the per-shard read-ahead is bounded explicitly; the
    public API does not expose that knob, hence the fallbacks.
    ``prefetch_input_elements`` bounds how many elements of ``files`` are
    opened ahead of the cycle (``None``: TensorFlow's default).
    """
    ahead = {} if prefetch_input_elements is None else {"prefetch_input_elements": prefetch_input_elements}
    try:
        from tensorflow.python.data.ops import interleave_op

        return interleave_op._ParallelInterleaveDataset(  # same op as Dataset.interleave
            input_dataset=files,  # keywords: a reordered signature cannot swap cycle and block length
            map_func=read,
            cycle_length=cycle_length,
            block_length=block_length,
            num_parallel_calls=num_parallel_calls,
            buffer_output_elements=buffer_output_elements,
            deterministic=True,
            **ahead,
        )
    except (ImportError, AttributeError, TypeError) as e:
        logger.debug("private ParallelInterleaveDataset unavailable (%s); using the legacy op", e)
    legacy = getattr(tf.data.experimental, "parallel_interleave", None)
    if legacy is not None:
        return files.apply(
            legacy(
                read,
                cycle_length=cycle_length,
                block_length=block_length,
                sloppy=False,
                buffer_output_elements=buffer_output_elements,
                **ahead,
            )
        )
    return files.flat_map(read)  # sequential, same order


class _Share(NamedTuple):
    """This input pipeline's part of a split."""

    shards: list[Any]
    num_pipelines: int
    pipeline_id: int
    #: Too few shards to share out: every pipeline reads every shard and keeps
    #: every ``num_pipelines``-th record.
    record_level: bool

    def num_records(self, total: int) -> int:
        """How many of the ``total`` records of this pipeline's shards it keeps."""
        return len(range(self.pipeline_id, total, self.num_pipelines)) if self.record_level else total


def _train_options(
    batch_size: int,
    *,
    num_epochs: int | None,
    seed: int | None,
    cache: Any,
    options: ReadOptions | None,
    shuffle_buffer: int | None,
    service: str | None,
    deterministic: bool | None,
) -> tuple[ReadOptions, bool]:
    """Checks :func:`train_dataset`'s arguments: the options in effect and whether the order is kept."""
    _check_positive("batch_size", batch_size)
    if num_epochs is not None:
        _check_positive("num_epochs", num_epochs)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed must be an int or None, found {seed!r}")
    if cache is not None and not isinstance(cache, str | os.PathLike):
        raise TypeError(f"cache must be None, 'memory' or a local directory, found {cache!r}")
    if options is not None and not isinstance(options, ReadOptions):
        raise TypeError(f"options must be a readers.ReadOptions, found {type(options).__name__}")
    opts = options or ReadOptions()
    if shuffle_buffer is not None:
        opts = opts.replace(shuffle_buffer=shuffle_buffer)
    if service is not None:
        opts = opts.replace(service=service)
    return opts, opts.deterministic if deterministic is None else bool(deterministic)


def _pipeline_share(sel: ShardSelection, input_context: tf.distribute.InputContext | None) -> _Share:
    """The shards this input pipeline reads: every ``num_pipelines``-th one, or all
    of them (record-level sharding) when there are fewer shards than pipelines."""
    shards = list(sel.shards)
    num_pipelines, pipeline_id = 1, 0
    if input_context is not None:
        num_pipelines = int(input_context.num_input_pipelines)
        pipeline_id = int(input_context.input_pipeline_id)
    record_level_shard = False
    if num_pipelines > 1:
        if len(shards) >= num_pipelines:
            shards = shards[pipeline_id::num_pipelines]
            if len(sel.shards) % num_pipelines:
                logger.info(
                    "%d shards over %d input pipelines: pipelines get %d or %d shards (and record "
                    "counts differ accordingly)",
                    len(sel.shards),
                    num_pipelines,
                    len(sel.shards) // num_pipelines,
                    len(sel.shards) // num_pipelines + 1,
                )
        else:
            record_level_shard = True
            logger.warning(
                "only %d shard(s) in split %r for %d input pipelines: falling back to record-level "
                "sharding (each pipeline reads every shard and keeps every %d-th record, so reading "
                "costs %dx). Convert with at least %d shards (ideally several per pipeline) to shard "
                "by file.",
                len(shards),
                sel.split,
                num_pipelines,
                num_pipelines,
                num_pipelines,
                num_pipelines,
            )
    return _Share(shards, num_pipelines, pipeline_id, record_level_shard)


def _shuffles_files(opts: ReadOptions, n_files: int, share: _Share, seed: int | None) -> bool:
    """Whether the shard order is shuffled: with record-level sharding only with a
    seed, since every pipeline must read the shards in the same order."""
    shuffle_files = opts.shuffle_files and n_files > 1
    if share.record_level and shuffle_files and seed is None:
        logger.warning(
            "record-level sharding without a seed: shard order is not shuffled "
            "(pipelines must agree on it); pass seed= to shuffle it"
        )
        shuffle_files = False
    return shuffle_files


def _one_pass_fn(read, share: _Share, *, cycle_length: int, parallel: int, deterministic: bool,
                 window_mode: bool, block: int):
    """``files -> records`` of one epoch: the shards' blocks interleaved, then this
    pipeline's records. They leave as vectors of consecutive records of one shard
    in window mode and as single records in buffer mode (see
    ``ReadOptions.shuffle_mode``), never one element per record in window mode."""
    # Record-level sharding needs the same record order in every pipeline.
    interleave_det = deterministic or share.record_level

    def one_pass(files: tf.data.Dataset) -> tf.data.Dataset:
        records = files.interleave(
            read,
            cycle_length=cycle_length,
            block_length=1,
            num_parallel_calls=parallel,
            deterministic=interleave_det,
        )
        if share.record_level:
            records = records.unbatch().shard(share.num_pipelines, share.pipeline_id)
            if window_mode:
                records = records.batch(block)
        elif not window_mode:
            records = records.unbatch()
        return records

    return one_pass


def _shuffled_epochs(one_pass, paths: Sequence[str], counts: Sequence[int], *, lookahead: int, total: int,
                     buffer: int, window_mode: bool, shuffle_files: bool, seed: int | None, num_epochs: int | None,
                     skip_corrupt: bool, cache: Any, cache_sel: ShardSelection, cache_key: str) -> tf.data.Dataset:
    """All epochs' records, shuffled: window mode permutes ``buffer``-record
    windows, buffer mode shuffles in a ``buffer``-record buffer. With
    ``lookahead`` > 0 that many next epochs start while the current one is read
    (:func:`_epochs_with_lookahead`), else epochs follow through ``repeat()``."""
    window_shuffle = window_mode and buffer > 1
    if lookahead:
        records = _epochs_with_lookahead(
            paths, counts, one_pass, num_epochs=num_epochs, seed=seed,
            shuffle_files=shuffle_files, window=buffer if window_shuffle else 0, ahead=lookahead,
        )
    else:
        records = _repeated_epochs(
            one_pass, paths, counts, total=total, buffer=buffer, window_mode=window_mode,
            shuffle_files=shuffle_files, seed=seed, num_epochs=num_epochs, skip_corrupt=skip_corrupt,
            cache=cache, cache_sel=cache_sel, cache_key=cache_key,
        )
    return _permute_windows(records, seed) if window_shuffle else records


def _repeated_epochs(one_pass, paths: Sequence[str], counts: Sequence[int], *, total: int, buffer: int,
                     window_mode: bool, shuffle_files: bool, seed: int | None, num_epochs: int | None,
                     skip_corrupt: bool, cache: Any, cache_sel: ShardSelection, cache_key: str) -> tf.data.Dataset:
    """Epochs one after the other through ``repeat()``: shard order shuffled, one
    pass read (and cached), cut into ``buffer``-record windows (window mode) or
    shuffled in a ``buffer``-record buffer."""
    files = _shard_list(paths, counts)
    if shuffle_files:
        files = files.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
    records = one_pass(files)
    if not window_mode and not skip_corrupt and num_epochs is not None:
        # The count is exact (a shard that ends early fails above), so the dataset's
        # cardinality can be known: model.fit then shows real progress.
        records = records.apply(tf.data.experimental.assert_cardinality(total))
    if cache is not None:
        records = _cache(records, cache, cache_sel, paths, cache_key)
    if window_mode and buffer > 1:
        # Windows of `buffer` consecutive records; an epoch's last one is short, so epochs stay apart.
        records = records.rebatch(buffer)
    elif buffer > 1:
        records = records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
    if num_epochs is None:
        records = records.repeat()
    elif num_epochs > 1:
        records = records.repeat(num_epochs)
    return records


def _train_batches(records: tf.data.Dataset, batch_size: int, *, window_mode: bool, drop_remainder: bool,
                   num_epochs: int | None, total: int, skip_corrupt: bool) -> tf.data.Dataset:
    """Batches of serialized records, their cardinality stated where it is known."""
    if not window_mode:
        return records.batch(batch_size, drop_remainder=drop_remainder)
    batches = records.rebatch(batch_size, drop_remainder=drop_remainder)
    # rebatch and the epochs' interleave lose the cardinality; state it as a
    # plain batch() after repeat() knows it.
    if num_epochs is None:
        if total > 0:  # a pipeline left without records (record-level sharding) is empty
            batches = batches.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    elif not skip_corrupt:  # the counts are exact (see above)
        n = total * num_epochs
        known = n // batch_size if drop_remainder else -(-n // batch_size)
        batches = batches.apply(tf.data.experimental.assert_cardinality(known))
    return batches


# --------------------------------------------------------------------------- public


def train_dataset(
    pattern: str,
    batch_size: int = 256,
    *,
    split: str | None = None,
    label_key: str | None = FROM_METADATA,
    features: Sequence[str] | None = None,
    shuffle_buffer: int | None = None,
    seed: int | None = None,
    num_epochs: int | None = None,
    cache: str | None = None,
    deterministic: bool | None = None,
    drop_remainder: bool = True,
    input_context: tf.distribute.InputContext | None = None,
    skip_corrupt: bool = False,
    options: ReadOptions | None = None,
    service: str | None = None,
) -> tf.data.Dataset:
    """A shuffled, repeated, batched and parsed training dataset, ready for ``model.fit``.

    Args:
      pattern: shard pattern (``out/train-*``, ``gs://b/out/train-*.tfrecord.gz``)
        or the output directory (then ``split`` says which split, unless the
        dataset has one). The shard list comes from ``dataset_info.json``.
      batch_size: records per batch (per input pipeline: with
        ``distribute_datasets_from_function`` pass the per-replica size,
        ``input_context.get_per_replica_batch_size(global_batch)``).
      split: split name, to read a directory or disambiguate a pattern.
      label_key: feature returned as the label; default the metadata's
        ``label_key``; ``None`` yields only the features dict.
      features: subset of features to parse (default: all but the label).
        Unparsed features cost no parse time.
      shuffle_buffer: records shuffled together (the window, or with
        ``options.shuffle_mode="buffer"`` the buffer; see
        :class:`ReadOptions`); default ``options.shuffle_buffer`` (10 000); 0
        disables record shuffling.
      seed: seeds the shard and record shuffles. With ``deterministic=True``
        the order is then identical on every run.
      num_epochs: passes over the data; ``None`` repeats forever (give
        ``model.fit`` a ``steps_per_epoch``). With a number, the dataset's
        cardinality is known.
      cache: ``None``; ``"memory"`` (cache serialized records in RAM after the
        first pass); or a local directory to cache them in a file there (the
        file name is derived from the shards read, so different datasets do
        not collide).
      deterministic: keep a reproducible element order (slower when one read
        or batch stalls). Default ``options.deterministic`` (False).
      drop_remainder: drop the last partial batch (static batch dimension,
        needed e.g. on TPU). Only matters with ``num_epochs``.
      input_context: ``tf.distribute.InputContext``; the pipeline then reads
        only its share of the shards.
      skip_corrupt: skip the rest of a damaged shard instead of failing
        (docs/reading.md#damaged-shards: everything after a corrupt record in that file
        is lost; each skipped shard is reported on stderr).
      options: :class:`ReadOptions`; default picks local/remote settings from
        the pattern.
      service: a tf.data service dispatcher (``"grpc://host:port"``): read,
        shuffle, batch and parse on its workers (``ReadOptions.service``;
        sharding policy, job sharing and what holds through the service:
        :mod:`readers.service`).

    Returns:
      ``tf.data.Dataset`` of ``(features_dict, label)``, or ``features_dict``
      when there is no label. Tensors have shape ``(batch, *feature.shape)``.

    Raises (when building; damage found while reading raises
    ``tf.errors.InvalidArgumentError`` naming the shard, see docs/reading.md#damaged-shards):
      DatasetIncompleteError: no ``dataset_info.json`` (conversion unfinished
        or failed; :class:`DatasetFailedError` if the converter said why).
      ShardSelectionError: the pattern/split selects nothing or several splits.
      ShardNotFoundError: a listed shard is missing.
      ShardMismatchError: a shard's size differs from the metadata (truncated
        or replaced; only logged with ``skip_corrupt``).
      SpecError: metadata damaged or from a newer recordprep.

    Example, one input pipeline per worker under a ``tf.distribute`` strategy::

        def make(ctx):
            return readers.train_dataset(
                "gs://b/out/train-*", ctx.get_per_replica_batch_size(1024),
                seed=7, input_context=ctx)

        ds = strategy.distribute_datasets_from_function(make)
    """
    opts, det = _train_options(
        batch_size, num_epochs=num_epochs, seed=seed, cache=cache, options=options,
        shuffle_buffer=shuffle_buffer, service=service, deterministic=deterministic)

    sel = select_shards(str(pattern), split)
    label, specs = _resolve_label(sel.info, label_key, features)
    parse_names = [s.name for s in specs] + ([label] if label is not None else [])
    plan = parse_plan(sel.info, parse_names)  # unknown names fail here, before any reading
    if opts.service is not None:
        from readers import service as _service

        return _service.train_dataset(
            sel, plan, label, batch_size=batch_size, seed=seed, num_epochs=num_epochs, deterministic=det,
            drop_remainder=drop_remainder, skip_corrupt=skip_corrupt, cache=cache,
            input_context=input_context, opts=opts)

    share = _pipeline_share(sel, input_context)
    paths, counts, remote, cycle_length, parallel, buffer_bytes = _open_shards(sel, share.shards, opts, skip_corrupt)
    shuffle_files = _shuffles_files(opts, len(paths), share, seed)
    read = _read_shard_fn(
        sel.info.compression, buffer_bytes, skip_corrupt=skip_corrupt, block=opts.block_length,
        scheme=_scheme(paths),
    )
    if skip_corrupt:
        logger.warning(
            "skip_corrupt=True: a damaged shard is read up to its first bad record and the rest of "
            "it is skipped; each skip is reported on stderr as 'recordprep: skip_corrupt: ...'"
        )
    window_mode = opts.shuffle_mode == "window"
    total = share.num_records(sum(counts))
    one_pass = _one_pass_fn(read, share, cycle_length=cycle_length, parallel=parallel, deterministic=det,
                            window_mode=window_mode, block=opts.block_length)

    buffer = min(opts.shuffle_buffer, total)
    # Window mode only (see _epochs_with_lookahead); not with skip_corrupt or without
    # records: an epoch that yields nothing must end the dataset, as repeat() does,
    # instead of starting the next empty epoch forever.
    lookahead = opts.resolved_epoch_lookahead(remote=remote, read_bytes=sum(s.num_bytes for s in share.shards))
    if not (window_mode and cache is None and num_epochs != 1 and not skip_corrupt and total > 0):
        lookahead = 0
    elif num_epochs is not None:
        lookahead = min(lookahead, num_epochs - 1)
    records = _shuffled_epochs(
        one_pass, paths, counts, lookahead=lookahead, total=total, buffer=buffer, window_mode=window_mode,
        shuffle_files=shuffle_files, seed=seed, num_epochs=num_epochs, skip_corrupt=skip_corrupt,
        cache=cache, cache_sel=sel,
        cache_key=f"{share.pipeline_id}/{share.num_pipelines}/{share.record_level}/{skip_corrupt}/{opts.shuffle_mode}",
    )
    batches = _train_batches(records, batch_size, window_mode=window_mode, drop_remainder=drop_remainder,
                             num_epochs=num_epochs, total=total, skip_corrupt=skip_corrupt)
    batches = _parse_batches(batches, plan, label, opts.prefetch)
    _describe(
        "train_dataset",
        sel,
        len(paths),
        total,
        cycle_length=cycle_length,
        parallel_reads=parallel,
        read_buffer=buffer_bytes,
        shuffle_buffer=buffer,
        shuffle_mode=opts.shuffle_mode,
        deterministic=det,
        remote=remote,
        epoch_lookahead=lookahead,
        pipeline=f"{share.pipeline_id}/{share.num_pipelines}"
        + (" (record-level)" if share.record_level else ""),
    )
    return batches.with_options(
        _tf_options(sharded_by_reader=input_context is not None, opts=opts)
    )


def eval_dataset(
    pattern: str,
    batch_size: int = 256,
    *,
    split: str | None = None,
    label_key: str | None = FROM_METADATA,
    features: Sequence[str] | None = None,
    options: ReadOptions | None = None,
) -> tf.data.Dataset:
    """A single, deterministic pass for ``model.evaluate`` / ``model.predict``.

    Records come in metadata order (shard by shard, as listed, each in file
    order), so predictions line up with the shards. The next
    ``cycle_length - 1`` shards are already open and reading ahead (a bounded
    256 records each), so remote latency overlaps. The last partial
    batch is kept, and ``dataset.cardinality()`` is
    ``ceil(num_records / batch_size)``, so Keras shows real progress.

    Args: ``pattern``, ``batch_size``, ``split``, ``label_key``, ``features``
    and ``options`` as in :func:`train_dataset`. A damaged shard always fails
    (no skipping: the cardinality and the alignment with the shards would be
    wrong).

    Returns:
      ``tf.data.Dataset`` of ``(features_dict, label)`` or ``features_dict``.

    Raises: as :func:`train_dataset`.
    """
    _check_positive("batch_size", batch_size)
    if options is not None and not isinstance(options, ReadOptions):
        raise TypeError(f"options must be a readers.ReadOptions, found {type(options).__name__}")
    opts = options or ReadOptions()
    sel = select_shards(str(pattern), split)
    label, specs = _resolve_label(sel.info, label_key, features)
    parse_names = [s.name for s in specs] + ([label] if label is not None else [])
    plan = parse_plan(sel.info, parse_names)  # unknown names fail here, before any reading

    shards = list(sel.shards)
    paths, counts, remote, cycle_length, parallel, buffer_bytes = _open_shards(sel, shards, opts, False)
    files = _shard_list(paths, counts)
    records = _in_order_interleave(
        files,
        _read_shard_fn(sel.info.compression, buffer_bytes, skip_corrupt=False, block=_EVAL_BLOCK,
                       scheme=_scheme(paths)),
        cycle_length=cycle_length,
        block_length=-(-max(counts) // _EVAL_BLOCK),  # blocks per shard, rounded up
        num_parallel_calls=parallel,
    )
    total = sum(counts)
    # rebatch slices the 256-record blocks into batches without a per-record element.
    batches = records.rebatch(batch_size).apply(
        tf.data.experimental.assert_cardinality(-(-total // batch_size)))
    batches = _parse_batches(batches, plan, label, opts.prefetch)
    _describe(
        "eval_dataset",
        sel,
        len(paths),
        total,
        cycle_length=cycle_length,
        parallel_reads=parallel,
        read_buffer=buffer_bytes,
        batches=math.ceil(total / batch_size),
    )
    return batches.with_options(_tf_options(sharded_by_reader=False, opts=opts))
