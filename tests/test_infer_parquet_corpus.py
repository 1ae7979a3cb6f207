"""``recordprep infer`` then ``recordprep convert`` on Parquet files of writers the
suite does not run itself: apache/parquet-testing's ``data/`` (beside the checkout,
when present) and the small files kept in ``tests/data/parquet/`` (their sources and
licences in its README). At least 95% of the readable files convert from their draft;
the rest are listed with the reason, one line each."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _e2e import check_accounting, cli

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "tests" / "data" / "parquet"
_CANDIDATES = [Path(p) for p in (os.environ.get("RECORDPREP_PARQUET_TESTING", ""),) if p] + [
    ROOT.parent / "shared" / "parquet-testing", ROOT.parent.parent / "shared" / "parquet-testing"]
PARQUET_TESTING = next((p / "data" for p in _CANDIDATES if (p / "data").is_dir()), None)


def _readable(paths: list[Path]) -> list[Path]:
    """Files whose footer and schema pyarrow reads (the corpus's damaged files aside)."""
    out = []
    for p in paths:
        try:
            pq.ParquetFile(p).schema_arrow  # noqa: B018 - reads the footer and the schema
        except Exception:  # noqa: BLE001 - any reason a file is not valid Parquet
            continue
        out.append(p)
    return out


def _outcome(path: Path, tmp: Path) -> str | None:
    """None when the draft converts every record of ``path``, else why not (one line)."""
    r = cli("infer", "-i", path, seconds=600)
    if r.exit_code != 0:
        return f"infer: {r.output.strip().splitlines()[-1][:300]}"
    cfg = tmp / f"{path.name}.yaml"
    cfg.write_text(r.stdout)
    out = tmp / f"{path.name}.out"
    r = cli("convert", "-i", path, "-c", cfg, "-o", out, seconds=600)
    if r.exit_code != 0:
        return f"convert: {' | '.join(r.output.strip().splitlines()[-3:])[:400]}"
    counts = check_accounting(out)
    rows = pq.ParquetFile(path).metadata.num_rows
    if counts["errors"] or counts["read"] != rows:
        return f"convert: {counts['errors']} error(s), {counts['read']} of {rows} rows read"
    return None


def _rate(paths: list[Path], tmp: Path) -> tuple[float, list[str]]:
    failed = [f"{p.name}: {why}" for p in paths if (why := _outcome(p, tmp)) is not None]
    return 1 - len(failed) / len(paths), failed


@pytest.mark.slow
@pytest.mark.skipif(PARQUET_TESTING is None, reason="apache/parquet-testing is not beside the checkout "
                                                    "(../shared/parquet-testing/data; optional: docs/development.md)")
def test_drafts_of_parquet_testing_files_convert(tmp_path):
    files = _readable(sorted(PARQUET_TESTING.glob("*.parquet")))
    assert len(files) >= 40, files
    rate, failed = _rate(files, tmp_path)
    assert rate >= 0.95, f"{rate:.1%} of {len(files)} files convert from their draft; failed:\n" + "\n".join(failed)


@pytest.mark.slow
def test_drafts_of_the_kept_writers_files_convert(tmp_path):
    files = _readable(sorted(KEPT.glob("*.parquet")))
    assert files, f"no Parquet files in {KEPT}"
    rate, failed = _rate(files, tmp_path)
    assert rate >= 0.95, f"{rate:.1%} of {len(files)} files convert from their draft; failed:\n" + "\n".join(failed)
