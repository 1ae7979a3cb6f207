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
