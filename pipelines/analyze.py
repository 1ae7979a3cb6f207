"""The analysis pass: vocabularies and statistics of the training split.

::

    units ──AnalyzeUnit──> (unit, Analyzer, prepared file, term counts file)
          ──MergeAnalysis──> AnalysisValue (singleton; the convert pass' side input)

``AnalyzeUnits`` reads each unit once (``pipelines.unit_input``), analyzes its
training records and writes its prepared batches to a temp file the convert
pass reads instead of the input (``pipelines.tempfile_format``). Vocabulary
counts merge exactly in any order; the numeric partials are merged in unit
order, so the same input always gives bit-identical statistics.

The vocabulary merge scales out: term counts are partitioned by term. With
more than one unit, each ``_AnalyzeUnit`` writes its vocabulary term
counts to ``<output>/.recordprep-tmp/terms-<unit>-*.bin`` cut into
``partitions`` blocks by term (``convert.term_counts``) instead of sending
them through the global combine. One task per (feature, partition) then
merges that partition's block of every unit file and keeps its best
``top_k`` candidates; a small global combine keeps the best ``top_k`` of the
candidates. Memory per process is one unit's terms, one partition's terms
(about distinct terms / partitions) or ``partitions x top_k`` candidates,
never every distinct term (unless there is no ``top_k``: the vocabulary is
then as large as its distinct terms). The result equals ``Analyzer.result``'s.

A vocabulary without ``top_k`` is held whole by every process that applies
it, so one larger than ``ConvertOptions.max_vocabulary_terms`` stops the run
with a ``ConfigError`` once it is counted, before any shard is written
(``check_vocabulary_sizes``). In the partitioned merge a partition over the
limit sends its count only, and the combine drops a feature's candidates as
soon as their count passes it: the refusal never holds more than the limit.

The output statistics' term counts (``convert.stats``: per feature and split)
go the same way: each unit's are written to ``stats-terms-<unit>-*.bin``
(``spill_stats_terms``), one task per partition merges that partition of
every unit file into a ``TermSummary`` per feature and split (top terms,
distinct, items, terms seen once), and the summaries merge exactly, since a
term's whole count is in one partition (``merge_stats_terms``).
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.runners.worker.statecache import CacheAware

import convert.stats as _stats
from convert.analysis import Analyzer, vocabulary_label
from convert.config import Config, ConfigError
from convert.prepare import Preparer
from convert.stats import StatsAccumulator, StatsMerger, TermCounts
from convert.term_counts import (
    TermSummary,
    add_counts,
    merge_top,
    read_partition,
    read_partitions,
    top_terms,
    write_term_arrays,
)
from convert.transforms import transform_of
from convert.transforms.label_vocabulary import LabelTermCounts
from pipelines.options import ConvertOptions
from pipelines.plan import WorkUnit
from pipelines.run_files import TMP_DIR
from pipelines.tempfile_format import PreparedWriter
from pipelines.unit_input import prepare_unit, relaxed_gc, unit_bytes, unit_progress

#: Key of the analysis side input mapping unit index -> its prepared-batches temp file.
PREPARED_KEY = "prepared_units"
#: Key of the analysis side input mapping feature -> values seen in the training
#: split (``Analyzer.present``); absent with a reused analysis (``--analysis-from``).
PRESENT_KEY = "present_values"


class _AnalyzeUnit(beam.DoFn):
    """A unit -> ``(index, Analyzer, prepared file, term counts file)``.

    With ``partitions`` > 1 the unit's vocabulary term counts go to a temp
    file cut by term (``spill_unit_counts``), not into the yielded analyzer.
    """

    def __init__(self, config: Config, options: ConvertOptions, partitions: int = 1):
        self.config, self.options, self.partitions = config, options, partitions

    def process(self, unit: WorkUnit):
        acc = Analyzer(self.config)
        path = None
        if unit.ranges:
            # The unit's prepared batches go to a temp file the convert pass
            # reads instead of decoding and preparing the input again.
            path = FileSystems.join(self.options.output, TMP_DIR, f"prepared-{unit.index:05d}-{uuid.uuid4().hex[:8]}.bin")
            prog = unit_progress(self.options, "analyze", unit)
            with PreparedWriter(path) as out, relaxed_gc():
                for item in prepare_unit(unit, self.options, Preparer(self.config, unit_terms=True), acc):
                    out.write(item)
                    prog.add(item.read)
            prog.add(0, unit_bytes(unit))
            prog.close()
        acc.flush()
        spill = None
        if self.partitions > 1:
            spill = spill_unit_counts(acc, FileSystems.join(self.options.output, TMP_DIR), unit.index, self.partitions)
        yield unit.index, acc, path, spill


@dataclasses.dataclass
class _MergedAnalysis:
    """The global combine's output when term counts were spilled: all but the vocabularies."""

    analyzer: Analyzer
    prepared: dict[int, str | None]
    spills: dict[int, str | None]
    max_terms: int | None = None

    def value(self, config: Config, vocabularies: dict[str, list[str]] | None = None,
              doc_freqs: dict[str, list[int]] | None = None) -> AnalysisValue:
        # Where each unit's prepared batches are, and which features had values
        # (for the commit's check; neither is part of the saved analysis).
        present = {f.name: self.analyzer.present[f.name] for f in config.features}
        analysis = self.analyzer.result(vocabularies, doc_freqs)
        # before any shard is written
        if self.max_terms is not None:
            sizes = {n: len(analysis.vocabularies[n]) for n in spilled_features(config) if n in analysis.vocabularies}
            check_vocabulary_sizes(config, sizes, self.max_terms)
        self.analyzer.check_vocabularies(analysis)
        return AnalysisValue({**analysis.to_json(), PREPARED_KEY: self.prepared, PRESENT_KEY: present})


