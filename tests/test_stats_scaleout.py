"""The output statistics' term counts merged per partition of the terms
(``pipelines.analyze.merge_stats_terms``) give exactly ``StatsMerger``'s
document, on random data with many ties, several splits and units; a whole
job's output directory is byte-identical to the one-merge path."""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

import fastavro
import numpy as np
import pytest
from _pipelines_data import without_run_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import convert.stats
from convert.config import parse_config
from convert.stats import StatsAccumulator, StatsMerger
from pipelines.analyze import (
    _MergeSummaries,
    _partition_tasks,
    spill_stats_terms,
    summarize_partition,
)

SPLITS = ["train", "eval", "test"]
CONFIG = parse_config({"label": {"source": "y", "transform": "vocabulary"},
                       "features": [{"name": "t", "transform": "vocabulary"},
                                    {"name": "s", "transform": "text", "max_len": 4},
                                    {"name": "x", "transform": "zscore"}]})
_TERM = st.text(alphabet="abé\U0001f600", min_size=0, max_size=3)
# per unit: per (feature, split) a few terms with small counts (ties at every cut)
_UNIT = st.dictionaries(st.tuples(st.sampled_from(["t", "s", "y"]), st.integers(0, len(SPLITS) - 1)),
                        st.dictionaries(_TERM, st.integers(1, 3), max_size=25), max_size=9)


def _unit_stats(unit: dict) -> StatsAccumulator:
    acc = StatsAccumulator(CONFIG, SPLITS)
    for (name, s), counts in unit.items():
        if counts:
            acc.feature[name][s].terms.add(list(counts), np.array(list(counts.values()), dtype=np.int64))
    return acc


def _document(merger: StatsMerger) -> bytes:
    return json.dumps(merger.result().to_json(), allow_nan=False).encode()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(_UNIT, min_size=1, max_size=5), top=st.integers(1, 6), partitions=st.integers(2, 5),
       order=st.randoms(use_true_random=False))
def test_partitioned_term_statistics_equal_the_stats_merger_document(tmp_path_factory, monkeypatch, units, top,
                                                                     partitions, order):
    monkeypatch.setattr(convert.stats, "TOP_TERMS", top)  # cuts through ties
    want = StatsMerger(CONFIG, SPLITS)
    for i, unit in enumerate(units):
        want.add(i, _unit_stats(unit))

    tmp = str(tmp_path_factory.mktemp("spill"))
    got, files = StatsMerger(CONFIG, SPLITS), []
    for i, unit in enumerate(units):
        acc = _unit_stats(unit)
        files.append(spill_stats_terms(acc, tmp, i, partitions))
        assert all(not fs.terms.summed()[0] for accs in acc.feature.values() for fs in accs if fs.terms is not None)
        got.add(i, acc)
    tasks = _partition_tasks(files, partitions)
    order.shuffle(tasks)
    merge = _MergeSummaries()
    accs = [merge.create_accumulator() for _ in range(2)]  # two combine workers, merged
    for j, (p, paths) in enumerate(tasks):
        for item in summarize_partition(paths, p):
            accs[j % 2] = merge.add_input(accs[j % 2], item)
    got.term_summaries = merge.extract_output(merge.merge_accumulators(accs))
    assert _document(got) == _document(want)


SCHEMA = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "string"}, {"name": "words", "type": "string"}, {"name": "x", "type": "double"},
    {"name": "y", "type": "string"}]}
JOB_CONFIG = """
label: {source: y, transform: vocabulary}
features:
  - {name: id, transform: vocabulary, top_k: 50, min_frequency: 2}
  - {name: words, transform: text, max_len: 4, top_k: 20}
  - {name: x, transform: zscore}
"""


def _digests(out: Path) -> dict[str, str]:
    """Every file's digest; the metadata's run times (``created``, ``started``) and the run's id
    (``run_id``, and in shard names) blanked."""
    def data(p: Path) -> bytes:
        b = p.read_bytes()
        if p.name != "dataset_info.json":
            return b
        b = re.sub(rb'"(created|started|run_id)": ?"[^"]*"', b'"\\1": ""', b)
        return re.sub(rb"-[0-9a-f]{12}(?=\.tfrecord)", b"", b)
    return {without_run_id(str(p.relative_to(out))): hashlib.sha256(data(p)).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_output_directory_is_byte_identical_with_the_one_merge_path(tmp_path, monkeypatch):
    import pipelines.convert_pass
    import pipelines.job
    from convert.splits import Splits
    from pipelines.convert_pass import ConvertUnits
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    monkeypatch.setattr(convert.stats, "TOP_TERMS", 40)  # the document cuts the id column's terms
    rng = random.Random(11)
    recs = [{"id": f"u{rng.randrange(2000)}", "words": " ".join(rng.choice("ab bc cd de ef fg".split())
                                                                 for _ in range(rng.randrange(4))),
             "x": rng.random(), "y": rng.choice("pqr")} for _ in range(6000)]
    with open(tmp_path / "e.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, recs, codec="deflate", sync_interval=4000)
    (tmp_path / "features.yaml").write_text(JOB_CONFIG)

    def run(out: str) -> dict[str, str]:
        run_convert(ConvertOptions(inputs=(str(tmp_path / "e.avro"),), config=str(tmp_path / "features.yaml"),
                                   output=str(tmp_path / "out"), num_shards=4,
                                   splits=Splits(names=("train", "eval", "test"), weights=(0.6, 0.2, 0.2))))
        (tmp_path / "out").rename(tmp_path / out)
        return _digests(tmp_path / out)

    spills = []
    real_spill = pipelines.convert_pass.spill_stats_terms
    monkeypatch.setattr(pipelines.convert_pass, "spill_stats_terms", lambda *a: spills.append(a[2]) or real_spill(*a))
    partitioned = run("partitioned")
    assert sorted(spills) == [0, 1, 2, 3]  # in process: every unit took the partitioned path

    class OneMerge(ConvertUnits):
        def __init__(self, config, options, analysis, num_shards, partitions=1):
            super().__init__(config, options, analysis, num_shards, 1)

    monkeypatch.setattr(pipelines.job, "ConvertUnits", OneMerge)
    spills.clear()
    one = run("one")
    assert not spills
    doc = json.loads((tmp_path / "one" / "stats.json").read_text())
    assert doc["features"]["id"]["splits"]["eval"]["distinct"] > 40  # the cut is exercised
    assert len(doc["features"]["id"]["splits"]["train"]["terms"]) == 40
    assert "stats.json" in one and "dataset_info.json" in one
    assert partitioned == one
