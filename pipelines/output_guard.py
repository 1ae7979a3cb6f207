"""The output's guards: what a conversion checks and clears in its output before it writes.

Each runs before the next stage may write (:func:`pipelines.job.run_convert` calls them in
order): an output overlapping an input, under a file or on a read-only file system is refused
(:func:`guard_output`, a usage error); under the lock, files of another run or files no
recordprep run wrote are refused (:func:`refuse_clashing_files`, :func:`refuse_unknown_files`:
``--overwrite`` replaces a recordprep output, never foreign files); and a previous dataset is
cleared only of what a recordprep run wrote (:func:`clear_output`).
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
from typing import Any

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems

from convert.spec import FAILURE_FILENAME, METADATA_FILENAME
from convert.stats import STATS_FILENAME
from pipelines._fs import delete as fs_delete
from pipelines._fs import match_in, read_metadata
from pipelines.commit import cleanup_tmp
from pipelines.lock import LOCK_FILENAME
from pipelines.options import ConvertOptions
from pipelines.plan import InputFile
from pipelines.run_files import ANALYSIS_FILENAME, ERRORS_DIR, TMP_DIR, VOCAB_DIR


class OutputExistsError(RuntimeError):
    """The output holds another conversion (``--overwrite`` replaces it), or files no recordprep run wrote (nothing is deleted)."""


def read_existing(output: str) -> dict[str, Any] | None:
    """The metadata ``output`` holds (as JSON), None when it has none."""
    info = read_metadata(output)
    return None if info is None else info.to_json()


class OutputPathError(ValueError):
    """The output overlaps an input: a usage error, refused before anything is written."""


def _norm(path: str) -> str:
    """A path to compare locations by: local paths resolved (symlinks too), remote ones normalized."""
    if "://" not in path:
        return os.path.realpath(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    return f"{scheme.lower()}://{posixpath.normpath('/' + rest).lstrip('/')}"


def _inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or under it (both from :func:`_norm`)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _input_dirs(patterns: tuple[str, ...], files: list[InputFile]) -> list[str]:
    """The inputs given as directories (no glob, not a file)."""
    file_paths = {_norm(f.path) for f in files}
    dirs = []
    for pat in patterns:
        if "://" not in pat:
            if os.path.isdir(pat):
                dirs.append(pat)
        elif not any(c in pat for c in "*?[") and _norm(pat) not in file_paths:
            dirs.append(pat)
    return dirs


def _guard_local_output(output: str) -> None:
    """Refuse a local output the run could not create or write: a file, one under a
    file, or on a read-only file system (or without write permission), before any work."""
    if os.path.lexists(output) and not os.path.isdir(output):
        raise OutputPathError(f"--output {output} is a file, not a directory; name a directory to write the dataset into")
    here = os.path.abspath(output)
    while not os.path.lexists(here):  # the deepest part of the path that exists: the run creates the rest
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise OutputPathError(f"--output {output} lies under {here}, a file, not a directory; "
                              f"name a directory to write the dataset into")
    if not os.access(here, os.W_OK | os.X_OK):
        why = "is on a read-only file system" if _read_only(here) else "is not writable by this user"
        raise OutputPathError(f"--output {output}: {here} {why}; write the dataset to a writable directory")


def _refuse_symlinked_dirs(output: str) -> None:
    """Refuse an output whose temp, vocabulary or error directory is a symbolic link: the run
    would write (and its cleanup remove) files wherever the link points, outside the output."""
    for sub in (TMP_DIR, VOCAB_DIR, ERRORS_DIR):
        path = os.path.join(output, sub)
        if os.path.islink(path):
            raise OutputPathError(
                f"--output {output}: {path} is a symbolic link (to {os.readlink(path)}); a conversion writes "
                f"its {sub}/ files only inside the output. Remove the link, or write to another directory")


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def guard_output(opts: ConvertOptions, files: list[InputFile]) -> None:
    """Refuse an output that is, contains or lies inside an input, before anything is written.

    A conversion never writes where it reads: ``--overwrite`` there would
    delete the inputs, and a later run would read the shards as input. An
    output next to the inputs (``-i data/x.avro -o data/out``) is fine. A local
    output whose temp, ``vocab/`` or ``errors/`` directory is a symbolic link is
    refused too: the run would write through it, outside the output.
    """
    if "://" not in opts.output:
        _guard_local_output(opts.output)
        _refuse_symlinked_dirs(opts.output)
    out = _norm(opts.output)
    hint = "write to another directory (a conversion never writes where it reads its inputs)"
    for f in files:
        if _inside(_norm(f.path), out):
            raise OutputPathError(f"--output {opts.output} holds the input file {f.path}; {hint}")
    for d in _input_dirs(opts.inputs, files):
        if _inside(out, _norm(d)):
            raise OutputPathError(f"--output {opts.output} lies inside the input directory {d}; {hint}")


#: Names the converter writes, besides those a dataset's metadata lists.
_SHARD_RE = re.compile(r"[^/]+-\d{5}-of-\d{5}(-[0-9a-f]{12})?\.tfrecord(\.gz)?")
_VOCAB_RE = re.compile(VOCAB_DIR + r"/[^/]+\.txt")
_ERRORS_RE = re.compile(ERRORS_DIR + r"/errors-\d{5}(-of-\d{5})?\.jsonl")
_ATOMIC_TMP_RE = re.compile(r"(.+)\.tmp-[0-9a-f]{8}")  # a write_atomic interrupted before its rename
#: How many unknown files a refused --overwrite names.
_UNKNOWN_SHOWN = 5


def _first_few(names: list[str]) -> str:
    more = len(names) - _UNKNOWN_SHOWN
    return ", ".join(names[:_UNKNOWN_SHOWN]) + (f" and {more} more" if more > 0 else "")


def _listed_files(info: dict[str, Any]) -> set[str]:
    """Every file a dataset's metadata names, relative to its output."""
    names = {METADATA_FILENAME, FAILURE_FILENAME, ANALYSIS_FILENAME, STATS_FILENAME,
             str(info.get("analysis_file") or ""), str(info.get("stats_file") or "")}
    for sp in (info.get("splits") or {}).values():
        names.update(str(sh.get("file")) for sh in sp.get("shards", []))
    names.update(str(v.get("file")) for v in (info.get("vocabularies") or {}).values())
    names.update(str(e.get("file")) for e in (info.get("errors") or {}).get("files", []))
    return names - {""}


