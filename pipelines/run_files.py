"""What every step of a conversion shares about its files: the names under the
output directory, and the error a run that must not be committed raises.

::

    <output>/
      .recordprep-tmp/          TMP_DIR: temp shards, prepared batches, scatter files,
                                error files and progress of the running job (removed at commit)
      {split}-{i}-of-{n}-{run id}.tfrecord[.gz]   the shards (convert.spec.shard_name)
      errors/errors-{i}-of-{n}.jsonl              ERRORS_DIR: rejected records
      vocab/{feature}.txt                         VOCAB_DIR: one term per line
      analysis.json, stats.json                   ANALYSIS_FILENAME, convert.stats.STATS_FILENAME
      dataset_info.json                           convert.spec.METADATA_FILENAME, written last
"""

from __future__ import annotations

TMP_DIR = ".recordprep-tmp"
ANALYSIS_FILENAME = "analysis.json"
ERRORS_DIR = "errors"
VOCAB_DIR = "vocab"


class ConversionFailed(RuntimeError):
    """The run finished but must not be committed (too many errors, accounting), or a
    temp file it wrote is damaged."""

    MARKER = "recordprep:"

    def __init__(self, message: str):
        super().__init__(f"{self.MARKER} {message}")
        self.message = message


def posix_basename(p: str) -> str:
    """The last part of a local or URL-style path (``gs://b/x/y.bin`` -> ``y.bin``)."""
    return p.rstrip("/").rsplit("/", 1)[-1]
