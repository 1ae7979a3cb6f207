"""The analysis pass: what transforms learn from the training split.

``Analyzer`` accumulates what transforms need (vocabulary counts,
count/mean/M2/min/max, quantile sketches) over the *training split only*;
accumulators merge, so the pipeline runs them as a Beam combiner.
``Analyzer.result()`` gives an ``Analysis`` (JSON-serializable;
``--analysis-from`` reuses one, checked by ``Analysis.check_config``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from convert.columns import Finished, LabelTerms, PresentRows, RawValues, TermRows, ValidNumbers
from convert.config import Config, ConfigError, FeatureConfig, LabelConfig, parse_path
from convert.prepare import PreparedBatch, Preparer, count_values, label_terms
from convert.quantiles import QuantileSketch
from convert.records import (
    F32_MAX,
    as_list,
    getter,
    is_list_path,
    joined_text,
    term,
    to_float,
    tokenize,
)
from convert.spec import MAX_LABEL_CLASSES, statistics_problems
from convert.transforms import transform_of
from convert.transforms.label_vocabulary import LabelTermCounts, row_classes
from convert.transforms.ngrams import UNIGRAMS, ngrams_of
from convert.transforms.tfidf import DocumentFrequencies, row_document_counts
from convert.transforms.zscore_per_key import MAX_KEYS, KeyedMoments, per_key_problems


def _feature_getter(f: FeatureConfig) -> Callable[[Any], Any]:
    """``getter(f.source)``; for ``text`` through lists, each record's strings joined (``joined_text``)."""
    get = getter(f.source)
    if not transform_of(f).tokens or not is_list_path(parse_path(f.source)):
        return get
    return lambda r: joined_text([get(r)])[0]


@dataclasses.dataclass
class NumericStats:
    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf
    missing: int = 0
    #: ``bucketize`` features also sketch quantiles; merged in the same
    #: (unit) order as the moments, so boundaries are reproducible.
    sketch: QuantileSketch | None = None
    #: ``zscore_per_key`` features also keep each key's moments (``KeyedMoments``), merged
    #: in the same order as the global ones.
    keyed: KeyedMoments | None = None

    def add(self, x: np.ndarray, missing: int) -> None:
        self.missing += missing
        if x.size == 0:
            return
        if self.sketch is not None:
            self.sketch.add(x)
        other = NumericStats(int(x.size), float(x.mean()), float(((x - x.mean()) ** 2).sum()),
                             float(x.min()), float(x.max()))
        self.merge(other)

    def merge(self, o: NumericStats) -> None:
        """Chan et al. parallel variance: exact-enough and order-insensitive."""
        self.missing += o.missing
        if self.sketch is not None and o.sketch is not None:
            self.sketch.merge(o.sketch)
        if self.keyed is not None and o.keyed is not None:
            self.keyed.merge(o.keyed)
        if o.count == 0:
            return
        n = self.count + o.count
        d = o.mean - self.mean
        self.mean += d * o.count / n
        self.m2 += o.m2 + d * d * self.count * o.count / n
        self.count = n
        self.min = min(self.min, o.min)
        self.max = max(self.max, o.max)

    @property
    def std(self) -> float:
        return math.sqrt(self.m2 / self.count) if self.count else 0.0

    def to_json(self) -> dict[str, Any]:
        d = {"count": self.count, "missing": self.missing, "mean": self.mean, "std": self.std,
             "min": self.min if self.count else None, "max": self.max if self.count else None}
        if self.keyed is not None:
            d["per_key"] = self.keyed.finish()
        return d


class AnalysisMismatchError(ConfigError):
    """A reused analysis (``--analysis-from``) was not computed for this config's features."""


#: Options that shape a feature's vocabulary or statistics, by transform,
#: besides its source and transform: a reused analysis must match them.
_ANALYSIS_OPTIONS = {
    "vocabulary": ("top_k", "min_frequency", "num_oov_buckets"),
    "text": ("top_k", "min_frequency", "num_oov_buckets", "lowercase"),
    "bucketize": ("num_buckets",),
    "zscore_per_key": ("key",),
    "label_vocabulary": ("top_k", "min_frequency", "num_oov_buckets", "mutual_information", "min_diff_from_avg"),
}


