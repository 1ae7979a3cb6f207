"""``recordprep inspect``: a readable summary of an output, without TensorFlow."""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from typing import Any

from apache_beam.io.filesystems import FileSystems

from convert.example import decode_example, unpack_decoded
from convert.spec import METADATA_FILENAME, PACKED_KEYS, DatasetInfo, SpecError
from convert.tfrecord import iter_records
from pipelines import remote
from pipelines._fs import read_metadata
from pipelines.cli.terminal import visible

#: What reading a damaged or foreign shard raises (not gzip, truncated, bad CRC, not an Example).
SHARD_ERRORS = (ValueError, OSError, EOFError, zlib.error)


class InspectError(RuntimeError):
    """``inspect``/``verify`` cannot read the output: not complete, no such split, or a record that is not an Example."""


def _output_dir(path: str) -> str:
    """The output directory ``path`` names: ``path`` itself when it is a directory or holds the
    metadata, whatever characters its name has (``ds[1]``, ``run*``); else, when its last part
    is a shard pattern (``train-*``) or a shard file, that part's directory."""
    path = path.rstrip("/") if path.rstrip("/") and not path.endswith("://") else path
    head, sep, tail = path.rpartition("/")
    if not (any(c in tail for c in "*?[") or tail.endswith((".tfrecord", ".tfrecord.gz"))):
        return path
    if os.path.isdir(path) if "://" not in path else FileSystems.exists(FileSystems.join(path, METADATA_FILENAME)):
        return path
    return head if sep else "."


def load(output: str) -> DatasetInfo:
    """The validated metadata of ``output``; InspectError (one clear line) for anything else."""
    remote.use_paths(output)  # hdfs:// needs Beam's --hdfs_* flags (derived)
    try:
        info = read_metadata(output)
    except SpecError as e:
        raise InspectError(str(e)) from e
    except OSError as e:  # a directory in its place, no permission
        meta = FileSystems.join(output, METADATA_FILENAME)
        raise InspectError(f"{meta}: cannot be read ({e}); {output} is not a complete recordprep output") from e
    if info is None:
        raise InspectError(f"{output}: no {METADATA_FILENAME}; the conversion has not finished (or failed). "
                           f"`recordprep wait {output}` waits for it")
    return info


def _get(d: Any, key: str) -> Any:
    """``d[key]`` for the free-form parts of the metadata (``extra``, params), None if absent or not an object."""
    return d.get(key) if isinstance(d, dict) else None


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) and not isinstance(v, bool) else repr(v)


def _feature_rows(info: DatasetInfo) -> Iterator[str]:
    """One line per feature, its columns as wide as their longest entry (as the terminal shows it)."""
    cols = [[visible(f.name), f.dtype, f"shape={list(f.shape)}", f.transform] for f in info.features]
    widths = [max((len(c[i]) for c in cols), default=0) for i in range(4)]
    for f, row in zip(info.features, cols, strict=True):
        what = f" vocab_size={f.params['vocab_size']}" if "vocab_size" in f.params else ""
        st = _get(f.params, "stats")
        if _get(st, "mean") is not None:
            what += f" mean={_num(st['mean'])} std={_num(st.get('std'))}"
        role = "" if f.role == "feature" else f" [{f.role}]"
        yield "  " + " ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + f" <- {f.source}{what}{role}"


def inspect_output(path: str, n_examples: int = 3, split: str | None = None) -> Iterator[str]:
    out = _output_dir(path)
    info = load(out)
    extra = info.extra
    yield f"dataset: {out}"
    yield f"  format_version {info.format_version}, tool {_get(_get(extra, 'tool'), 'version')}, created {extra.get('created')}"
    counts = extra.get("counts")
    yield f"  records read {_get(counts, 'read')}, rejected {_get(counts, 'errors')}, compression {info.compression}"
    seed = _get(extra, "shuffle") and extra["shuffle"].get("seed")
    yield (f"  order {info.order}" + (f" (seed {seed}): every shard a uniform random sample of its split"
                                       if info.order == "shuffled" else
                                       ": shards in input order; shuffle across shards when reading (readers' defaults)"))
    if info.layout != "features":
        yield f"  layout {info.layout}: float32 and int64 features packed into {sorted(PACKED_KEYS.values())}"
    for name, sp in info.splits.items():
        yield f"  split {name}: {sp.num_records} records in {len(sp.shards)} shards, {sp.num_bytes / 1e6:.2f} MB"
    yield f"features ({len(info.features)}):"
    yield from _feature_rows(info)
    if n_examples <= 0:
        return
    if split and split not in info.splits:
        raise InspectError(f"no split {split!r} in {out}; it has: {', '.join(info.splits)}")
    if not info.splits:
        return
    sp = info.splits[split] if split else next(iter(info.splits.values()))
    shown = 0
    for shard in sp.shards:
        if shard.num_records == 0:
            continue
        shard_path = FileSystems.join(out, shard.file)
        n = 0
        try:
            with FileSystems.open(shard_path, compression_type="uncompressed") as raw:
                stream = gzip.GzipFile(fileobj=raw) if info.compression == "GZIP" else raw
                for rec in iter_records(stream, shard_path):
                    feats = decode_example(rec)
                    if info.packing is not None:
                        feats = unpack_decoded(feats, info.packing)
                    yield f"example {shown} ({sp.name}, {shard.file}):"
                    for name, (_, vals) in sorted(feats.items()):
                        shown_vals = [round(v, 5) if isinstance(v, float) else v for v in vals]
                        yield f"  {name}: {shown_vals}"
                    shown += 1
                    n += 1
                    if shown >= n_examples:
                        return
        except SHARD_ERRORS as e:
            kind = "a gzip TFRecord" if info.compression == "GZIP" else "a TFRecord"
            raise InspectError(
                f"{shard_path}: record {n} cannot be read as {kind} of tf.train.Example ({type(e).__name__}: {e}); "
                f"the shard is damaged or was replaced. `recordprep verify {out}` checks every shard"
            ) from e
