"""The converter's outputs are byte-identical to the recorded ones (run id, timestamps, mtimes cut).

The guard of refactors that promise "behaviour unchanged": every file ``recordprep convert``
writes for the example data and a small bench dataset (tests/_outputs_unchanged.py) is compared
by digest with tests/data/outputs_unchanged.json. When a change of the outputs is intended,
regenerate that file (see the failure message) and commit it with the change.
"""

from __future__ import annotations

import json

import pytest
from _outputs_unchanged import GOLDEN, REGEN, all_digests, differences

pytestmark = pytest.mark.slow


def test_outputs_match_the_recorded_digests(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    got = all_digests(tmp_path)
    diff = differences(golden, got)
    assert not diff, (
        "the converter's outputs differ from the recorded ones:\n  " + "\n  ".join(diff)
        + f"\nIf the change is intended, regenerate the digests with `{REGEN}` and commit "
        f"{GOLDEN.relative_to(GOLDEN.parents[2])} with it.")
