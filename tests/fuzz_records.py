"""Fuzz the record -> features -> Example path at scale with hypothesis: ``make fuzz``.

    python tests/fuzz_records.py [--seconds 300] [--examples-per-round 500] [--target NAME ...] [--seed N]

Targets (each a property; rounds of fresh random examples run until the time is up):

- ``avro``: random schemas/records within the supported types -> Avro file ->
  ``convert.sources`` -> ``Analyzer`` -> ``Vectorizer`` -> bulk Example encoder ->
  TensorFlow's parser; values must match the README's rules (tests/_expected_values.py).
- ``json``: random JSON documents and garbage lines never crash the path;
  every record is accepted or rejected with a field and a reason.
- ``numbers``: any number (NaN, +-inf, beyond float32, huge ints) under each ``on_nan`` policy.
- ``avro-bytes``: valid Avro files with flipped bytes, truncations and inserted
  garbage: the reader yields records or raises ``InputFileError`` naming the
  file, nothing else, in bounded time and memory.
- ``json-bytes``: arbitrary bytes as a JSON input: records, bad lines, or ``InputFileError``.
- ``config``: hostile feature configs (alias bombs, deep nesting, duplicate keys, huge and
  non-finite numbers, wrong types, non-UTF-8 bytes, long strings; tests/_config_strategies.py):
  ``load_config`` loads them or raises ``ConfigError`` with a short message, nothing else.
- ``metadata``: a valid ``dataset_info.json`` with hostile file names, huge or wrong shapes,
  wrong types and counts, or nested thousands of levels deep (tests/_metadata_strategies.py):
  it loads within every limit or raises ``SpecError``, nothing else.

A failure prints every distinct failure hypothesis found, each with its traceback, shrunk
falsifying example and a ``--reproduce BLOB`` command that re-runs just that example, and exits 1. ``tests/test_property_fuzz.py``
runs a few seconds of it in the normal suite.
"""

from __future__ import annotations

import argparse
import functools
import io
import re
import resource
import signal
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import hypothesis  # noqa: E402
import test_property_roundtrip as props  # noqa: E402
from _config_strategies import config_target, hostile_configs  # noqa: E402
from _metadata_strategies import metadata_target, metadata_texts  # noqa: E402
from _record_strategies import avro_bytes, avro_cases  # noqa: E402
from hypothesis import HealthCheck, given, reproduce_failure, settings  # noqa: E402
from hypothesis import seed as hseed  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.errors import DidNotReproduce  # noqa: E402

from convert.sources import InputFileError, iter_avro, iter_json  # noqa: E402

#: One example may take this long before it counts as a hang.
EXAMPLE_SECONDS = 20.0
#: The reader must stay under this address space (a corrupt header must not allocate gigabytes).
MEMORY_LIMIT = 4 << 30


class Hang(Exception):
    pass


def _alarm(*_):
    raise Hang(f"one example ran for more than {EXAMPLE_SECONDS} s")


def bounded(fn):
    """Run one example under a per-example time limit (SIGALRM)."""

    @functools.wraps(fn)  # hypothesis reads the wrapped signature
    def run(*args, **kwargs):
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, EXAMPLE_SECONDS)
        try:
            return fn(*args, **kwargs)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)

    return run


# ------------------------------------------------------------------ targets


def _inner(test):
    return test.hypothesis.inner_test


