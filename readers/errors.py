"""Errors the readers raise before any data is read.

They derive from the built-in exception a caller would naturally catch
(``FileNotFoundError``, ``ValueError``, ``RuntimeError``), so generic handlers
keep working. Problems found *while* reading (a corrupt or truncated shard)
surface from inside TensorFlow as ``tf.errors.InvalidArgumentError`` whose
message starts with ``recordprep: shard <path> is damaged``; see
:func:`readers.train_dataset`.

Malformed metadata or metadata from a newer format raises
:class:`convert.spec.SpecError` (a ``ValueError``), re-exported here, as are
:class:`ShardNotFoundError` and :class:`StagingError` (``stores``: a shard
missing on the store, a copy to local disk that failed).
"""

from __future__ import annotations

from convert.spec import SpecError
from stores import ShardNotFoundError, StagingError  # raised by the stores' staging too

__all__ = [
    "DatasetDeadError",
    "DatasetFailedError",
    "DatasetIncompleteError",
    "ShardMismatchError",
    "ShardNotFoundError",
    "ShardSelectionError",
    "SpecError",
    "StagingError",
]


class DatasetIncompleteError(FileNotFoundError):
    """The output directory has no ``dataset_info.json``.

    The converter writes the metadata last and atomically, so its absence
    means the conversion has not finished, or failed. Readers refuse such a
    directory rather than read a partial set of shards.
    """


class DatasetFailedError(DatasetIncompleteError):
    """The conversion failed: no ``dataset_info.json``, and the converter's ``_FAILURE.json`` says why.

    A subclass of :class:`DatasetIncompleteError`, so handlers of the latter
    also catch it; :func:`readers.wait_for_dataset` raises it at once instead
    of waiting for a timeout.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class DatasetDeadError(DatasetFailedError):
    """The conversion died without saying so: its lock's heartbeat stopped (killed, or its machine lost).

    ``lock`` is the lock document it left (``convert.lockfile``), ``reason``
    why it counts as dead ("no heartbeat for 75 s"). A new conversion into
    the same output takes the dead run's lock over (no ``--overwrite`` needed).
    """

    def __init__(self, message: str, reason: str, lock: dict) -> None:
        super().__init__(message, reason)
        self.lock = lock


class ShardMismatchError(ValueError):
    """A shard's size on disk differs from the ``num_bytes`` in ``dataset_info.json``.

    The file was truncated, or replaced after the conversion committed.
    """


class ShardSelectionError(ValueError):
    """The pattern / split selects no shard, or shards of several splits."""