def analysis_options(f: FeatureConfig) -> dict[str, Any]:
    """What made ``f``'s vocabulary or statistics: its source, transform,
    whether it is a list, and the options of ``_ANALYSIS_OPTIONS`` (else its
    transform's ``analysis_options``), as JSON has them."""
    d: dict[str, Any] = {"source": f.source, "transform": f.transform, "multi_valued": f.multi_valued}
    for k in _ANALYSIS_OPTIONS.get(f.transform, transform_of(f).analysis_options):
        v = getattr(f, k)
        d[k] = list(v) if isinstance(v, tuple) else v
    return d


def has_stats(f: FeatureConfig) -> bool:
    """Whether the analysis records statistics of ``f``: a numeric transform that needs
    them (``needs_stats``), or one scaled by the training split (``Transform.scaled``)."""
    return f.needs_stats or transform_of(f).scaled is not None


def label_analysis_options(lab: LabelConfig) -> dict[str, Any]:
    """What made a vocabulary label's classes (recorded like ``analysis_options``)."""
    return {"source": lab.source, "transform": "vocabulary", "role": "label"}


def vocabulary_label(config: Config) -> LabelConfig | None:
    """The label when its classes come from the analysis (``transform: vocabulary``)."""
    return config.label if config.label is not None and config.label.needs_vocabulary else None


@dataclasses.dataclass
class Analysis:
    """What the vectorize pass needs, computed on the training split.

    ``config_hash`` and ``features`` (``analysis_options`` of each feature
    analyzed) record what it was computed for, so that a reuse with another
    config is refused (``check_config``); analyses written before they
    existed have ``None``. ``document_frequencies``: per feature whose transform
    counts them (``Transform.document_frequencies``), ``{"documents": N, "df":
    [...]}``, the training documents and, per vocabulary term in id order, the
    documents holding it.
    """

    vocabularies: dict[str, list[str]]
    stats: dict[str, dict[str, Any]]
    config_hash: str | None = None
    features: dict[str, dict[str, Any]] | None = None
    document_frequencies: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_config(cls, config: Config, vocabularies: dict[str, list[str]], stats: dict[str, dict[str, Any]]) -> Analysis:
        """The analysis of ``config``'s features, recording what it was computed for."""
        features = {f.name: analysis_options(f) for f in config.features if f.needs_vocabulary or has_stats(f)}
        lab = vocabulary_label(config)
        if lab is not None:
            features[lab.name] = label_analysis_options(lab)
        return cls(vocabularies, stats, config.hash, features)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"vocabularies": self.vocabularies, "stats": self.stats}
        if self.config_hash is not None:
            d["config_hash"] = self.config_hash
        if self.features is not None:
            d["features"] = self.features
        if self.document_frequencies:
            d["document_frequencies"] = self.document_frequencies
        return d

    @classmethod
    def load(cls, d: Any, where: str = "the analysis") -> Analysis:
        """``from_json`` after checking the whole document (``analysis_problems``).

        Raises:
          AnalysisMismatchError: naming every problem (feature, key, value).
        """
        problems = analysis_problems(d)
        if problems:
            shown = "; ".join(problems[:20]) + (f"; and {len(problems) - 20} more" if len(problems) > 20 else "")
            raise AnalysisMismatchError(f"{where} is not a recordprep analysis as the converter writes it: {shown}. Point it at the "
                                        "analysis.json of a completed recordprep output, unedited")
        return cls.from_json(d)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Analysis:
        features = d.get("features")
        return cls(vocabularies=dict(d["vocabularies"]), stats=dict(d["stats"]), config_hash=d.get("config_hash"),
                   features=None if features is None else dict(features),
                   document_frequencies=dict(d.get("document_frequencies") or {}))

    def check_config(self, config: Config, where: str = "the analysis") -> list[str]:
        """Refuse to vectorize ``config`` with this analysis unless every feature that
        needs a vocabulary or statistics has them, computed with its transform and
        options (``analysis_options``), and a vocabulary label has its classes.

        Returns the features whose transform and options cannot be verified
        (an analysis written before it recorded them).

        Raises:
          AnalysisMismatchError: naming every feature without a match and what differs.
        """
        problems, unverified = [], []
        for f in config.features:
            if not (f.needs_vocabulary or has_stats(f)):
                continue
            what = "vocabulary" if f.needs_vocabulary else "statistics"
            stats = self.stats.get(f.name)
            have = (self.vocabularies.get(f.name) is not None if f.needs_vocabulary
                    else isinstance(stats, dict) and all(k in stats for k in transform_of(f).sketch_keys)
                    and (not transform_of(f).per_key or "per_key" in stats))
            recorded = None if self.features is None else self.features.get(f.name)
            if have and transform_of(f).document_frequencies and f.name not in self.document_frequencies:
                have, what = False, "document frequencies"
            if not have:
                was = f" (it analyzed {recorded['transform']!r})" if recorded else ""
                problems.append(f"feature {f.name!r} ({f.transform}): no {what} for it{was}")
            elif self.features is None:
                unverified.append(f.name)
            elif recorded is None:
                problems.append(f"feature {f.name!r} ({f.transform}): its {what} came from another feature config")
            else:
                now = analysis_options(f)
                diff = [f"{k} {recorded.get(k)!r} there, {v!r} here" for k, v in now.items() if recorded.get(k) != v]
                if diff:
                    problems.append(f"feature {f.name!r}: {', '.join(diff)}")
        lab = vocabulary_label(config)
        if lab is not None:
            recorded = None if self.features is None else self.features.get(lab.name)
            if recorded != label_analysis_options(lab) or self.vocabularies.get(lab.name) is None:
                was = "" if recorded is None else f" (it has {recorded!r})"
                problems.append(f"label {lab.name!r} (vocabulary): no classes computed for it from "
                                f"source {lab.source!r}{was}")
        if problems:
            made = f" (computed for config {self.config_hash})" if self.config_hash else ""
            raise AnalysisMismatchError(
                f"{where}{made} does not fit this config: {'; '.join(problems)}. Reuse an analysis computed with "
                f"these features' transforms and options, or run without --analysis-from to compute a new one")
        return unverified


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


