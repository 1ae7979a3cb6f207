"""A local worker's malloc set-up (``pipelines.local.worker``) keeps batch-sized buffers in its heap.

Each batch allocates and frees buffers of a few MB (encoded Examples, id and
float columns, framed records). If glibc maps each one afresh, every page of it
is a page fault the kernel zeroes: system CPU time per record, paid by every
worker process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc tuning is Linux-only")

_PROBE = """
import json, resource, sys
import numpy as np
from pipelines.local import worker as _worker
tuned = _worker._tune_malloc()
between = sys.argv[1] == "between"
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
later = []
for i in range(21):
    if i == 1:
        before = faults()  # the first buffer of this size faults in
    a = np.ones(3 << 20, dtype=np.uint8)  # a batch-sized buffer, written, then freed
    if between:
        later.append(np.ones(128 << 10, dtype=np.uint8))  # what a worker allocates meanwhile (above it in the heap)
    del a  # without "between", at the top of the heap
print(json.dumps({"tuned": tuned, "faults": faults() - before}))
"""


def _faults(where: str) -> dict:
    """Page faults of 20 batch-sized buffers allocated and freed after the first, in a fresh tuned process."""
    out = subprocess.run([sys.executable, "-c", _PROBE, where], capture_output=True, text=True, timeout=120, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["tuned"]
    return got


def test_a_freed_batch_sized_buffer_is_reused_without_page_faults():
    got = _faults("between")
    # 20 fresh mappings of 3 MB would fault ~15,000 pages in; reused, only the 128 KB ones fault (640 pages).
    assert got["faults"] < 2000, got


def test_a_freed_buffer_at_the_top_of_the_heap_stays_for_the_next_batch():
    """A heap top trimmed back to the system on every free is faulted in again on the next batch."""
    got = _faults("top")
    # Trimmed each time, 20 buffers of 3 MB fault ~15,000 pages in; kept, none.
    assert got["faults"] < 2000, got
