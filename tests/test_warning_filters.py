"""The suite's warning filters (pyproject.toml): a DeprecationWarning raised in
recordprep's own packages fails the test that triggers it, and a third-party
one is shown, not hidden, so an upgrade's announcements surface."""

from __future__ import annotations

import warnings

import pytest


@pytest.mark.parametrize("module", ["convert.sources", "readers", "pipelines.cli"])
@pytest.mark.parametrize("category", [DeprecationWarning, PendingDeprecationWarning])
def test_our_deprecation_warnings_fail_the_tests(module, category):
    with pytest.raises(category, match="going away"):
        warnings.warn_explicit("going away", category, "x.py", 1, module=module)


@pytest.mark.parametrize("module", ["fastavro.read", "apache_beam.io.filesystems", "tensorflow", "converters"])
def test_third_party_deprecation_warnings_are_shown_not_hidden(module):
    with warnings.catch_warnings(record=True) as caught:  # keeps the filters pytest set
        warnings.warn_explicit("going away", DeprecationWarning, "y.py", 1, module=module)
    assert [str(w.message) for w in caught] == ["going away"]