_STATS_KEYS = ("count", "missing", "mean", "std", "min", "max")


def _stats_problems(name: str, st: Any) -> list[str]:
    """What in one feature's statistics the converter never writes (``NumericStats.to_json``
    and bucketize boundaries), each naming the feature, the key and the value."""
    if not isinstance(st, dict):
        return [f"stats of {name!r} must be a mapping, found {_short(st)}"]
    absent = [k for k in _STATS_KEYS if k not in st]
    if absent:
        return [f"stats of {name!r} lack {', '.join(map(repr, absent))} (the converter writes {', '.join(_STATS_KEYS)})"]
    out = per_key_problems(name, st["per_key"]) if "per_key" in st else []
    return out + statistics_problems(name, st)  # count and missing: exact non-negative integers there


def _vocabulary_problems(name: str, terms: Any) -> list[str]:
    if not isinstance(terms, list):
        return [f"vocabulary of {name!r} must be a list of strings, found {_short(terms)}"]
    bad = next((t for t in terms if not isinstance(t, str)), None)
    if bad is not None or any(not isinstance(t, str) for t in terms):
        return [f"vocabulary of {name!r}: every term must be a string, found {_short(bad)}"]
    if len(set(terms)) != len(terms):
        seen: set[str] = set()
        dup = next(t for t in terms if t in seen or seen.add(t))
        return [f"vocabulary of {name!r}: the term {_short(dup)} appears twice (ids would skip); terms are unique"]
    return []


