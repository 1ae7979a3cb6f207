"""``recordprep verify``: re-read a committed output and compare it with its metadata.

Checks every shard listed in ``dataset_info.json``: it exists, its size and
record count match, every record's CRCs are intact, and every record decodes
to exactly the features of the spec with the right dtype and shape; and the
output's ``analysis.json`` holds what the converter writes
(``convert.analysis.analysis_problems``), since a later run may reuse it
(``--analysis-from``). Runs without TensorFlow (conversion machines don't have it).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import zlib

from apache_beam.io.filesystems import FileSystems

from convert.analysis import analysis_problems
from convert.apply import content_digest
from convert.example import decode_example, unpack_decoded
from convert.spec import DatasetInfo, check_name
from convert.tfrecord import iter_records
from pipelines._fs import read_file, size_of
from pipelines.cli.inspect import load
from pipelines.run_files import ANALYSIS_FILENAME


@dataclasses.dataclass
class VerifyReport:
    problems: list[str]
    shards: int
    records: int

    @property
    def ok(self) -> bool:
        return not self.problems


def _check_example(rec: bytes, info: DatasetInfo, where: str) -> str | None:
    try:
        feats = decode_example(rec)
    except (ValueError, UnicodeDecodeError) as e:
        return f"{where}: not a parseable tf.train.Example ({e})"
    if info.packing is not None:
        try:
            feats = unpack_decoded(feats, info.packing)
        except ValueError as e:
            return f"{where}: {e} (layout 'packed')"
    want = {f.name: f for f in info.features}
    if set(feats) != set(want):
        missing, extra = sorted(set(want) - set(feats)), sorted(set(feats) - set(want))
        return f"{where}: features differ from the spec (missing {missing}, unexpected {extra})"
    for name, (dtype, vals) in feats.items():
        spec = want[name]
        if dtype != spec.dtype or len(vals) != spec.size:
            return f"{where}: feature {name!r} is {dtype}[{len(vals)}], spec says {spec.dtype}{list(spec.shape)}"
    return None


def verify_output(output: str, max_problems: int = 50) -> VerifyReport:
    """Re-read everything; collect problems (not raise) so the report is complete."""
    info = load(output)
    problems: list[str] = []
    shards = records = 0
    for split in info.splits.values():
        for shard in split.shards:
            shards += 1
            path = FileSystems.join(output, shard.file)
            if not FileSystems.exists(path):
                problems.append(f"{path}: listed in the metadata but missing")
                continue
            size = size_of(path)
            if size != shard.num_bytes:
                problems.append(f"{path}: {size} bytes on disk, metadata says {shard.num_bytes}")
            n = 0
            try:
                with FileSystems.open(path, compression_type="uncompressed") as raw:
                    stream = gzip.GzipFile(fileobj=raw) if info.compression == "GZIP" else raw
                    for rec in iter_records(stream, path):
                        if (msg := _check_example(rec, info, f"{path} record {n}")) and len(problems) < max_problems:
                            problems.append(msg)
                        n += 1
            except (ValueError, OSError, EOFError, zlib.error) as e:
                problems.append(f"{path}: unreadable after {n} records ({e})")
            records += n
            if n != shard.num_records:
                problems.append(f"{path}: {n} records readable, metadata says {shard.num_records}")
    problems += _analysis_problems(output) + _digest_problems(output, info)
    return VerifyReport(problems, shards, records)


def _analysis_problems(output: str) -> list[str]:
    """What is wrong with the output's analysis, each naming the file (none when it has none)."""
    path = FileSystems.join(output, ANALYSIS_FILENAME)
    data = read_file(path)
    if data is None:
        return []
    try:
        doc = json.loads(data)
    except ValueError as e:
        return [f"{path}: not JSON ({e})"]
    return [f"{path}: {p}" for p in analysis_problems(doc)]


def _digest_problems(output: str, info: DatasetInfo) -> list[str]:
    """The analysis and vocabulary files that are not the ones the metadata was committed with
    (``analysis_sha256``, each vocabulary's ``sha256``; outputs from before digests are not checked)."""
    files = [(info.extra.get("analysis_file", ANALYSIS_FILENAME), info.extra.get("analysis_sha256"))]
    files += [(v.get("file"), v.get("sha256")) for v in (info.extra.get("vocabularies") or {}).values()
              if isinstance(v, dict)]
    problems = []
    for name, digest in files:
        if digest is None or not isinstance(name, str):
            continue
        path = FileSystems.join(output, check_name(name, f"{output}: metadata"))
        data = read_file(path)
        if data is None:
            problems.append(f"{path}: listed in the metadata but missing")
        elif content_digest(data) != digest:
            problems.append(f"{path}: not the file the metadata was committed with (its sha256 differs); "
                            f"re-run the conversion")
    return problems
