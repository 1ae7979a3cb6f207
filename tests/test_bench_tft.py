"""The TF Transform bench rows (bench/tft.py, bench/report.py): what they print
when the peer is there, when it cannot be installed, and when recordprep's
serving layer has not landed. The rows themselves run in ``make bench``."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bench import report, tft


def _conv(rate: float, cpu: float, rss: float) -> dict:
    return {"label": "x", "ok": True, "runs": 1, "records": 1000, "records_per_s": rate, "cpu_s_per_1k": cpu,
            "peak_rss_mb": rss, "raw": []}


def _layer(rate: float, single_ms: float) -> dict:
    return {"label": "y", "ok": True, "runs": 1, "batch": 1024, "batch_median_ms": 1024 / rate * 1e3,
            "batch_records_per_s": rate, "single_median_ms": single_ms, "single_p90_ms": single_ms,
            "batch_calls": 10, "single_calls": 10, "outputs": 26, "peak_rss_mb": 700.0, "raw": []}


def _tft_results(**rows) -> dict:
    return {"rows": rows, "workers": 2, "shards": {"train": 4, "eval": 2},
            "peer": {"built": "2026-11-25T00:00:00Z", "install_seconds": 100.0,
                     "versions": {"tensorflow-transform": "1.21.0", "tensorflow": "2.21.0", "apache-beam": "2.77.0",
                                  "tfx-bsl": "1.21.0", "python": "3.11.7"}}}


def _tft_targets(tft_results: dict | None) -> dict[str, dict]:
    res = {"size": "small", **({"tft": tft_results} if tft_results is not None else {})}
    return {t["key"]: t for t in report.evaluate_targets(res) if t["key"].startswith("tft_")}


def test_targets_are_ratios_of_recordprep_to_tf_transform_in_the_same_run():
    res = _tft_results(recordprep_convert=_conv(60_000, 0.03, 480), tft_convert=_conv(5_000, 0.5, 2_400),
                       tft_layer=_layer(200_000, 2.0), recordprep_layer=_layer(300_000, 0.8))
    t = _tft_targets(res)
    assert t["tft_convert_rate"]["value"] == pytest.approx(12.0) and t["tft_convert_rate"]["status"] == "NOT MET"
    assert t["tft_convert_cpu"]["value"] == pytest.approx(0.06) and t["tft_convert_cpu"]["status"] == "MET"
    assert t["tft_convert_rss"]["value"] == pytest.approx(0.2) and t["tft_convert_rss"]["status"] == "MET"
    assert t["tft_layer_batch"]["value"] == pytest.approx(1.5) and t["tft_layer_batch"]["status"] == "NOT MET"
    assert t["tft_layer_single"]["value"] == pytest.approx(0.4) and t["tft_layer_single"]["status"] == "MET"
    md = "\n".join(report.tft_md({"tft": res}))
    assert "tensorflow-transform 1.21.0" in md and "| conversion records/s | 12.00x |" in md
    assert "| serving layer median latency (one record) | 0.40x |" in md


@pytest.mark.parametrize(("added", "status"), [(0.95, "MET"), (1.1, "MET"), (1.3, "NOT MET")])
def test_the_export_target_is_its_added_latency_over_the_layers_own(added, status):
    layer = {**_layer(300_000, 0.8), "big_export_added_per_layer": added}
    res = {"size": "small", "tft": _tft_results(recordprep_convert=_conv(60_000, 0.03, 480), tft_convert=_conv(5_000, 0.5, 2_400),
                                                tft_layer=_layer(200_000, 2.0), recordprep_layer=layer)}
    t = {t["key"]: t for t in report.evaluate_targets(res)}["export_added_per_layer"]
    assert t["value"] == pytest.approx(added) and t["status"] == status and t["threshold"] == 1.1
    assert f"| serving export's added batch latency / the layer's own (not a TF Transform ratio) | {added:.2f}x |" in \
        "\n".join(report.tft_md(res))


def test_layer_targets_say_recordprep_layer_is_not_available_yet():
    res = _tft_results(recordprep_convert=_conv(60_000, 0.03, 480), tft_convert=_conv(5_000, 0.5, 2_400),
                       tft_layer=_layer(200_000, 2.0),
                       recordprep_layer={"label": "recordprep serving layer", "ok": False, "unavailable": True,
                                         "runs": 1, "raw": [], "error": "not available yet: no layer"})
    t = _tft_targets(res)
    assert t["tft_convert_rate"]["status"] == "NOT MET"
    for key in ("tft_layer_batch", "tft_layer_single"):
        assert t[key]["status"] == "NOT MEASURED"
        assert "not available yet" in t[key]["note"]
    assert "| recordprep serving layer | not available yet: no layer |" in "\n".join(report.tft_md({"tft": res}))


def test_skipped_peer_is_reported_with_its_reason_on_every_tft_target():
    t = _tft_targets({"skipped": "no wheel for this Python", "rows": {}})
    assert {v["status"] for v in t.values()} == {"NOT MEASURED"}
    assert all("TF Transform skipped: no wheel for this Python" in v["note"] for v in t.values())
    assert report.tft_md({"tft": {"skipped": "no wheel", "rows": {}}}) == ["_skipped: no wheel_"]
    assert all("--skip-tft" in v["note"] for v in _tft_targets(None).values())


@pytest.fixture
def peer_paths(tmp_path, monkeypatch):
    """bench.tft pointed at a virtualenv under tmp_path (the real one is never touched)."""
    req, con = tmp_path / "req.txt", tmp_path / "con.txt"
    req.write_text("tensorflow-transform==1.21.0\n")
    con.write_text("tensorflow-transform==1.21.0\n")
    venv = tmp_path / "peers" / "tft-venv"
    monkeypatch.setattr(tft, "VENV", venv)
    monkeypatch.setattr(tft, "STAMP", venv / ".bench-stamp.json")
    monkeypatch.setattr(tft, "REQUIREMENTS", req)
    monkeypatch.setattr(tft, "CONSTRAINTS", con)
    return venv, req


def test_failed_install_raises_peer_unavailable_with_the_failing_step_and_leaves_no_venv(peer_paths, monkeypatch):
    venv, _ = peer_paths
    broken = venv.parent.parent / "python3.11"
    broken.write_text("#!/bin/sh\necho 'ERROR: no matching distribution' >&2\nexit 3\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(tft, "_python311", lambda: str(broken))
    with pytest.raises(tft.PeerUnavailable, match=r"exit 3\).*no matching distribution"):
        tft.ensure_venv(log=lambda _: None)
    assert not venv.exists()


def test_run_table_without_the_peer_returns_the_reason_and_no_rows(peer_paths, monkeypatch, tmp_path):
    def unavailable(log):
        raise tft.PeerUnavailable("pip could not reach the package registry")

    monkeypatch.setattr(tft, "ensure_venv", unavailable)
    logged: list[str] = []
    out = tft.run_table("small", {}, log=logged.append, log_dir=tmp_path, out_root=tmp_path)
    assert out == {"skipped": "pip could not reach the package registry", "rows": {}}
    assert any("SKIPPED" in line for line in logged)


def test_stamp_is_reused_until_the_requirements_change(peer_paths):
    venv, req = peer_paths
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    stamp = {"requirements": tft._requirements_hash(), "versions": {}, "built": "x", "install_seconds": 1.0}
    (venv / ".bench-stamp.json").write_text(json.dumps(stamp))
    assert tft.ensure_venv(log=lambda _: None) == stamp  # no rebuild: nothing is run
    req.write_text("tensorflow-transform==1.21.1\n")
    assert tft.read_stamp() is None


def test_tft_requirements_pin_tf_transform_its_tensorflow_and_beam():
    text = Path(tft.REQUIREMENTS).read_text()
    for pin in ("tensorflow-transform==1.21.", "tensorflow==2.21.", "apache-beam[gcp]==2.77."):
        assert pin in text
    assert ".peers/" in (Path(tft.HERE).parent / ".gitignore").read_text()


def _fake_measurements(monkeypatch, *, tft_convert_ok: bool = True, layer_unavailable: bool = False,
                       tft_written: tuple[int, ...] = ()) -> list[str]:
    """Stand-in for bench.measure.run_child: records the order of the rows, returns plausible results."""
    from bench import measure

    calls: list[str] = []

    def run_child(module, argv, **kw):
        case = argv[argv.index("--case") + 1]
        calls.append(f"{module}:{case}")
        ok, result = True, {"work_wall_s": 1.0, "work_cpu_s": 1.0, "records": 1000}
        if case == "recordprep":
            result["shards"] = {"train": 3, "eval": 1}
        elif case == "convert":
            assert kw["python"] == str(tft.venv_python())
            assert argv[argv.index("--shards") + 1:argv.index("--shards") + 3] == ["3", "1"]
            ok = tft_convert_ok
            n = sum(c.startswith("bench.tft_worker:convert") for c in calls) - 1
            if n < len(tft_written):
                result = result | {"records": tft_written[n], "work_wall_s": tft_written[n] / 1000}
        elif case in ("layer", "recordprep-layer"):
            result = _layer(100_000, 2.0) | {"work_wall_s": 1.0, "work_cpu_s": 1.0, "records": 1024}
            if case == "recordprep-layer" and layer_unavailable:
                result = {"unavailable": "not available yet: no layer"}
        return measure.Measurement(ok=ok, result=result, wall_s=1.0, cpu_s=1.0, peak_rss_mb=100.0, samples=1,
                                   error=None if ok else "exit code 1")

    monkeypatch.setattr(measure, "run_child", run_child)
    monkeypatch.setattr(tft, "ensure_venv", lambda log: {"versions": {}, "built": "x", "install_seconds": 1.0})
    monkeypatch.setattr(tft, "_workers_for", lambda avro: 1)
    return calls


_MANIFEST = {"records": 1000, "avro": {"files": [{"path": "avro/part-00000.avro"}]}, "json": {"files": [{"path": "json/part-00000.jsonl"}]}}


def test_run_table_interleaves_and_repeats_every_row_but_tf_transforms_conversion(monkeypatch, tmp_path):
    calls = _fake_measurements(monkeypatch)
    out = tft.run_table("small", _MANIFEST, log=lambda _: None, log_dir=tmp_path, out_root=tmp_path, target_repeats=3)
    rp, tc, tl, rl = ("bench.convert_bench:recordprep", "bench.tft_worker:convert", "bench.tft_worker:layer",
                      "bench.tft:recordprep-layer")
    assert calls == [rp, tc, tl, rl, rp, tl, rl, rp, tl, rl]
    assert {k: r["runs"] for k, r in out["rows"].items()} == {
        "recordprep_convert": 3, "tft_convert": 1, "tft_layer": 3, "recordprep_layer": 3}
    assert all(r["ok"] for r in out["rows"].values())


def test_tf_transforms_conversion_repeats_interleaved_with_recordpreps_when_asked(monkeypatch, tmp_path):
    calls = _fake_measurements(monkeypatch)
    out = tft.run_table("small", _MANIFEST, log=lambda _: None, log_dir=tmp_path, out_root=tmp_path, target_repeats=2,
                        tft_convert_repeats=3)
    rp, tc, tl, rl = ("bench.convert_bench:recordprep", "bench.tft_worker:convert", "bench.tft_worker:layer",
                      "bench.tft:recordprep-layer")
    assert calls == [rp, tc, tl, rl, rp, tc, tl, rl, tc]
    assert {k: r["runs"] for k, r in out["rows"].items()} == {
        "recordprep_convert": 2, "tft_convert": 3, "tft_layer": 2, "recordprep_layer": 2}


def test_run_table_when_recordprep_has_no_layer_or_tf_transform_fails(monkeypatch, tmp_path):
    calls = _fake_measurements(monkeypatch, tft_convert_ok=False, layer_unavailable=True)
    out = tft.run_table("small", _MANIFEST, log=lambda _: None, log_dir=tmp_path, out_root=tmp_path, target_repeats=2)
    assert calls.count("bench.tft:recordprep-layer") == 1 and "bench.tft_worker:layer" not in calls
    rows = out["rows"]
    assert rows["recordprep_layer"]["unavailable"] and "not available yet" in rows["recordprep_layer"]["error"]
    assert not rows["tft_convert"]["ok"] and "transform_fn" in rows["tft_layer"]["error"]


def test_the_recordprep_layer_row_carries_the_median_export_overhead():
    def run(overhead: float | None) -> dict:
        result = {"batch_median_ms": 3.0, "batch_records_per_s": 1e5, "single_median_ms": 1.0,
                  "single_p90_ms": 1.2, "batch": 1024, "batch_calls": 9, "single_calls": 9, "outputs": 26}
        if overhead is not None:
            result |= {"model_batch_ms": 1.0, "export_batch_ms": 1.0 + overhead, "export_overhead": overhead}
        return {"ok": True, "peak_rss_mb": 600.0, "result": result}

    row = tft._layer_row("recordprep", [run(2.0), run(3.0), run(4.0)])
    assert (row["export_overhead"], row["export_batch_ms"], row["model_batch_ms"]) == (3.0, 4.0, 1.0)
    assert "export_overhead" not in tft._layer_row("TF Transform", [run(None), run(None)])


def test_a_tf_transform_conversion_that_loses_records_is_left_out_of_the_medians(monkeypatch, tmp_path):
    """A peer run that wrote fewer records than the input did not do the same job: it is
    marked failed, says how many it wrote, and its rate is not in the row's median."""
    _fake_measurements(monkeypatch, tft_written=(1000, 990))
    logged: list[str] = []
    out = tft.run_table("small", _MANIFEST, log=logged.append, log_dir=tmp_path, out_root=tmp_path, target_repeats=2,
                        tft_convert_repeats=2)
    row = out["rows"]["tft_convert"]
    assert row["ok"] and row["runs"] == 2 and row["records"] == 1000
    lossy = [r for r in row["raw"] if not r["ok"]]
    assert len(lossy) == 1 and "wrote 990 of the 1,000 input records" in lossy[0]["error"]
    assert row["work_wall_s"] == 1.0  # the whole run's only: with the lossy one's 0.99 s the median is 0.995
    assert any("DISCARDED" in line for line in logged)
