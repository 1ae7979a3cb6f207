"""`recordprep report`: terminal summary, JSON and a self-contained HTML page opened in a real headless Chromium."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path

import fastavro
import pytest
from _browser import _chromium, _Page, devtools_page
from _pipelines_data import make_records, write_dataset
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
#: Where the HTML test keeps its screenshot (besides the pytest tmp dir).
ARTIFACTS = ROOT / ".cache" / "artifacts"


def _convert(*args: str) -> None:
    r = runner.invoke(app, ["convert", "--no-progress", *args])
    assert r.exit_code == 0, r.output


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("d"), make_records(200), bad_json_lines=True)


def test_terminal_summary_of_an_output_with_rejected_records(data, tmp_path):
    out = tmp_path / "o"
    _convert("-i", str(data["json"]), "-c", str(data["config"]), "-o", str(out), "--max-errors", "2")
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 0, r.output
    for text in ("splits", "features", "rejected records: 2", "input files", "part-1.jsonl", "skew: train -> eval"):
        assert text in r.output
    r = runner.invoke(app, ["report", str(out), "--json", str(tmp_path / "r.json")])
    rep = json.loads((tmp_path / "r.json").read_text())
    assert {g["field"] for g in rep["rejections"]["groups"]} == {"y", "<record>"}
    assert all(g["examples"] for g in rep["rejections"]["groups"])
    assert sum(f["rejected"] for f in rep["files"]) == 2


def test_an_empty_split_is_reported_and_not_compared(data, tmp_path):
    out = tmp_path / "o"
    _convert("-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out), "--splits", "train=1,eval=0")
    r = runner.invoke(app, ["report", str(out), "--fail-on-drift", "--json", str(tmp_path / "r.json"),
                            "--html", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["splits"]["eval"]["records"] == 0 and rep["skew"][0]["findings"] == []
    page = (tmp_path / "r.html").read_text()
    assert 'id="feature-color"' in page
    assert "<code>x_missing</code> is 1 on the missing rows: train " in page  # x has missing_indicator


def test_a_packed_output_has_the_statistics_of_the_default_layout(data, tmp_path):
    docs = []
    for layout in ("features", "packed"):
        out = tmp_path / layout
        _convert("-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out), "--layout", layout)
        r = runner.invoke(app, ["report", str(out), "--json", str(tmp_path / f"{layout}.json")])
        assert r.exit_code == 0, r.output
        docs.append(json.loads((tmp_path / f"{layout}.json").read_text()))
    assert docs[1]["layout"] == "packed"
    assert docs[0]["features"] == docs[1]["features"] and docs[0]["splits"].keys() == docs[1]["splits"].keys()


def test_an_output_without_statistics_gets_a_clear_message(data, tmp_path):
    out = tmp_path / "o"
    _convert("-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out))
    meta = json.loads((out / "dataset_info.json").read_text())
    del meta["stats_file"]  # what outputs written before stats.json hold
    (out / "dataset_info.json").write_text(json.dumps(meta))
    (out / "stats.json").unlink()
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 1
    assert "has no statistics (stats.json)" in r.output and "Re-convert" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["report", str(tmp_path / "nothing-here")])
    assert r.exit_code == 1 and "no dataset_info.json" in r.output


def test_a_damaged_stats_file_is_named(data, tmp_path):
    out = tmp_path / "o"
    _convert("-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out))
    (out / "stats.json").write_text("{not json")
    r = runner.invoke(app, ["report", str(out)])
    assert r.exit_code == 1 and "stats.json" in r.output and "re-run the conversion" in r.output


# ------------------------------------------------------------ real Chromium


def _bench_avro(path: Path, n: int = 3000) -> None:
    from bench.make_data import SCHEMA, records

    with open(path, "wb") as f:
        fastavro.writer(f, SCHEMA, records(0, n), codec="deflate")


@pytest.mark.slow
def test_html_report_in_headless_chromium(tmp_path, monkeypatch):
    chromium = _chromium()
    monkeypatch.syspath_prepend(str(ROOT))  # bench.make_data
    _bench_avro(tmp_path / "part-0.avro")
    out = tmp_path / "out"
    config = ROOT / "bench" / "features.yaml"
    _convert("-i", str(tmp_path / "part-0.avro"), "-c", str(config), "-o", str(out))
    page_path = tmp_path / "report.html"
    r = runner.invoke(app, ["report", str(out), "--html", str(page_path)])
    assert r.exit_code == 0, r.output
    names = [f["name"] for f in json.loads((out / "dataset_info.json").read_text())["config"]["features"]]
    assert "drift/skew" in r.output and 'id="gate"' in page_path.read_text()

    with devtools_page(chromium, tmp_path / "profile") as ws_url:
        shot, checks = asyncio.run(_drive(ws_url, page_path.as_uri(), names))
    (tmp_path / "report.png").write_bytes(shot)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "report.png").write_bytes(shot)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 10_000
    assert checks["errors"] == [], checks["errors"]
    assert checks["requests"] == [], checks["requests"]
    assert checks["missing_sections"] == []
    assert checks["chart"]["rects"] > 0 and checks["chart"]["width"] > 100 and checks["chart"]["height"] > 50
    assert checks["rows_before"] == len(names) + 1  # every feature and the label
    assert checks["rows_after"] == 1 and checks["visible"] == ["city"]
    assert checks["sorted"] == [min(names + ["clicked"]), max(names + ["clicked"])]  # a click on a header sorts, again reverses


async def _drive(ws_url: str, url: str, names: list[str]):
    import websockets

    async with websockets.connect(ws_url, max_size=None) as ws:
        page = _Page(ws)
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page.call(f"{domain}.enable")
        await page.call("Page.navigate", url=url)
        await page.wait_for("Page.loadEventFired")
        await asyncio.sleep(0.3)
        checks = {"missing_sections": await page.eval(
            f"{json.dumps(names)}.filter(n => !document.querySelector('section.feature[data-feature=\"' + n + '\"]'))")}
        checks["chart"] = await page.eval(
            "(() => { const s = document.querySelector('section.feature svg.chart'); const b = s.getBoundingClientRect();"
            " return {rects: s.querySelectorAll('rect').length, width: b.width, height: b.height}; })()")
        rows = "document.querySelectorAll('#features-table tbody tr:not(.hidden)')"
        checks["rows_before"] = await page.eval(f"{rows}.length")
        await page.eval("document.getElementById('search').focus()")
        await page.call("Input.insertText", text="city")  # typed, as a user does: fires the input event
        await asyncio.sleep(0.2)
        checks["rows_after"] = await page.eval(f"{rows}.length")
        checks["visible"] = await page.eval(f"Array.from({rows}).map(r => r.dataset.feature)")
        await page.eval("document.getElementById('search').value = ''; document.getElementById('search')"
                        ".dispatchEvent(new Event('input'))")
        first = f"{rows}[0].dataset.feature"
        header = "document.querySelector('#features-table th')"
        checks["sorted"] = [await page.eval(f"{header}.click(), {first}"), await page.eval(f"{header}.click(), {first}")]
        shot = base64.b64decode((await page.call("Page.captureScreenshot", format="png"))["data"])
        ev = page.events
        checks["errors"] = [e["params"] for e in ev if e.get("method") == "Runtime.exceptionThrown"
                            or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
                            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        checks["requests"] = [e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"
                              and not e["params"]["request"]["url"].startswith(("file:", "data:", "about:"))]
        return shot, checks


def test_an_unwritable_html_path_is_named_without_traceback(data, tmp_path):
    out = tmp_path / "o"
    _convert("-i", str(data["avro"]), "-c", str(data["config"]), "-o", str(out))
    r = runner.invoke(app, ["report", str(out), "--html", str(tmp_path / "no" / "such" / "dir" / "r.html")])
    assert r.exit_code == 1 and "cannot write" in r.output and "r.html" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