class _MergeAnalyzers(beam.CombineFn):
    """Merges per-unit analyzers into one ``Analysis``, reproducibly.

    Vocabulary counts merge exactly in any order. Floating-point statistics
    do not, and the runner picks the merge order, so the per-unit numeric
    partials are kept apart and merged in unit order at the end: the same
    input always gives bit-identical statistics, hence identical shards.
    With ``spilled`` the term counts are in files (``spill_unit_counts``) and
    the output is a ``_MergedAnalysis`` still without those vocabularies.
    """

    def __init__(self, config: Config, spilled: bool = False, max_terms: int | None = None):
        self.config, self.spilled, self.max_terms = config, spilled, max_terms

    def create_accumulator(self):
        return (Analyzer(self.config), {}, {}, {})

    def add_input(self, acc, element):
        unit, analyzer, prepared, *spill = element
        analyzer.flush()
        for k, c in analyzer.counts.items():
            acc[0].counts[k].update(c)
        for k, r in analyzer.ranked.items():
            acc[0].ranked[k].merge(r)
        acc[0].present.update(analyzer.present)
        for k, d in analyzer.doc_freq.items():
            acc[0].doc_freq[k].merge(d)
        acc[1][unit] = analyzer.numeric
        acc[2][unit] = prepared
        acc[3][unit] = spill[0] if spill else None
        return acc

    def merge_accumulators(self, accs):
        accs = iter(accs)
        first = next(accs)
        for counts_acc, partials, prepared, spills in accs:
            for k, c in counts_acc.counts.items():
                first[0].counts[k].update(c)
            for k, r in counts_acc.ranked.items():
                first[0].ranked[k].merge(r)
            first[0].present.update(counts_acc.present)
            for k, d in counts_acc.doc_freq.items():
                first[0].doc_freq[k].merge(d)
            first[1].update(partials)
            first[2].update(prepared)
            first[3].update(spills)
        return first

    def extract_output(self, acc):
        analyzer, partials, prepared, spills = acc
        for unit in sorted(partials):
            for k, st in partials[unit].items():
                analyzer.numeric[k].merge(st)
        merged = _MergedAnalysis(analyzer, prepared, spills, self.max_terms)
        return merged if self.spilled else merged.value(self.config)


class AnalysisValue(CacheAware):
    """The analysis side input: ``Analysis.to_json()`` (plus ``PREPARED_KEY``) in ``.json``.

    Why a wrapper: Beam's state cache weighs every side input value it loads
    by walking its whole object graph (objsize), again at each bundle that
    loads it, which is slow for an analysis of tens of thousands of terms
    (docs/benchmarks.md#design-converter). ``CacheAware`` is Beam's hook for this: the
    weight is estimated once, where the analysis is made, and the cache reads
    it from ``__sizeof__`` instead of walking the graph. The estimate is 8x
    the pickled size, a little above what the walk finds on real analyses:
    the cache (100 MB by default) only needs the right order of magnitude.
    """

    def __init__(self, analysis_json: dict[str, Any]):
        super().__init__()
        self.json = analysis_json
        self.weight = 8 * len(pickle.dumps(analysis_json, protocol=pickle.HIGHEST_PROTOCOL))

    def get_referents_for_cache(self) -> list[Any]:
        return []

    def __sizeof__(self) -> int:
        return self.weight


