"""``recordprep verify``: re-read a committed output and compare it with its metadata.

Checks every shard listed in ``dataset_info.json``: it exists, its size and
record count match, every record's CRCs are intact, and every record decodes
to exactly the features of the spec with the right dtype and shape; the
output's ``analysis.json`` holds what the converter writes
(``convert.analysis.analysis_problems``), since a later run may reuse it
(``--analysis-from``), and agrees with the metadata's feature spec
(``convert.apply.analysis_contradictions``); and the analysis and every
vocabulary are the files the metadata was committed with (their sha256, read in
blocks), the digests present as every run writes them. Metadata no run writes
(a shard listed twice or in two splits, impossible statistics) is refused when
it is loaded. Runs without TensorFlow (conversion machines don't have it).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import zlib

from apache_beam.io.filesystems import FileSystems

from convert.analysis import analysis_problems
from convert.apply import OutputAnalysis
from convert.example import decode_example, unpack_decoded
from convert.spec import METADATA_FILENAME, DatasetInfo, SpecError, check_name
from convert.stats import StatsFormatError, load_stats
from convert.stats_checks import problems_message, stats_metadata_problems
from convert.tfrecord import iter_records
from pipelines._fs import read_file, size_of
from pipelines.cli.inspect import load
from pipelines.run_files import ANALYSIS_FILENAME

#: Bytes read at a time to hash a file.
_HASH_BLOCK = 1 << 20


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
    problems += _analysis_problems(output, info) + _digest_problems(output, info) + _stats_problems(output, info)
    return VerifyReport(problems, shards, records)


def _analysis_problems(output: str, info: DatasetInfo) -> list[str]:
    """What is wrong with the output's analysis, each naming the file: what the converter never
    writes (``analysis_problems``), and where it contradicts the metadata's feature spec
    (``OutputAnalysis.from_json``). None when the file is absent (``_digest_problems`` says so)."""
    path = FileSystems.join(output, _analysis_name(output, info))
    try:
        data = read_file(path)
    except OSError as e:  # a directory in its place, no permission
        return [f"{path}: unreadable ({e}); re-run the conversion"]
    if data is None:
        return []
    try:
        doc = json.loads(data)
    except ValueError as e:
        return [f"{path}: not JSON ({e})"]
    problems = [f"{path}: {p}" for p in analysis_problems(doc)]
    if not problems:
        try:
            OutputAnalysis.from_json(info, doc, source=output)
        except SpecError as e:
            problems.append(str(e))
    return problems


def _stats_problems(output: str, info: DatasetInfo) -> list[str]:
    """What is wrong with the output's statistics (``stats.json``, which ``report`` reads): a
    count that is not an exact non-negative integer or a sum that does not agree (``load_stats``),
    or counts that contradict the metadata (``stats_metadata_problems``). None for an output
    written before statistics (no ``stats_file``)."""
    name = info.extra.get("stats_file")
    if name is None:
        return []
    path = FileSystems.join(output, check_name(name, f"{output}: metadata stats_file"))
    try:
        data = read_file(path)
    except OSError as e:
        return [f"{path}: unreadable ({e}); re-run the conversion"]
    if data is None:
        return [f"{path}: listed in the metadata but missing; re-run the conversion"]
    try:
        doc = load_stats(json.loads(data), where=path)
    except ValueError as e:  # StatsFormatError, or not JSON
        return [str(e) if isinstance(e, StatsFormatError) else f"{path}: not JSON ({e})"]
    problems = stats_metadata_problems(doc, info, path)
    return [problems_message(problems)] if problems else []


def _analysis_name(output: str, info: DatasetInfo) -> str:
    return check_name(info.extra.get("analysis_file", ANALYSIS_FILENAME), f"{output}: metadata analysis_file")


def _digest_problems(output: str, info: DatasetInfo) -> list[str]:
    """The analysis and vocabulary files that are not the ones the metadata was committed with
    (``analysis_sha256``, each vocabulary's ``sha256``). The converter always writes both
    digests, so an absent one is a problem too: the metadata was edited."""
    vocabularies = info.extra.get("vocabularies") or {}
    files = [(_analysis_name(output, info), info.extra.get("analysis_sha256"), "analysis_sha256")]
    files += [(v.get("file"), v.get("sha256"), f"vocabularies.{name}.sha256") for name, v in vocabularies.items()]
    listed = {v.get("file") for v in vocabularies.values()}
    problems = [f"{FileSystems.join(output, METADATA_FILENAME)}: feature {f.name!r} reads "
                f"{f.params['vocabulary_file']!r}, which its 'vocabularies' does not list (with its digest); "
                f"the converter always lists it, so the metadata was edited: re-run the conversion"
                for f in info.features if "vocabulary_file" in f.params and f.params["vocabulary_file"] not in listed]
    for name, digest, key in files:
        path = FileSystems.join(output, check_name(name, f"{output}: metadata"))
        if not isinstance(digest, str):
            problems.append(f"{FileSystems.join(output, METADATA_FILENAME)}: no {key} (the digest of {name}); "
                            f"the converter always writes it, so the metadata was edited: re-run the conversion")
            continue
        try:
            actual = _streamed_digest(path)
        except OSError as e:  # a directory in its place, no permission
            problems.append(f"{path}: unreadable ({e}); re-run the conversion")
            continue
        if actual is None:
            problems.append(f"{path}: listed in the metadata but missing")
        elif actual != digest:
            problems.append(f"{path}: not the file the metadata was committed with (its sha256 differs); "
                            f"re-run the conversion")
    return problems


def _streamed_digest(path: str) -> str | None:
    """``content_digest`` of the file at ``path``, read in blocks (a vocabulary may be larger than
    memory) and no further than one byte past its size: a device or pipe in its place (a symlink
    to ``/dev/zero``, size 0) never ends, and its digest then differs. ``None`` when it does not
    exist; ``OSError`` when it cannot be read (a directory)."""
    if not FileSystems.exists(path):
        return None
    left = size_of(path) + 1
    h = hashlib.sha256()
    with FileSystems.open(path, compression_type="uncompressed") as f:
        while left > 0 and (block := f.read(min(_HASH_BLOCK, left))):
            h.update(block)
            left -= len(block)
    return "sha256:" + h.hexdigest()
