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

The output statistics' term counts (``convert.stats``: per feature and split)
go the same way: each unit's are written to ``stats-terms-<unit>-*.bin``
(``spill_stats_terms``), one task per partition merges that partition of
every unit file into a ``TermSummary`` per feature and split (top terms,
distinct, items, terms seen once), and the summaries merge exactly, since a
term's whole count is in one partition (``merge_stats_terms``).
"""

from __future__ import annotations

import copy
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

import convert.stats as _stats
from convert.analysis import Analyzer, vocabulary_label
from convert.config import Config
from convert.stats import StatsAccumulator, StatsMerger, _TermCounts
from convert.term_counts import (
    TermSummary,
    add_counts,
    merge_top,
    read_partition,
    read_partitions,
    top_terms,
    write_term_arrays,
    write_unit_counts,
)


def spilled_features(config: Config) -> list[str]:
    """The features whose term counts go through the partitioned merge (not a vocabulary label's
    classes: those are bounded and stay in the global combine)."""
    lab = vocabulary_label(config)
    return [f.name for f in config.features if f.needs_vocabulary and (lab is None or f.name != lab.name)]


def _spill_file(tmp_dir: str, kind: str, unit: int, write: Callable[[Any], None]) -> str:
    """A unit's temp file ``<kind>-<unit>-<random>.bin`` in ``tmp_dir``, written by ``write``; its path."""
    path = FileSystems.join(tmp_dir, f"{kind}-{unit:05d}-{uuid.uuid4().hex[:8]}.bin")
    with FileSystems.create(path) as out:
        write(out)
    return path


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
    return _spill_file(tmp_dir, "terms", unit, lambda out: write_unit_counts(out, counts, partitions))


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


# -------------------------------------------------- the output statistics' term counts


def spill_stats_terms(acc: StatsAccumulator, tmp_dir: str, unit: int, partitions: int) -> str | None:
    """Write a unit's statistics' term counts (every term feature and split) to a temp file
    cut into ``partitions`` blocks by term, and leave ``acc`` without them; the file's
    path, or None when the unit has no terms."""
    acc.flush()
    arrays = {}
    for name, accs in acc.feature.items():
        for s, fs in enumerate(accs):
            if isinstance(fs.terms, _TermCounts):
                terms, counts = fs.terms.summed()
                if terms:
                    arrays[(name, s)] = (terms, counts)
                fs.terms = _TermCounts()
    if not arrays:
        return None
    return _spill_file(tmp_dir, "stats-terms", unit, lambda out: write_term_arrays(out, arrays, partitions))


def summarize_partition(paths: list[str], partition: int) -> Iterator[tuple[tuple[str, int], TermSummary]]:
    """One partition of every unit file's term counts -> ``((feature, split), summary)`` per key:
    about distinct terms / partitions held at once."""
    totals: dict[tuple[str, int], Counter] = {}
    for path in paths:
        with FileSystems.open(path) as fh:
            for key, (terms, counts) in read_partitions(fh, partition).items():
                add_counts(totals.setdefault(key, Counter()), terms, counts)
    for key in sorted(totals):
        c = totals.pop(key)
        yield key, TermSummary.of(list(c), np.fromiter(c.values(), dtype=np.int64, count=len(c)), _stats.TOP_TERMS)


class _MergeSummaries(beam.CombineFn):
    """Partitions' ``((feature, split), TermSummary)`` -> ``{(feature, split): TermSummary}``."""

    def create_accumulator(self) -> dict[tuple[str, int], TermSummary]:
        return {}

    def add_input(self, acc, element):
        key, summary = element
        acc[key] = acc[key].merge(summary, _stats.TOP_TERMS) if key in acc else summary
        return acc

    def merge_accumulators(self, accs):
        out: dict[tuple[str, int], TermSummary] = {}
        for acc in accs:
            for item in acc.items():
                out = self.add_input(out, item)
        return out

    def extract_output(self, acc):
        return acc


def _partition_tasks(paths: list[str | None], partitions: int) -> list[tuple[int, list[str]]]:
    files = sorted(p for p in paths if p is not None)
    return [(p, files) for p in range(partitions)] if files else []


def merge_stats_terms(results: Any, partitions: int) -> Any:
    """Unit results (``PCollection[dict]`` with ``"stats_terms"``: a ``spill_stats_terms``
    file) -> singleton ``{(feature, split): TermSummary}``: one task per partition."""
    return (
        results
        | "StatsTermFiles" >> beam.Map(lambda r: r.get("stats_terms"))
        | "AllStatsTermFiles" >> beam.combiners.ToList()
        | "StatsPartitionTasks" >> beam.FlatMap(_partition_tasks, partitions)
        | "SpreadStatsPartitions" >> beam.Reshuffle()
        | "SummarizePartition" >> beam.FlatMapTuple(lambda p, files: summarize_partition(files, p))
        | "MergeSummaries" >> beam.CombineGlobally(_MergeSummaries())
    )


def with_term_summaries(keyed: tuple[None, StatsMerger], summaries: dict) -> tuple[None, StatsMerger]:
    """The merged statistics with their term counts' partition summaries."""
    merger = copy.copy(keyed[1])
    merger.term_summaries = summaries
    return keyed[0], merger
