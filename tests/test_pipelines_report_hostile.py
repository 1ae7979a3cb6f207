"""Data that holds markup or terminal escapes is shown as text, never acted on: the HTML
report in a real headless Chromium, the terminal report and the CLI's messages."""

from __future__ import annotations

import asyncio
import json

import pytest
from _browser import _chromium, _Page, devtools_page
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()

PWN = "document.title='PWNED'"
#: What would run script or break the page if the HTML report pasted it in raw.
HTML_PAYLOADS = ["{{data}}", "{{body}}", f"</script><script>{PWN}</script>", f"<img src=x onerror={PWN}>",
                 "<!--<script>", f"\"' onmouseover=\"{PWN}\" x='"]
#: What a terminal would act on (retitle, clipboard write, reorder) or rich would parse as markup.
OSC_TITLE, OSC_CLIPBOARD = "\x1b]0;PWNED\x1b\\", "\x1b]52;c;UFdORUQ=\x07"
TERMINAL_PAYLOADS = ["[/]", OSC_CLIPBOARD, "[bold red]R", "[link=http://x]L", OSC_TITLE, "\u202eevil"]
#: A field name with both kinds (a feature reads it with a quoted path).
FIELD = f"f<img src=x onerror={PWN}>{{{{data}}}}<!--<script>[bold red]F[link=http://x]L\x1b]0;PWNED\x07"
FILE_HTML = f"d-{{{{data}}}}-{{{{body}}}}-<img src=x onerror={PWN}>-<!--<script>-\"q'.jsonl"
FILE_TERMINAL = f"e-{OSC_TITLE}-{OSC_CLIPBOARD}-[bold red]B-[link=x]L.jsonl"
#: The output path: '/' in a payload makes directories.
OUTPUT_PARTS = ("o-{{data}}-{{body}}-<img src=x onerror=" + PWN + ">-<!--<script>-<",
                "script><script>" + PWN + "<", "script>-" + OSC_TITLE)
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def _records() -> list[dict]:
    """The terminal payloads most frequent (the terminal shows each split's top 3 terms)."""
    weights = [60, 45, 30] + [8] * (len(TERMINAL_PAYLOADS) - 3 + len(HTML_PAYLOADS))
    terms = TERMINAL_PAYLOADS + HTML_PAYLOADS
    picked = [t for t, w in zip(terms, weights, strict=True) for _ in range(w)]
    return [{"term": t, FIELD: t, "x": float(i), "y": i % 2} for i, t in enumerate(picked)]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hostile")
    inp = root / "in"
    inp.mkdir()
    recs = _records()
    with open(inp / FILE_HTML, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs[::2])
        f.write(json.dumps({"term": "ok", FIELD: {"nested": HTML_PAYLOADS[2]}, "x": 1.0, "y": 1}) + "\n")
        f.write(json.dumps({"term": "ok", FIELD: "a", "x": 1.0, "y": f"{{{{data}}}}<img src=x onerror={PWN}>"}) + "\n")
    with open(inp / FILE_TERMINAL, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs[1::2])
        f.write(f'{{"term": "</script><script>{PWN}</script> {{{{data}}}} [/] {OSC_TITLE}"\n')  # malformed
    cfg = root / "features.json"
    cfg.write_text(json.dumps({"label": {"source": "y", "dtype": "int64"}, "features": [
        {"name": "term", "transform": "vocabulary"},
        {"name": "hostile", "source": f"[{json.dumps(FIELD)}]", "transform": "vocabulary"},
        {"name": "x", "transform": "zscore"}]}))
    out = root.joinpath(*OUTPUT_PARTS)
    r = runner.invoke(app, ["convert", "--no-progress", "-i", str(inp), "-c", str(cfg), "-o", str(out),
                            "--max-errors", "10"])
    assert r.exit_code == 0, r.output
    return {"root": root, "out": out, "convert_output": r.output}


def _shown_safely(text: str) -> None:
    """No character a terminal acts on; the escapes shown as text."""
    bad = [c for c in RAW if c in text]
    assert not bad, (bad, text)


# ------------------------------------------------------------------ HTML


