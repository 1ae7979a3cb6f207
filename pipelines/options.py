"""Options of a conversion run: one frozen dataclass, validated in one place."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from convert import formats
from convert.sources import AVRO_DECODERS, DEFAULT_MAX_BLOCK_BYTES, DEFAULT_MAX_RECORD_BYTES
from convert.spec import LAYOUTS, MAX_SHARDS
from convert.splits import Splits

COMPRESSIONS = ("none", "gzip")
#: Record order of the shards: ``shuffled`` (each shard a uniform random sample
#: of its split, in random order; ``pipelines.shuffle``) or ``input``.
ORDERS = ("shuffled", "input")
#: ``--seed`` when none is given: fixed, so a re-run writes the same bytes.
DEFAULT_SEED = 0
#: Upper bound of --max-record-mb and --max-block-mb: past a few GB one record
#: or block no longer fits a worker's memory once decoded, so a cap above it
#: is no cap.
MAX_INPUT_CAP_MB = 4096.0
#: ``--max-vocabulary-terms`` when none is given: a vocabulary without ``top_k`` larger than this
#: is refused once the analysis has counted it. Every process that applies a vocabulary holds it
#: whole (the convert pass, the commit, the serving layer); a few million terms is a few hundred MB.
DEFAULT_MAX_VOCABULARY_TERMS = 5_000_000
#: Upper bound of ``--max-vocabulary-terms``: a vocabulary of a billion terms is hundreds of GB per process.
MAX_VOCABULARY_TERMS = 1_000_000_000
#: The Beam runners the job runs on (``--runner`` after ``--``; none given: Beam's FnApiRunner, local).
#: The job needs Beam's standard semantics: outputs from ``finish_bundle`` (the gather), side inputs
#: that wait for their whole input (the analysis before the convert pass, every unit's scatter before
#: the gather, every result before the commit) and multi-output ParDos. The local runners and the
#: portable ones (Dataflow, a job service: Flink, Spark) have them; a runner outside this list (Dask's,
#: for one, which lacks the first two) is refused before anything runs rather than writing a wrong output.
SUPPORTED_RUNNERS = (
    "FnApiRunner", "DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner", "PrismRunner",
    "TestDirectRunner", "DataflowRunner", "TestDataflowRunner", "PortableRunner", "FlinkRunner", "SparkRunner",
)


class OptionsError(ValueError):
    """A conversion option is out of range, or a Beam flag would be dropped or has no ``--`` before it (a usage error)."""


def input_cap_bytes(flag: str, mb: float) -> int:
    """The bytes of an input cap given in MB (2**20 bytes), checked: > 0 and at
    most ``MAX_INPUT_CAP_MB``. For ``convert`` (``ConvertOptions``) and ``infer``."""
    if not 0 < mb <= MAX_INPUT_CAP_MB:  # (NaN fails too)
        raise OptionsError(f"{flag} must be > 0 and at most {MAX_INPUT_CAP_MB:g} (MB), found {mb}")
    return max(1, int(mb * 2**20))


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What ``recordprep convert`` does.

    Attributes:
      inputs: file paths, globs or directories (local, gs://, hdfs://).
      config: path of the feature config (YAML or JSON).
      output: output directory; ``dataset_info.json`` appears there last.
      splits: split names, weights and optional key field.
      num_shards: shards per split; ``None`` derives it from input size
        (``target_shard_mb`` of input per shard, at least enough shards for
        readers to interleave when the input is large enough).
      compression: ``gzip`` or ``none``.
      gzip_level: 0 (stored) .. 9 (smallest); each step up compresses more
        slowly into fewer bytes. 1 and 2 are ISA-L's igzip, 3..9 zlib-ng's.
        Default 2: much less deflate CPU than level 5 for somewhat more
        bytes (the size zlib's level 1 writes); 5 writes shards smaller than
        zlib's default 6 (what TensorFlow's and Beam's writers use), for when
        storage or the network between storage and trainers is the limit
        (docs/benchmarks.md#design-converter).
      layout: ``features`` (one Feature per column) or ``packed`` (float32 and
        int64 columns concatenated into one Feature each; ``readers`` unpacks
        them, other tools must slice them; see ``convert.spec.LAYOUTS``).
      batch_size: records per vectorized batch inside workers.
      avro_decoder: ``auto`` (polars where it gives fastavro's values, the
        rest with fastavro; see ``convert.sources``) or ``fastavro`` (always);
        the output is the same either way.
      max_errors / max_error_fraction: rejected records tolerated before the
        run fails (the error output is written either way). Default: none.
      json_records_path: dotted key holding the record array in JSON documents.
      max_record_mb: cap on one JSON line (longer lines go to the error
        output) and one whole JSON document (a longer one fails the file).
      max_block_mb: cap on one Avro block's decompressed size (a larger
        block fails the file).
      analysis_from: earlier output whose vocabularies/statistics to reuse.
      overwrite: replace an existing output made from other inputs/config.
      force: run even when the output already holds this very dataset
        (same fingerprint); implies ``overwrite``. Not in the fingerprint.
      beam_args: extra Beam pipeline flags, passed through untouched.
      progress: print progress lines while a local run goes (the CLI's default).
      workers: local runs: worker processes; ``None`` = one per core when the
        input is large enough to repay their start-up (see ``pipelines.job``),
        1 = in-process (least memory).
      pre_fork: local runs with worker processes: fork them from this
        process before the pipeline starts (Linux, when safe; see
        ``pipelines.local.warm``) instead of starting new interpreters, which
        saves each worker's imports. Off by default: forking the caller's
        process is the caller's choice. ``recordprep convert`` turns it on.
        Not in the fingerprint (same bytes either way).
      order: ``shuffled`` (default: every shard a uniform random sample of
        its split, records in random order, so any batch a reader draws is a
        fair sample even of sorted input) or ``input`` (each shard a
        contiguous range of the input, in input order).
      seed: seeds the shuffle (0 .. 2**63-1); ``None``: ``DEFAULT_SEED`` when
        shuffled. The same seed gives the same bytes whatever the runner or
        worker count. Refused with ``order="input"`` (it would be ignored).
      max_vocabulary_terms: the largest vocabulary without ``top_k`` a run
        accepts (terms counted ``min_frequency`` times or more in the training
        split); a larger one stops the run after the analysis, before any
        shard is written (``pipelines.analyze``). Not in the fingerprint: it
        decides whether a run goes on, not what it writes.
    """

    inputs: tuple[str, ...]
    config: str
    output: str
    splits: Splits = Splits()
    num_shards: int | None = None
    target_shard_mb: float = 128.0
    compression: str = "gzip"
    gzip_level: int = 2
    layout: str = "features"
    batch_size: int = 4096
    avro_decoder: str = "auto"
    max_errors: int | None = None
    max_error_fraction: float | None = None
    json_records_path: str | None = None
    max_record_mb: float = DEFAULT_MAX_RECORD_BYTES / 2**20
    max_block_mb: float = DEFAULT_MAX_BLOCK_BYTES / 2**20
    analysis_from: str | None = None
    overwrite: bool = False
    force: bool = False
    beam_args: tuple[str, ...] = ()
    progress: bool = False
    workers: int | None = None
    pre_fork: bool = False
    order: str = "shuffled"
    seed: int | None = None
    max_vocabulary_terms: int = DEFAULT_MAX_VOCABULARY_TERMS

    def __post_init__(self) -> None:
        if not self.inputs:
            raise OptionsError("no --input given; pass one or more paths or glob patterns")
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_SHARDS:
            raise OptionsError(f"--num-shards must be between 1 and {MAX_SHARDS}, found {self.num_shards}")
        if self.workers is not None and not 1 <= self.workers <= 256:
            raise OptionsError(f"--workers must be between 1 and 256, found {self.workers}")
        if not (math.isfinite(self.target_shard_mb) and self.target_shard_mb > 0):
            raise OptionsError(f"--target-shard-mb must be a finite number > 0, found {self.target_shard_mb}")
        if self.compression not in COMPRESSIONS:
            raise OptionsError(f"--compression must be one of {COMPRESSIONS}, found {self.compression!r}")
        if not 0 <= self.gzip_level <= 9:
            raise OptionsError(f"--gzip-level must be 0..9, found {self.gzip_level}")
        if self.order not in ORDERS:
            raise OptionsError(f"--order must be one of {ORDERS}, found {self.order!r}")
        if self.seed is not None:
            if self.order == "input":
                raise OptionsError("--seed seeds the shuffle, and --order input (--no-shuffle) writes input order: "
                                   "drop one of them")
            if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
                raise OptionsError(f"--seed must be an integer 0 .. 2**63-1, found {self.seed!r}")
        if (isinstance(self.max_vocabulary_terms, bool) or not isinstance(self.max_vocabulary_terms, int)
                or not 1 <= self.max_vocabulary_terms <= MAX_VOCABULARY_TERMS):
            raise OptionsError(f"--max-vocabulary-terms must be a whole number 1 .. {MAX_VOCABULARY_TERMS:,}, "
                               f"found {self.max_vocabulary_terms!r}")
        if self.layout not in LAYOUTS:
            raise OptionsError(f"--layout must be one of {LAYOUTS}, found {self.layout!r}")
        if not 1 <= self.batch_size <= 1_000_000:
            raise OptionsError(f"--batch-size must be 1..1000000, found {self.batch_size}")
        if self.avro_decoder not in AVRO_DECODERS:
            raise OptionsError(f"--avro-decoder must be one of {', '.join(AVRO_DECODERS)}, found {self.avro_decoder!r}")
        input_cap_bytes("--max-record-mb", self.max_record_mb)
        input_cap_bytes("--max-block-mb", self.max_block_mb)
        if self.max_errors is not None and self.max_errors < 0:
            raise OptionsError("--max-errors must be >= 0")
        if self.max_error_fraction is not None and not 0 <= self.max_error_fraction <= 1:
            raise OptionsError("--max-error-fraction must be between 0 and 1")
        if re.match(r"^[a-z][a-z0-9+.-]*://", self.output) is None and self.output.strip() == "":
            raise OptionsError("--output must be a directory path")
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "beam_args", tuple(self.beam_args))
        stray = unparseable_beam_args(self.beam_args)
        if stray:
            hint = ("; to convert several files list them after --input (-i a.avro b.avro) or repeat --input"
                    if any(looks_like_path(a) for a in stray) else "")
            raise OptionsError(f"Beam would ignore {' '.join(stray)} after `--` (Beam flags are --name value or "
                               f"--name=value){hint}")
        check_runner(beam_flag(self.beam_args, "--runner"))

    @property
    def max_record_bytes(self) -> int:
        return input_cap_bytes("--max-record-mb", self.max_record_mb)

    @property
    def max_block_bytes(self) -> int:
        return input_cap_bytes("--max-block-mb", self.max_block_mb)

    @property
    def shuffle_seed(self) -> int | None:
        """The seed of the shuffle; None when the output keeps input order."""
        if self.order == "input":
            return None
        return DEFAULT_SEED if self.seed is None else self.seed

    @property
    def compression_type(self) -> str:
        return "GZIP" if self.compression == "gzip" else "NONE"

    def errors_tolerated(self, errors: int, read: int) -> bool:
        if errors == 0:
            return True
        if self.max_errors is not None and errors <= self.max_errors:
            return True
        if self.max_error_fraction is not None and read and errors / read <= self.max_error_fraction:
            return True
        return False

    def fingerprint_fields(self) -> dict[str, object]:
        """The options that change the output's content (part of the fingerprint)."""
        return {
            "splits": dataclasses.asdict(self.splits),
            "num_shards": self.num_shards,
            "target_shard_mb": self.target_shard_mb,
            "compression": self.compression,
            "gzip_level": self.gzip_level,
            "json_records_path": self.json_records_path,
            "analysis_from": self.analysis_from,
            "order": self.order,
            "seed": self.shuffle_seed,
            # only when not the default, so outputs written before the option existed keep their fingerprint
            **({"layout": self.layout} if self.layout != "features" else {}),
            **({"max_record_mb": self.max_record_mb} if self.max_record_bytes != DEFAULT_MAX_RECORD_BYTES else {}),
            **({"max_block_mb": self.max_block_mb} if self.max_block_bytes != DEFAULT_MAX_BLOCK_BYTES else {}),
        }


