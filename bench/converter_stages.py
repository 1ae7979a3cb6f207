"""Where a converted record's CPU goes: the job's steps, one at a time, in one process.

``python -m bench.converter_stages --size default [--format avro|parquet|json] [--records N]``

Runs the conversion's own steps, the functions the Beam DoFns call
(``pipelines.unit_input.prepare_unit``, ``pipelines.analyze``, ``pipelines.convert_pass``,
``pipelines.shuffle``), on the first ``--records`` records of the bench data (whole
batches: the last batch read is kept whole) with the job's default options, and times
each step with ``time.process_time`` (CPU of every thread of this process):

A warm-up run on one batch comes first (imports and first-call set-up are not a record's cost).

``read``        ``convert.sources.iter_records`` with the job's options (each record's
                JSON when the split hashes whole records, the columns ``read_columns`` picks)
``split``       ``Splits.assign``
``prepare``     ``Preparer.prepare`` (``unit_terms=True``, ``analyze=True``, as the analysis pass)
``analyze``     ``Analyzer.add_prepared`` of the training rows
``temp write``  ``PreparedWriter.write`` to a local temp file (the analysis pass' output)
``merge``       the analysis combine of the one unit and ``Vectorizer`` set-up (once per job)
``temp read``   ``read_prepared`` (the convert pass' input)
``finish``      ``Vectorizer.finish``
``stats``       ``StatsAccumulator.add`` (``stats.json``)
``encode``      ``encode_examples``
``frame``       ``frame_records`` (TFRecord framing, CRC32C per record)
``gzip``        ``tempfile_format.gzip_file`` at the job's default level, to a null sink

Not measured here: the shuffle's scatter and gather (bucket keys, sort, temp files), Beam's
stages, worker start-up and the commit; the end-to-end rows of ``bench.convert_bench`` hold
those. The decode limit (polars ``read_avro``, pyarrow ``read_table``, orjson per line) is
measured in the same process on the same files, for comparison.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.convert_bench import CONFIG, parquet_twins
from bench.make_data import avro_files, dataset_dir, ensure_dataset, json_files

STEPS = ("read", "split", "prepare", "analyze", "temp write", "merge", "temp read", "finish", "stats",
         "encode", "frame", "gzip")
FORMATS = ("avro", "parquet", "json")


class _Steps:
    """CPU seconds (``time.process_time``) per step name."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.process_time()
        try:
            yield
        finally:
            self.cpu[name] += time.process_time() - t0