@pytest.mark.slow
def test_html_report_payloads_are_text_in_chromium(hostile, tmp_path):
    chromium = _chromium()
    out = hostile["out"]
    page_path = tmp_path / "report.html"
    r = runner.invoke(app, ["report", str(out), "--html", str(page_path)])
    assert r.exit_code == 0, r.output
    with devtools_page(chromium, tmp_path / "profile") as ws_url:
        checks = asyncio.run(_look(ws_url, page_path.as_uri()))
    assert checks["title"] != "PWNED", "a payload in the data ran script"
    assert checks["title"] == f"recordprep report: {out}".replace("\x1b", "\\x1b")  # no payload retitled the page
    assert checks["injected"] == {"img": 0, "script": 2, "handlers": 0, "comments": 0}
    assert checks["filled"] == str(out)  # the page's own script ran and read its JSON
    text = checks["text"]
    # The statistics keep a rejected record and its reason shortened ("..." in the middle).
    shown = [*HTML_PAYLOADS, FILE_HTML, str(out).replace("\x1b", "\\x1b"),
             f"\"{{{{data}}}}<img src=x onerror={PWN}>\"}}",  # a rejected record
             "'{\"term\": \"</script><script>document.t", "ript> {{data}} [/] ",  # a line that is no JSON
             "ists or point 'source' at a leaf field",  # an error reason
             f"f<img src=x onerror={PWN}>{{{{data}}}}<!--<script>[bold red]F"]  # the field name
    assert [s for s in shown if s not in text] == []
    assert checks["sections"] == ["term", "hostile", "x", "y"]
    assert checks["errors"] == [], checks["errors"]


