"""bench/report.py's reader table: the CPU-per-example ratios printed beside the examples/s ones."""

from __future__ import annotations

from bench import report


def _row(case: str, comp: str, rate: float, cpu_us: float) -> dict:
    return {"label": case, "compression": comp, "case": case, "step_ms": 0.0, "runs": 1, "ok": True,
            "examples_per_s": rate, "time_to_first_batch_s": 0.2, "cpu_us_per_example": cpu_us,
            "input_wait_fraction": 0.0, "cpu_cores_used": 1.0, "peak_rss_mb": 500.0}


def test_cpu_per_example_ratios_beside_the_rates():
    rows = {"train_dataset:gzip": _row("train_dataset", "gzip", 200_000, 8.0),
            "mbfd:gzip": _row("mbfd", "gzip", 50_000, 20.0),
            "raw:gzip": _row("raw", "gzip", 250_000, 4.0)}
    md = "\n".join(report.readers_md({"readers": {"rows": rows, "batch": 1024, "step_ms": 0.0,
                                                  "warmup": {"batches": 2, "seconds": 1.0},
                                                  "windows": {"count": 7, "min_batches": 1, "seconds": 0.4}}}))
    assert "| readers / make_batched_features_dataset (gzip) | 4.00x |" in md
    assert "| CPU-µs per example: make_batched_features_dataset / readers (gzip) | 2.50x |" in md
    assert "| CPU-µs per example: readers / limit raw read (gzip) | 2.00x |" in md