class _NullSink:
    """A binary file that counts what is written to it (gzip's output)."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.bytes += n
        return n

    def flush(self) -> None:
        pass


def _analysis_pass(paths: list[str], records: int, config: Any, opts: Any, steps: _Steps, prepared: str) -> tuple[Any, int]:
    """``prepare_unit``'s loop (read, split, prepare, analyze) over ``paths`` until ``records`` are
    read, each batch written to the ``prepared`` temp file; returns the analyzer and the records read."""
    from apache_beam.io.filesystems import FileSystems

    from convert.analysis import Analyzer
    from convert.prepare import Preparer
    from convert.sources import iter_records
    from pipelines.tempfile_format import Prepared, PreparedWriter
    from pipelines.unit_input import read_columns

    analyzer, preparer = Analyzer(config), Preparer(config, unit_terms=True)
    columns = read_columns(config, opts.splits)
    n = 0
    with PreparedWriter(prepared) as out:
        for path in paths:
            with FileSystems.open(path, compression_type="uncompressed") as f:
                batches = iter_records(f, path, 0, None, opts.batch_size, opts.json_records_path, opts.avro_decoder,
                                       record_json=opts.splits.hashes_whole_records,
                                       max_record_bytes=opts.max_record_bytes, max_block_bytes=opts.max_block_bytes,
                                       columns=columns)
                while n < records:
                    with steps("read"):
                        batch = next(batches, None)
                    if batch is None:
                        break
                    if batch.bad:
                        raise RuntimeError(f"{path}: {len(batch.bad)} unreadable records in the bench data")
                    if not batch.records:
                        continue
                    with steps("split"):
                        split = opts.splits.assign(batch.records)
                    with steps("prepare"):
                        pb = preparer.prepare(batch.records, analyze=True)
                    if pb.bad:
                        raise RuntimeError(f"{path}: {len(pb.bad)} rejected records in the bench data")
                    with steps("analyze"):
                        analyzer.add_prepared(pb, split == 0)
                        pb.analysis = None
                    with steps("temp write"):
                        out.write(Prepared(path, len(batch.records), [], split, pb))
                    n += len(batch.records)
            if n >= records:
                break
    return analyzer, n


def _convert_pass(config: Any, opts: Any, analyzer: Any, steps: _Steps, prepared: str) -> int:
    """The analysis combine, then ``_encode_batch``'s steps over the prepared file; returns gzip's bytes."""
    import numpy as np

    from convert.analysis import Analysis
    from convert.example import encode_examples
    from convert.stats import StatsAccumulator
    from convert.tfrecord import frame_records
    from convert.vectorize import Vectorizer
    from pipelines.analyze import _MergeAnalyzers
    from pipelines.tempfile_format import gzip_file, read_prepared

    with steps("merge"):
        combine = _MergeAnalyzers(config)
        value = combine.extract_output(combine.add_input(combine.create_accumulator(), (0, analyzer, prepared)))
        vec = Vectorizer(config, Analysis.from_json(value.json))
    stats = StatsAccumulator(config, opts.splits.names)
    sink = _NullSink()
    gz = gzip_file(sink, opts.gzip_level)
    items = read_prepared(prepared)
    while True:
        with steps("temp read"):
            item = next(items, None)
        if item is None:
            break
        with steps("finish"):
            vb = vec.finish(item.batch)
        with steps("stats"):
            stats.add(item.batch, vb, item.split)
        rows = int(vb.keep.sum())
        with steps("encode"):
            buf, lens = encode_examples(vb.columns, rows)
            starts = np.cumsum(lens) - lens
        with steps("frame"):
            framed = frame_records(buf, starts, lens)
        with steps("gzip"):
            gz.write(framed)
    with steps("gzip"):
        gz.close()
    return sink.bytes


def measure(paths: list[str], records: int, config_path: str = CONFIG) -> dict[str, Any]:
    """The job's steps over the first ``records`` records of ``paths`` (whole batches):
    ``{"records", "cpu_s": {step: CPU seconds}, "us_per_record": {step: µs}, "sum_us", "gzip_bytes"}``."""
    from convert.config import load_config
    from pipelines.options import ConvertOptions
    from pipelines.unit_input import relaxed_gc

    config = load_config(config_path)
    opts = ConvertOptions(inputs=tuple(paths), config=config_path, output="/nonexistent")
    steps = _Steps()
    tmp = tempfile.mkdtemp(prefix="converter-stages-")
    try:
        prepared = str(Path(tmp) / "prepared-00000.bin")
        with relaxed_gc():
            analyzer, n = _analysis_pass(paths, records, config, opts, steps, prepared)
            analyzer.flush()
            gz_bytes = _convert_pass(config, opts, analyzer, steps, prepared)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if n == 0:
        raise RuntimeError(f"no records in {paths}")
    us = {s: steps.cpu[s] * 1e6 / n for s in STEPS}
    return {"records": n, "cpu_s": {s: steps.cpu[s] for s in STEPS}, "us_per_record": us,
            "sum_us": sum(us.values()), "gzip_bytes": gz_bytes}


def decode_limit(fmt: str, paths: list[str]) -> dict[str, Any]:
    """The decode limit on ``paths`` in this process: polars ``read_avro`` (Avro), pyarrow
    ``read_table`` without threads (Parquet), orjson per line (JSON); CPU µs per record."""
    n = 0
    t0 = time.process_time()
    if fmt == "avro":
        import polars as pl

        label = "polars read_avro"
        t0 = time.process_time()
        for p in paths:
            n += pl.read_avro(p).height
    elif fmt == "parquet":
        import pyarrow.parquet as pq

        label = "pyarrow read_table"
        t0 = time.process_time()
        for p in paths:
            n += pq.read_table(p, use_threads=False).num_rows
    else:
        import orjson

        label = "orjson per line"
        t0 = time.process_time()
        for p in paths:
            with open(p, "rb") as f:
                for line in f:
                    orjson.loads(line)
                    n += 1
    return {"label": label, "records": n, "us_per_record": (time.process_time() - t0) * 1e6 / max(n, 1)}


def bench_files(size: str, fmt: str, records: int) -> list[str]:
    """The first files of the ``size`` bench data in ``fmt`` holding ``records`` records (Parquet:
    ``convert_bench.parquet_twins`` of the Avro files, made once)."""
    manifest = ensure_dataset(size, log=lambda *_: None)
    counts = [f["records"] for f in manifest["avro"]["files"]]
    k, total = 0, 0
    while k < len(counts) and total < records:
        total += counts[k]
        k += 1
    avro = avro_files(size, manifest)[:k]
    if fmt == "avro":
        return avro
    if fmt == "json":
        return json_files(size, manifest)[:k]
    return parquet_twins(avro, dataset_dir(size) / "out" / "parquet-input")


def table(fmt: str, res: dict[str, Any], limit: dict[str, Any]) -> str:
    """The steps as a markdown table: µs per record, CPU share, the sum and the decode limit."""
    lines = [f"{fmt}: {res['records']:,} records, gzip {res['gzip_bytes'] / 1e6:.1f} MB", "",
             "| step | µs / record | share |", "|---|---:|---:|"]
    for s in STEPS:
        us = res["us_per_record"][s]
        lines.append(f"| {s} | {us:.2f} | {us / res['sum_us']:.0%} |")
    lines.append(f"| **sum** | **{res['sum_us']:.2f}** | ({res['sum_us'] / 1000:.4f} CPU-s / 1k) |")
    lines.append(f"| limit: {limit['label']} | {limit['us_per_record']:.2f} | "
                 f"sum / limit {res['sum_us'] / limit['us_per_record']:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="default")
    ap.add_argument("--format", choices=FORMATS, default="avro")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--config", default=CONFIG)
    args = ap.parse_args()
    paths = bench_files(args.size, args.format, args.records)
    import polars  # noqa: F401 - imported before any timing, as in a warm worker
    import pyarrow.parquet  # noqa: F401

    measure(paths[:1], 1, args.config)  # warm-up (imports, first-call set-up): left out of the table
    res = measure(paths, args.records, args.config)
    limit = decode_limit(args.format, paths)
    print(table(args.format, res, limit))


if __name__ == "__main__":
    main()
