"""``recordprep infer``'s draft as text: feature names, YAML scalars that load
back to the same strings, comments that stay on their line.

Field names come from the data and may hold any Unicode (emoji, line breaks,
lone surrogates from JSON's ``\\ud83e``): a source is written ASCII-only with
YAML's escapes, ``\\uXXXX`` below U+10000 and ``\\UXXXXXXXX`` above, so a
character outside the Basic Multilingual Plane is one escape, not a UTF-16
surrogate pair (which YAML reads as two lone surrogates).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from convert.config import TRANSFORM_TABLE

#: Plain (unquoted) YAML scalars the draft writes as they are.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
_RESERVED = frozenset(("true", "false", "null", "yes", "no", "on", "off", "y", "n", "~"))
#: What YAML's reader refuses in a stream (comments included): PyYAML's NON_PRINTABLE, plus line breaks.
_UNPRINTABLE = re.compile("[^\x09\x20-\x7e\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]|[\u2028\u2029]")
#: Derived outputs a feature may add to its name (``<name>_len``, ``<name>_missing``, timestamp parts).
_DERIVED = ("_len", "_missing")


def yaml_string(s: str) -> str:
    """``s`` as a YAML scalar that ``yaml.safe_load`` reads back as ``s``: plain
    when unambiguous, else double-quoted ASCII with escapes."""
    if _PLAIN.fullmatch(s) and s.lower() not in _RESERVED:
        return s
    out = []
    for c in s:
        o = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= o < 0x7f:
            out.append(c)
        elif o <= 0xFFFF:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    return '"' + "".join(out) + '"'


def yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    return yaml_string(str(v))


def comment(text: str) -> str:
    """``text`` on one comment line that YAML reads (field names from the data may
    hold line breaks or characters a YAML stream may not)."""
    return _UNPRINTABLE.sub(lambda m: repr(m.group(0))[1:-1], text)


@dataclasses.dataclass
class Draft:
    """An inferred config entry: ``entry`` is the YAML mapping, ``comment`` why.

    ``role`` is ``"label"`` for the label's draft (``entry`` is then the
    config's ``label`` mapping, or None when the field cannot be a label);
    ``warnings`` are what the user must know before converting with it.
    """

    entry: dict[str, Any] | None
    comment: str
    path: str
    role: str = "feature"
    warnings: list[str] = dataclasses.field(default_factory=list)
    #: What the feature's name is made from, when not ``path`` (a count: ``items_count``).
    path_name: str | None = None
    #: The entry drafted after all when no field of the sample gives a feature (a left-out identifier's hash).
    fallback: dict[str, Any] | None = None


class Names:
    """Feature names for dotted paths, unique with every output name they derive.

    A name is the path with every character outside ``[A-Za-z0-9_]`` turned to
    ``_``; a clash (with a name or a derived ``<name>_len``/``<name>_missing``/
    ``<name>_<part>``) takes the next free ``_2``, ``_3``... Each claim is a
    few set lookups, so a draft of many thousand fields stays linear.
    """

    def __init__(self) -> None:
        self._used: set[str] = set()  # every output name claimed, derived ones included
        self._next: dict[str, int] = {}  # per base: the suffix number to try first

    def claim(self, path: str, parts: tuple[str, ...] = ()) -> str:
        """A free name for ``path``; it and its derived names are taken from now on."""
        path = path.replace("[keys]", ".keys").replace("[]", "")
        base = re.sub(r"[^A-Za-z0-9_]", "_", path.replace(".", "_")).strip("_") or "field"
        if not re.match(r"[A-Za-z_]", base):
            base = f"f_{base}"
        i = self._next.get(base, 1)
        while True:
            name = base if i == 1 else f"{base}_{i}"
            derived = [name, *(name + s for s in _DERIVED), *(f"{name}_{p}" for p in parts)]
            if not any(n in self._used for n in derived):
                break
            i += 1
        self._next[base] = i + 1
        self._used.update(derived)
        return name


def _header() -> list[str]:
    """Every transform, what it does and its options (the config's own table)."""
    width = max(map(len, TRANSFORM_TABLE))
    lines = ["# Drafted by `recordprep infer`: check every entry. Every transform, and its options",
             "# (besides name, source, allow_all_missing; details: docs/feature-config.md):"]
    for t, info in TRANSFORM_TABLE.items():
        opts = f" [{', '.join(info.options)}]" if info.options else ""
        lines.append(f"#   {t:<{width}}  {info.summary}{opts}")
    return lines


def _label_lines(label: Draft | None) -> list[str]:
    """The label's line: its entry, why no entry, or the candidate a draft without ``--label`` names."""
    if label is not None and label.entry is not None:
        body = ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in label.entry.items())
        return [f"label: {{{body}}}  # {comment(label.comment)}"]
    if label is not None:
        return [f"# label: none drafted: {comment(label.comment)}"]
    return ["# label: {source: FIELD, dtype: int64}   # none drafted: name yours here, or rerun with --label FIELD"]


def render_yaml(config: dict[str, Any], drafts: list[Draft], header: str = "") -> str:
    """The draft as commented YAML (loads back with ``load_config``)."""
    lines = [f"# {comment(h)}" for h in header.splitlines()] if header else []
    lines += _header()
    label = next((d for d in drafts if d.role == "label"), None)
    lines += _label_lines(label)
    lines += [f"# warning: {comment(w)}" for w in (label.warnings if label else ())]
    lines.append("features:")
    for d in drafts:
        if d.role == "label":
            continue
        if d.entry is None:
            lines.append(f"  # skipped {comment(d.comment)}")
        else:
            body = ", ".join(f"{k}: {yaml_scalar(v)}" for k, v in d.entry.items())
            lines.append(f"  - {{{body}}}  # {comment(d.comment)}")
        lines += [f"  # warning: {comment(w)}" for w in d.warnings]
    if not config["features"]:
        lines.append("  []  # nothing vectorizable found in the sample")
    return "\n".join(lines) + "\n"
