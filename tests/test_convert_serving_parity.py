"""The converter's hashed ids and text tokens equal what TensorFlow computes in a graph.

A serving graph recomputes ``hash``, ``cross`` and vocabulary OOV ids with
``tf.strings.to_hash_bucket_fast(term, buckets) + 1`` and text tokens with
``tf.strings.lower`` / ``regex_replace`` / ``split``; these tests run the
converter's real ``Vectorizer`` (and the columnar Avro path) and TensorFlow's
ops on the same random and real values and compare them element for element.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import pytest
import tensorflow as tf
from _text_strategies import texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from convert.analysis import Analyzer
from convert.config import FeatureConfig, parse_config
from convert.derive import CROSS_SEPARATOR
from convert.prepare import Preparer
from convert.records import TEXT_DELIMITERS_RE, hash_ids, stable_hash, term, tokenize
from convert.sources import iter_avro
from convert.transforms.ngrams import ngrams_of
from convert.vectorize import Vectorizer
from readers import transforms

REALDATA = Path(__file__).resolve().parents[2] / "shared" / "realdata"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"

SCALARS = st.one_of(texts(), st.integers(min_value=-(2**70), max_value=2**70), st.booleans(),
                    st.floats(width=64), st.floats(width=32), st.binary(max_size=8))
#: Lists of one type reach the converter's fast paths; mixed lists the per-value one.
COLUMNS = st.one_of(st.lists(st.one_of(st.none(), texts()), max_size=30),
                    st.lists(st.one_of(st.none(), st.integers(min_value=-(2**70), max_value=2**70)), max_size=30),
                    st.lists(st.one_of(st.none(), SCALARS), max_size=30))


def _utf8(s: str) -> bytes:
    """What a client sends TensorFlow for ``s``: UTF-8, lone surrogates as their 3 bytes."""
    return s.encode("utf-8", "surrogatepass")


def tf_hash_ids(terms: list[str], buckets: int) -> list[int]:
    t = tf.constant([_utf8(x) for x in terms], dtype=tf.string, shape=[len(terms)])
    return (tf.strings.to_hash_bucket_fast(t, buckets).numpy() + 1).tolist()


def _vectorize(features: list[dict], records: list[dict], train: list[dict] | None = None):
    config = parse_config({"features": features})
    an = Analyzer(config)
    an.add_records(train or [])
    vb = Vectorizer(config, an.result()).vectorize(records)
    assert not vb.rejections, vb.rejections
    return vb


def _col(vb, name: str) -> list[int]:
    return vb.columns[name][1][:, 0].tolist()


# ------------------------------------------------------------------ hash


def test_the_farmhash_binding_is_tensorflows_fingerprint64():
    """Lengths around every FarmHash code path boundary (0..4, 8, 16, 32, 64 bytes) and beyond."""
    rng = np.random.default_rng(0)
    blobs = [rng.bytes(n) for n in [*range(0, 70), 100, 255, 256, 1000, 4096, 65_537] for _ in range(3)]
    terms = [b.decode("latin-1") for b in blobs] + [b.decode("utf-8", "surrogateescape") for b in blobs]
    terms = [t for t in terms if t.encode("utf-8", "surrogatepass")] + [""]
    ids = tf.strings.to_hash_bucket_fast([_utf8(t) for t in terms], 2**63 - 1).numpy().tolist()
    assert [stable_hash(t) % (2**63 - 1) for t in terms] == ids
    assert hash_ids(terms, 2**40).tolist() == tf_hash_ids(terms, 2**40)


#: The transforms whose serving ids need the converter's hash or tokenizer, each checked here.
HASHED_CHECKED = {"hash": "test_hash_cross_and_oov_ids_equal_tensorflows",
                  "cross": "test_hash_cross_and_oov_ids_equal_tensorflows",
                  "vocabulary": "test_hash_cross_and_oov_ids_equal_tensorflows",
                  "text": "test_text_ids_equal_tensorflows",
                  "label_vocabulary": "test_label_vocabulary_oov_ids_equal_tensorflows",
                  **dict.fromkeys(("ngrams", "bag_of_words", "tfidf"), "test_ngram_ids_equal_tensorflows")}


@pytest.mark.parametrize("name", transforms.names())
def test_every_registered_transform_with_hashed_ids_has_its_parity_test_here(name):
    """A transform of the serving registry whose ids come from a hash (``ServingTransform.hashed``,
    with OOV buckets) is one whose ids this file compares with TensorFlow's."""
    f = FeatureConfig(name="f", source="f", transform=name, num_oov_buckets=2, buckets=8)
    assert (transforms.get(name).hashed(f) is not None) == (name in HASHED_CHECKED), name
    assert name not in HASHED_CHECKED or callable(globals().get(HASHED_CHECKED[name]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=COLUMNS, other=COLUMNS, buckets=st.integers(min_value=1, max_value=2**40),
       oov=st.integers(min_value=1, max_value=100_000))
def test_hash_cross_and_oov_ids_equal_tensorflows(values, other, buckets, oov):
    """Through the real Vectorizer: ``hash`` ids, ``cross`` ids and the OOV buckets of
    a vocabulary (trained on nothing, so every term is unseen)."""
    other = (other + [None] * len(values))[: len(values)]
    records = [{"h": v, "a": v, "b": w} for v, w in zip(values, other, strict=True)]
    vb = _vectorize([{"name": "h", "transform": "hash", "buckets": buckets},
                     {"name": "v", "source": "h", "transform": "vocabulary", "num_oov_buckets": oov},
                     {"name": "c", "transform": "cross", "sources": ["a", "b"], "buckets": buckets}], records)
    present = [i for i, v in enumerate(values) if v is not None]
    terms = [term(values[i]) for i in present]
    for name, n in (("h", buckets), ("v", oov)):
        want = [0] * len(values)
        for i, tid in zip(present, tf_hash_ids(terms, n), strict=True):
            want[i] = tid
        assert _col(vb, name) == want, name
    both = [i for i in present if other[i] is not None]
    want = [0] * len(values)
    keys = [term(values[i]) + CROSS_SEPARATOR + term(other[i]) for i in both]
    for i, tid in zip(both, tf_hash_ids(keys, buckets), strict=True):
        want[i] = tid
    assert _col(vb, "c") == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=COLUMNS, oov=st.integers(min_value=1, max_value=100_000))
