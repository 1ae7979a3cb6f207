"""Progress files written by workers and summed by the launcher."""

from __future__ import annotations

import io
import json
import threading

from pipelines.local.progress import ProgressReporter, UnitProgress, format_line, read_totals


def test_units_report_and_the_launcher_sums_per_pass(tmp_path):
    a = UnitProgress(str(tmp_path), "analyze", 0, every=0)
    b = UnitProgress(str(tmp_path), "analyze", 1, every=0)
    c = UnitProgress(str(tmp_path), "convert", 0, every=3600)  # throttled: only close() writes
    a.add(100, 1000)
    b.add(50, 500)
    b.add(50, 500)
    c.add(7, 70)
    assert read_totals(str(tmp_path)) == {"analyze": (200, 2000), "convert": (0, 0)}
    c.close()
    assert read_totals(str(tmp_path))["convert"] == (7, 70)
    assert not list(tmp_path.glob("*.tmp"))


def test_unreadable_or_foreign_files_are_ignored(tmp_path):
    (tmp_path / "analyze-00000.json").write_text("{not json")
    (tmp_path / "other-00000.json").write_text(json.dumps({"records": 5}))
    (tmp_path / "convert-00001.json").write_text(json.dumps({"records": 3, "bytes": 9}))
    assert read_totals(str(tmp_path)) == {"analyze": (0, 0), "convert": (3, 9)}
    assert read_totals(str(tmp_path / "missing")) == {"analyze": (0, 0), "convert": (0, 0)}


def test_a_unit_that_cannot_write_carries_on(tmp_path):
    p = UnitProgress(str(tmp_path / "no" / "such" / "dir"), "convert", 0, every=0)
    p.add(10, 10)
    p.close()
    assert p.records == 10 and p.path is None


def test_line_shows_records_bytes_percent_and_rate():
    line = format_line({"analyze": (1000, 5_000_000), "convert": (500, 2_500_000)}, 10_000_000, 10.0, ("analyze", "convert"))
    assert "analyze: 1,000 records, 5.0/10.0 MB  50.0%" in line
    assert "convert: 500 records" in line
    assert "(75 records/s)" in line  # (1000 + 500) records over 2 passes in 10 s


class _Lines(io.StringIO):
    """A stream that says when a line containing ``wanted`` was written."""

    def __init__(self, wanted: str):
        super().__init__()
        self.wanted, self.seen = wanted, threading.Event()

    def write(self, text: str) -> int:
        n = super().write(text)
        if self.wanted in self.getvalue():
            self.seen.set()
        return n


def test_reporter_prints_while_running(tmp_path):
    """A line appears while the block still runs (not only when it ends)."""
    out = _Lines("analyze: 42 records")
    with ProgressReporter(str(tmp_path / "p"), 1000, interval=0.05, stream=out):
        UnitProgress(str(tmp_path / "p"), "analyze", 0, every=0).add(42, 100)
        assert out.seen.wait(timeout=60), out.getvalue()  # the reporter's thread printed it, unprompted


def test_a_local_run_reports_progress_and_leaves_no_progress_files(tmp_path, monkeypatch):
    import functools

    from _pipelines_data import make_records, write_dataset

    import pipelines.job as job
    import pipelines.local.runner
    from pipelines.options import ConvertOptions

    out_stream = io.StringIO()
    monkeypatch.setattr(pipelines.local.runner, "ProgressReporter", functools.partial(ProgressReporter, interval=0.02, stream=out_stream))
    paths = write_dataset(tmp_path / "d", make_records(3000))
    out = tmp_path / "out"
    job.run_convert(ConvertOptions(inputs=(str(paths["avro"]),), config=str(paths["config"]), output=str(out),
                                   num_shards=2, batch_size=100, progress=True))
    text = out_stream.getvalue()
    assert "analyze: " in text and "records/s" in text, text
    assert not (out / ".recordprep-tmp").exists()
