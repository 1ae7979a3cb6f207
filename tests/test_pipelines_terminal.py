"""``pipelines.cli.terminal``: data printed to a terminal shows its control characters and rich markup as text."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from pipelines.cli.terminal import markup, text, visible


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b]0;PWNED\x1b\\", "\\x1b]0;PWNED\\x1b\\"),  # OSC title
    ("\x1b]52;c;UFdORUQ=\x07", "\\x1b]52;c;UFdORUQ=\\x07"),  # OSC 52 clipboard write
    ("a\x00b\x7fc\x9bd", "a\\x00b\\x7fc\\x9bd"),  # NUL, DEL, C1 CSI
    ("x\ry\nz\tw", "x\\ry\\nz\\tw"),
    ("\u202eevil\u2066\u200f\ufeff", "\\u202eevil\\u2066\\u200f\\ufeff"),  # bidi override, isolate, mark; BOM
    ("plain é 字 [b]", "plain é 字 [b]"),
])
def test_visible_shows_every_control_character(raw, shown):
    assert visible(raw) == shown


def test_a_message_keeps_its_own_lines():
    assert visible("one\n  two\tthree\r\x1b", lines=True) == "one\n  two\tthree\\r\\x1b"


@pytest.mark.parametrize("raw", ["[/]", "[bold red]R", "[link=http://x]L", "a\\", "[/bold]\x1b[31m"])
def test_text_and_markup_print_literally_through_rich(raw):
    for shown in (text(raw), f"[bold]{markup(raw)}[/bold]"):
        buf = io.StringIO()
        Console(file=buf, width=200, force_terminal=True, color_system="truecolor", highlight=False).print(shown)
        out = buf.getvalue()
        assert "\x1b" not in out.replace("\x1b[1m", "").replace("\x1b[0m", ""), out  # only our own bold
        assert out.replace("\x1b[1m", "").replace("\x1b[0m", "").rstrip("\n") == visible(raw)


def test_cli_log_lines_show_control_characters():
    from pipelines.cli.base import _VisibleFormatter

    rec = logging.LogRecord("recordprep", logging.WARNING, __file__, 1, "could not remove %s", ("o-\x1b]0;PWNED\x07",), None)
    assert _VisibleFormatter("%(levelname)s %(message)s").format(rec) == "WARNING could not remove o-\\x1b]0;PWNED\\x07"