def test_label_vocabulary_oov_ids_equal_tensorflows(values, oov):
    """A ``label_vocabulary``'s unseen terms (trained on nothing) take ``vocabulary``'s OOV ids: TensorFlow's hash."""
    config = parse_config({"label": {"source": "y", "dtype": "int64"},
                           "features": [{"name": "v", "source": "h", "transform": "label_vocabulary", "num_oov_buckets": oov}]})
    vb = Vectorizer(config, Analyzer(config).result()).vectorize([{"h": v, "y": 0} for v in values])
    assert not vb.rejections, vb.rejections
    present = [i for i, v in enumerate(values) if v is not None]
    want = [0] * len(values)
    for i, tid in zip(present, tf_hash_ids([term(values[i]) for i in present], oov), strict=True):
        want[i] = tid
    assert _col(vb, "v") == want


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lists=st.lists(st.one_of(st.none(), st.lists(st.one_of(st.none(), texts()), max_size=6)), max_size=12),
       max_len=st.integers(min_value=1, max_value=4), oov=st.integers(min_value=1, max_value=100_000))
def test_label_vocabulary_list_oov_ids_equal_tensorflows(lists, max_len, oov):
    """A ``label_vocabulary`` list (``max_len``) trained on nothing: each row's first ``max_len``
    non-null items take TensorFlow's OOV ids, 0-padded, and ``_len`` counts them."""
    config = parse_config({"label": {"source": "y", "dtype": "int64"},
                           "features": [{"name": "v", "source": "h", "transform": "label_vocabulary",
                                         "num_oov_buckets": oov, "max_len": max_len}]})
    vb = Vectorizer(config, Analyzer(config).result()).vectorize([{"h": v, "y": 0} for v in lists])
    assert not vb.rejections, vb.rejections
    want, lens = [], []
    for v in lists:
        kept = [term(x) for x in v or [] if x is not None][:max_len]
        ids = tf_hash_ids(kept, oov) if kept else []
        want.append(ids + [0] * (max_len - len(ids)))
        lens.append(len(ids))
    assert vb.columns["v"][1].tolist() == want
    assert vb.columns["v_len"][1][:, 0].tolist() == lens


