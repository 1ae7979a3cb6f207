"""The partitioned vocabulary merge (pipelines.analyze, convert.term_counts)
gives exactly ``Analyzer.result``'s vocabularies, on random data with many
ties, and the job's shards are byte-identical to the one-combine path."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import fastavro
import pytest
from _pipelines_data import without_run_id
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert.analysis import Analyzer
from convert.config import ConfigError, parse_config
from pipelines.analyze import _CountPartition, _TopVocabularies, partition_tasks, spill_unit_counts

_TERMS = st.text(alphabet="abcé\U0001f600 ", min_size=0, max_size=3)


def _config(top_k: int | None, min_frequency: int):
    vocab = {"name": "t", "transform": "vocabulary", "min_frequency": min_frequency}
    text = {"name": "s", "transform": "text", "max_len": 4, "min_frequency": min_frequency}
    # tf-idf: each candidate term's document frequency comes from its partition too.
    tfidf = {"name": "d", "source": "s", "transform": "tfidf", "max_len": 4, "min_frequency": min_frequency,
             "ngram_range": [1, 2]}
    if top_k is not None:
        vocab["top_k"] = text["top_k"] = tfidf["top_k"] = top_k
    return parse_config({"label": "y", "features": [vocab, text, tfidf, {"name": "x", "transform": "zscore"}]})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(units=st.lists(st.lists(st.tuples(_TERMS, _TERMS), max_size=30), min_size=1, max_size=5),
       top_k=st.none() | st.integers(1, 8), min_frequency=st.integers(1, 3), partitions=st.integers(2, 5),
       max_terms=st.none() | st.integers(1, 40))
def test_partitioned_vocabularies_equal_the_one_analyzer_result(tmp_path_factory, units, top_k, min_frequency,
                                                                partitions, max_terms):
    """... or, for a vocabulary without top_k of more than ``max_terms`` terms, a ConfigError naming
    it, the merge never holding more than ``max_terms`` of its candidates."""
    config = _config(top_k, min_frequency)
    tmp = str(tmp_path_factory.mktemp("spill"))
    records = [[{"t": t, "s": s, "x": 1.0, "y": 0} for t, s in unit] for unit in units]
    reference = Analyzer(config)
    for recs in records:
        reference.add_records(recs)
    want = reference.result()
    spills = {}
    for i, recs in enumerate(records):
        a = Analyzer(config)
        a.add_records(recs)
        spills[i] = spill_unit_counts(a, tmp, i, partitions)
        assert not a.counts["t"] and not a.counts["s"] and not a.doc_freq["d"].terms  # nothing left for the global combine
    count, top = _CountPartition(config, max_terms), _TopVocabularies(config, max_terms)
    accs = [top.create_accumulator() for _ in range(2)]  # two combine workers, merged
    merged = SimpleNamespace(spills=spills)
    for j, task in enumerate(partition_tasks(config, partitions)):
        for cands in count.process(task, merged):
            accs[j % 2] = top.add_input(accs[j % 2], cands)
    if max_terms is not None and top_k is None:
        assert all(len(best) <= max_terms for acc in accs for _, best in acc.values())
    over = [n for n in ("t", "s", "d") if max_terms is not None and top_k is None and len(want.vocabularies[n]) > max_terms]
    if over:
        with pytest.raises(ConfigError) as e:
            top.extract_output(top.merge_accumulators(accs))
        assert [p.split("'")[1] for p in e.value.problems] == over
        for n, p in zip(over, e.value.problems, strict=True):
            assert f"{len(want.vocabularies[n]):,} distinct terms" in p and "top_k" in p and "hash" in p
        return
    got, doc_freqs = top.extract_output(top.merge_accumulators(accs))
    assert got == {n: want.vocabularies[n] for n in ("t", "s", "d")}
    assert doc_freqs == {"d": want.document_frequencies["d"]["df"]}


SCHEMA = {"type": "record", "name": "E", "fields": [
    {"name": "id", "type": "string"}, {"name": "words", "type": "string"}, {"name": "x", "type": "double"},
    {"name": "y", "type": "int"}]}
CONFIG = """
label: y
features:
  - {name: id, transform: vocabulary, top_k: 50, min_frequency: 2}
  - {name: words, transform: text, max_len: 4, top_k: 20}
  - {name: words_tfidf, source: words, transform: tfidf, max_len: 4, top_k: 20, ngram_range: [1, 2]}
  - {name: x, transform: zscore}
"""


def _digests(out: Path) -> dict[str, str]:
    files = [p for p in out.rglob("*") if p.is_file() and (p.suffix == ".tfrecord" or "vocab" in p.parts
                                                         or p.name.endswith(".gz"))]
    # shard names carry their run's id: compared without it
    return {without_run_id(str(p.relative_to(out))): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


@pytest.mark.slow
def test_shards_are_byte_identical_with_the_one_combine_path(tmp_path, monkeypatch):
    import random

    import pipelines.job
    from pipelines.analyze import AnalyzeUnits
    from pipelines.job import run_convert
    from pipelines.options import ConvertOptions

    rng = random.Random(7)
    recs = [{"id": f"u{rng.randrange(300)}", "words": " ".join(rng.choice("ab bc cd de ef fg".split())
                                                                for _ in range(rng.randrange(4))),
             "x": rng.random(), "y": i % 2} for i in range(3000)]
    with open(tmp_path / "e.avro", "wb") as f:
        fastavro.writer(f, SCHEMA, recs, codec="deflate", sync_interval=2000)
    (tmp_path / "features.yaml").write_text(CONFIG)

    def convert(out: str) -> dict[str, str]:
        run_convert(ConvertOptions(inputs=(str(tmp_path / "e.avro"),), config=str(tmp_path / "features.yaml"),
                                   output=str(tmp_path / out), num_shards=4))
        return _digests(tmp_path / out)

    import pipelines.analyze

    spills = []
    real_spill = pipelines.analyze.spill_unit_counts
    monkeypatch.setattr(pipelines.analyze, "spill_unit_counts", lambda *a: spills.append(a[2]) or real_spill(*a))
    spilled = convert("spilled")
    assert sorted(spills) == [0, 1, 2, 3]  # in process: every unit took the partitioned path

    class OneCombine(AnalyzeUnits):
        def __init__(self, config, options, partitions=1):
            super().__init__(config, options, 1)

    monkeypatch.setattr(pipelines.job, "AnalyzeUnits", OneCombine)
    one = convert("one")
    assert len([k for k in one if k.endswith(".tfrecord") or ".tfrecord" in k]) >= 4
    assert spilled == one