async def _look(ws_url: str, url: str) -> dict:
    import websockets

    async with websockets.connect(ws_url, max_size=None) as ws:
        page = _Page(ws)
        for domain in ("Page", "Runtime", "Log"):
            await page.call(f"{domain}.enable")
        await page.call("Page.navigate", url=url)
        await page.wait_for("Page.loadEventFired")
        await asyncio.sleep(0.3)
        checks = {
            "title": await page.eval("document.title"),
            "filled": await page.eval("(document.getElementById('report-output') || {}).textContent"),
            "injected": await page.eval(
                "({img: document.querySelectorAll('img').length, script: document.querySelectorAll('script').length,"
                " handlers: document.querySelectorAll('[onerror],[onmouseover]').length,"
                " comments: document.createNodeIterator(document, NodeFilter.SHOW_COMMENT).nextNode() ? 1 : 0})"),
            "text": await page.eval("document.body.textContent"),
            "sections": await page.eval(
                "Array.from(document.querySelectorAll('section.feature')).map(s => s.dataset.feature)"),
        }
        checks["errors"] = [e["params"] for e in page.events if e.get("method") == "Runtime.exceptionThrown"
                            or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
        return checks


def test_html_report_fills_each_placeholder_once_and_escapes_its_json(hostile, tmp_path):
    """Without a browser: the page's JSON is the report's, with nothing in it that ends its script."""
    page_path = tmp_path / "report.html"
    r = runner.invoke(app, ["report", str(hostile["out"]), "--html", str(page_path)])
    assert r.exit_code == 0, r.output
    page = page_path.read_text()
    assert page.count('<script type="application/json" id="report-data">') == 1
    raw = page.split('id="report-data">', 1)[1].split("</script>", 1)[0]
    assert not any(c in raw for c in "<>&\u2028\u2029")
    assert json.loads(raw)["output"] == str(hostile["out"])
    assert page.split("</head>")[0].count("<title>") == 1 and "<img" not in page and "<!--" not in page


# -------------------------------------------------------------- terminal


def test_terminal_report_shows_markup_and_escapes_literally(hostile):
    r = runner.invoke(app, ["report", str(hostile["out"])])
    assert r.exit_code == 0 and r.exception is None, r.output
    out = r.output
    _shown_safely(out)
    assert "MarkupError" not in out
    for text in ("[/]", "[bold", "red]R", "[link=http://x]L", "\\x1b]52;c;UFdORUQ=\\x07",  # terms
                 "red]B", "[link=x]L", "\\x1b]0;PWNED\\x1b",  # the file name
                 "red]F[link=http://x]L"):  # the field name (a rejection's field)
        assert text in out, text


def test_cli_messages_show_escapes(hostile, tmp_path):
    out = hostile["out"]
    _shown_safely(hostile["convert_output"])  # convert's summary names the output
    assert "\\x1b]0;PWNED\\x1b\\" in hostile["convert_output"]
    runs = {"inspect": runner.invoke(app, ["inspect", str(out), "-n", "1"]),
            "verify": runner.invoke(app, ["verify", str(out)]),
            "wait": runner.invoke(app, ["wait", str(out), "--timeout", "0"]),
            "report --json": runner.invoke(app, ["report", str(out), "--json", str(tmp_path / f"r-{OSC_TITLE}.json")]),
            "wait, failing": runner.invoke(app, ["wait", str(out / OSC_CLIPBOARD), "--timeout", "0", "--poll", "0.01"])}
    for what, r in runs.items():
        _shown_safely(r.output)
        assert "\\x1b]" in r.output, (what, r.output)
    assert runs["wait, failing"].exit_code == 1 and "\\x1b]52;c;UFdORUQ=\\x07" in runs["wait, failing"].output


def test_all_rejected_names_the_fields_with_escapes_shown(tmp_path):
    """convert's "all N records were rejected ... the records' fields are: ..." quotes field names from the data."""
    data = tmp_path / "d.jsonl"
    fields = [OSC_TITLE, OSC_CLIPBOARD, "[bold red]B", "[/]", "\u202eevil"]
    data.write_text("".join(json.dumps({**{f: i for f in fields}, "y": f"n{i}"}) + "\n" for i in range(5)))
    cfg = tmp_path / "features.json"
    cfg.write_text(json.dumps({"label": {"source": "y", "dtype": "int64"},
                               "features": [{"name": "a", "source": f"[{json.dumps(OSC_TITLE)}]", "transform": "zscore"}]}))
    r = runner.invoke(app, ["convert", "--no-progress", "-i", str(data), "-c", str(cfg), "-o", str(tmp_path / "o")])
    assert r.exit_code != 0 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    _shown_safely(r.output)
    assert "fields are" in r.output and "\\x1b]0;PWNED\\x1b" in r.output and "[bold red]B" in r.output, r.output
    assert "\\u202eevil" in r.output


def test_html_attributes_hold_a_hostile_feature_name_as_its_value(hostile):
    """Feature names reach attributes (``data-feature``, ``id``, ``href``); a config only takes plain
    names, so the report is given one directly: each attribute parses back to the name, nothing more."""
    from html.parser import HTMLParser

    from pipelines.cli.report import build_report, render_html

    rep = build_report(str(hostile["out"]))
    name = "\"' onmouseover=\"document.title='PWNED'\" zz='<!--<script>{{data}}"
    rep["features"] = {name: rep["features"]["term"]}
    attrs: list[dict] = []

    class Attrs(HTMLParser):
        def handle_starttag(self, tag, a):
            attrs.append(dict(a))

    Attrs().feed(render_html(rep))
    assert not [a for a in attrs if "onmouseover" in a or "zz" in a]
    assert [a["data-feature"] for a in attrs if "data-feature" in a] == [name, name]  # the table row and the section
    assert f"#feature-{name}" in [a.get("href") for a in attrs] and f"feature-{name}" in [a.get("id") for a in attrs]


def test_html_escapes_numbers_that_a_damaged_output_holds_as_text(hostile):
    """The metadata's params and the statistics' counts are data too: a string where a number belongs is text."""
    from pipelines.cli.report import build_report, render_html

    rep = build_report(str(hostile["out"]))
    rep["features"]["term"]["params"]["vocab_size"] = f"<img src=x onerror={PWN}>"
    rep["rejections"]["count"] = f"<img src=x onerror={PWN}>"
    page = render_html(rep)
    assert "<img" not in page and page.count(f"&lt;img src=x onerror={PWN.replace(chr(39), '&#x27;')}&gt;") >= 2


def test_terminal_prints_numbers_that_a_damaged_output_holds_as_text(hostile):
    import io

    from rich.console import Console

    from pipelines.cli.report import build_report, render_terminal

    rep = build_report(str(hostile["out"]))
    rep["files"][0]["read"] = f"[/]{OSC_TITLE}"
    rep["rejections"]["count"] = "[bold red]many"
    buf = io.StringIO()
    render_terminal(rep, Console(file=buf, width=200))
    _shown_safely(buf.getvalue())
    assert "[/]\\x1b]0;PWNED" in buf.getvalue() and "rejected records: [bold red]many" in buf.getvalue()