def _avro_column(values: list[str | None]) -> bytes:
    schema = {"type": "record", "name": "r", "fields": [{"name": "s", "type": ["null", "string"]}]}
    buf = io.BytesIO()
    fastavro.writer(buf, schema, [{"s": v} for v in values], codec="null")
    return buf.getvalue()


def _vectorize_avro(features: list[dict], values: list[str | None], decoder: str):
    """Columns of an Avro file of ``values`` in field ``s``, decoded by ``decoder``
    (``auto``: the columnar path with its term codes)."""
    config = parse_config({"features": features})
    prep, an = Preparer(config), Analyzer(config)
    vec = Vectorizer(config, an.result())
    out = []
    for batch in iter_avro(io.BytesIO(_avro_column(values)), "s.avro", batch_size=64, decoder=decoder):
        vb = vec.finish(prep.prepare(batch.records))
        assert not vb.rejections
        out.append(vb)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(st.none(), texts(surrogates=False)), min_size=1, max_size=100),
       buckets=st.integers(min_value=1, max_value=2**40))
def test_hash_ids_of_both_avro_decoders_equal_tensorflows(values, buckets):
    features = [{"name": "h", "source": "s", "transform": "hash", "buckets": buckets}]
    want = [0 if v is None else t for v, t in zip(values, tf_hash_ids([v or "" for v in values], buckets), strict=True)]
    for decoder in ("auto", "fastavro"):
        got = [i for vb in _vectorize_avro(features, values, decoder) for i in _col(vb, "h")]
        assert got == want, decoder


# ------------------------------------------------------------------ text


def tf_tokens(texts: list[str], lowercase: bool) -> list[list[str]]:
    """The serving graph's tokenizer (``readers.serving_ops.text_tokens``) on the texts' UTF-8 bytes;
    ``convert.records.tokenize``'s formula in TensorFlow ops gives the same tokens."""
    from readers.serving_ops import text_tokens as _tokens

    t = tf.constant([_utf8(x) for x in texts], dtype=tf.string, shape=[len(texts)])
    if lowercase:
        t = tf.strings.lower(t)
    toks = tf.RaggedTensor.from_sparse(_tokens(t)).to_list()
    assert toks == tf.strings.split(tf.strings.regex_replace(t, TEXT_DELIMITERS_RE, " ")).to_list()
    return [[w.decode("utf-8", "surrogatepass") for w in row] for row in toks]


def _text_ids_and_tokens(values: list[str | None], lowercase: bool, max_len: int, oov: int,
                         train: list[str | None]) -> tuple[list[list[int]], list[int], list[str]]:
    """(ids, lens, vocabulary) of a ``text`` feature through the real Analyzer and Vectorizer."""
    config = parse_config({"features": [{"name": "t", "transform": "text", "max_len": max_len, "lowercase": lowercase,
                                         "num_oov_buckets": oov, "top_k": 10**6}]})
    an = Analyzer(config)
    an.add_records([{"t": v} for v in train])
    analysis = an.result()
    vb = Vectorizer(config, analysis).vectorize([{"t": v} for v in values])
    assert not vb.rejections, vb.rejections
    return vb.columns["t"][1].tolist(), _col(vb, "t_len"), analysis.vocabularies["t"]


def _tf_text_ids(texts: list[str | None], lowercase: bool, max_len: int, oov: int,
                 vocab: list[str]) -> tuple[list[list[int]], list[int]]:
    """What a serving graph computes: tokens, the first ``max_len``, vocabulary
    ids after the ``oov`` OOV ids, unseen tokens hashed into the OOV buckets, 0-padded."""
    ids_of = {t: 1 + oov + i for i, t in enumerate(vocab)}
    rows = [toks[:max_len] for toks in tf_tokens([t or "" for t in texts], lowercase)]
    hashed = iter(tf_hash_ids([t for toks in rows for t in toks], oov))  # one id per token, in order
    ids = [[ids_of.get(t, h) for t, h in zip(toks, hashed)] for toks in rows]  # noqa: B905 (hashed is longer)
    return [row + [0] * (max_len - len(row)) for row in ids], [len(row) for row in ids]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(st.none(), texts()), max_size=20), lowercase=st.booleans())
