"""The converter stage bench (``bench/converter_stages.py``) runs the job's steps on a tiny copy of
the bench data: every step is timed, the records are counted, the decode limit is measured."""

from __future__ import annotations

from bench import converter_stages


def test_every_step_of_every_record(tiny_bench_avro: list[str]) -> None:
    res = converter_stages.measure(tiny_bench_avro, records=10_000)
    assert res["records"] == 600
    assert tuple(res["us_per_record"]) == converter_stages.STEPS
    assert set(converter_stages.STEPS) >= {"read", "split", "prepare", "analyze", "finish", "stats", "encode",
                                           "frame", "gzip"}
    assert res["sum_us"] > 0 and res["gzip_bytes"] > 0
    limit = converter_stages.decode_limit("avro", tiny_bench_avro)
    assert limit["records"] == 600 and limit["us_per_record"] >= 0
    text = converter_stages.table("avro", res, limit)
    assert "| read |" in text and "| **sum** |" in text and "polars read_avro" in text


def test_stops_after_the_batch_that_reaches_the_records_asked(tiny_bench_avro: list[str]) -> None:
    res = converter_stages.measure(tiny_bench_avro + tiny_bench_avro, records=100)
    assert 100 <= res["records"] <= 600  # whole batches of the first file only