def beam_flag(beam_args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` (``"--runner"``) in Beam args, given as ``--flag value``
    or ``--flag=value``; the last one wins, as in Beam's parser. ``""`` for a
    flag followed by no value (a switch such as ``--hdfs_full_urls``), ``None``
    when it is not given. The one place recordprep reads Beam's flags itself."""
    args, found = list(beam_args), None
    for i, a in enumerate(args):
        if a == flag:
            found = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
        elif a.startswith(flag + "="):
            found = a[len(flag) + 1:]
    return found


def check_runner(name: str | None) -> None:
    """OptionsError unless ``name`` (``--runner``'s value; None: the default) is one of
    ``SUPPORTED_RUNNERS``, spelt as Beam accepts it: a class name in any case, with or without
    its ``Runner`` suffix, or its module path."""
    if name is None:
        return
    short = name.rsplit(".", 1)[-1].lower()
    known = {r.lower(): r for r in SUPPORTED_RUNNERS}
    if short in known or short + "runner" in known:
        return
    raise OptionsError(f"--runner {name}: the job is not supported on this runner; it needs outputs from finish_bundle "
                       f"and side inputs that wait for their whole input (docs/converting.md#runners). Supported: "
                       f"{', '.join(SUPPORTED_RUNNERS)}")


def split_beam_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``recordprep`` args from Beam args at the first literal ``--``."""
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


@dataclasses.dataclass(frozen=True)
class RegroupedArgs:
    """A command line regrouped by :func:`regroup_args`.

    Attributes:
      args: the command's own args, each value of a multi-value option
        behind its own copy of the option (``-i a -i b``), then ``--`` and
        the Beam args when there were any.
      stray: positional arguments before ``--`` that no option took.
    """

    args: list[str]
    stray: list[str]


def regroup_args(argv: Sequence[str], takes_value: Mapping[str, bool], multi: Collection[str]) -> RegroupedArgs:
    """Give every value after a multi-value option (``-i a.avro b.avro``, a glob
    the shell expanded) to that option, up to the next option or ``--``.

    ``takes_value`` maps each option string (``-c``, ``--config``) to whether
    it takes a value; ``multi`` names the options that take several. Unknown
    options are left for the parser to refuse; values glued to an option
    (``--config=x``, ``-cx``) are understood. Args after ``--`` are untouched.
    """
    own, beam = split_beam_args(argv)
    out: list[str] = []
    stray: list[str] = []
    i = 0
    while i < len(own):
        a = own[i]
        i += 1
        if not a.startswith("-") or a == "-":
            stray.append(a)
            continue
        out.append(a)
        name, glued = _option_name(a, takes_value)
        if not takes_value.get(name, False) or glued:
            values_follow = glued and name in multi
        else:
            if i < len(own):
                out.append(own[i])
                i += 1
            values_follow = name in multi
        while values_follow and i < len(own) and (not own[i].startswith("-") or own[i] == "-"):
            out += [name, own[i]]
            i += 1
    if "--" in argv:
        out += ["--", *beam]
    return RegroupedArgs(out, stray)


def _option_name(arg: str, takes_value: Mapping[str, bool]) -> tuple[str, bool]:
    """``(option string, whether its value is glued to it)`` of ``--name=v``, ``-xv`` or a bare option."""
    if arg.startswith("--"):
        name, eq, _ = arg.partition("=")
        return name, bool(eq)
    if len(arg) > 2 and takes_value.get(arg[:2], False):
        return arg[:2], True
    return arg, False


#: Compressed files' suffixes that mark an argument as a data file too (beside the input formats').
_COMPRESSED_SUFFIXES = (".bz2", ".zst", ".deflate", ".snappy")


def looks_like_path(arg: str) -> bool:
    """An existing path, or a string with a ``/``, a glob character or a data-file suffix (``convert.formats``)."""
    return ("/" in arg or any(c in arg for c in "*?[") or os.path.lexists(arg)
            or arg.lower().endswith((*formats.suffixes(), *_COMPRESSED_SUFFIXES)))


def unparseable_beam_args(beam_args: Sequence[str]) -> list[str]:
    """The Beam args that Beam would drop with only a log line: positional
    values no flag takes (a path after ``--``, a value after a boolean flag)
    and single-dash flags. Unknown ``--name value`` flags are kept, as Beam
    keeps them for the runner (Dataflow's service options).
    """
    if not beam_args:
        return []
    from apache_beam.options.pipeline_options import PipelineOptions

    parsed: list[tuple[Any, list[str]]] = []
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            # The parser of every registered option class; parsed here, before
            # Beam adds the unknown flags to it.
            PipelineOptions([]).get_all_options(
                add_extra_args_fn=lambda parser: parsed.append(parser.parse_known_args(list(beam_args))))
    except SystemExit as e:  # argparse: a flag without its value, a bad choice
        said = (err.getvalue().strip().splitlines() or [f"exit {e.code}"])[-1]
        raise OptionsError(f"Beam flags after --: {said.split('error: ', 1)[-1]}") from None
    unknown = parsed[0][1]
    bad = []
    for i, a in enumerate(unknown):
        if a.startswith("--"):
            continue
        if a.startswith("-") and a != "-":
            bad.append(a)  # Beam discards single-dash flags
            continue
        prev = unknown[i - 1] if i else ""
        if not (prev.startswith("--") and "=" not in prev):
            bad.append(a)
    return bad
