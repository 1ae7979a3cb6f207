"""Digests of what ``recordprep convert`` writes for fixed inputs: the byte-identity guard of a refactor.

Each case of :data:`CASES` is a real CLI run (a subprocess, ``python -m pipelines.cli convert``)
with a fixed seed, in a work directory that holds the inputs under relative paths
(``examples/...`` as in ``make demo``, ``bench/...`` for a small dataset from
``bench.make_data``), so no host path reaches the outputs. Every file the run writes is
digested (SHA-256 of its bytes): shards, ``dataset_info.json``, ``analysis.json``,
``stats.json``, the vocabulary files, the error files.

What differs between two runs of the same conversion is cut before digesting, and only that:
the run id (in shard names and ``dataset_info.json``), ``created``/``started`` timestamps,
the inputs' mtimes and the ``fingerprint`` made from them. Each cut must match as often as
expected (:func:`_cut`), so a format change cannot make a cut silently miss.

Shards are digested compressed, as written: the golden digests hold for the compression
libraries constraints.txt pins (zlib-ng, isal); another build may deflate differently.

``tests/regen_outputs_unchanged.py`` records the golden digests
(``tests/data/outputs_unchanged.json``); ``tests/test_outputs_unchanged.py`` compares.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _pipelines_data import without_run_id

REPO = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "outputs_unchanged.json"
REGEN = "python tests/regen_outputs_unchanged.py"

#: The bench-shaped inputs: files x records per file of bench.make_data's generator (small: < 1 min in all).
BENCH_FILES, BENCH_PER_FILE = 2, 3000


@dataclass(frozen=True)
class Case:
    """One conversion: its inputs (relative to the work directory) and CLI options."""

    name: str
    input: str
    config: str
    options: tuple[str, ...]


CASES: tuple[Case, ...] = (
    # make demo's two conversions
    Case("examples-avro", "examples/data/*.avro", "examples/features.yaml", ("--seed", "7")),
    Case("examples-json", "examples/data/*.jsonl", "examples/features.yaml",
         ("--seed", "7", "--max-error-fraction", "0.01")),
    # the bench dataset's shape: several shards, worker processes, the other layout, no compression
    Case("bench-avro", "bench/avro/*.avro", "bench/features.yaml",
         ("--seed", "11", "--num-shards", "3", "--workers", "2")),
    Case("bench-json", "bench/json/*.jsonl", "bench/features.yaml",
         ("--seed", "13", "--num-shards", "2", "--compression", "none", "--layout", "packed",
          "--split-key", "user_id")),
    Case("bench-avro-input-order", "bench/avro/*.avro", "bench/features.yaml",
         ("--order", "input", "--splits", "train=0.8,eval=0.1,test=0.1")),
)


def make_inputs(work: Path) -> None:
    """The example data and a small bench dataset under ``work/examples`` and ``work/bench``."""
    from bench import make_data

    shutil.copytree(REPO / "examples" / "data", work / "examples" / "data")
    shutil.copy(REPO / "examples" / "features.yaml", work / "examples" / "features.yaml")
    for kind in ("avro", "json"):
        (work / "bench" / kind).mkdir(parents=True)
    for index in range(BENCH_FILES):
        make_data.write_file((work / "bench", index, BENCH_PER_FILE))
    shutil.copy(REPO / "bench" / "features.yaml", work / "bench" / "features.yaml")


def convert(work: Path, case: Case) -> Path:
    """Run ``recordprep convert`` for ``case`` in ``work``; its output directory."""
    out = f"out/{case.name}"
    cmd = [sys.executable, "-m", "pipelines.cli", "convert", "--input", case.input, "--config", case.config,
           "--output", out, *case.options]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(f"case {case.name}: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return work / out


#: (pattern, replacement, times it must match) per cut of dataset_info.json; None = at least once.
_INFO_CUTS: tuple[tuple[str, str, int | None], ...] = (
    (r'"created": "[^"]*"', '"created": "<cut>"', 1),
    (r'"started": "[^"]*"', '"started": "<cut>"', 1),
    (r'"run_id": "[0-9a-f]{12}"', '"run_id": "<cut>"', 1),
    (r'"fingerprint": "[0-9a-f]+"', '"fingerprint": "<cut>"', 1),
    (r'"mtime": [0-9.e+-]+', '"mtime": "<cut>"', None),
)


def _cut(text: str, name: str) -> str:
    for pattern, repl, times in _INFO_CUTS:
        text, n = re.subn(pattern, repl, text)
        if n == 0 or (times is not None and n != times):
            raise AssertionError(f"{name}: {pattern!r} matched {n} times, expected {times or 'at least 1'}: "
                                 f"the run-dependent fields changed form; update tests/_outputs_unchanged.py")
    return text


def normalised(path: Path, rel: str) -> bytes:
    """A file's bytes with what two runs differ in cut (see the module docstring)."""
    data = path.read_bytes()
    if rel == "dataset_info.json":
        data = _cut(without_run_id(data.decode("utf-8")), rel).encode("utf-8")
    return data


def output_digests(out: Path) -> dict[str, str]:
    """``{path relative to out, run id cut: sha256}`` of every file under ``out``."""
    digests = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        rel = path.relative_to(out).as_posix()
        digests[without_run_id(rel)] = hashlib.sha256(normalised(path, rel)).hexdigest()
    return digests


def all_digests(work: Path) -> dict[str, dict[str, str]]:
    """Inputs made in ``work``, every case converted there: ``{case: {file: sha256}}``."""
    make_inputs(work)
    return {case.name: output_digests(convert(work, case)) for case in CASES}


def differences(golden: dict[str, dict[str, str]], got: dict[str, dict[str, str]]) -> list[str]:
    """One line per case or file whose digest differs, is missing or is new."""
    lines = []
    for case in sorted(golden.keys() | got.keys()):
        want, have = golden.get(case), got.get(case)
        if want is None or have is None:
            lines.append(f"{case}: case {'new' if want is None else 'missing'}")
            continue
        for rel in sorted(want.keys() | have.keys()):
            if rel not in have:
                lines.append(f"{case}/{rel}: not written any more")
            elif rel not in want:
                lines.append(f"{case}/{rel}: new file")
            elif want[rel] != have[rel]:
                lines.append(f"{case}/{rel}: content differs")
    return lines
