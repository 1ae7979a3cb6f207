"""The vocabulary merge that scales out: term counts partitioned by term.

With more than one unit, each ``_AnalyzeUnit`` writes its vocabulary term
counts to ``<output>/.recordprep-tmp/terms-<unit>-*.bin`` cut into
``partitions`` blocks by term (``convert.term_counts``) instead of sending
them through the global combine. One task per (feature, partition) then
merges that partition's block of every unit file and keeps its best
``top_k`` candidates; a small global combine keeps the best ``top_k`` of the
candidates. Memory per process is one unit's terms, one partition's terms
(about distinct terms / partitions) or ``partitions x top_k`` candidates,
never every distinct term (unless there is no ``top_k``: the vocabulary is
then as large as its distinct terms). The result equals ``Analyzer.result``'s.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from convert.analysis import Analyzer, vocabulary_label
from convert.config import Config
from convert.term_counts import add_counts, merge_top, read_partition, top_terms, write_unit_counts


def spilled_features(config: Config) -> list[str]:
    """The features whose term counts go through the partitioned merge (not a vocabulary label's
    classes: those are bounded and stay in the global combine)."""
    lab = vocabulary_label(config)
    return [f.name for f in config.features if f.needs_vocabulary and (lab is None or f.name != lab.name)]


def spill_unit_counts(acc: Analyzer, tmp_dir: str, unit: int, partitions: int) -> str | None:
    """Write ``acc``'s vocabulary term counts to a temp file and drop them from ``acc``;
    the file's path, or None when the unit has no terms."""
    acc.flush()
    names = spilled_features(acc.config)
    counts = {n: acc.counts[n] for n in names if acc.counts[n]}
    for n in names:
        acc.counts[n] = Counter()
    if not counts:
        return None
    path = FileSystems.join(tmp_dir, f"terms-{unit:05d}-{uuid.uuid4().hex[:8]}.bin")
    with FileSystems.create(path) as out:
        write_unit_counts(out, counts, partitions)
    return path


class _CountPartition(beam.DoFn):
    """``(feature, partition)`` + the merged analysis (side input: its unit files)
    -> ``(feature, best top_k (term, count))``."""

    def __init__(self, config: Config):
        self.config = config

    def process(self, task: tuple[str, int], merged: Any) -> Iterator[tuple[str, list[tuple[str, int]]]]:
        name, partition = task
        paths = unit_files(merged.spills)
        f = next(f for f in self.config.features if f.name == name)
        total: Counter = Counter()
        for path in paths:
            with FileSystems.open(path) as fh:
                add_counts(total, *read_partition(fh, name, partition))
        yield name, top_terms(total, f.min_frequency, f.top_k)


class _TopVocabularies(beam.CombineFn):
    """Partition candidates -> ``{feature: vocabulary}``, keeping the best ``top_k`` as they merge."""

    def __init__(self, config: Config):
        self.top_k = {f.name: f.top_k for f in config.features}
        self.names = spilled_features(config)

    def create_accumulator(self) -> dict[str, list[tuple[str, int]]]:
        return {}

    def add_input(self, acc, element):
        name, cands = element
        acc[name] = merge_top([acc.get(name, []), cands], self.top_k[name])
        return acc

    def merge_accumulators(self, accs):
        out: dict[str, list[tuple[str, int]]] = {}
        for acc in accs:
            for name, cands in acc.items():
                out[name] = merge_top([out.get(name, []), cands], self.top_k[name])
        return out

    def extract_output(self, acc) -> dict[str, list[str]]:
        return {n: [t for t, _ in acc.get(n, [])] for n in self.names}


def unit_files(spills: dict[int, str | None]) -> list[str]:
    """Every unit's term counts file, in unit order."""
    return [spills[u] for u in sorted(spills) if spills[u] is not None]


def partition_tasks(config: Config, partitions: int) -> list[tuple[str, int]]:
    """One task per spilled feature and partition."""
    return [(n, p) for n in spilled_features(config) for p in range(partitions)]


def merge_vocabularies(merged: Any, config: Config, partitions: int) -> Any:
    """``merged`` (singleton with ``.spills``) -> singleton ``{feature: vocabulary}``."""
    return (
        merged
        | "PartitionTasks" >> beam.FlatMap(lambda _: partition_tasks(config, partitions))
        | "SpreadPartitions" >> beam.Reshuffle()
        | "CountPartition" >> beam.ParDo(_CountPartition(config), beam.pvalue.AsSingleton(merged))
        | "TopVocabularies" >> beam.CombineGlobally(_TopVocabularies(config))
    )
