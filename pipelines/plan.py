"""Input discovery and work planning, done once in the launcher: :func:`plan` -> :class:`Plan`.

The job's unit of work is a *work unit*: a list of byte ranges of input files.
Each unit is read and vectorized by one DoFn call, and its records go to
exactly one shard per split (``--order input``) or are scattered over the
``N`` output shards (shuffled; ``pipelines.shuffle``), so ``--num-shards N``
gives exactly N shards per split, the data never passes through a GroupByKey
(memory stays flat on the local runner, which buffers shuffles in memory), and
Beam's per-element overhead is paid per unit or shard, not per record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import posixpath
import re
import stat
import warnings
from collections.abc import Sequence
from typing import Any

from apache_beam.io.filesystem import FileSystem
from apache_beam.io.filesystems import FileSystems

from convert import formats
from convert.check import check_inputs
from convert.config import Config, load_config
from convert.config_model import named_fill
from convert.sources import is_splittable
from convert.spec import FORMAT_VERSION, MAX_SHARDS
from pipelines.options import ConvertOptions


class InputError(ValueError):
    """An ``--input`` matches no file, cannot be listed or read, is not a regular file, or makes too many shards."""


@dataclasses.dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime: float


@dataclasses.dataclass(frozen=True)
class ByteRange:
    """Bytes ``[start, end)`` of an input.

    ``path`` is the input as the user gave it (what messages, counts and the
    metadata name); ``absolute`` is the same local file as an absolute path,
    set by the plan for a relative one, since the workers of a remote or
    distributed runner do not share the launcher's working directory.
    """

    path: str
    start: int
    end: int | None  # None: to end of file
    absolute: str | None = None

    @property
    def location(self) -> str:
        """Where a worker opens the input: the same file from any working directory."""
        return self.absolute or self.path


@dataclasses.dataclass(frozen=True)
class WorkUnit:
    index: int
    ranges: tuple[ByteRange, ...]


_DATA_SUFFIXES = formats.suffixes()  # .avro, .json, .jsonl, .ndjson, .gz, .parquet, ...
_GLOB_CHARS = "*?["


def discover(patterns: Sequence[str]) -> list[InputFile]:
    """The input files of ``--input`` patterns, sorted by path, each once.

    A pattern is a file, a directory or a glob (Beam's syntax: ``*`` within a
    path segment, ``**`` across segments, ``?``, ``[...]``), local or remote.
    A path that exists is taken literally even if it contains glob characters
    (``br[1].jsonl`` is that file, not ``br1.jsonl``); to glob on such a name,
    escape the literal character (``[[]``, ``[*]``, ``[?]``). Directories and
    globs skip names starting with ``.`` or ``_`` (``_SUCCESS``, editor
    files); a file named directly is read. Each pattern must yield at
    least one file, and local inputs must be readable regular files (see
    :func:`_regular_file`); anything else is an :class:`InputError` naming it.
    """
    found: dict[str, InputFile] = {}
    for pat in patterns:
        files = _discover_remote(pat) if FileSystems.get_scheme(pat) else _discover_local(pat)
        if not files:
            raise InputError(f"--input {pat!r} matched no files; check the path or quote the glob so the shell does not expand it")
        for f in files:
            found[f.path] = f
    return sorted(found.values(), key=lambda f: f.path)


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in _GLOB_CHARS)


def _is_hidden(path: str) -> bool:
    return posixpath.basename(path).startswith((".", "_"))


def _discover_local(pat: str) -> list[InputFile]:
    """A directory, then an existing path taken literally, then a glob."""
    if os.path.isdir(pat):
        return _list_directory(pat)
    if os.path.lexists(pat):
        return [_regular_file(pat, pat)]
    if _is_glob(pat):
        return [_regular_file(p, pat) for p in _glob_local(pat)]
    return []


def _list_directory(directory: str) -> list[InputFile]:
    """Every data file directly in ``directory`` (by suffix: ``_DATA_SUFFIXES``),
    and in its hive-style partition subdirectories (``key=value``, at any depth:
    Parquet datasets written by Spark, pyarrow, polars or DuckDB).

    Subdirectories and files with other suffixes are skipped: a directory
    holds data files next to configs, logs and outputs. An entry with a data
    suffix that is not a regular file (a FIFO, socket or device named
    ``part-0.jsonl``) is refused rather than skipped: its name says it is
    meant as input, so converting the rest would silently give a partial
    dataset; the error names it so the user moves it or narrows the input.
    """
    try:
        with os.scandir(directory) as it:
            listed = [(e.name, e.is_dir(), e.is_dir(follow_symlinks=False)) for e in it]
    except OSError as e:
        raise InputError(f"--input {directory!r}: cannot list it ({e.strerror or e})") from e
    root = directory.rstrip("/") or "/"
    entries = sorted(n for n, is_dir, _ in listed if not is_dir)
    names = [n for n in entries if not _is_hidden(n) and n.lower().endswith(_DATA_SUFFIXES)]
    found = [_regular_file(os.path.join(root, n), directory) for n in names]
    # (real directories only: a symlinked one could loop)
    partitions = sorted(n for n, _, real_dir in listed if real_dir and "=" in n[1:] and not _is_hidden(n))
    return found + [f for n in partitions for f in _list_directory(os.path.join(root, n))]


def _glob_local(pat: str) -> list[str]:
    """Paths matching a local glob (Beam's syntax), hidden names skipped.

    Matched here rather than by Beam's local file system, which skips entries
    it cannot stat: a broken symlink would silently drop its records, where a
    directory input or an explicit path refuses it. Every name under the
    literal part's directory is listed, symlinks included (symlinked
    directories are not descended, as Beam does), and :func:`_regular_file`
    then refuses what is not a readable regular file, naming it. A relative
    glob in the current directory (``'*.jsonl'``) is matched as
    ``./PATTERN`` and reported without the ``./``.
    """
    anchored = posixpath.dirname(_literal_prefix(pat)) == "" and not pat.startswith("/")
    query = "./" + pat if anchored else pat
    root = posixpath.dirname(_literal_prefix(query)) or "/"
    if not os.path.isdir(root):
        return []
    with warnings.catch_warnings():  # the escape '[[]' compiles with a FutureWarning from re
        warnings.simplefilter("ignore", FutureWarning)
        match = re.compile(FileSystem.translate_pattern(query)).match

    def fail(e: OSError) -> None:
        raise InputError(f"--input {pat!r}: cannot list {e.filename} ({e.strerror or e})") from e

    depth = None if "**" in query else query.count("/") - root.rstrip("/").count("/") - 1  # levels below root
    paths = []
    for d, dirs, names in os.walk(root, onerror=fail):
        paths += (os.path.join(d, n) for n in names)
        if depth is not None and d.rstrip("/").count("/") - root.rstrip("/").count("/") >= depth:
            dirs.clear()  # deeper names cannot match: '*' stays within a path segment
    matched = [p[2:] if anchored else p for p in paths if match(p)]
    return sorted(p for p in matched if not _is_hidden(p))


def _match(pattern: str) -> list:
    """Beam's matches of a glob; the escape ``[[]`` compiles with a FutureWarning from ``re`` that is noise here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return FileSystems.match([pattern])[0].metadata_list


def _literal_prefix(pat: str) -> str:
    """The part of ``pat`` before its first glob character."""
    cut = min((i for i in (pat.find(c) for c in _GLOB_CHARS) if i >= 0), default=len(pat))
    return pat[:cut]


def _regular_file(path: str, given: str) -> InputFile:
    """``path`` as an input, if it is a readable regular file (symlinks followed).

    Anything else is refused with what it is: reading a FIFO with no writer
    blocks forever, a device may never end, a directory or socket cannot be
    read, and none of them can be cut into byte ranges or read twice (the
    job reads each input in an analysis pass and a convert pass).
    """
    where = f"input {path}" if path == given else f"--input {given!r}: {path}"
    try:
        st = os.stat(path)
    except FileNotFoundError as e:
        what = "is a broken symlink" if os.path.islink(path) else "does not exist (removed while listing?)"
        raise InputError(f"{where} {what}") from e
    except OSError as e:
        raise InputError(f"{where}: cannot read it ({e.strerror or e})") from e
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{where} is {_file_kind(st.st_mode)}, not a regular file; inputs must be regular files: "
                         "copy the data into one, or leave this path out of --input")
    if not os.access(path, os.R_OK):
        raise InputError(f"{where} is not readable (permission denied); check its permissions")
    return InputFile(path, st.st_size, st.st_mtime)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _discover_remote(pat: str) -> list[InputFile]:
    """An object of exactly that name, else a glob, else a directory (prefix).

    A pattern without glob characters and without an object of that name is a
    directory: its data files (``_DATA_SUFFIXES``) and those of its hive-style
    partition directories, as for local directories.
    """
    try:
        fs = FileSystems.get_filesystem(pat)
        if not pat.endswith("/") and fs.exists(pat):
            return [_input_file(fs.metadata(pat))]
        glob = _is_glob(pat)
        # a directory: everything under it, then its data files and those of its partitions
        matched = _match(pat if glob else FileSystems.join(pat.rstrip("/"), "**"))
    except Exception as e:
        raise InputError(f"--input {pat!r}: cannot list it ({e})") from e
    files = [m for m in matched if not _is_hidden(m.path)]
    if not glob:
        root = pat.rstrip("/") + "/"
        files = [m for m in files if m.path.lower().endswith(_DATA_SUFFIXES) and _in_partitions(root, m.path)]
    return [_input_file(m) for m in files]


