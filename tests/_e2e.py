"""Running the real CLI in-process for end-to-end tests: no hangs, no tracebacks."""

from __future__ import annotations

import contextlib
import json
import signal
from pathlib import Path

from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()


@contextlib.contextmanager
def deadline(seconds: float):
    """Fail instead of hanging: SIGALRM interrupts the in-process run."""

    def boom(*_):
        raise TimeoutError(f"no result after {seconds} s: the converter hangs")

    old = signal.signal(signal.SIGALRM, boom)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def cli(*args, seconds: float = 120):
    """``recordprep ARGS`` through typer's CliRunner; any uncaught exception or traceback fails the test."""
    with deadline(seconds):
        r = runner.invoke(app, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"recordprep {' '.join(map(str, args))} raised {r.exception!r}:\n{r.output}") from r.exception
    assert "Traceback" not in r.output, r.output
    return r


def counts_of(out: Path) -> dict:
    return json.loads((Path(out) / "dataset_info.json").read_text())["counts"]


def check_accounting(out: Path, splits=("train", "eval")) -> dict:
    """read = sum of splits + errors, per input file and in total, as recorded in dataset_info.json."""
    counts = counts_of(out)
    for path, c in counts["per_file"].items():
        assert c["read"] == sum(c[s] for s in splits) + c["errors"], (path, c)
    assert counts["read"] == sum(counts["written"].values()) + counts["errors"], counts
    return counts


def error_rows(out: Path) -> list[dict]:
    """Rows of the error output. JSON Lines end at "\n" only: str.splitlines() would also split inside
    strings holding U+0085 or U+2028, which the converter writes unescaped (valid JSON)."""
    return [json.loads(line) for p in sorted((Path(out) / "errors").glob("*.jsonl"))
            for line in p.read_text(encoding="utf-8").split("\n") if line]