def _count_ok(v: Any) -> bool:
    """An exact non-negative integer (not a bool or a float)."""
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _document_frequency_problems(dfs: Any, vocabularies: dict[str, Any]) -> list[str]:
    """What in ``document_frequencies`` the converter never writes: per feature, a count of
    documents and one count per vocabulary term, each an integer in ``0..documents``."""
    if not isinstance(dfs, dict):
        return [f"'document_frequencies' must map feature names to their counts, found {_short(dfs)}"]
    out = []
    for name, d in dfs.items():
        n = d.get("documents") if isinstance(d, dict) else None
        df = d.get("df") if isinstance(d, dict) else None
        terms = vocabularies.get(name)
        if not _count_ok(n) or not isinstance(df, list) or not isinstance(terms, list) or len(df) != len(terms):
            out.append(f"document_frequencies of {name!r} must be {{documents: N, df: [one count per vocabulary "
                       f"term]}}, found {_short(d)}")
        elif not all(_count_ok(k) and k <= n for k in df):
            out.append(f"document_frequencies of {name!r}: every count must be an integer in 0..{n}, "
                       f"found {_short(next(k for k in df if not (_count_ok(k) and k <= n)))}")
    return out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def analysis_problems(d: Any) -> list[str]:
    """Everything in an analysis document that the converter's own ``analysis.json`` never
    has: types, finite statistics, ``std >= 0``, ``min <= max``, strictly increasing finite
    boundaries, unique string terms. An empty list
    when it is sound. Checked on load, before any work: an edited value would otherwise
    give features that are all NaN, -inf, sign-flipped or with skipped ids."""
    if not isinstance(d, dict):
        return [f"expected a JSON object with 'vocabularies' and 'stats', found {type(d).__name__}"]
    out = []
    for key in ("vocabularies", "stats"):
        if not isinstance(d.get(key), dict):
            out.append(f"{key!r} must be a mapping of feature names, found {_short(d.get(key))}")
    if out:
        return out
    for name, terms in d["vocabularies"].items():
        out += _vocabulary_problems(name, terms)
    for name, st in d["stats"].items():
        out += _stats_problems(name, st)
    out += _document_frequency_problems(d.get("document_frequencies", {}), d["vocabularies"])
    if d.get("config_hash") is not None and not isinstance(d["config_hash"], str):
        out.append(f"'config_hash' must be a string, found {_short(d['config_hash'])}")
    features = d.get("features")
    if features is not None and (not isinstance(features, dict) or not all(isinstance(v, dict) for v in features.values())):
        out.append(f"'features' must map feature names to their options, found {_short(features)}")
    return out


class PendingTermCounts:
    """Term counts kept per term index while a unit's batches carry the indexes over.

    Counts accumulate in numpy, ``width`` slots per term index (one per split
    where the owner counts per split), until the owner's ``drain(name, terms,
    counts)`` turns them into Counter entries: when a batch starts new indexes
    (``first == 0``: a new unit, or a batch prepared on its own) and on
    ``drain_all``. ``counts`` may be longer than ``len(terms) * width`` (it grows
    by doubling); the slots past that are zero.
    """

    def __init__(self, width: int = 1, what: str = "batches"):
        self.width = width
        self.what = what
        self.by_feature: dict[str, tuple[list[str], np.ndarray]] = {}

    def sync(self, name: str, first: int, new_terms: list[str],
             drain: Callable[[str, list[str], np.ndarray], None]) -> tuple[list[str], np.ndarray]:
        """The feature's terms and counts per term index, after a batch added ``new_terms`` from index ``first``."""
        if first == 0:
            self.drain(name, drain)
        terms, counts = self.by_feature.get(name) or ([], np.zeros(0, dtype=np.int64))
        if len(terms) != first:
            raise ValueError(f"feature {name!r}: {self.what} out of order (term index {first}, expected {len(terms)})")
        terms.extend(new_terms)
        need = len(terms) * self.width
        if counts.size < need:
            counts = np.concatenate([counts, np.zeros(max(need, 2 * counts.size) - counts.size, dtype=np.int64)])
        self.by_feature[name] = (terms, counts)
        return terms, counts

    def drain(self, name: str, drain: Callable[[str, list[str], np.ndarray], None]) -> None:
        """Hand one feature's pending counts to ``drain`` and forget them."""
        pending = self.by_feature.pop(name, None)
        if pending is not None:
            drain(name, *pending)

    def drain_all(self, drain: Callable[[str, list[str], np.ndarray], None]) -> None:
        for name in list(self.by_feature):
            self.drain(name, drain)