def test_tokenize_equals_tensorflows_tokens(values, lowercase):
    present = [v for v in values if v is not None]
    assert [tokenize(v, lowercase) for v in present] == tf_tokens(present, lowercase)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(st.none(), texts()), max_size=20), train=st.lists(st.one_of(st.none(), texts()), max_size=10),
       lowercase=st.booleans(), max_len=st.integers(min_value=1, max_value=12), oov=st.integers(min_value=1, max_value=100_000))
def test_text_ids_equal_tensorflows(values, train, lowercase, max_len, oov):
    """Through the real Vectorizer (a column at once, its ASCII and Unicode paths, and
    row by row when a text holds NUL): the vocabulary is exactly TensorFlow's tokens
    of the training texts, and every row's ids, ``max_len`` cut and ``_len`` are the
    serving graph's."""
    ids, lens, vocab = _text_ids_and_tokens(values, lowercase, max_len, oov, train)
    assert set(vocab) == {t for toks in tf_tokens([t for t in train if t is not None], lowercase) for t in toks}
    assert (ids, lens) == _tf_text_ids(values, lowercase, max_len, oov, vocab)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(st.none(), texts()), max_size=12), train=st.lists(st.one_of(st.none(), texts()), max_size=8),
       lo=st.integers(1, 3), extra=st.integers(0, 2), sep=st.sampled_from([" ", "", "_"]),
       oov=st.integers(min_value=1, max_value=1000))
def test_ngram_ids_equal_tensorflows(values, train, lo, extra, sep, oov):
    """The terms of ``ngrams`` (and of ``bag_of_words`` and ``tfidf``, which share them:
    ``convert.transforms.ngrams.document_terms``) through the real Vectorizer: n-grams of
    TensorFlow's tokens, their vocabulary ids, unseen n-grams hashed into the OOV buckets
    by TensorFlow's hash, in order (``max_len`` large enough for every one)."""
    hi = lo + extra
    feature = {"name": "g", "transform": "ngrams", "ngram_range": [lo, hi], "separator": sep, "max_len": 64,
               "num_oov_buckets": oov, "top_k": 10**6}
    config = parse_config({"features": [feature]})
    an = Analyzer(config)
    an.add_records([{"g": v} for v in train])
    analysis = an.result()
    vb = Vectorizer(config, analysis).vectorize([{"g": v} for v in values])
    assert not vb.rejections, vb.rejections
    ids_of = {t: 1 + oov + i for i, t in enumerate(analysis.vocabularies["g"])}
    rows = [ngrams_of(toks, lo, hi, sep) for toks in tf_tokens([t or "" for t in values], True)]
    hashed = iter(tf_hash_ids([g for row in rows for g in row], oov))
    want = [[ids_of.get(g, h) for g, h in zip(row, hashed)] for row in rows]  # noqa: B905 (hashed is longer)
    assert vb.columns["g"][1].tolist() == [row[:64] + [0] * (64 - len(row[:64])) for row in want]


# ------------------------------------------------------------------ real files


def _strings(v: Any, out: list[str]) -> list[str]:
    """Every string (and map key) anywhere in a decoded value."""
    if isinstance(v, str):
        out.append(v)
    elif isinstance(v, dict):
        for k, x in v.items():
            out.append(str(k))
            _strings(x, out)
    elif isinstance(v, list | tuple):
        for x in v:
            _strings(x, out)
    return out


def _file_strings(path: Path) -> list[str]:
    """The strings of the records a plain reader gets from ``path`` (up to where it fails)."""
    out: list[str] = []
    data = path.read_bytes()
    if path.suffix == ".avro":
        try:
            for r in fastavro.reader(io.BytesIO(data)):
                _strings(r, out)
        except Exception:  # the bad files of the collection: keep what was read
            pass
        return out
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    try:
        return _strings(json.loads(text), out)
    except ValueError:
        pass
    for line in text.splitlines():
        try:
            _strings(json.loads(line), out)
        except ValueError:
            continue
    return out


def _real_strings() -> dict[str, list[str]]:
    files = sorted(p for d in (REALDATA, EXAMPLES) if d.is_dir() for p in d.rglob("*")
                   if p.suffix in (".avro", ".json", ".jsonl", ".ndjson") and p.is_file())
    return {str(p): list(dict.fromkeys(s)) for p in files if (s := _file_strings(p))}