class AnalyzeUnits(beam.PTransform):
    """``PCollection[WorkUnit]`` -> singleton ``PCollection[AnalysisValue]``.

    Vocabulary counts and numeric statistics over the first split (training)
    only, so eval data never leaks into the mapping. Each unit's prepared
    batches are written to ``<output>/.recordprep-tmp/prepared-*.bin``; the
    output's ``PREPARED_KEY`` maps unit index to that file.

    With ``partitions`` > 1 (the job passes its unit count) vocabulary term
    counts are merged per partition of the terms (``merge_vocabularies``), so
    no process holds every distinct term; with one unit they go through the
    global combine. Both give the same analysis.
    """

    def __init__(self, config: Config, options: ConvertOptions, partitions: int = 1):
        super().__init__()
        self.config, self.options = config, options
        self.partitions = partitions if spilled_features(config) else 1

    def expand(self, units):
        spilled = self.partitions > 1
        merged = (
            units
            | "AnalyzeUnit" >> beam.ParDo(_AnalyzeUnit(self.config, self.options, self.partitions))
            | "MergeAnalysis" >> beam.CombineGlobally(
                _MergeAnalyzers(self.config, spilled, self.options.max_vocabulary_terms))
        )
        if not spilled:
            return merged
        vocabularies = merge_vocabularies(merged, self.config, self.partitions, self.options.max_vocabulary_terms)
        config = self.config
        return merged | "FinishAnalysis" >> beam.Map(
            lambda m, v: m.value(config, *v), beam.pvalue.AsSingleton(vocabularies))


# -------------------------------------------------- the partitioned vocabulary merge


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


def df_key(name: str) -> tuple[str, str]:
    """The key of a feature's document frequencies in a unit's term counts file (beside its
    counts, under ``name``): a term's count and document frequency land in one partition."""
    return (name, "df")


def spill_unit_counts(acc: Analyzer, tmp_dir: str, unit: int, partitions: int) -> str | None:
    """Write ``acc``'s vocabulary term counts (and document frequencies) to a temp file and drop
    them from ``acc``; the file's path, or None when the unit has no terms."""
    acc.flush()
    names = spilled_features(acc.config)
    arrays: dict[Any, tuple[list[str], np.ndarray]] = {
        n: (list(acc.counts[n]), np.fromiter(acc.counts[n].values(), dtype=np.int64, count=len(acc.counts[n])))
        for n in names if acc.counts[n] and n not in acc.ranked}
    for n in names:
        acc.counts[n] = Counter()
    # A label-ranked feature's counts per (feature, class); its records per class stay in the combine.
    for n, ranked in acc.ranked.items():
        arrays.update(((n, c), block) for c, block in ranked.arrays().items())
        ranked.by_class = {}
    for n, d in acc.doc_freq.items():
        if d.terms:
            arrays[df_key(n)] = (list(d.terms), np.fromiter(d.terms.values(), dtype=np.int64, count=len(d.terms)))
        d.terms = Counter()  # its documents stay: one number, merged by the global combine
    if not arrays:
        return None
    return _spill_file(tmp_dir, "terms", unit, lambda out: write_term_arrays(out, arrays, partitions))


#: (terms kept without top_k, best (term, count) or, with document frequencies, (term, count, df)).
_Candidates = tuple[int, list[tuple[Any, ...]]]


class _CountPartition(beam.DoFn):
    """``(feature, partition)`` + the merged analysis (side input: its unit files)
    -> ``(feature, (terms kept, best top_k (term, count)))``.

    Without ``top_k`` every kept term is a candidate; a partition keeping more
    than ``max_terms`` sends its count only (the feature is refused anyway).
    """

    def __init__(self, config: Config, max_terms: int | None = None):
        self.config, self.max_terms = config, max_terms

    def process(self, task: tuple[str, int], merged: Any) -> Iterator[tuple[str, _Candidates]]:
        name, partition = task
        paths = unit_files(merged.spills)
        f = next(f for f in self.config.features if f.name == name)
        if transform_of(f).label_ranked:
            best: list[tuple[Any, ...]] = _ranked_partition(f, paths, partition, merged.analyzer)
        else:
            total: Counter = Counter()
            for path in paths:
                with FileSystems.open(path) as fh:
                    add_counts(total, *read_partition(fh, name, partition))
            best = top_terms(total, f.min_frequency, f.top_k)
        kept = 0 if f.top_k else len(best)
        if self.max_terms is not None and kept > self.max_terms:
            best = []
        if transform_of(f).document_frequencies and best:  # the candidates' df, from the same partition
            df: Counter = Counter()
            for path in paths:
                with FileSystems.open(path) as fh:
                    add_counts(df, *read_partition(fh, df_key(name), partition))
            best = [(t, c, df[t]) for t, c in best]
        yield name, (kept, best)