def _in_partitions(root: str, path: str) -> bool:
    """Whether ``path`` lies directly in the directory ``root`` or in hive-style
    partition directories (``key=value``, not hidden) under it, as
    :func:`_list_directory` finds local files."""
    if not path.startswith(root):
        return False
    dirs = path[len(root):].split("/")[:-1]
    return all("=" in d[1:] and not d.startswith((".", "_")) for d in dirs)


def _input_file(m) -> InputFile:
    return InputFile(m.path, int(m.size_in_bytes), float(m.last_updated_in_seconds or 0.0))


def default_num_shards(total_bytes: int, target_shard_mb: float) -> int:
    """Enough shards for readers to interleave (up to 16) without tiny files.

    Inputs under 1 MB give one shard per split; above that, one shard per MB
    up to 16, and past 16 shards ``target_shard_mb`` of input per shard.
    More than ``MAX_SHARDS`` is an InputError (not clamped: the user asked for it).
    """
    shards = total_bytes / (target_shard_mb * 1024 * 1024)
    if shards > MAX_SHARDS:
        raise InputError(
            f"{total_bytes / 1e6:,.1f} MB of input at --target-shard-mb {target_shard_mb:g} makes {shards:,.0f} "
            f"shards per split, more than {MAX_SHARDS:,}; raise --target-shard-mb or pass --num-shards")
    by_target = math.ceil(shards)
    by_mb = math.ceil(total_bytes / (1024 * 1024))
    return max(1, by_target, min(16, by_mb))


