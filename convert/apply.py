"""Apply a finished output's analysis to new records, without TensorFlow.

What ``recordprep convert --analysis-from`` does, as a function for offline
scoring and tests: the output's own config and analysis (vocabularies,
statistics, bucket boundaries) drive the converter's ``Vectorizer``, so the
columns are exactly what a conversion of the same records with
``--analysis-from OUTPUT`` writes into its shards (same names, dtypes, shapes;
records the converter rejects are reported, not converted).

Usage::

    from convert.apply import OutputAnalysis

    applied = OutputAnalysis.load("out/")            # a local output directory
    batch = applied.vectorize(records)                # records: the dicts JSON/Avro decode to
    batch.columns["age"]                              # ("float32", array of shape (kept, 1))
    batch.rejections                                  # [Rejection(index, field, reason), ...]

Pure Python (numpy), like the rest of ``convert/``: conversion workers and
batch-scoring jobs need no TensorFlow. Remote outputs: read the two files with
your own client and pass their bytes to :meth:`OutputAnalysis.from_json`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from convert.analysis import Analysis, AnalysisMismatchError
from convert.config import Config, ConfigError, parse_config
from convert.spec import METADATA_FILENAME, DatasetInfo, SpecError, check_name
from convert.transforms import transform_of
from convert.vectorize import VectorBatch, Vectorizer

#: Name of the analysis file when the metadata does not say (``analysis_file``).
DEFAULT_ANALYSIS_FILENAME = "analysis.json"
#: Pauses (s) before a reader reads the metadata and the analysis again while they belong to
#: different runs: a replacing conversion writes its analysis, then its statistics, removes its
#: temp files, and writes the metadata last, which can take seconds on an object store.
_CONSISTENT_READ_PAUSES_S = (0.2, 0.5, 1.0, 2.0, 4.0, 8.0)


class AnalysisReplacedError(SpecError):
    """The analysis file is not the one the metadata was committed with: the output was replaced
    while it was read, or the file was damaged or edited."""


def content_digest(data: bytes) -> str:
    """``sha256:<hex>`` of ``data``: how the metadata binds the files written beside it
    (``analysis_sha256``, each vocabulary's ``sha256``), so a reader can tell that a file
    belongs to the run whose metadata it read."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def check_digest(expected: Any, data: bytes, what: str) -> None:
    """Raise :class:`AnalysisReplacedError` when ``data`` is not the file the metadata names
    by ``expected`` (a :func:`content_digest`; ``None``: metadata from before digests, unchecked)."""
    if expected is not None and content_digest(data) != expected:
        raise AnalysisReplacedError(
            f"{what} is not the file its {METADATA_FILENAME} was committed with: the output was replaced "
            f"by another conversion while it was read (read it again) or the file was changed by hand "
            f"(re-run the conversion)")


@dataclasses.dataclass(frozen=True)
class OutputAnalysis:
    """A finished output's metadata, config and analysis: everything needed to
    map new records exactly as its shards were mapped."""

    info: DatasetInfo
    config: Config
    analysis: Analysis

    @classmethod
    def from_json(cls, info: str | bytes | Mapping[str, Any] | DatasetInfo,
                  analysis: str | bytes | Mapping[str, Any], *, source: str = "output") -> OutputAnalysis:
        """From the contents of ``dataset_info.json`` and the analysis file.

        Raises SpecError when the metadata has no config (not a recordprep
        conversion) or the analysis does not match it.
        """
        if not isinstance(info, DatasetInfo):
            info = (DatasetInfo.from_json(info, source=f"{source}/{METADATA_FILENAME}") if isinstance(info, Mapping)
                    else DatasetInfo.loads(info, source=f"{source}/{METADATA_FILENAME}"))
        raw_config = info.extra.get("config")
        if not isinstance(raw_config, Mapping):
            raise SpecError(f"{source}: the metadata holds no feature config; re-run the conversion with this recordprep")
        try:
            config = parse_config(raw_config, source=f"{source}: config")
        except ConfigError as e:
            raise SpecError(f"{e}; re-run the conversion with this recordprep") from None
        if isinstance(analysis, (str, bytes)):
            raw = analysis.encode("utf-8", "surrogatepass") if isinstance(analysis, str) else analysis
            check_digest(info.extra.get("analysis_sha256"), raw, f"{source}: the analysis file")
        if not isinstance(analysis, Mapping):
            try:
                analysis = json.loads(analysis)
            except ValueError as e:
                raise SpecError(f"{source}: the analysis file is not valid JSON ({e}); re-run the conversion") from None
        if not isinstance(analysis, Mapping) or not isinstance(analysis.get("vocabularies"), Mapping) \
                or not isinstance(analysis.get("stats"), Mapping):
            raise SpecError(f"{source}: the analysis file has no 'vocabularies' and 'stats' objects; re-run the conversion")
        for f in config.features:
            if transform_of(f).scaled is not None and not isinstance(analysis["stats"].get(f.name), Mapping):
                raise SpecError(f"{source}: feature {f.name!r} ({f.transform}) was written unscaled, by an older "
                                f"recordprep; re-run the conversion with this recordprep to apply or serve it")
            if f.needs_vocabulary and not isinstance(analysis["vocabularies"].get(f.name), list):
                raise SpecError(f"{source}: the analysis has no vocabulary for feature {f.name!r}; re-run the conversion")
        parsed = Analysis.from_json(analysis)
        contradictions = analysis_contradictions(info, config, parsed)
        if contradictions:
            raise SpecError(f"{source}: the analysis contradicts {METADATA_FILENAME}: {'; '.join(contradictions)}. "
                            f"One of the two was edited or damaged; re-run the conversion")
        return cls(info=info, config=config, analysis=parsed)

    @classmethod
    def load(cls, output: str | Path) -> OutputAnalysis:
        """From a local output directory (``dataset_info.json`` and the analysis file it names,
        of the same run: see :func:`read_output_analysis`)."""
        root = Path(output)

        def read(path: str) -> bytes | None:
            try:
                return Path(path).read_bytes()
            except FileNotFoundError:
                return None

        return read_output_analysis(read, str(root), str(root / METADATA_FILENAME),
                                    lambda a, b: str(Path(a) / b))

    def vectorizer(self, *, label: bool = False) -> Vectorizer:
        """The converter's vectorizer with this output's analysis fixed;
        ``label``: also read (and require) the label, as a conversion does."""
        config = self.config if label else dataclasses.replace(self.config, label=None)
        return Vectorizer(config, self.analysis)

    def vectorize(self, records: Sequence[Any], *, label: bool = False) -> VectorBatch:
        """Columns for ``records`` exactly as a conversion with ``--analysis-from`` writes them.

        Rejected records are left out of every column and listed in
        ``rejections`` (index into ``records``, field, reason). Scoring
        records have no label: by default it is neither read nor required;
        ``label=True`` treats it as a conversion does (a record without it is rejected).
        """
        return self.vectorizer(label=label).vectorize(records)


#: The feature params the analysis determines (the rest come from the config, which
#: earlier versions listed in full).
_FROM_ANALYSIS = ("vocab_size", "stats", "boundaries", "classes", "oov_ids")


def analysis_contradictions(info: DatasetInfo, config: Config, analysis: Analysis) -> list[str]:
    """Where the feature spec that ``config`` and ``analysis`` give (what the converter wrote
    into the metadata from them) differs from ``info``'s, each naming the feature and the
    parameter: a vocabulary of 500 terms beside a metadata ``vocab_size`` of 10 would make
    the serving layer emit ids the model's embedding does not have."""
    try:
        derived = {s.name: s for s in Vectorizer(config, analysis).feature_specs()}
    except ValueError as e:  # a vocabulary the config needs is absent
        return [str(e)]
    listed = {f.name: f for f in info.features}
    out = [f"feature {name!r} is in the metadata only" for name in listed if name not in derived]
    out += [f"feature {name!r} is in the analysis' config only" for name in derived if name not in listed]
    for name in derived.keys() & listed.keys():
        # through JSON, as the metadata was written: tuples become lists
        mine = json.loads(json.dumps(derived[name].to_json(), default=str))
        theirs = listed[name].to_json()
        pairs = [(k, theirs.get(k), mine.get(k)) for k in ("dtype", "shape")]
        pairs += [(k, theirs["params"].get(k), mine["params"].get(k)) for k in _FROM_ANALYSIS]
        out += [f"feature {name!r}: the metadata's {k} is {_brief(a)}, the analysis gives {_brief(b)}"
                for k, a, b in pairs if a != b]
    return out


def _brief(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def check_reused_analysis(read: Callable[[str], bytes | None], root: str, join: Callable[[str, str], str],
                          raw: bytes) -> None:
    """``--analysis-from root``: raise :class:`AnalysisMismatchError` (a usage error) unless ``raw``
    is the analysis that ``root``'s metadata was committed with (``analysis_sha256``) and agrees
    with its feature spec (:func:`analysis_contradictions`), so no edited or replaced analysis
    scales a new output. ``read``: a path's bytes, ``None`` when absent. A directory without
    metadata (an analysis file on its own) has nothing to check it against, nor metadata
    without a digest or config (older versions) for what it lacks: the analysis' content is
    checked by ``Analysis.load`` either way."""
    metadata_path = join(root, METADATA_FILENAME)
    meta = read(metadata_path)
    if meta is None:
        return
    where = f"--analysis-from {root}"
    try:
        info = DatasetInfo.loads(meta, source=metadata_path)
        check_digest(info.extra.get("analysis_sha256"), raw, f"{where}: the analysis file")
        if isinstance(info.extra.get("config"), Mapping):  # the feature spec it gives (older outputs: none)
            OutputAnalysis.from_json(info, raw, source=where)
    except SpecError as e:
        raise AnalysisMismatchError(f"{e}; point --analysis-from at a completed recordprep output") from None


def read_output_analysis(read: Callable[[str], bytes | None], root: str, metadata_path: str,
                         join: Callable[[str, str], str]) -> OutputAnalysis:
    """The output's metadata and the analysis file of the same run, through ``read`` (a path's
    bytes, ``None`` when absent): both are read again, with growing pauses (about 16 s in all),
    while the analysis does not match the metadata's digest, so a reader never pairs one run's
    metadata with another run's vocabularies.

    Raises:
      SpecError: no metadata or analysis, damaged files, or still mismatched after the retries
        (:class:`AnalysisReplacedError`).
    """
    for pause in (*_CONSISTENT_READ_PAUSES_S, None):
        meta = read(metadata_path)
        if meta is None:
            raise SpecError(f"{root}: no {METADATA_FILENAME}; point at a completed recordprep output")
        info = DatasetInfo.loads(meta, source=metadata_path)
        name = check_name(info.extra.get("analysis_file", DEFAULT_ANALYSIS_FILENAME),
                          f"{metadata_path}: analysis_file")
        analysis = read(join(root, name))
        if analysis is None:
            raise SpecError(f"{root}: no {name} (the analysis); re-run the conversion")
        try:
            return OutputAnalysis.from_json(info, analysis, source=root)
        except AnalysisReplacedError:
            if pause is None:
                raise
            time.sleep(pause)
    raise AssertionError("unreachable")


def apply_analysis(output: str | Path, records: Sequence[Any], *, label: bool = False) -> VectorBatch:
    """``OutputAnalysis.load(output).vectorize(records, label=label)``: see the module docstring."""
    return OutputAnalysis.load(output).vectorize(records, label=label)
