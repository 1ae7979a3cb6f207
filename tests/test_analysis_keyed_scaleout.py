"""The keyed analyzers scale out as the vocabularies do: ``label_vocabulary``'s per-class term
counts go through the partitioned merge (``pipelines.analyze``) and rank exactly as one
``Analyzer`` ranks them; ``zscore_per_key``'s per-key moments, merged per unit in unit order, are
one accumulator's statistics."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert.analysis import Analyzer
from convert.config import parse_config
from convert.prepare import Preparer
from pipelines.analyze import (
    _CountPartition,
    _MergeAnalyzers,
    _TopVocabularies,
    partition_tasks,
    spill_unit_counts,
)

_TERMS = st.sampled_from(["a", "b", "c", "d", "é", "", "x y", "7"]) | st.none()
_RECORD = st.tuples(_TERMS, st.integers(0, 2))


def _config(label: dict, top_k: int | None, min_frequency: int, kind: str):
    f = {"name": "t", "transform": "label_vocabulary", "min_frequency": min_frequency, "mutual_information": kind}
    if top_k is not None:
        f["top_k"] = top_k
    return parse_config({"label": label, "features": [f, {"name": "v", "source": "t", "transform": "vocabulary"}]})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(_RECORD, max_size=40), min_size=1, max_size=4),
       top_k=st.none() | st.integers(1, 5), min_frequency=st.integers(1, 3), partitions=st.integers(2, 4),
       kind=st.sampled_from(["adjusted", "plain"]), class_label=st.booleans())
def test_partitioned_label_vocabulary_equals_the_one_analyzer_result(tmp_path_factory, units, top_k, min_frequency,
                                                                     partitions, kind, class_label):
    label = {"source": "y", "transform": "vocabulary"} if class_label else {"source": "y", "dtype": "int64"}
    config = _config(label, top_k, min_frequency, kind)
    tmp = str(tmp_path_factory.mktemp("spill"))
    records = [[{"t": t, "y": y} for t, y in unit] for unit in units]
    if not any(records):
        return
    reference = Analyzer(config)
    for recs in records:
        reference.add_records(recs)
    want = reference.result()
    combine = _MergeAnalyzers(config, spilled=True)
    acc = combine.create_accumulator()
    spills = {}
    for i, recs in enumerate(records):
        a = Analyzer(config)
        batch = Preparer(config).prepare(recs, analyze=True)
        rows = np.ones(len(recs), dtype=bool)
        rows[list(batch.bad)] = False
        a.add_prepared(batch, rows)
        spills[i] = spill_unit_counts(a, tmp, i, partitions)
        assert not a.ranked["t"].by_class  # the per-class term counts left the combine
        acc = combine.add_input(acc, (i, a, None, spills[i]))
    merged = combine.extract_output(acc)
    assert merged.analyzer.ranked["t"].classes == reference.ranked["t"].classes
    count, top = _CountPartition(config), _TopVocabularies(config)
    tacc = top.create_accumulator()
    for task in partition_tasks(config, partitions):
        for cands in count.process(task, SimpleNamespace(spills=spills, analyzer=merged.analyzer)):
            tacc = top.add_input(tacc, cands)
    got, _ = top.extract_output(tacc)  # (vocabularies, document frequencies)
    assert got["t"] == want.vocabularies["t"]
    assert got["v"] == want.vocabularies["v"]


def test_per_key_moments_merged_per_unit_are_one_accumulator_s_statistics():
    config = parse_config({"features": [{"name": "p", "transform": "zscore_per_key", "key": "k"}]})
    rng = np.random.default_rng(3)
    units = [[{"p": float(x), "k": str(k)} for x, k in zip(rng.lognormal(2, 1, n), rng.integers(0, 4, n), strict=True)]
             for n in (50, 70, 30)]
    one = Analyzer(config)
    combine = _MergeAnalyzers(config)
    acc = combine.create_accumulator()
    for i, recs in enumerate(units):
        a = Analyzer(config)
        a.add_records(recs)
        one.add_records(recs)
        acc = combine.add_input(acc, (i, a, None))
    got = combine.extract_output(acc).json["stats"]["p"]
    assert got["per_key"]["keys"] == ["0", "1", "2", "3"]
    ref = one.result().stats["p"]["per_key"]
    assert got["per_key"]["count"] == ref["count"]
    np.testing.assert_allclose(got["per_key"]["mean"], ref["mean"], rtol=1e-12)