def _head(path: str) -> bytes:
    """The first bytes of an input; a file gone or unreadable since :func:`discover` is an InputError."""
    try:
        with FileSystems.open(path, compression_type="uncompressed") as f:
            return f.read(4096)
    except OSError as e:
        raise InputError(f"cannot read input {path}: {e.strerror or e}") from e


def plan_units(files: Sequence[InputFile], num_shards: int, json_records_path: str | None = None) -> list[WorkUnit]:
    """Cut the inputs into ``num_shards`` units of about equal input bytes.

    Unit ``u`` owns global bytes ``[u*T, (u+1)*T)`` of the files laid end to
    end. Splittable files (Avro, JSON Lines) are cut at those points (readers
    align to the next block/line); compressed or whole-document files go
    entirely to the unit where they start. A unit may be empty; it still
    writes an (empty) shard so every split has exactly ``num_shards`` files.
    A relative local path gets its absolute one (``ByteRange.absolute``).
    """
    total = sum(f.size for f in files)
    target = max(1.0, total / num_shards)
    ranges: list[list[ByteRange]] = [[] for _ in range(num_shards)]
    g = 0
    for f in files:
        first = min(num_shards - 1, int(g // target))
        last = min(num_shards - 1, int(max(g, g + f.size - 1) // target))
        absolute = _absolute(f.path)
        if first == last or not is_splittable(f.path, _head(f.path), json_records_path):
            ranges[first].append(ByteRange(f.path, 0, None, absolute))
        else:
            for u in range(first, last + 1):
                lo = max(0, int(u * target) - g)
                hi = None if u == last else int((u + 1) * target) - g
                ranges[u].append(ByteRange(f.path, lo, hi, absolute))
        g += f.size
    return [WorkUnit(i, tuple(r)) for i, r in enumerate(ranges)]


def _absolute(path: str) -> str | None:
    """A relative local path made absolute (from this process' working directory); None for an
    absolute or remote one."""
    if FileSystems.get_scheme(path) or os.path.isabs(path):
        return None
    return os.path.abspath(path)


def input_fingerprint(files: Sequence[InputFile], config_hash: str, options: dict[str, object]) -> str:
    """Identity of a conversion: same inputs (path, size, mtime), config, options and
    ``FORMAT_VERSION`` (a new version encodes values differently: an older output is
    another dataset, not one to keep)."""
    blob = json.dumps(
        {"files": [[f.path, f.size, f.mtime] for f in files], "config": config_hash, "options": options,
         "format_version": FORMAT_VERSION},
        sort_keys=True, default=str,
    ).encode()
    return hashlib.sha256(blob).hexdigest()


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a run of ``options`` will do, decided in the launcher before anything is written.

    Attributes:
      options: the run's options.
      config: the feature config, checked against the inputs.
      files: the input files, sorted by path, each once (:func:`discover`).
      units: the work units, one per output shard of each split (:func:`plan_units`).
      fingerprint: the conversion's identity (:func:`input_fingerprint`).
      data_check: what the config was checked against (Avro schemas, a JSON sample).
    """

    options: ConvertOptions
    config: Config
    files: tuple[InputFile, ...]
    units: tuple[WorkUnit, ...]
    fingerprint: str
    data_check: str

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def num_shards(self) -> int:
        """Shards per split: one per work unit."""
        return len(self.units)

    def to_json(self) -> dict[str, Any]:
        """The plan as the user sees it: inputs, shards, units, splits, features, fingerprint, the data check."""
        splits = self.options.splits
        return {
            "inputs": [{"path": f.path, "size": f.size} for f in self.files],
            "total_bytes": self.total_bytes,
            "num_shards": self.num_shards,
            "units": [[(r.path, r.start, r.end) for r in u.ranges] for u in self.units],
            "splits": dict(zip(splits.names, splits.weights, strict=True)),
            "split_key": splits.key,
            "features": self.config.to_json(),
            "fingerprint": self.fingerprint,
            "data_check": self.data_check,
        }

    def describe(self) -> list[str]:
        """``convert --dry-run``'s lines: what a run would do, from :meth:`to_json`."""
        shown, opts = self.to_json(), self.options
        lines = [f"inputs: {len(shown['inputs'])} files, {shown['total_bytes'] / 1e6:.2f} MB"]
        lines += [f"  {f['path']}  {f['size']:,} bytes" for f in shown["inputs"][:_INPUTS_SHOWN]]
        if len(shown["inputs"]) > _INPUTS_SHOWN:
            lines.append(f"  ... and {len(shown['inputs']) - _INPUTS_SHOWN} more")
        lines.append(f"splits: {shown['splits']} (key: {shown['split_key'] or 'whole record'})")
        lines.append(f"shards per split: {shown['num_shards']}  compression: {opts.compression}")
        lines.append(f"order: {opts.order}" + (f" (seed {opts.shuffle_seed})" if opts.shuffle_seed is not None else ""))
        lines.append("features:")
        for feat in shown["features"]["features"]:
            extra = {k: v for k, v in feat.items() if k in ("max_len", "top_k", "buckets", "fill") and v is not None}
            if "fill" in extra:  # the fill the config means, not its normalized spelling
                extra["fill"] = named_fill(feat["transform"], extra["fill"])
            lines.append(f"  {feat['name']:<20} <- {feat['source']:<24} {feat['transform']} {extra or ''}")
        label = shown["features"]["label"]
        if label:
            lines.append(f"label: {label['name']} <- {label['source']}")
        lines.append(f"config checked against: {shown['data_check']}")
        return lines


#: How many input files ``convert --dry-run`` lists.
_INPUTS_SHOWN = 20

#: gs:// reads fetch this much at a time for the config check, which reads
#: headers and samples (Beam's own reader would fetch 16 MB per file).
_CHECK_READ_BUFFER = 1 << 20


def _open_input(path: str) -> Any:
    """An input for the config check (headers and samples only)."""
    if path.startswith("gs://"):
        gcsio = getattr(FileSystems.get_filesystem(path), "_gcsIO", None)
        if gcsio is not None:
            return gcsio().open(path, "rb", read_buffer_size=_CHECK_READ_BUFFER)
    return FileSystems.open(path, compression_type="uncompressed")


def plan(opts: ConvertOptions) -> Plan:
    """Everything the run will do, without running it (``--dry-run``).

    The config is checked against the inputs here (:func:`convert.check.check_inputs`:
    every Avro schema, a sample of the JSON), so a misspelled path fails
    before anything is written, and so is the output
    (:func:`pipelines.output_guard.guard_output`: OutputPathError when it
    overlaps an input). Remote inputs are listed with the file-system
    options in force: a caller sets them (``remote.filesystem_options``).
    """
    from pipelines.output_guard import guard_output  # it imports this module

    config = load_config(opts.config)
    files = discover(opts.inputs)
    guard_output(opts, files)  # what the run refuses, --dry-run refuses too: an output among its inputs
    data_check = check_inputs(config, [f.path for f in files], _open_input, json_records_path=opts.json_records_path,
                              max_record_bytes=opts.max_record_bytes, max_block_bytes=opts.max_block_bytes,
                              split_key=opts.splits.key)
    total = sum(f.size for f in files)
    n = opts.num_shards or default_num_shards(total, opts.target_shard_mb)
    units = plan_units(files, n, opts.json_records_path)
    return Plan(options=opts, config=config, files=tuple(files), units=tuple(units),
                fingerprint=input_fingerprint(files, config.hash, opts.fingerprint_fields()),
                data_check=data_check.describe())