def _written_by_us(rel: str, listed: set[str]) -> bool:
    if rel in listed or rel.split("/", 1)[0] == TMP_DIR or rel.startswith(LOCK_FILENAME + "."):
        return True  # (the last: a lock refresh or take-over interrupted before its rename)
    m = _ATOMIC_TMP_RE.fullmatch(rel)
    base = m.group(1) if m else rel
    return (base in listed or ("/" not in base and _SHARD_RE.fullmatch(base) is not None)
            or _VOCAB_RE.fullmatch(base) is not None or _ERRORS_RE.fullmatch(base) is not None)


def _list_output(output: str) -> list[str]:
    """Every file under ``output``, relative to it (on HDFS: the top level, errors/ and vocab/)."""
    root = output.rstrip("/")
    if "://" not in output:
        rel = []
        for dirpath, dirnames, filenames in os.walk(root):
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]  # never followed
            for name in filenames + links:
                rel.append(os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/"))
        return rel
    patterns = ["**"] if output.startswith("gs://") else ["*", f"{ERRORS_DIR}/*", f"{VOCAB_DIR}/*"]
    rel = set()
    for pattern in patterns:
        try:
            matched = match_in(root, pattern)
        except BeamIOError:  # HDFS: listing a missing directory fails
            continue
        rel.update(m[len(root) + 1:] for m in matched if m.startswith(root + "/"))
    return sorted(r for r in rel if r not in (ERRORS_DIR, VOCAB_DIR))


def refuse_unknown_files(output: str, existing: dict[str, Any]) -> list[str]:
    """The output's files (but the lock) when all are the previous dataset's (``existing``, its
    metadata) or a run's temp files; else raises OutputExistsError."""
    listed = _listed_files(existing)
    files = [r for r in _list_output(output) if r != LOCK_FILENAME]
    unknown = sorted(r for r in files if not _written_by_us(r, listed))
    if unknown:
        shown = _first_few(unknown)
        raise OutputExistsError(
            f"--overwrite: {output} holds {len(unknown)} file(s) no recordprep run wrote ({shown}); "
            f"nothing was deleted. Move them elsewhere, or write to another directory"
        )
    return files


def clear_output(output: str, files: list[str]) -> None:
    """Remove the previous dataset: ``files``, the output's files as ``refuse_unknown_files``
    found them all a recordprep run's. The metadata goes first so no reader sees a mix."""
    root = output.rstrip("/")
    meta = FileSystems.join(output, METADATA_FILENAME)
    if FileSystems.exists(meta):
        fs_delete([meta])
    mine = [f"{root}/{r}" for r in files if r != METADATA_FILENAME and r.split("/", 1)[0] != TMP_DIR]
    if "://" not in output:
        for path in mine:  # unlink: a symlink is removed, never what it points to
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    elif mine:
        fs_delete(mine)
    cleanup_tmp(output)
    for sub in (VOCAB_DIR, ERRORS_DIR):  # now empty (local, HDFS; object stores have no directories)
        d = FileSystems.join(output, sub)
        if "://" not in output:
            with contextlib.suppress(OSError):
                os.rmdir(d)
        elif not output.startswith("gs://") and FileSystems.exists(d):
            fs_delete([d])


def refuse_clashing_files(output: str, *, took_over: bool) -> None:
    """In an output without a dataset, refuse files under the names a run replaces or removes.

    The commit replaces its shard, vocabulary, error and analysis files and
    removes other shards of its splits. In a directory that an earlier
    recordprep run left unfinished those are its leftovers (its failure
    marker, its temp directory, or the dead run's lock just taken over say
    so); anywhere else they are someone's files, and nothing is deleted.
    """
    files = [r for r in _list_output(output) if r != LOCK_FILENAME]
    if took_over or any(r == FAILURE_FILENAME or r.split("/", 1)[0] == TMP_DIR for r in files):
        return
    clashing = sorted(r for r in files if _written_by_us(r, {ANALYSIS_FILENAME, STATS_FILENAME}))
    if clashing:
        shown = _first_few(clashing)
        raise OutputExistsError(
            f"{output} holds no recordprep dataset but {len(clashing)} file(s) under names a conversion writes "
            f"or removes ({shown}); nothing was deleted. Move them elsewhere, or write to another directory"
        )
