"""``recordprep estimate`` (issue 38): the plan's units and shards, the shuffle's fan-in
keeping reads at about 1 MB and requests growing with bytes, not with units x shards."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.estimate import EstimateError, JobSize, estimate
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


def test_memory_per_worker_grows_with_distinct_ids_per_unit_only():
    few, many = (estimate(JobSize(records=10**9, input_bytes=200 * 10**9, distinct_ids=n)) for n in (10**6, 10**9))
    grown = many["peak_mb_per_worker"] - few["peak_mb_per_worker"]
    assert grown == pytest.approx(4 * (many["partition_mb"] - few["partition_mb"]))  # n1-standard-4: 4 processes
    assert many["partition_terms"] <= 10**9 // many["units"] + 1


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
