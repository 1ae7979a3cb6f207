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

import hashlib
import logging
import math
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import tensorflow as tf

from readers import _io
from readers import service as _service
from readers.info import ShardSelection, select_shards
from readers.options import ReadOptions, TrainRequest, check_positive
from readers.parsing import FROM_METADATA, parse_batches, parse_plan, plain, resolve_label
from readers.shards import (
    open_shards,
    paths_scheme,
    read_shard_fn,
    shard_list,
    shard_tensors,
    tf_options,
)

__all__ = ["eval_dataset", "parse_plan", "train_dataset"]

logger = logging.getLogger("readers")


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
        plain(lambda records, s: tf.random.experimental.stateless_shuffle(records, s))
    )


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
    tensors = shard_tensors(paths, counts)

    def epoch(seeds: tf.Tensor) -> tf.data.Dataset:
        columns = tensors
        if shuffle_files:
            order = tf.random.experimental.stateless_shuffle(tf.range(len(paths)), seeds)
            columns = tuple(tf.gather(c, order) for c in columns)
        records = one_pass(tf.data.Dataset.from_tensor_slices(columns))
        return records.rebatch(window) if window else records

    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    if num_epochs is not None:
        seeds = seeds.take(num_epochs)
    return _in_order_interleave(seeds, plain(epoch), cycle_length=1, block_length=1,
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
    files = shard_list(paths, counts)
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
      batch_size: records per batch, per input pipeline (under a strategy,
        ``input_context.get_per_replica_batch_size(global_batch)``).
      split: split name, to read a directory or disambiguate a pattern.
      label_key: feature returned as the label; default the metadata's
        ``label_key``; ``None`` yields only the features dict.
      features: subset of features to parse (default: all but the label).
      shuffle_buffer: records shuffled together (:class:`ReadOptions`'s window or
        buffer); default ``options.shuffle_buffer`` (10 000); 0: no shuffle.
      seed: seeds the shard and record shuffles. With ``deterministic=True``
        the order is then identical on every run.
      num_epochs: passes over the data (the cardinality is then known);
        ``None`` repeats forever (give ``model.fit`` a ``steps_per_epoch``).
      cache: ``None``; ``"memory"`` (serialized records in RAM after the first
        pass); or a local directory (a file named after the shards read).
      deterministic: keep a reproducible element order (slower when one read
        or batch stalls). Default ``options.deterministic`` (False).
      drop_remainder: drop the last partial batch (static batch dimension,
        needed e.g. on TPU). Only matters with ``num_epochs``.
      input_context: ``tf.distribute.InputContext``; the pipeline then reads
        only its share of the shards.
      skip_corrupt: skip the rest of a damaged shard instead of failing
        (docs/reading.md#damaged-shards: everything after a corrupt record in that file
        is lost; each skipped shard is reported on stderr).
      options: :class:`ReadOptions`; default: local or remote ones by the pattern.
      service: a tf.data service dispatcher (``"grpc://host:port"``): read,
        shuffle, batch and parse on its workers (``ReadOptions.service``;
        sharding policy, job sharing and what holds through the service:
        :mod:`readers.service`).

    Returns:
      ``tf.data.Dataset`` of ``(features_dict, label)``, or ``features_dict``
      when there is no label. Tensors have shape ``(batch, *feature.shape)``.

    Raises (when building; damage found while reading raises
    ``tf.errors.InvalidArgumentError`` naming the shard, see docs/reading.md#damaged-shards):
      DatasetIncompleteError: no ``dataset_info.json`` (unfinished or failed:
        :class:`DatasetFailedError` if the converter said why).
      ShardSelectionError: the pattern/split selects nothing or several splits.
      ShardNotFoundError: a listed shard is missing.
      ShardMismatchError: a shard's size differs from the metadata (truncated
        or replaced; only logged with ``skip_corrupt``).
      SpecError: metadata damaged or from a newer recordprep.

    One input pipeline per worker under a ``tf.distribute`` strategy:
    docs/reading.md#distribution.
    """
    req = TrainRequest(batch_size, split, label_key, features, shuffle_buffer, seed, num_epochs, cache,
                       deterministic, drop_remainder, input_context, skip_corrupt, options, service)
    sel = select_shards(str(pattern), split)
    label, plan = _parse_stage(sel, label_key, features)
    if req.opts.service is not None:
        return _service.train_dataset(sel, plan, label, req)
    return _train_in_process(sel, plan, label, req)


def _parse_stage(sel: ShardSelection, label_key: Any, features: Sequence[str] | None) -> tuple[str | None, Any]:
    """The parse stage's plan: the label and how to parse it and ``features`` out of each batch.
    Built before any reading, so unknown names fail at once."""
    label, specs = resolve_label(sel.info, label_key, features)
    parse_names = [s.name for s in specs] + ([label] if label is not None else [])
    return label, parse_plan(sel.info, parse_names)


class _TrainSource(NamedTuple):
    """Where and how :func:`train_dataset`'s pipeline reads: its share of the shards, opened."""

    share: _Share
    paths: list[str]
    counts: list[int]
    remote: bool
    cycle_length: int
    parallel: int
    buffer_bytes: int
    #: Records of this pipeline's shards (after record-level sharding).
    total: int


def _train_in_process(sel: ShardSelection, plan: Any, label: str | None, req: TrainRequest) -> tf.data.Dataset:
    """:func:`train_dataset` read, shuffled, batched and parsed in this process, stage by stage:
    the source (this pipeline's shards, opened and checked), the records of every epoch (shards
    interleaved, shuffled), the batches, the parse."""
    src = _train_source(sel, req)
    window_mode = req.opts.shuffle_mode == "window"
    buffer = min(req.opts.shuffle_buffer, src.total)
    lookahead = _epoch_lookahead(req, src.share, remote=src.remote, window_mode=window_mode, total=src.total)
    records = _train_records(src, req, sel, buffer=buffer, lookahead=lookahead)
    batches = _train_batches(records, req.batch_size, window_mode=window_mode, drop_remainder=req.drop_remainder,
                             num_epochs=req.num_epochs, total=src.total, skip_corrupt=req.skip_corrupt)
    batches = parse_batches(batches, plan, label, req.opts.prefetch)
    _describe(
        "train_dataset", sel, len(src.paths), src.total,
        cycle_length=src.cycle_length, parallel_reads=src.parallel, read_buffer=src.buffer_bytes,
        shuffle_buffer=buffer, shuffle_mode=req.opts.shuffle_mode, deterministic=req.ordered,
        remote=src.remote, epoch_lookahead=lookahead,
        pipeline=f"{src.share.pipeline_id}/{src.share.num_pipelines}"
        + (" (record-level)" if src.share.record_level else ""),
    )
    return batches.with_options(tf_options(sharded_by_reader=req.input_context is not None, opts=req.opts))


def _train_source(sel: ShardSelection, req: TrainRequest) -> _TrainSource:
    """The source stage: this input pipeline's shards, staged and checked (``open_shards``),
    with the interleave's cycle length, reader threads and read buffer."""
    share = _pipeline_share(sel, req.input_context)
    paths, counts, remote, cycle_length, parallel, buffer_bytes = open_shards(
        sel, share.shards, req.opts, req.skip_corrupt)
    if req.skip_corrupt:
        logger.warning(
            "skip_corrupt=True: a damaged shard is read up to its first bad record and the rest of "
            "it is skipped; each skip is reported on stderr as 'recordprep: skip_corrupt: ...'"
        )
    return _TrainSource(share, paths, counts, remote, cycle_length, parallel, buffer_bytes,
                        share.num_records(sum(counts)))


def _train_records(src: _TrainSource, req: TrainRequest, sel: ShardSelection, *, buffer: int,
                   lookahead: int) -> tf.data.Dataset:
    """The records stage: every epoch's records, shards interleaved in blocks and shuffled
    (windows permuted, or a shuffle buffer), epochs kept apart."""
    opts = req.opts
    read = read_shard_fn(sel.info.compression, src.buffer_bytes, skip_corrupt=req.skip_corrupt,
                         block=opts.block_length, scheme=paths_scheme(src.paths))
    window_mode = opts.shuffle_mode == "window"
    one_pass = _one_pass_fn(read, src.share, cycle_length=src.cycle_length, parallel=src.parallel,
                            deterministic=req.ordered, window_mode=window_mode, block=opts.block_length)
    share = src.share
    return _shuffled_epochs(
        one_pass, src.paths, src.counts, lookahead=lookahead, total=src.total, buffer=buffer,
        window_mode=window_mode, shuffle_files=_shuffles_files(opts, len(src.paths), share, req.seed),
        seed=req.seed, num_epochs=req.num_epochs, skip_corrupt=req.skip_corrupt, cache=req.cache, cache_sel=sel,
        cache_key=f"{share.pipeline_id}/{share.num_pipelines}/{share.record_level}/{req.skip_corrupt}/{opts.shuffle_mode}",
    )


def _epoch_lookahead(req: TrainRequest, share: _Share, *, remote: bool, window_mode: bool, total: int) -> int:
    """How many next epochs start while one is read (``ReadOptions.epoch_lookahead``).

    Window mode only (see _epochs_with_lookahead); not with
    skip_corrupt or without records: an epoch that yields nothing must end the dataset,
    as repeat() does, instead of starting the next empty epoch forever.
    """
    lookahead = req.opts.resolved_epoch_lookahead(remote=remote, read_bytes=sum(s.num_bytes for s in share.shards))
    if not (window_mode and req.cache is None and req.num_epochs != 1 and not req.skip_corrupt and total > 0):
        return 0
    if req.num_epochs is not None:
        return min(lookahead, req.num_epochs - 1)
    return lookahead


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
    check_positive("batch_size", batch_size)
    if options is not None and not isinstance(options, ReadOptions):
        raise TypeError(f"options must be a readers.ReadOptions, found {type(options).__name__}")
    opts = options or ReadOptions()
    sel = select_shards(str(pattern), split)
    label, plan = _parse_stage(sel, label_key, features)
    shards = list(sel.shards)
    paths, counts, remote, cycle_length, parallel, buffer_bytes = open_shards(sel, shards, opts, False)
    files = shard_list(paths, counts)
    records = _in_order_interleave(
        files,
        read_shard_fn(sel.info.compression, buffer_bytes, skip_corrupt=False, block=_EVAL_BLOCK,
                       scheme=paths_scheme(paths)),
        cycle_length=cycle_length,
        block_length=-(-max(counts) // _EVAL_BLOCK),  # blocks per shard, rounded up
        num_parallel_calls=parallel,
    )
    total = sum(counts)
    # rebatch slices the 256-record blocks into batches without a per-record element.
    batches = records.rebatch(batch_size).apply(
        tf.data.experimental.assert_cardinality(-(-total // batch_size)))
    batches = parse_batches(batches, plan, label, opts.prefetch)
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
    return batches.with_options(tf_options(sharded_by_reader=False, opts=opts))
