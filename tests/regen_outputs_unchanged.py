"""Record the golden digests of tests/test_outputs_unchanged.py: run when an output change is intended.

``python tests/regen_outputs_unchanged.py`` (from the repository's root) converts every case of
``tests/_outputs_unchanged.py`` twice, in two work directories, refuses if the two runs differ
(then something run-dependent reaches the outputs and must be cut), and writes
``tests/data/outputs_unchanged.json``. Commit that file with the change that explains it.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # the tests' helpers (as pytest's pythonpath) and this checkout

from _outputs_unchanged import GOLDEN, all_digests, differences  # noqa: E402


def main() -> int:
    runs = []
    for _ in range(2):
        with tempfile.TemporaryDirectory(prefix="outputs-unchanged-") as work:
            runs.append(all_digests(Path(work)))
    unstable = differences(runs[0], runs[1])
    if unstable:
        print("two runs of the same conversions differ (cut what is run-dependent in "
              "tests/_outputs_unchanged.py):\n  " + "\n  ".join(unstable), file=sys.stderr)
        return 1
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(runs[0], indent=2, sort_keys=True) + "\n")
    files = sum(len(d) for d in runs[0].values())
    print(f"{GOLDEN}: {len(runs[0])} cases, {files} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