class Analyzer:
    """Mergeable accumulator for one config; see module docstring."""

    def __init__(self, config: Config):
        self.config = config
        self.counts: dict[str, Counter] = {f.name: Counter() for f in config.features if f.needs_vocabulary}
        self.numeric: dict[str, NumericStats] = {
            f.name: NumericStats(sketch=QuantileSketch() if transform_of(f).quantiles else None,
                                 keyed=KeyedMoments() if transform_of(f).per_key else None)
            for f in config.features if has_stats(f)
        }
        #: Values seen per feature (every feature): records for scalars, items
        #: or tokens for lists and text. 0: the feature was missing (null,
        #: absent or empty) in every analyzed record, as a misspelled source is.
        self.present: Counter = Counter()
        lab = vocabulary_label(config)
        if lab is not None:  # records per class; merged with the term counts
            self.counts[lab.name] = Counter()
        #: Training documents, and per term the documents holding it, of the features whose
        #: transform counts them (``Transform.document_frequencies``).
        self.doc_freq = {f.name: DocumentFrequencies() for f in config.features if transform_of(f).document_frequencies}
        #: ``label_vocabulary`` features: records per (class, term) and per class.
        self.ranked: dict[str, LabelTermCounts] = {
            f.name: LabelTermCounts() for f in config.features if transform_of(f).label_ranked}
        self._get = {f.name: _feature_getter(f) for f in config.features}
        self._pending = PendingTermCounts(what="prepared batches")
        self._pending_df = PendingTermCounts(what="prepared batches")

    # Accumulators travel between Beam workers: pickle the counts, not the getters.
    def __getstate__(self) -> dict[str, Any]:
        self.flush()
        return {"config": self.config, "counts": self.counts, "numeric": self.numeric, "present": self.present,
                "doc_freq": self.doc_freq, "ranked": self.ranked}

    @property
    def label_counts(self) -> Counter | None:
        """Records per class of a vocabulary label, in ``counts`` under the label's name; else None."""
        lab = vocabulary_label(self.config)
        return self.counts[lab.name] if lab is not None else None

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._get = {f.name: _feature_getter(f) for f in self.config.features}
        self._pending = PendingTermCounts(what="prepared batches")
        self._pending_df = PendingTermCounts(what="prepared batches")

    def add_records(self, records: Sequence[Any]) -> None:
        """Accumulate ``records`` (every one counts: pass the training split only).

        The reference path, a value at a time; the pipeline feeds the batches
        it prepares anyway to ``add_prepared``, which gives the same result.
        """
        for f in self.config.features:
            get = self._get[f.name]
            t = transform_of(f)
            if t.scaled is not None:
                self._add_scaled_records(f, records)
            elif t.per_key:
                self._add_keyed_records(f, records)
            elif t.label_ranked:
                self._add_values(f, [get(r) for r in records])
                self._add_ranked_records(f, records)
            elif f.name in self.counts or f.name in self.numeric:
                self._add_values(f, [get(r) for r in records])
            elif t.reads_sources:
                gets = [getter(s) for s in f.sources or ()]
                self.present[f.name] += sum(all(g(r) is not None for g in gets) for r in records)
            else:
                self.present[f.name] += count_values(f, [get(r) for r in records])
        lab = vocabulary_label(self.config)
        if lab is not None and self.label_counts is not None:
            get = getter(lab.source)
            self.label_counts.update(t for t in label_terms(lab, [get(r) for r in records], {}) if t is not None)

    def add_prepared(self, batch: PreparedBatch, rows: np.ndarray) -> None:
        """Accumulate the rows of a batch selected by the bool mask ``rows``.

        ``batch`` comes from ``Preparer.prepare(..., analyze=True)``: terms are
        counted per distinct term (``np.bincount`` of the rows' term indexes),
        statistics come from the already-converted numbers.
        """
        if batch.analysis is None:
            raise ValueError("the batch was prepared without analyze=True")
        for f in self.config.features:
            extra = batch.analysis.get(f.name)
            if extra is None:
                continue
            match extra:
                case PresentRows():
                    self.present[f.name] += int(np.count_nonzero(extra.rows & rows))
                    if transform_of(f).scaled is not None:
                        part = next(p for p in batch.parts if isinstance(p, Finished) and p.name == f.name)
                        self._add_scaled(f, part.columns[f.name][1][:, 0], extra.rows, rows)
                case RawValues():
                    self._add_values(f, [v for v, keep in zip(extra.values, rows.tolist(), strict=True) if keep])
                    if f.name in self.ranked:
                        self._add_ranked(f.name, [], extra, batch, rows)
                    if extra.new_terms is not None:
                        self._pending.sync(f.name, extra.first, extra.new_terms, self._drain)  # type: ignore[arg-type]
                case TermRows():
                    terms, counts = self._pending.sync(f.name, extra.first, extra.new_terms, self._drain)
                    if f.name in self.ranked:
                        self._add_ranked(f.name, terms, extra, batch, rows)
                    sel = extra.codes[rows if extra.row_of is None else rows[extra.row_of]]
                    sel = sel[sel >= 0]
                    self.present[f.name] += int(sel.size)
                    if sel.size:
                        counts[: len(terms)] += np.bincount(sel, minlength=len(terms))
                    if f.name in self.doc_freq:
                        self._add_documents(f.name, extra, rows)
                case ValidNumbers():
                    self._add_valid(f.name, extra, rows)
        lab = vocabulary_label(self.config)
        if lab is not None and self.label_counts is not None:
            label = batch.analysis[lab.name]
            assert isinstance(label, LabelTerms)
            terms = label.terms
            self.label_counts.update(t for t, keep in zip(terms, rows.tolist(), strict=True) if keep and t is not None)

    def flush(self) -> None:
        """Move term counts kept per term index (``add_prepared``) into ``counts`` (and ``doc_freq``)."""
        self._pending.drain_all(self._drain)
        self._pending_df.drain_all(self._drain_df)

    def _add_documents(self, name: str, extra: TermRows, rows: np.ndarray) -> None:
        """The selected ``rows`` as documents of ``doc_freq[name]``: each counts once, and once
        for each distinct term it holds."""
        terms, df = self._pending_df.sync(name, extra.first, extra.new_terms, self._drain_df)
        self.doc_freq[name].documents += int(np.count_nonzero(rows))
        assert extra.row_of is not None
        take = rows[extra.row_of]
        df[: len(terms)] += row_document_counts(extra.codes[take], extra.row_of[take], len(terms))

    def _drain_df(self, name: str, terms: list[str], df: np.ndarray) -> None:
        self.doc_freq[name].add(terms, df[: len(terms)], 0)

    def _drain(self, name: str, terms: list[str], counts: np.ndarray) -> None:
        nz = np.flatnonzero(counts)
        c = self.counts[name]
        if not c:  # dict.update at C speed into an empty Counter
            c.update(dict(zip([terms[i] for i in nz.tolist()], counts[nz].tolist(), strict=True)))
        else:
            for i, k in zip(nz.tolist(), counts[nz].tolist(), strict=True):
                c[terms[i]] += k

    def _add_values(self, f: FeatureConfig, values: list[Any]) -> None:
        self.present[f.name] += count_values(f, values)
        if f.name in self.counts:
            c = self.counts[f.name]
            if transform_of(f).tokens:
                lo, hi = f.ngram_range or UNIGRAMS
                docs = [ngrams_of(tokenize(v, f.lowercase), lo, hi, f.separator) if isinstance(v, str) else []
                        for v in values]
                for doc in docs:
                    c.update(doc)
                if f.name in self.doc_freq:
                    acc = self.doc_freq[f.name]
                    acc.documents += len(values)
                    acc.terms.update(t for doc in docs for t in set(doc))
            elif f.multi_valued:
                # nested values are rejected by the vectorizer: never terms
                for v in values:
                    items = as_list(v)
                    if not any(isinstance(x, dict | list) for x in items):
                        c.update(term(x) for x in items if x is not None)
            else:
                c.update(term(v) for v in values if v is not None and not isinstance(v, dict | list))
        if f.name in self.numeric:
            flat: list[float] = []
            missing = 0
            for v in values:
                for x in (as_list(v) if f.multi_valued else [v]):
                    if x is None:
                        missing += 1
                    elif isinstance(x, int | float) and abs(fx := to_float(x)) <= F32_MAX:  # finite as float32
                        flat.append(fx)
            self.numeric[f.name].add(np.asarray(flat, dtype=np.float64), missing)

    def _add_scaled(self, f: FeatureConfig, col: np.ndarray, present: np.ndarray, rows: np.ndarray) -> None:
        """Statistics of the base values (``Transform.scaled``) of the selected ``rows``."""
        scaled = transform_of(f).scaled
        assert scaled is not None
        take = rows if scaled.missing_is_value else rows & present
        self.numeric[f.name].add(scaled.base(col[take]), int(np.count_nonzero(rows & ~present)))

    def _add_valid(self, name: str, extra: ValidNumbers, rows: np.ndarray) -> None:
        """A numeric feature's valid numbers of the selected ``rows`` (and their keys' moments)."""
        take = rows[extra.row_of]
        st = self.numeric[name]
        st.add(extra.values[take], int(np.count_nonzero(extra.missing & rows)))
        if st.keyed is not None and extra.keys is not None:
            at = extra.row_of[take]
            st.keyed.add([extra.keys[i] for i in at.tolist()], extra.values[take], np.ones(at.size, dtype=bool))
            if len(st.keyed) > MAX_KEYS:
                raise ConfigError(f"feature {name!r}: more than {MAX_KEYS:,} distinct keys in the training split; "
                                  f"zscore_per_key keeps statistics per key (a category such as a country), and every "
                                  f"process applying them holds them all: pick a coarser key, or use zscore")
        self.present[name] += int(np.count_nonzero(rows & ~extra.missing))

    def _add_ranked(self, name: str, terms: list[str], extra: TermRows | RawValues, batch: PreparedBatch,
                    rows: np.ndarray) -> None:
        """A ``label_vocabulary`` feature's selected ``rows``: each row's term (``terms[code]``,
        or its raw value's term; a list's every item) with the row's label class."""
        assert self.config.label is not None
        classes = [c if keep else None for c, keep in zip(row_classes(batch.parts, self.config.label), rows.tolist(),
                                                           strict=True)]
        if isinstance(extra, TermRows):
            self.ranked[name].add_codes(terms, extra.codes.reshape(-1), classes, extra.row_of)
        elif next(f for f in self.config.features if f.name == name).multi_valued:
            self.ranked[name].add([_list_terms(v) for v in extra.values], classes)
        else:
            self.ranked[name].add([None if v is None or isinstance(v, dict | list) else term(v) for v in extra.values],
                                  classes)

    def _add_ranked_records(self, f: FeatureConfig, records: Sequence[Any]) -> None:
        """``add_records`` of a ``label_vocabulary`` feature's label-class counts (its terms as the preparer reads them)."""
        batch, extra, rows = self._prepared_alone(f, records, self.config.label)
        assert isinstance(extra, TermRows | RawValues)
        self._add_ranked(f.name, list(extra.new_terms or ()), extra, batch, rows)

    def label_ids(self) -> dict[str, int] | None:
        """A class label's ids (the order label-ranked scores sum in); None for an int64 label."""
        lab = vocabulary_label(self.config)
        return None if lab is None else {c: i for i, c in enumerate(_label_classes(lab, self.counts[lab.name]))}

    @staticmethod
    def _prepared_alone(f: FeatureConfig, records: Sequence[Any],
                        label: LabelConfig | None = None) -> tuple[PreparedBatch, Any, np.ndarray]:
        """``(batch, f's analysis part, rows not rejected)``: ``records`` as the preparer reads ``f``
        alone (with ``label``), for ``add_records`` of the features analyzed from prepared columns."""
        batch = Preparer(Config((f,), label)).prepare(records, analyze=True)
        rows = np.ones(len(records), dtype=bool)
        rows[list(batch.bad)] = False
        return batch, batch.analysis[f.name] if batch.analysis else None, rows

    def _add_keyed_records(self, f: FeatureConfig, records: Sequence[Any]) -> None:
        """``add_records`` of a ``zscore_per_key`` feature: its numbers and keys as the preparer reads them."""
        _, extra, rows = self._prepared_alone(f, records)
        assert isinstance(extra, ValidNumbers)
        self._add_valid(f.name, extra, rows)

    def _add_scaled_records(self, f: FeatureConfig, records: Sequence[Any]) -> None:
        """``add_records`` of a scaled feature: its column as the preparer makes it, rejected rows left out."""
        batch, extra, rows = self._prepared_alone(f, records)
        assert isinstance(extra, PresentRows)
        self.present[f.name] += int(np.count_nonzero(extra.rows & rows))
        part = batch.parts[0]
        assert isinstance(part, Finished)
        self._add_scaled(f, part.columns[f.name][1][:, 0], extra.rows, rows)

    def merge(self, other: Analyzer) -> Analyzer:
        self.flush()
        other.flush()
        for k, c in other.counts.items():
            self.counts[k].update(c)
        for k, s in other.numeric.items():
            self.numeric[k].merge(s)
        for k, r in other.ranked.items():
            self.ranked[k].merge(r)
        self.present.update(other.present)
        for k, d in other.doc_freq.items():
            self.doc_freq[k].merge(d)
        return self

    def check_vocabularies(self, analysis: Analysis) -> None:
        """ConfigError when a feature had values in the training split but its vocabulary in
        ``analysis`` is empty: no term reached its ``min_frequency``, so every id would be
        out-of-vocabulary.

        Checked on the result, so the spilled (partitioned) analysis is held to it too. A
        feature with ``allow_all_missing`` is exempt; a feature with no value at all is the
        commit's all-missing check (``convert.check.all_missing_message``).
        """
        lab = vocabulary_label(self.config)
        empty = [f"feature {f.name!r} (source {f.source!r}): no term of the training split occurs "
                 f"min_frequency ({f.min_frequency}) times or more"
                 for f in self.config.features
                 if f.name in analysis.vocabularies and not analysis.vocabularies[f.name]
                 and self.present.get(f.name) and not f.allow_all_missing and (lab is None or f.name != lab.name)]
        keyless = [f"feature {f.name!r}: its key {f.key!r} is missing (null or absent) in every training record "
                   f"with a value, so every record would take the global statistics; check the key's path"
                   for f in self.config.features
                   if transform_of(f).per_key and self.present.get(f.name) and not f.allow_all_missing
                   and not (analysis.stats.get(f.name) or {}).get("per_key", {}).get("keys")]
        if keyless:
            raise ConfigError(*keyless)
        if empty:
            raise ConfigError(f"{'; '.join(empty)}: an empty vocabulary, every value out-of-vocabulary; "
                              f"no dataset was committed. Lower min_frequency, or set allow_all_missing: true on the "
                              f"feature if that is expected")

    def result(self, vocabularies: dict[str, list[str]] | None = None,
               doc_freqs: dict[str, list[int]] | None = None) -> Analysis:
        """The analysis; ``vocabularies`` gives features' vocabularies merged elsewhere
        (``pipelines.analyze``), in the order computed here, and ``doc_freqs`` their terms'
        document frequencies (features with ``doc_freq``) in vocabulary order."""
        self.flush()
        vocabs = {}
        by_name = {f.name: f for f in self.config.features}
        lab = vocabulary_label(self.config)
        for name, c in self.counts.items():
            if lab is not None and name == lab.name:
                vocabs[name] = _label_classes(lab, c)
                continue
            if vocabularies is not None and name in vocabularies:
                vocabs[name] = vocabularies[name]
                continue
            f = by_name[name]
            if name in self.ranked:
                r = self.ranked[name]
                vocabs[name] = [t for t, _ in transform_of(f).rank(f, r, r.classes, self.label_ids())]  # type: ignore[attr-defined]
                continue
            # Most frequent first, ties by term: a sort by term, then a stable
            # sort by count (faster than one sort on (-count, term) tuples, measured).
            terms = [t for t, n in c.items() if n >= f.min_frequency]
            terms.sort()
            terms.sort(key=c.__getitem__, reverse=True)  # reverse keeps equal counts in term order
            vocabs[name] = terms[: f.top_k] if f.top_k else terms
        stats = {k: s.to_json() for k, s in self.numeric.items()}
        for k, s in self.numeric.items():
            if s.sketch is not None:
                stats[k].update(transform_of(by_name[k]).sketch_stats(by_name[k], s.sketch))
        analysis = Analysis.for_config(self.config, vocabs, stats)
        for name, d in self.doc_freq.items():
            df = doc_freqs[name] if doc_freqs is not None and name in doc_freqs else d.of(vocabs[name])
            analysis.document_frequencies[name] = {"documents": d.documents, "df": df}
        return analysis


def _list_terms(v: Any) -> list[str] | None:
    """A list value's terms as ``_add_values`` counts a list vocabulary's: every non-null item
    (None: null, or nested values, which the vectorizer rejects)."""
    if v is None:
        return None
    items = as_list(v)
    if any(isinstance(x, dict | list) for x in items):
        return None
    return [term(x) for x in items if x is not None]


def _label_classes(lab: LabelConfig, counts: Counter) -> list[str]:
    """Every class of the training split, most frequent first, ties by term
    (the order of feature vocabularies); class id = position."""
    if not counts:
        raise ConfigError(f"label {lab.name!r}: no record of the training split has a class in {lab.source!r} "
                          f"(it is null, absent or rejected in every one); check the label's source and the data")
    if len(counts) > MAX_LABEL_CLASSES:
        raise ConfigError(f"label {lab.name!r}: {len(counts)} distinct values of {lab.source!r} in the training "
                          f"split, more than the {MAX_LABEL_CLASSES} classes a label may have; is it the label?")
    classes = sorted(counts)
    classes.sort(key=counts.__getitem__, reverse=True)
    return classes
