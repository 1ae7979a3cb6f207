"""Sizing a conversion before running it (``recordprep estimate``): units, shards, requests,
memory, worker-hours and cost on Dataflow, beside TF Transform on the same job.

The model is the plan's own arithmetic (:func:`pipelines.plan.default_num_shards`,
one unit per shard, the shuffle's fan-in of ``pipelines.shuffle``) applied to
per-record constants measured by the bench (:data:`MEASURED`; figures and dates in
``docs/benchmarks.md#sizing-constants``). Prices are list prices (:data:`PRICES`,
with their date and source), overridable; a user with their own data should pass
``--cpu-us-per-record`` and the byte ratios measured on a sample run.
"""

from __future__ import annotations

import dataclasses
import math

from convert.splits import MAX_SPLITS
from pipelines.plan import InputError, default_num_shards

MB = 1 << 20

#: Measured on the bench data (docs/benchmarks.md#sizing-constants).
MEASURED = {
    "cpu_us_per_record": 14.6,  # recordprep AVRO -> gzip, whole job, CPU-s per record
    "tft_cpu_us_per_record": 194.0,  # TF Transform AnalyzeAndTransformDataset, the same records
    "scatter_bytes_per_record": 193.0,  # LZ4 frames of the encoded records (the shuffle's temp data)
    "output_bytes_per_record": 158.0,  # gzip shards, all splits
    "prepared_bytes_per_record": 157.0,  # the analysis pass's prepared batches (LZ4), read back once
    "worker_rss_mb": 264.0,  # peak RSS per local worker process
    "tft_worker_rss_mb": 2450.0,  # TF Transform, per worker process
    "bytes_per_held_term": 330.0,  # a distinct term's count held in one process (analysis-memory, one combine)
}

#: Dataflow batch list prices, us-central1, USD (cloud.google.com/dataflow/pricing, as listed in 2024;
#: not re-checked from this machine: override with the options of ``recordprep estimate``).
PRICES = {"vcpu_hour": 0.056, "gb_hour": 0.003557, "pd_gb_hour": 0.000054, "shuffle_gb": 0.011}

#: vCPUs and memory (GB) of common worker machine types.
MACHINES = {
    "n1-standard-1": (1, 3.75), "n1-standard-2": (2, 7.5), "n1-standard-4": (4, 15.0),
    "n1-standard-8": (8, 30.0), "n1-highmem-4": (4, 26.0), "n2-standard-4": (4, 16.0),
    "n2-standard-8": (8, 32.0), "e2-standard-4": (4, 16.0),
}

_READ = 8 * MB  # pipelines.shuffle._READ_BYTES
_FAN_IN = 1 * MB  # pipelines.shuffle._FAN_IN_READ_BYTES
_BEAM_READ = 16 * MB  # Beam's gs:// reader fetches this much per request
_UPLOAD_CHUNK = 8 * MB  # resumable upload chunk of Beam's gs:// writer (about)
_DISK_GB = 250  # Dataflow's default persistent disk per batch worker


class EstimateError(ValueError):
    """An impossible job description: a size, split count, rate or price that is not a finite
    number in its range, or an unknown machine type. The message names the option."""


#: Upper bound of ``--records`` and of ``--distinct-ids``: far past any job (a million billion records),
#: below where float64 stops holding whole numbers exactly.
MAX_RECORDS = 10**15