def _ranked_partition(f: Any, paths: list[str], partition: int, analyzer: Analyzer) -> list[tuple[str, float]]:
    """A label-ranked feature's best ``(term, score)`` of one partition of the terms: its
    per-class counts of every unit file, scored with the label's records per class (the combine's)."""
    counts = LabelTermCounts()
    for path in paths:
        with FileSystems.open(path) as fh:
            counts.add_arrays({key[1]: block for key, block in read_partitions(fh, partition).items()
                               if isinstance(key, tuple) and key[0] == f.name})
    classes = analyzer.ranked[f.name].classes
    return transform_of(f).rank(f, counts, classes, analyzer.label_ids())  # type: ignore[attr-defined]


class _TopVocabularies(beam.CombineFn):
    """Partition candidates -> ``{feature: vocabulary}``, keeping the best ``top_k`` as they merge.

    A feature without ``top_k`` whose kept terms pass ``max_terms`` keeps only
    their count from then on, and ``extract_output`` refuses it
    (``check_vocabulary_sizes``).
    """

    def __init__(self, config: Config, max_terms: int | None = None):
        self.config, self.max_terms = config, max_terms
        self.top_k = {f.name: f.top_k for f in config.features}
        self.names = spilled_features(config)
        self.doc_freq = {f.name: transform_of(f).document_frequencies for f in config.features}

    def create_accumulator(self) -> dict[str, _Candidates]:
        return {}

    def _add(self, acc: dict[str, _Candidates], name: str, cands: _Candidates) -> None:
        kept, best = acc.get(name, (0, []))
        kept += cands[0]
        over = self.max_terms is not None and kept > self.max_terms
        acc[name] = (kept, [] if over else merge_top([best, cands[1]], self.top_k[name]))

    def add_input(self, acc, element):
        self._add(acc, *element)
        return acc

    def merge_accumulators(self, accs):
        out: dict[str, _Candidates] = {}
        for acc in accs:
            for name, cands in acc.items():
                self._add(out, name, cands)
        return out

    def extract_output(self, acc) -> tuple[dict[str, list[str]], dict[str, list[int]]]:
        """``(vocabularies, document frequencies)``: each spilled feature's terms, and for those
        whose transform counts them, their document frequencies in the same order."""
        if self.max_terms is not None:
            check_vocabulary_sizes(self.config, {n: kept for n, (kept, _) in acc.items()}, self.max_terms)
        best = {n: acc.get(n, (0, []))[1] for n in self.names}
        return ({n: [c[0] for c in best[n]] for n in self.names},
                {n: [c[2] for c in best[n]] for n in self.names if self.doc_freq[n]})


def check_vocabulary_sizes(config: Config, sizes: dict[str, int], max_terms: int) -> None:
    """ConfigError naming every feature without ``top_k`` whose vocabulary (``sizes``: terms
    counted ``min_frequency`` times or more in the training split) holds more than
    ``max_terms`` terms, with what to do: a ``top_k``, a ``hash``, or a higher limit."""
    over = [(f, sizes[f.name]) for f in config.features
            if f.name in sizes and not f.top_k and sizes[f.name] > max_terms]
    if over:
        raise ConfigError(*(
            f"feature {f.name!r} (source {f.source!r}): {n:,} distinct terms of the training split occur "
            f"min_frequency ({f.min_frequency}) times or more, more than --max-vocabulary-terms ({max_terms:,}) "
            f"for a vocabulary without top_k, which every process applying it holds whole; no dataset was "
            f"committed. Give it a top_k (its most frequent terms get ids, the rest num_oov_buckets), or for "
            f"identifiers use transform: hash with buckets; or raise --max-vocabulary-terms"
            for f, n in over))


def unit_files(spills: dict[int, str | None]) -> list[str]:
    """Every unit's term counts file, in unit order."""
    return [spills[u] for u in sorted(spills) if spills[u] is not None]


def partition_tasks(config: Config, partitions: int) -> list[tuple[str, int]]:
    """One task per spilled feature and partition."""
    return [(n, p) for n in spilled_features(config) for p in range(partitions)]


def merge_vocabularies(merged: Any, config: Config, partitions: int, max_terms: int | None = None) -> Any:
    """``merged`` (singleton with ``.spills``) -> singleton ``{feature: vocabulary}``; a vocabulary
    without ``top_k`` of more than ``max_terms`` terms is a ConfigError (``check_vocabulary_sizes``)."""
    return (
        merged
        | "PartitionTasks" >> beam.FlatMap(lambda _: partition_tasks(config, partitions))
        | "SpreadPartitions" >> beam.Reshuffle()
        | "CountPartition" >> beam.ParDo(_CountPartition(config, max_terms), beam.pvalue.AsSingleton(merged))
        | "TopVocabularies" >> beam.CombineGlobally(_TopVocabularies(config, max_terms))
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
            if isinstance(fs.terms, TermCounts):
                terms, counts = fs.terms.summed()
                if terms:
                    arrays[(name, s)] = (terms, counts)
                fs.terms = TermCounts()
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
