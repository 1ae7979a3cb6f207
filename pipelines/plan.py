"""Input discovery and work planning, done once in the launcher.

The job's unit of work is a *work unit*: a list of byte ranges of input files.
Each unit is read, vectorized and written by one DoFn call into exactly one
shard per split, so ``--num-shards N`` gives exactly N shards per split, the
data never passes through a GroupByKey (memory stays flat on the local
runner, which buffers shuffles in memory), and Beam's per-element overhead is
paid per unit, not per record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import posixpath
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from convert.sources import is_splittable


class InputError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime: float


@dataclasses.dataclass(frozen=True)
class ByteRange:
    path: str
    start: int
    end: int | None  # None: to end of file


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    index: int
    ranges: tuple[ByteRange, ...]


_DATA_SUFFIXES = (".avro", ".json", ".jsonl", ".ndjson", ".gz")


def _expand(pattern: str) -> str:
    """A directory means every data file directly in it."""
    if any(c in pattern for c in "*?["):
        return pattern
    try:
        if FileSystems.match([pattern])[0].metadata_list and not pattern.endswith("/"):
            return pattern
    except Exception:
        pass
    return FileSystems.join(pattern.rstrip("/"), "*")


def discover(patterns: Sequence[str]) -> list[InputFile]:
    """Match every pattern; each must match at least one file."""
    found: dict[str, InputFile] = {}
    for pat in patterns:
        expanded = _expand(pat)
        try:
            result = FileSystems.match([expanded])[0]
        except Exception as e:
            raise InputError(f"--input {pat!r}: cannot list it ({e})") from e
        files = [m for m in result.metadata_list if not posixpath.basename(m.path).startswith((".", "_"))]
        if expanded != pat:  # directory: only data files
            files = [m for m in files if m.path.lower().endswith(_DATA_SUFFIXES)]
        if not files:
            raise InputError(f"--input {pat!r} matched no files; check the path or quote the glob so the shell does not expand it")
        for m in files:
            found[m.path] = InputFile(m.path, int(m.size_in_bytes), float(m.last_updated_in_seconds or 0.0))
    return sorted(found.values(), key=lambda f: f.path)


def default_num_shards(total_bytes: int, target_shard_mb: float) -> int:
    """Enough shards for readers to interleave (up to 16) without tiny files.

    Inputs under 1 MB give one shard per split; above that, one shard per MB
    up to 16, and past 16 shards ``target_shard_mb`` of input per shard.
    """
    by_target = math.ceil(total_bytes / (target_shard_mb * 1024 * 1024))
    by_mb = math.ceil(total_bytes / (1024 * 1024))
    return max(1, by_target, min(16, by_mb))


def _head(path: str) -> bytes:
    with FileSystems.open(path, compression_type="uncompressed") as f:
        return f.read(4096)


def plan_units(files: Sequence[InputFile], num_shards: int, json_records_path: str | None = None) -> list[WorkUnit]:
    """Cut the inputs into ``num_shards`` units of about equal input bytes.

    Unit ``u`` owns global bytes ``[u*T, (u+1)*T)`` of the files laid end to
    end. Splittable files (Avro, JSON Lines) are cut at those points (readers
    align to the next block/line); compressed or whole-document files go
    entirely to the unit where they start. A unit may be empty; it still
    writes an (empty) shard so every split has exactly ``num_shards`` files.
    """
    total = sum(f.size for f in files)
    target = max(1.0, total / num_shards)
    ranges: list[list[ByteRange]] = [[] for _ in range(num_shards)]
    g = 0
    for f in files:
        first = min(num_shards - 1, int(g // target))
        last = min(num_shards - 1, int(max(g, g + f.size - 1) // target))
        if first == last or not is_splittable(f.path, _head(f.path), json_records_path):
            ranges[first].append(ByteRange(f.path, 0, None))
        else:
            for u in range(first, last + 1):
                lo = max(0, int(u * target) - g)
                hi = None if u == last else int((u + 1) * target) - g
                ranges[u].append(ByteRange(f.path, lo, hi))
        g += f.size
    return [WorkUnit(i, tuple(r)) for i, r in enumerate(ranges)]


def input_fingerprint(files: Sequence[InputFile], config_hash: str, options: dict[str, object]) -> str:
    """Identity of a conversion: same inputs (path, size, mtime), config and options."""
    blob = json.dumps(
        {"files": [[f.path, f.size, f.mtime] for f in files], "config": config_hash, "options": options},
        sort_keys=True, default=str,
    ).encode()
    return hashlib.sha256(blob).hexdigest()
