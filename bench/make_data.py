"""The standard benchmark dataset: seeded, streamed, written as AVRO and JSON Lines.

``python -m bench.make_data --size small`` (``run`` calls :func:`ensure_dataset`).

21 input fields covering what real click/event logs hold and every kind of
input the converter handles (see :data:`SCHEMA`): int/long/float/double
numerics, nullable numerics, low-cardinality (``country``, enum ``device``,
``segment``), medium (``city``, Zipf over 5 000 names) and high-cardinality
(``user_id``: ~2M distinct, ``item_id``) categoricals, a free-text ``query``
whose words follow a Zipf law over a 30 000-word vocabulary, a variable-length
float array (``scores``, 0-24 values), a string-tag array (``tags``, 0-12
values), a boolean, a ``timestamp-millis``, a nested record ``user`` with two
fields, and an int label ``clicked`` that depends on several features.

The same records are written twice, in the same order: ``avro/part-NNNNN.avro``
(deflate, 64 000-byte blocks like Java's ``DataFileWriter`` default) and
``json/part-NNNNN.jsonl``. Float fields are rounded to float32 before writing,
so the AVRO ``float`` and the JSON number hold the same value and both
conversions produce identical examples.

Records are generated in numpy chunks and streamed into the writers (never a
list of the whole dataset); each file has its own seed, so files are generated
in parallel and every file's content is fixed by (generator version, file
index, records per file). A dataset directory is complete when its
``MANIFEST.json`` (written last) matches :data:`GENERATOR_VERSION` and the size:
then it is reused as is.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import numpy as np
import orjson

#: Bump when the schema or the distributions change: cached data is then regenerated.
GENERATOR_VERSION = 1
BASE_SEED = 20261122
DATA_ROOT = Path(__file__).resolve().parent / "data"
MANIFEST = "MANIFEST.json"

#: size -> (records, files)
SIZES: dict[str, tuple[int, int]] = {
    "small": (40_000, 4),
    "default": (400_000, 16),
    "large": (4_000_000, 64),
}

AVRO_SYNC_INTERVAL = 64_000  # Java DataFileWriter's default block size
CHUNK = 4096

SCHEMA: dict[str, Any] = {
    "type": "record", "name": "Event", "namespace": "recordprep.bench",
    "fields": [
        {"name": "event_id", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "age", "type": ["null", "int"], "default": None},
        {"name": "income", "type": ["null", "double"], "default": None},
        {"name": "price", "type": "float"},
        {"name": "duration_ms", "type": "long"},
        {"name": "score", "type": "double"},
        {"name": "n_items", "type": "int"},
        {"name": "rating", "type": ["null", "float"], "default": None},
        {"name": "country", "type": "string"},
        {"name": "device", "type": {"type": "enum", "name": "Device",
                                    "symbols": ["desktop", "mobile", "tablet", "tv"]}},
        {"name": "city", "type": "string"},
        {"name": "referrer", "type": ["null", "string"], "default": None},
        {"name": "user_id", "type": "string"},
        {"name": "item_id", "type": "long"},
        {"name": "query", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "scores", "type": {"type": "array", "items": "float"}},
        {"name": "is_member", "type": "boolean"},
        {"name": "user", "type": {"type": "record", "name": "User", "fields": [
            {"name": "segment", "type": ["null", "string"], "default": None},
            {"name": "tenure_days", "type": "int"},
        ]}},
        {"name": "clicked", "type": "int"},
    ],
}

#: Numeric fields (non-null in every record, or nullable) for readers that do no
#: vectorization (``reader_bench``'s from_generator row).
NUMERIC_FIELDS = ("event_id", "ts", "age", "income", "price", "duration_ms", "score",
                  "n_items", "rating", "item_id")

_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"]  # 90 syllables
_COUNTRIES = ["US", "IN", "BR", "DE", "GB", "FR", "JP", "NG", "MX", "ID", "TR", "IT", "ES", "CA",
              "KR", "AU", "PL", "NL", "AR", "EG", "VN", "PH", "TH", "SE", "CH", "BE", "AT", "PT",
              "CZ", "RO", "GR", "HU", "DK", "FI", "NO", "IE", "NZ", "CL", "CO", "ZA"]
_DEVICES = ["desktop", "mobile", "tablet", "tv"]
_SEGMENTS = ["new", "casual", "regular", "power", "churned"]
TEXT_VOCAB = 30_000
N_CITIES = 5_000
N_TAGS = 300
N_REFERRERS = 100
N_USERS = 2_000_000


def _word(k: int) -> str:
    """Distinct pronounceable word for every k >= 0 (base-90 syllables)."""
    out = []
    while True:
        k, r = divmod(k, len(_SYLLABLES))
        out.append(_SYLLABLES[r])
        if k == 0:
            return "".join(out)
        k -= 1


WORDS = [_word(k) for k in range(TEXT_VOCAB)]
CITIES = [f"{_word(k + 7919).capitalize()} City" if k % 7 == 0 else _word(k + 7919).capitalize()
          for k in range(N_CITIES)]
TAGS = [f"tag_{_word(k + 104729)}" for k in range(N_TAGS)]
REFERRERS = [f"https://{_word(k + 31337)}.example.com/" for k in range(N_REFERRERS)]


def _zipf(rng: np.random.Generator, a: float, n: int, size: int | tuple[int, ...]) -> np.ndarray:
    """Zipf-distributed ranks in ``[0, n)`` (the tail folded back in)."""
    return (rng.zipf(a, size=size) - 1) % n


def _f32(x: np.ndarray) -> list[float]:
    """float32-rounded values as Python floats (same value in AVRO float and JSON)."""
    return np.asarray(x, dtype=np.float32).astype(np.float64).tolist()


def _chunk(rng: np.random.Generator, first_id: int, n: int) -> Iterator[dict[str, Any]]:
    """``n`` records as dicts, generated column-wise with numpy."""
    ts = (1_767_225_600_000 + (first_id + np.arange(n)) * 1_000 + rng.integers(0, 1_000, n)).tolist()
    age = rng.integers(16, 90, n).tolist()
    age_null = (rng.random(n) < 0.08).tolist()
    income = np.round(rng.lognormal(10.5, 0.7, n), 2).tolist()
    income_null = (rng.random(n) < 0.12).tolist()
    price = _f32(rng.lognormal(3.0, 1.0, n))
    duration = rng.exponential(30_000, n).astype(np.int64).tolist()
    score = rng.normal(0.0, 2.0, n).tolist()
    n_items = rng.integers(1, 51, n).tolist()
    rating = _f32(np.round(rng.uniform(1, 5, n), 1))
    rating_null = (rng.random(n) < 0.2).tolist()
    country = _zipf(rng, 1.6, len(_COUNTRIES), n).tolist()
    device = rng.choice(4, n, p=[0.35, 0.5, 0.12, 0.03]).tolist()
    city = _zipf(rng, 1.2, N_CITIES, n).tolist()
    referrer = _zipf(rng, 1.4, N_REFERRERS, n).tolist()
    referrer_null = (rng.random(n) < 0.3).tolist()
    user = rng.integers(0, N_USERS, n).tolist()
    item = (_zipf(rng, 1.1, 10_000_000, n) * 7919 + 13).tolist()
    q_len = rng.integers(1, 25, n)
    q_words = _zipf(rng, 1.15, TEXT_VOCAB, int(q_len.sum())).tolist()
    q_cap = (rng.random(n) < 0.3).tolist()
    q_mark = (rng.random(n) < 0.2).tolist()
    t_len = np.minimum(rng.poisson(3.0, n), 12)
    t_ids = _zipf(rng, 1.3, N_TAGS, int(t_len.sum())).tolist()
    s_len = rng.integers(0, 25, n)
    s_vals = _f32(rng.normal(0.0, 1.0, int(s_len.sum())))
    member = (rng.random(n) < 0.25).tolist()
    segment = rng.integers(0, len(_SEGMENTS) + 1, n).tolist()
    tenure = rng.integers(0, 3650, n).tolist()
    noise = rng.random(n).tolist()
    q_len, t_len, s_len = q_len.tolist(), t_len.tolist(), s_len.tolist()
    qp = tp = sp = 0
    for i in range(n):
        words = [WORDS[w] for w in q_words[qp:qp + q_len[i]]]
        qp += q_len[i]
        if q_cap[i]:
            words[0] = words[0].capitalize()
        query = " ".join(words) + ("?" if q_mark[i] else "")
        tags = [TAGS[t] for t in t_ids[tp:tp + t_len[i]]]
        tp += t_len[i]
        scores = s_vals[sp:sp + s_len[i]]
        sp += s_len[i]
        dev = _DEVICES[device[i]]
        logit = (-1.6 + 0.9 * member[i] + 0.5 * (dev == "mobile") + 0.4 * (len(tags) > 3)
                 - 0.2 * abs(score[i]) + 0.3 * (q_words[qp - 1] < 100))
        yield {
            "event_id": first_id + i,
            "ts": ts[i],
            "age": None if age_null[i] else age[i],
            "income": None if income_null[i] else income[i],
            "price": price[i],
            "duration_ms": duration[i],
            "score": score[i],
            "n_items": n_items[i],
            "rating": None if rating_null[i] else rating[i],
            "country": _COUNTRIES[country[i]],
            "device": dev,
            "city": CITIES[city[i]],
            "referrer": None if referrer_null[i] else REFERRERS[referrer[i]],
            "user_id": f"u{user[i]:07d}",
            "item_id": item[i],
            "query": query,
            "tags": tags,
            "scores": scores,
            "is_member": member[i],
            "user": {"segment": _SEGMENTS[segment[i]] if segment[i] < len(_SEGMENTS) else None,
                     "tenure_days": tenure[i]},
            "clicked": int(noise[i] < 1.0 / (1.0 + np.exp(-logit))),
        }


def records(file_index: int, per_file: int) -> Iterator[dict[str, Any]]:
    """The records of one file, streamed chunk by chunk (deterministic)."""
    rng = np.random.default_rng([BASE_SEED, GENERATOR_VERSION, file_index])
    first = file_index * per_file
    for start in range(0, per_file, CHUNK):
        yield from _chunk(rng, first + start, min(CHUNK, per_file - start))


def write_file(args: tuple[Path, int, int]) -> tuple[int, int, int]:
    """Write one AVRO file and its JSON Lines twin from one record stream: ``(root, file index,
    records per file)`` -> ``root/avro/part-NNNNN.avro`` and ``root/json/part-NNNNN.jsonl``;
    returns (records, AVRO bytes, JSON bytes)."""
    root, index, per_file = args
    name = f"part-{index:05d}"
    avro_path, json_path = root / "avro" / f"{name}.avro", root / "json" / f"{name}.jsonl"
    parsed = fastavro.parse_schema(SCHEMA)
    count = 0
    with open(avro_path, "wb") as fa, open(json_path, "wb") as fj:
        def tee() -> Iterator[dict[str, Any]]:
            nonlocal count
            for rec in records(index, per_file):
                fj.write(orjson.dumps(rec))
                fj.write(b"\n")
                count += 1
                yield rec

        fastavro.writer(fa, parsed, tee(), codec="deflate", sync_interval=AVRO_SYNC_INTERVAL)
    return count, avro_path.stat().st_size, json_path.stat().st_size


def dataset_dir(size: str) -> Path:
    return DATA_ROOT / size


def read_manifest(size: str) -> dict[str, Any] | None:
    p = dataset_dir(size) / MANIFEST
    try:
        m = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    n, files = SIZES[size]
    if m.get("generator_version") != GENERATOR_VERSION or m.get("records") != n or m.get("files") != files:
        return None
    root = dataset_dir(size)
    for kind in ("avro", "json"):
        for f in m[kind]["files"]:
            if not (root / f["path"]).is_file() or (root / f["path"]).stat().st_size != f["bytes"]:
                return None
    return m


def ensure_dataset(size: str, *, jobs: int | None = None, log=print) -> dict[str, Any]:
    """Generate ``bench/data/<size>/`` unless a matching one is there; return its manifest."""
    m = read_manifest(size)
    if m is not None:
        log(f"data: reusing {dataset_dir(size)} (generator v{GENERATOR_VERSION}, {m['records']:,} records)")
        return m
    n, files = SIZES[size]
    per_file = n // files
    final = dataset_dir(size)
    tmp = final.with_name(f".{size}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "avro").mkdir(parents=True)
    (tmp / "json").mkdir(parents=True)
    jobs = jobs or min(files, os.cpu_count() or 1)
    log(f"data: generating {n:,} records in {files} files ({jobs} processes) -> {final}")
    t0 = time.perf_counter()
    work = [(tmp, i, per_file) for i in range(files)]
    if jobs > 1:
        # fork where there is one: spawn would re-import the caller's main module,
        # which runs it again unless it has a __main__ guard.
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        with multiprocessing.get_context(method).Pool(jobs) as pool:
            out = pool.map(write_file, work)
    else:
        out = [write_file(w) for w in work]
    manifest = {
        "generator_version": GENERATOR_VERSION, "size": size, "records": sum(c for c, _, _ in out),
        "files": files, "seed": BASE_SEED, "schema": SCHEMA,
        "avro": {"codec": "deflate", "sync_interval": AVRO_SYNC_INTERVAL, "bytes": sum(a for _, a, _ in out),
                 "files": [{"path": f"avro/part-{i:05d}.avro", "records": c, "bytes": a}
                           for i, (c, a, _) in enumerate(out)]},
        "json": {"bytes": sum(j for _, _, j in out),
                 "files": [{"path": f"json/part-{i:05d}.jsonl", "records": c, "bytes": j}
                           for i, (c, _, j) in enumerate(out)]},
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    log(f"data: {manifest['records']:,} records, AVRO {manifest['avro']['bytes'] / 1e6:.1f} MB, "
        f"JSON {manifest['json']['bytes'] / 1e6:.1f} MB in {manifest['seconds']} s")
    return manifest


def avro_files(size: str, manifest: dict[str, Any]) -> list[str]:
    return [str(dataset_dir(size) / f["path"]) for f in manifest["avro"]["files"]]


def json_files(size: str, manifest: dict[str, Any]) -> list[str]:
    return [str(dataset_dir(size) / f["path"]) for f in manifest["json"]["files"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    ensure_dataset(args.size, jobs=args.jobs)


if __name__ == "__main__":
    main()
