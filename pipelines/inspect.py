"""``recordprep inspect``: a readable summary of an output, without TensorFlow."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

from convert.example import decode_example, unpack_decoded
from convert.spec import METADATA_FILENAME, PACKED_KEYS, DatasetInfo, SpecError
from convert.tfrecord import iter_records
from pipelines import remote


class InspectError(RuntimeError):
    pass


def _output_dir(path: str) -> str:
    if any(c in path for c in "*?[") or path.endswith((".tfrecord", ".tfrecord.gz")):
        return path.rsplit("/", 1)[0] if "/" in path else "."
    return path


def load(output: str) -> DatasetInfo:
    remote.use_paths(output)  # hdfs:// needs Beam's --hdfs_* flags (derived)
    meta = FileSystems.join(output, METADATA_FILENAME)
    if not FileSystems.exists(meta):
        raise InspectError(f"{output}: no {METADATA_FILENAME}; the conversion has not finished (or failed). "
                           f"`recordprep wait {output}` waits for it")
    with FileSystems.open(meta, compression_type="uncompressed") as f:
        try:
            return DatasetInfo.loads(f.read(), source=meta)
        except SpecError as e:
            raise InspectError(str(e)) from e


def inspect_output(path: str, n_examples: int = 3, split: str | None = None) -> Iterator[str]:
    out = _output_dir(path)
    info = load(out)
    extra = info.extra
    yield f"dataset: {out}"
    yield f"  format_version {info.format_version}, tool {extra.get('tool', {}).get('version')}, created {extra.get('created')}"
    counts = extra.get("counts", {})
    yield f"  records read {counts.get('read')}, rejected {counts.get('errors')}, compression {info.compression}"
    if info.layout != "features":
        yield f"  layout {info.layout}: float32 and int64 features packed into {sorted(PACKED_KEYS.values())}"
    for name, sp in info.splits.items():
        yield f"  split {name}: {sp.num_records} records in {len(sp.shards)} shards, {sp.num_bytes / 1e6:.2f} MB"
    yield f"features ({len(info.features)}):"
    for f in info.features:
        params = f.params
        what = ""
        if "vocab_size" in params:
            what = f" vocab_size={params['vocab_size']}"
        if params.get("stats"):
            st = params["stats"]
            what += f" mean={st.get('mean'):.4g} std={st.get('std'):.4g}" if st.get("mean") is not None else ""
        role = "" if f.role == "feature" else f" [{f.role}]"
        yield f"  {f.name:<24} {f.dtype:<8} shape={list(f.shape)!s:<6} {f.transform:<12} <- {f.source}{what}{role}"
    if n_examples <= 0:
        return
    sp = info.split(split) if split else next(iter(info.splits.values()))
    shown = 0
    for shard in sp.shards:
        if shard.num_records == 0:
            continue
        shard_path = FileSystems.join(out, shard.file)
        with FileSystems.open(shard_path, compression_type="uncompressed") as raw:
            stream = gzip.GzipFile(fileobj=raw) if info.compression == "GZIP" else raw
            for rec in iter_records(stream, shard_path):
                yield f"example {shown} ({sp.name}, {shard.file}):"
                feats = decode_example(rec)
                if info.packing is not None:
                    feats = unpack_decoded(feats, info.packing)
                for name, (_, vals) in sorted(feats.items()):
                    shown_vals = [round(v, 5) if isinstance(v, float) else v for v in vals]
                    yield f"  {name}: {shown_vals}"
                shown += 1
                if shown >= n_examples:
                    return