@st.composite
def damaged_avro(draw):
    data = bytearray(avro_bytes(draw(avro_cases(max_records=30)), sync_interval=draw(st.sampled_from([16, 64, 512]))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "flip", "truncate", "insert", "varint"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:  # a large varint where a count or length may be
            data[i:i] = draw(st.sampled_from([b"\xfe\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x80\x80\x80\x01", b"\xff\x01"]))
    return bytes(data)


def avro_bytes_target(data: bytes) -> None:
    try:
        for batch in iter_avro(io.BytesIO(data), "fuzz.avro", batch_size=64):
            assert len(batch.records) == len(batch.offsets) == len(batch.indexes)
    except InputFileError as e:
        assert "fuzz.avro" in str(e)


def json_bytes_target(data: bytes) -> None:
    try:
        for batch in iter_json(io.BytesIO(data), "fuzz.jsonl", batch_size=64):
            assert len(batch.records) == len(batch.offsets) == len(batch.indexes)
            for off, _line, reason, raw in batch.bad:
                assert off >= 0 and reason and isinstance(raw, str)
    except InputFileError as e:
        assert "fuzz.jsonl" in str(e)


TARGETS = {  # name: (strategies for the arguments, body)
    "avro": ((avro_cases(),), _inner(props.test_random_avro_schema_and_records_vectorize_as_documented)),
    "json": ((props.json_files,), _inner(props.test_random_json_never_crashes_the_record_path)),
    "numbers": ((st.lists(props.NUMBERS, min_size=1, max_size=30), st.sampled_from(["error", "fill", "keep"]),
                 st.sampled_from(["identity", "zscore", "minmax", "clip"])),
                _inner(props.test_non_finite_policy_holds_for_any_number)),
    "avro-bytes": ((damaged_avro(),), avro_bytes_target),
    "json-bytes": ((st.one_of(st.binary(max_size=400),
                              props.json_files.map(lambda b: b[: len(b) // 2] + b"\xff" + b[len(b) // 2:])),),
                   json_bytes_target),
    "config": ((hostile_configs(),), config_target),
    "metadata": ((metadata_texts(),), metadata_target),
}


def _leaves(e: BaseException) -> list[BaseException]:
    """The distinct failures hypothesis found: the leaves of its ExceptionGroup, or ``e`` itself."""
    if isinstance(e, BaseExceptionGroup):
        return [leaf for sub in e.exceptions for leaf in _leaves(sub)]
    return [e]


_BLOB_RE = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


def report_failure(name: str, round_no: int, e: BaseException, per_round: int, seed: int | None) -> None:
    """Print every distinct failure (traceback, falsifying example) and a command reproducing it.

    Hypothesis attaches the shrunk falsifying example and the
    ``@reproduce_failure`` blob (``print_blob=True``) to each failure as
    notes, which ``traceback`` prints; ``str()`` of its ExceptionGroup has
    neither.
    """
    leaves = _leaves(e)
    err = sys.stderr
    print(f"FAIL {name} (round {round_no}): {len(leaves)} distinct failure(s)", file=err)
    for i, leaf in enumerate(leaves, 1):
        print(f"\n--- failure {i}/{len(leaves)} of {name}: {type(leaf).__name__}: {leaf}", file=err)
        print("".join(traceback.format_exception(leaf)).rstrip(), file=err)
        blob = _BLOB_RE.search("\n".join(getattr(leaf, "__notes__", [])))
        if blob:
            print(f"reproduce failure {i}: python tests/fuzz_records.py --target {name} --reproduce {blob[2]}", file=err)
    if seed is not None:
        print(f"re-run the round: python tests/fuzz_records.py --target {name} --seconds 0 "
              f"--examples-per-round {per_round} --seed {seed}", file=err)
    err.flush()


def _test(name: str, per_round: int, seed: int | None, blob: str | None):
    strategies, body = TARGETS[name]
    test = settings(max_examples=per_round, deadline=None, database=None, derandomize=False,
                    suppress_health_check=list(HealthCheck), print_blob=True)(given(*strategies)(bounded(body)))
    if seed is not None:
        test = hseed(seed)(test)
    if blob is not None:
        test = reproduce_failure(hypothesis.__version__, blob.encode())(test)
    return test


def run(targets: list[str], seconds: float, per_round: int, seed: int | None) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    end = time.monotonic() + seconds
    rounds = examples = 0
    while True:
        for name in targets:
            round_seed = None if seed is None else seed + rounds
            t0 = time.monotonic()
            try:
                _test(name, per_round, round_seed, None)()
            except Exception as e:  # noqa: BLE001 - report and stop
                report_failure(name, rounds, e, per_round, round_seed)
                return 1
            examples += per_round
            print(f"ok   {name:<11} round {rounds}: {per_round} examples in {time.monotonic() - t0:.1f} s", flush=True)
        rounds += 1
        if time.monotonic() >= end:  # every target runs at least one round
            print(f"fuzz: {examples} examples over {len(targets)} target(s) in {rounds} round(s), no failure")
            return 0


def reproduce(name: str, blob: str) -> int:
    """Run the one example a failure report's blob encodes; 1 (with the report) if it still fails."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    try:
        _test(name, 1, None, blob)()
    except DidNotReproduce as e:
        if "completed successfully" in str(e):
            print(f"{name}: the example passes now")
            return 0
        print(f"{name}: the blob does not fit this target's strategies ({e}); was it printed for another "
              f"--target or another version of the code?", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - report and stop
        report_failure(name, 0, e, 1, None)
        return 1
    raise AssertionError("unreachable: reproduce_failure always raises")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="stop after the round that is running when this much time has passed")
    ap.add_argument("--examples-per-round", type=int, default=300)
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="repeatable; default: all")
    ap.add_argument("--seed", type=int, default=None, help="reproducible rounds")
    ap.add_argument("--reproduce", metavar="BLOB", help="run the example of a failure report (its blob) on one --target")
    a = ap.parse_args(argv)
    if a.reproduce is not None:
        if not a.target or len(a.target) != 1:
            ap.error("--reproduce needs exactly one --target (the one the failure report names)")
        return reproduce(a.target[0], a.reproduce)
    return run(a.target or list(TARGETS), a.seconds, a.examples_per_round, a.seed)


if __name__ == "__main__":
    sys.exit(main())
