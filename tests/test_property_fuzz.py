"""A short smoke run of the fuzz driver (`make fuzz` runs it for minutes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_fuzz_driver_smoke_run():
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_records.py"), "--seconds", "1",
                        "--examples-per-round", "15", "--seed", "7"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    for target in ("avro", "json", "numbers", "avro-bytes", "json-bytes", "metadata"):
        assert f"ok   {target:<11} round 0: 15 examples" in p.stdout, p.stdout
    assert "no failure" in p.stdout


@pytest.mark.slow
def test_fuzz_driver_reports_a_failure(tmp_path):
    """The driver exits 1 and names the target when a property fails (here: a reader made to crash)."""
    script = tmp_path / "crash.py"
    script.write_text(
        "import sys, runpy\n"
        f"sys.argv = ['fuzz_records.py', '--seconds', '0', '--examples-per-round', '5', '--target', 'json-bytes']\n"
        f"sys.path.insert(0, {str(ROOT / 'tests')!r})\n"
        "import fuzz_records\n"
        "def boom(data): raise KeyError('planted')\n"
        "fuzz_records.TARGETS['json-bytes'] = (fuzz_records.TARGETS['json-bytes'][0], boom)\n"
        "sys.exit(fuzz_records.main())\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 1 and "FAIL json-bytes" in p.stderr and "planted" in p.stderr, p.stderr[-3000:]