@pytest.fixture(scope="module")
def real_strings() -> dict[str, list[str]]:
    found = _real_strings()
    if not found:
        pytest.skip(f"no real data: {REALDATA} and {EXAMPLES} hold no readable string fields")
    return found


def test_hash_ids_on_real_files_equal_tensorflows(real_strings):
    assert any("realdata" in p for p in real_strings) or not REALDATA.is_dir()
    for path, strings in real_strings.items():
        for buckets in (1, 7, 1000, 2**40):
            vb = _vectorize([{"name": "h", "source": "s", "transform": "hash", "buckets": buckets},
                             {"name": "v", "source": "s", "transform": "vocabulary", "num_oov_buckets": 97}],
                            [{"s": s} for s in strings])
            assert _col(vb, "h") == tf_hash_ids(strings, buckets), path
            assert _col(vb, "v") == tf_hash_ids(strings, 97), path


def test_text_on_real_files_equals_tensorflows(real_strings):
    for path, strings in real_strings.items():
        for lowercase in (True, False):
            assert [tokenize(v, lowercase) for v in strings] == tf_tokens(strings, lowercase), path
            ids, lens, vocab = _text_ids_and_tokens(strings, lowercase, 16, 5, strings[::2])
            assert (ids, lens) == _tf_text_ids(strings, lowercase, 16, 5, vocab), path


# ------------------------------------------------------------------ format version


@pytest.mark.parametrize("version", [1, 2, 3])
def test_readers_train_on_outputs_of_every_format_version(tmp_path, version):
    import _readers_fixtures as fx

    import readers

    o = fx.write_output(tmp_path / "out", format_version=version)
    assert readers.load_info(str(o.root)).format_version == version
    ds = readers.train_dataset(str(o.root / "train-*"), 7, num_epochs=1, drop_remainder=False)
    assert sorted(fx.ids_of(ds)) == o.all_ids("train")


@pytest.mark.parametrize("version", [0, -1])
def test_a_format_version_below_one_is_refused(tmp_path, version):
    import _readers_fixtures as fx

    import readers
    from convert.spec import SpecError

    o = fx.write_output(tmp_path / "out", format_version=version)
    with pytest.raises(SpecError, match="format_version"):
        readers.load_info(str(o.root))


def test_an_output_of_an_older_format_is_not_taken_as_complete(tmp_path):
    """Before format_version 3 the fingerprint left the version out: the same inputs
    and config re-run over such an output must not count as "nothing to do" (its ids
    differ); it is refused naming the version, and --overwrite rewrites it as version 3."""
    import hashlib

    from _e2e import cli

    from convert.spec import FORMAT_VERSION, SERVING_MIN_FORMAT_VERSION

    assert FORMAT_VERSION == SERVING_MIN_FORMAT_VERSION == 3
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"q": f"Stra\u00dfe {i} \u0130", "u": f"u{i}"}) + "\n" for i in range(20)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("features:\n  - {name: q, transform: text, max_len: 3}\n  - {name: u, transform: hash, buckets: 8}\n")
    out = tmp_path / "out"
    args = ("convert", "-i", inp, "-c", cfg, "-o", out, "--splits", "all=1")
    assert cli(*args).exit_code == 0
    meta_path = out / "dataset_info.json"
    meta = json.loads(meta_path.read_text())
    assert meta["format_version"] == 3
    # what recordprep wrote before: version 1 and the fingerprint without the version
    old_fp = hashlib.sha256(json.dumps(
        {"files": [[f["path"], f["size"], f["mtime"]] for f in meta["inputs"]], "config": meta["config_hash"],
         "options": meta["options"]}, sort_keys=True, default=str).encode()).hexdigest()
    meta_path.write_text(json.dumps({**meta, "format_version": 1, "fingerprint": old_fp}))
    r = cli(*args)
    assert r.exit_code != 0 and "older recordprep (format_version 1" in r.output and "--overwrite" in r.output, r.output
    assert json.loads(meta_path.read_text())["format_version"] == 1
    r = cli(*args, "--overwrite")
    assert r.exit_code == 0, r.output
    assert json.loads(meta_path.read_text())["format_version"] == 3
    assert cli(*args).exit_code == 0  # now complete: nothing to do
