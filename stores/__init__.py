"""Stores: one module per URL scheme behind one interface, below ``pipelines`` and ``readers``.

A store serves the paths of one scheme: local paths (:mod:`stores.local`),
``gs://`` (:mod:`stores.gcs`), ``s3://`` (:mod:`stores.s3`), ``azfs://``
(:mod:`stores.azure`), ``hdfs://`` and ``viewfs://`` (:mod:`stores.hdfs`).
Each module defines a :class:`Store` subclass and its instance ``STORE``;
:data:`REGISTRY` maps a scheme to its module, as Apache Beam has one
``FileSystem`` class per scheme. :func:`store_for` gives the store of a URL;
a scheme without a module gets the base :class:`Store` (Beam's file system
of that scheme).

The interface (:class:`Store`): ``parse`` a URL into its parts, ``stat``,
``read`` (a whole small file), ``list``, ``ranged_reader``, the lock file's
conditional create / replace / delete (``lock_object``, used by
``pipelines.lock``), and for stores the readers stage on local disk
(``staged``) a staging client and local layout (:mod:`stores.staging`).

This package imports neither ``pipelines`` nor ``readers`` nor TensorFlow;
Beam and the cloud clients are imported lazily, inside the methods that
use them.

Adding a scheme: a module here with a ``Store`` subclass and ``STORE``, a
line in :data:`REGISTRY`, and its tests (``tests/test_stores.py``).
"""

from __future__ import annotations

import importlib

from stores.base import (
    IO_ATTEMPTS,
    IO_TIMEOUT_SECONDS,
    LockObject,
    ShardNotFoundError,
    StagingClient,
    StagingError,
    Store,
    escape_glob,
)

__all__ = [
    "IO_ATTEMPTS",
    "IO_TIMEOUT_SECONDS",
    "REGISTRY",
    "LockObject",
    "ShardNotFoundError",
    "StagingClient",
    "StagingError",
    "Store",
    "beam_filesystem_modules",
    "escape_glob",
    "other_scheme_hint",
    "scheme_of",
    "store_for",
]

#: URL scheme (lowercase; ``""`` for a local path) -> the module of its store.
REGISTRY: dict[str, str] = {
    "": "stores.local",
    "gs": "stores.gcs",
    "s3": "stores.s3",
    "azfs": "stores.azure",
    "hdfs": "stores.hdfs",
    "viewfs": "stores.hdfs",
}

_OTHER: dict[str, Store] = {}


def scheme_of(url: str) -> str:
    """``"gs"`` for ``gs://b/x``, ``""`` for local paths (and ``file://``)."""
    head, sep, _ = str(url).partition("://")
    if not sep or "/" in head:
        return ""
    return "" if head.lower() == "file" else head.lower()


def store_for(url: str) -> Store:
    """The store serving ``url``: its scheme's module's ``STORE``, else Beam's file system of the scheme."""
    scheme = scheme_of(url)
    module = REGISTRY.get(scheme)
    if module is not None:
        return importlib.import_module(module).STORE
    if scheme not in _OTHER:
        _OTHER[scheme] = Store(scheme)
    return _OTHER[scheme]


def other_scheme_hint(url: str) -> str | None:
    """For a URL in another tool's spelling of a registered store (``az://``, ``abfs://``): what to write
    instead; else None."""
    for module in dict.fromkeys(REGISTRY.values()):
        hint = importlib.import_module(module).STORE.other_scheme_hint(url)
        if hint:
            return hint
    return None


def beam_filesystem_modules() -> dict[str, str]:
    """Scheme -> the module of Beam's file system for it, for each registered store that names one
    (by its own scheme, not an alias: ``hdfs``, not ``viewfs``)."""
    found: dict[str, str] = {}
    for scheme, module in REGISTRY.items():
        loaded = importlib.import_module(module)
        beam = getattr(loaded, "BEAM_MODULE", None)
        if scheme and beam and scheme == loaded.STORE.scheme:
            found[scheme] = beam
    return found
