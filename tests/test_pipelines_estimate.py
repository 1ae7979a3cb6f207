"""``recordprep estimate`` (issue 38): the plan's units and shards, the shuffle's fan-in
keeping reads at about 1 MB and requests growing with bytes, not with units x shards."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.estimate import EstimateError, JobSize, estimate, held_terms
from pipelines.plan import default_num_shards


def test_the_example_job_uses_the_plans_shards_and_reads_of_about_a_megabyte():
    job = JobSize(records=10**9, input_bytes=200 * 10**9, distinct_ids=300 * 10**6)
    e = estimate(job)
    assert e["units"] == e["shards_per_split"] == default_num_shards(job.input_bytes, 128.0) == 1491
    assert e["fan_in"] > 1 and e["groups"] * e["fan_in"] >= e["units"]
    assert 1.0 <= e["gather_read_mb"] < 2.0
    assert e["gather_reads"] < e["units"] * e["buckets"] / 10  # not units x shards
    assert e["tft_cost_usd"] > 10 * e["cost_usd"]
    # the analysis' term counts: one partition (distinct ids / units) per process, not all of them
    assert e["partition_terms"] == -(-job.distinct_ids // e["units"])
    assert e["partition_mb"] < 100 < e["one_process_terms_mb"] / 100
    assert e["peak_mb_per_worker"] < 0.8 * e["worker_mem_mb"]


def test_memory_per_worker_grows_with_the_terms_a_process_holds():
    few, many = (estimate(JobSize(records=10**9, input_bytes=200 * 10**9, distinct_ids=n)) for n in (10**6, 10**9))
    grown = many["peak_mb_per_worker"] - few["peak_mb_per_worker"]
    assert grown == pytest.approx(4 * (many["held_mb"] - few["held_mb"]))  # n1-standard-4: 4 processes
    assert many["partition_terms"] <= 10**9 // many["units"] + 1


def test_a_units_own_distinct_terms_count_with_few_units():
    """At 4 units, 10x the distinct ids of the analysis-memory bench (2M records) grows each process by a
    unit's terms (200k -> 500k), not only by a partition's (50k -> 500k): the model holds the larger."""
    lo, hi = (held_terms(2_000_000, d, 4) for d in (200_000, 2_000_000))
    assert (lo["unit_terms"], lo["partition_terms"], lo["held_terms"]) == (200_000, 50_000, 200_000)
    assert (hi["unit_terms"], hi["partition_terms"], hi["held_terms"]) == (500_000, 500_000, 500_000)
    # with many units a unit's share of the records bounds it, however many distinct ids
    assert held_terms(2_000_000, 2_000_000, 128)["held_terms"] == held_terms(2_000_000, 200_000, 128)["held_terms"]
    e = estimate(JobSize(records=2_000_000, input_bytes=4 * 2**20, distinct_ids=200_000))
    assert e["units"] == 4 and e["held_terms"] == 200_000 > e["partition_terms"]
    assert held_terms(10, 0, 4)["held_terms"] == 0


@pytest.mark.parametrize(("args", "flag"), [
    (["--records", "inf"], "--records"), (["--records", "nan"], "--records"), (["--records", "-5"], "--records"),
    (["--records", "0"], "--records"), (["--records", "2.5"], "--records"), (["--input-gb", "inf"], "--input-gb"),
    (["--input-gb", "nan"], "--input-gb"), (["--input-gb", "0"], "--input-gb"), (["--input-gb", "-1"], "--input-gb"),
    (["--distinct-ids", "-1"], "--distinct-ids"), (["--distinct-ids", "inf"], "--distinct-ids"),
    (["--splits", "0"], "--splits"), (["--splits", "-2"], "--splits"), (["--splits", "1000"], "--splits"),
    (["--target-shard-mb", "0"], "--target-shard-mb"), (["--target-shard-mb", "nan"], "--target-shard-mb"),
    (["--target-shard-mb", "1e-9"], "--target-shard-mb"), (["--cpu-us-per-record", "0"], "--cpu-us-per-record"),
    (["--cpu-us-per-record", "-3"], "--cpu-us-per-record"), (["--cpu-us-per-record", "inf"], "--cpu-us-per-record"),
    (["--utilization", "0"], "--utilization"), (["--utilization", "1.5"], "--utilization"),
    (["--utilization", "nan"], "--utilization"), (["--vcpu-hour-usd", "-0.05"], "--vcpu-hour-usd"),
    (["--vcpu-hour-usd", "0"], "--vcpu-hour-usd"), (["--vcpu-hour-usd", "inf"], "--vcpu-hour-usd"),
    (["--gb-hour-usd", "nan"], "--gb-hour-usd"), (["--gb-hour-usd", "-1"], "--gb-hour-usd"),
])
def test_every_argument_is_checked_with_a_message_naming_it(args, flag):
    base = {"--records": "1e9", "--input-gb": "200"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    r = CliRunner().invoke(app, ["estimate", *(x for kv in base.items() for x in kv)])
    assert r.exit_code == 2, r.output
    assert flag in r.output and "Traceback" not in r.output and isinstance(r.exception, SystemExit)
    assert "cost" not in r.output


def test_the_checked_job_is_a_frozen_value_of_whole_numbers():
    job = JobSize(records=1e9, input_bytes=2e11, distinct_ids=3e8)  # type: ignore[arg-type]
    assert (job.records, job.input_bytes, job.distinct_ids) == (10**9, 2 * 10**11, 3 * 10**8)
    assert all(type(v) is int for v in (job.records, job.input_bytes, job.distinct_ids, job.splits))
    e = estimate(JobSize(records=10**9, input_bytes=200 * 10**9, vcpu_hour_usd=0.112))
    assert e["cost_usd"] > estimate(JobSize(records=10**9, input_bytes=200 * 10**9))["cost_usd"] > 0


def test_requests_grow_with_bytes_not_with_units_times_shards():
    small, large = (estimate(JobSize(records=n, input_bytes=200 * n)) for n in (10**8, 10**9))
    assert large["units"] > 9 * small["units"]
    assert large["requests"] < 12 * small["requests"]  # units x shards grew ~100x
    assert large["gather_read_mb"] >= 1.0 and small["gather_read_mb"] >= 1.0


def test_the_cli_prints_the_model_and_refuses_unknown_machines():
    r = CliRunner().invoke(app, ["estimate", "--records", "1e9", "--input-gb", "200", "--distinct-ids", "3e8"])
    assert r.exit_code == 0, r.output
    assert "units: 1,491" in r.output and "worker-hours" in r.output and "TF Transform" in r.output
    r = CliRunner().invoke(app, ["estimate", "--records", "1e9", "--input-gb", "200", "--machine-type", "m9-huge"])
    assert r.exit_code == 2 and "m9-huge" in r.output
    with pytest.raises(EstimateError):
        JobSize(records=0, input_bytes=1)
