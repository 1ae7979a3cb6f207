"""Text from data or file names made safe for a terminal.

A term, field name, file name or error reason may hold control characters: an
escape sequence can retitle the terminal, write the clipboard (OSC 52) or
hide text; a bidi override reorders what is shown. Printed raw, they act.
``visible`` shows each as a Python-style escape (``\\x1b``, ``\\u202e``)
instead. Through rich, ``text`` makes it a ``Text`` (no markup parsed: ``[bold]``,
``[/]``, ``[link=...]`` stay text) and ``markup`` escapes it for a markup string. Only the CLI prints: library
code returns text and the CLI passes it through here.
"""

from __future__ import annotations

import re

from rich.markup import escape
from rich.text import Text

#: C0 controls, DEL, C1 controls, and the Unicode marks that reorder or hide text
#: (bidi embeddings, overrides, isolates, marks; the zero-width joiners and BOM).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")
#: What a whole multi-line message keeps: its own line breaks and tabs.
_CONTROL_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _show(m: re.Match[str]) -> str:
    ch = m.group()
    if ch in _NAMED:
        return _NAMED[ch]
    c = ord(ch)
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text: object, *, lines: bool = False) -> str:
    """``str(text)`` with every control character shown as an escape; ``lines``
    keeps line feeds and tabs (a message of several lines)."""
    return (_CONTROL_BUT_LINES if lines else _CONTROL).sub(_show, str(text))


def text(value: object) -> Text:
    """``visible(value)`` as a rich ``Text``: printed literally, as a table cell or alone."""
    return Text(visible(value))


def markup(value: object) -> str:
    """``visible(value)`` escaped to sit inside a rich markup string (``f"[bold]{markup(x)}[/bold]"``)."""
    return escape(visible(value))