def _number(flag: str, value: float, *, low: float = 0.0, zero: bool = False, high: float = math.inf,
            whole: bool = False) -> float:
    """``value`` checked: a finite number above ``low`` (or equal with ``zero``), at most ``high``,
    a whole number with ``whole``; an EstimateError naming ``flag`` otherwise."""
    ok = (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
          and (value >= low if zero else value > low) and value <= high and (not whole or float(value).is_integer()))
    if not ok:
        what = "a whole number" if whole else "a finite number"
        bound = f">= {low:g}" if zero else f"> {low:g}"
        top = f" and at most {high:g}" if math.isfinite(high) else ""
        raise EstimateError(f"{flag} must be {what} {bound}{top}, found {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class JobSize:
    """What ``recordprep estimate`` sizes: the job, the workers, the per-record rates and the prices.

    Validated in one place (``__post_init__``): every size, count and rate is a finite number in
    its range and every price > 0 (an EstimateError names the ``recordprep estimate`` option);
    ``records``, ``input_bytes``, ``distinct_ids`` and ``splits`` are whole numbers (``1e9`` is).
    """

    records: int
    input_bytes: int
    distinct_ids: int = 0
    machine_type: str = "n1-standard-4"
    splits: int = 2
    target_shard_mb: float = 128.0
    cpu_us_per_record: float = MEASURED["cpu_us_per_record"]
    scatter_bytes_per_record: float = MEASURED["scatter_bytes_per_record"]
    output_bytes_per_record: float = MEASURED["output_bytes_per_record"]
    utilization: float = 0.7  # of the workers' vCPU-hours spent converting (start-up, stragglers, I/O waits)
    vcpu_hour_usd: float = PRICES["vcpu_hour"]
    gb_hour_usd: float = PRICES["gb_hour"]

    def __post_init__(self) -> None:
        _number("--input-gb", self.input_bytes / 1e9, high=1e12)  # a thousand PB
        if self.input_bytes < 1:
            raise EstimateError(f"--input-gb must be at least one byte (1e-9), found {self.input_bytes / 1e9!r}")
        whole = {
            "records": _number("--records", self.records, high=MAX_RECORDS, whole=True),
            "input_bytes": self.input_bytes,
            "distinct_ids": _number("--distinct-ids", self.distinct_ids, zero=True, high=MAX_RECORDS, whole=True),
            "splits": _number("--splits", self.splits, low=1, zero=True, high=MAX_SPLITS, whole=True),
        }
        for name, v in whole.items():
            object.__setattr__(self, name, int(v))
        if self.machine_type not in MACHINES:
            raise EstimateError(f"--machine-type {self.machine_type!r} is not modelled; one of {', '.join(MACHINES)}")
        _number("--target-shard-mb", self.target_shard_mb)
        _number("--cpu-us-per-record", self.cpu_us_per_record)
        _number("scatter bytes per record", self.scatter_bytes_per_record)
        _number("output bytes per record", self.output_bytes_per_record)
        _number("--utilization", self.utilization, high=1.0)
        _number("--vcpu-hour-usd", self.vcpu_hour_usd)
        _number("--gb-hour-usd", self.gb_hour_usd)
        try:
            default_num_shards(self.input_bytes, self.target_shard_mb)
        except InputError as e:  # more shards than a conversion may make
            raise EstimateError(str(e)) from None


def held_terms(records: int, distinct: int, units: int) -> dict[str, int]:
    """The distinct terms of one vocabulary feature a process holds at once, by stage.

    ``unit_terms``: a unit's own distinct terms, counted while it is analyzed (and again in its
    statistics): at most its records' worth and at most the column's. ``partition_terms``: one
    partition of the merge, about ``distinct / units``. A process holds one or the other at a time,
    so its peak follows the larger (``held_terms``); with few units the unit's own terms are it.
    """
    if not distinct:
        return {"unit_terms": 0, "partition_terms": 0, "held_terms": 0}
    unit = min(distinct, math.ceil(records / units))
    partition = math.ceil(distinct / units)
    return {"unit_terms": unit, "partition_terms": partition, "held_terms": max(unit, partition)}


def estimate(job: JobSize, prices: dict[str, float] | None = None) -> dict[str, float]:
    """The model's figures for ``job`` (see the module docstring and docs/scale.md); ``prices``
    overrides :data:`PRICES` beyond the job's own vCPU-hour and GB-hour prices."""
    price = {**PRICES, **(prices or {}), "vcpu_hour": job.vcpu_hour_usd, "gb_hour": job.gb_hour_usd}
    shards = default_num_shards(job.input_bytes, job.target_shard_mb)
    units, buckets = shards, shards * job.splits
    scatter = job.records * job.scatter_bytes_per_record
    output = job.records * job.output_bytes_per_record
    per_unit = scatter / units
    fan_in = max(1, min(units, math.ceil(_FAN_IN * buckets / per_unit))) if per_unit else 1
    groups = math.ceil(units / fan_in)
    gather_reads = groups * buckets
    merge_reads = math.ceil(scatter / _READ) + units if fan_in > 1 else 0
    prepared = job.records * MEASURED["prepared_bytes_per_record"]
    input_reads = math.ceil((job.input_bytes + prepared) / _BEAM_READ) + 4 * units
    writes = math.ceil((prepared + 2 * scatter + output) / _UPLOAD_CHUNK) + 3 * units + 2 * groups + 2 * buckets
    vcpus, mem_gb = MACHINES[job.machine_type]
    vcpu_hours = job.records * job.cpu_us_per_record / 3.6e9 / job.utilization
    worker_hours = vcpu_hours / vcpus
    tft_vcpu_hours = job.records * MEASURED["tft_cpu_us_per_record"] / 3.6e9 / job.utilization
    # Per worker: one process per vCPU, each at the measured RSS plus the shuffle's buffers (3 spills,
    # 2 key ranges of 16 MB, a read of 8 MB).
    worker_mb = vcpus * (MEASURED["worker_rss_mb"] + 3 * 4 + 2 * 16 + 8)
    # The analysis and the statistics count terms by unit, then by partition (pipelines.analyze, one
    # partition per unit): a process holds a unit's distinct terms or a partition's (held_terms).
    terms = held_terms(job.records, job.distinct_ids, units)
    held_mb = terms["held_terms"] * MEASURED["bytes_per_held_term"] / MB
    worker_mb += vcpus * held_mb

    def cost(vh: float) -> float:
        wh = vh / vcpus
        return vh * price["vcpu_hour"] + wh * (mem_gb * price["gb_hour"] + _DISK_GB * price["pd_gb_hour"])

    return {
        "units": units, "shards_per_split": shards, "buckets": buckets, "fan_in": fan_in, "groups": groups,
        "scatter_gb": scatter / 1e9, "output_gb": output / 1e9, "merge_disk_gb": fan_in * per_unit / 1e9,
        "gather_reads": gather_reads, "gather_read_mb": scatter / gather_reads / MB,
        "requests": input_reads + merge_reads + gather_reads + writes,
        "requests_per_gb_written": (input_reads + merge_reads + gather_reads + writes) / (output / 1e9),
        "peak_mb_per_worker": worker_mb, "worker_mem_mb": mem_gb * 1024,
        "tft_peak_mb_per_worker": vcpus * MEASURED["tft_worker_rss_mb"],
        "vcpu_hours": vcpu_hours, "worker_hours": worker_hours, "cost_usd": cost(vcpu_hours),
        "tft_vcpu_hours": tft_vcpu_hours, "tft_worker_hours": tft_vcpu_hours / vcpus,
        "tft_cost_usd": cost(tft_vcpu_hours) + 2 * job.input_bytes / 1e9 * price["shuffle_gb"],
        "distinct_ids": job.distinct_ids, **terms, "held_mb": held_mb,
        "partition_mb": terms["partition_terms"] * MEASURED["bytes_per_held_term"] / MB,
        "one_process_terms_mb": job.distinct_ids * MEASURED["bytes_per_held_term"] / MB,
    }


def render(job: JobSize, est: dict[str, float]) -> list[str]:
    """The estimate as the lines ``recordprep estimate`` prints."""
    e = est
    fits = "fits" if e["peak_mb_per_worker"] < 0.8 * e["worker_mem_mb"] else "DOES NOT FIT: pick a machine with more memory"
    tft_fits = "fits" if e["tft_peak_mb_per_worker"] < 0.8 * e["worker_mem_mb"] else "does not fit"
    return [
        f"job: {job.records:,} records, {job.input_bytes / 1e9:,.1f} GB of input, {job.distinct_ids:,} distinct ids, "
        f"{job.splits} splits, workers {job.machine_type}",
        f"units: {e['units']:,}  shards per split: {e['shards_per_split']:,}  (--target-shard-mb {job.target_shard_mb:g})",
        f"shuffle: {e['scatter_gb']:,.1f} GB of temp data, units merged {e['fan_in']:,} at a time into "
        f"{e['groups']:,} groups ({e['merge_disk_gb']:,.1f} GB of local disk per merge)",
        f"requests: {e['requests']:,.0f} ({e['requests_per_gb_written']:,.0f} per GB written); the gather's "
        f"{e['gather_reads']:,} reads average {e['gather_read_mb']:.2f} MB",
        f"output: {e['output_gb']:,.1f} GB of shards",
        f"peak memory per worker: {e['peak_mb_per_worker']:,.0f} MB of {e['worker_mem_mb']:,.0f} MB ({fits}), "
        f"with the term counts a process holds ({e['held_terms']:,} of the {job.distinct_ids:,} distinct ids, "
        f"{e['held_mb']:,.0f} MB: a unit's own {e['unit_terms']:,} or a merge partition's {e['partition_terms']:,}; "
        f"{e['one_process_terms_mb']:,.0f} MB if one process held them all)",
        f"worker-hours: {e['worker_hours']:,.1f} ({e['vcpu_hours']:,.1f} vCPU-hours at "
        f"{job.cpu_us_per_record:g} µs per record, {job.utilization:.0%} busy)",
        f"cost: ${e['cost_usd']:,.2f} (${job.vcpu_hour_usd:g} per vCPU-hour, ${job.gb_hour_usd:g} per GB-hour; "
        f"defaults: Dataflow batch list prices, pipelines/estimate.py PRICES)",
        f"TF Transform on the same job: {e['tft_worker_hours']:,.1f} worker-hours, ${e['tft_cost_usd']:,.2f} "
        f"(its measured {MEASURED['tft_cpu_us_per_record']:g} µs per record, Shuffle of twice the input), "
        f"{e['tft_peak_mb_per_worker']:,.0f} MB per worker ({tft_fits})",
    ]
