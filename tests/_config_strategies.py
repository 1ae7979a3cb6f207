"""Hypothesis strategies for hostile feature configs (tests/fuzz_records.py target ``config``,
tests/test_convert_config_hostile.py).

``hostile_configs()`` draws ``(file suffix, bytes)``: structures near a real config
(right keys, wrong or extreme values: huge and non-finite numbers, booleans for
ints, long strings, names with path components) dumped as YAML (shared
sub-structures become anchors and aliases) or JSON, and texts no dumper writes:
alias bombs, deep nesting, duplicate keys, huge numbers, non-UTF-8 bytes and
damaged copies of any of them. ``load_config`` must load each or raise
``ConfigError``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import yaml
from hypothesis import strategies as st

from convert.config import MAX_PROBLEMS, ConfigError, load_config

#: A problem in a config error message quotes values cut short, never a whole document.
CONFIG_MESSAGE_CHARS = 5000

_KEYS = ["name", "source", "transform", "fill", "missing_indicator", "on_nan", "clip_min", "clip_max", "top_k",
         "min_frequency", "num_oov_buckets", "buckets", "max_len", "lowercase", "num_buckets", "unit", "parts",
         "sources", "dtype", "features", "label", "<<"]
_WORDS = ["identity", "zscore", "clip", "bucketize", "vocabulary", "hash", "text", "bytes", "timestamp", "cross",
          "mean", "fill", "keep", "error", "hour", "ms", "int64", "float32", "a/b", "a/../x", "..", "x" * 300]
_NUMBERS = st.one_of(
    st.integers(-5, 70_000), st.integers(), st.sampled_from([2**31, 2**53, 2**63, 10**12, 10**300, -(10**40)]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([3.5e38, -3.5e38, 1e300, 3.4028234663852886e38]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, st.sampled_from(_WORDS), st.text(max_size=30),
                     st.text(min_size=1, max_size=5).map(lambda s: s * 2000))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.one_of(st.sampled_from(_KEYS), _SCALARS), inner, max_size=5)),
    max_leaves=30)
_FEATURE = st.dictionaries(st.sampled_from(_KEYS), st.one_of(st.sampled_from(_WORDS), _VALUES), min_size=1, max_size=8)
_DOCUMENT = st.one_of(
    st.fixed_dictionaries({"features": st.lists(_FEATURE, max_size=4)},
                          optional={"label": _VALUES, "extra": _VALUES}),
    _VALUES,
)


def _yaml(doc) -> str:
    try:
        return yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, ValueError, TypeError):
        return json.dumps(doc, default=str)


@st.composite
def _shared(draw):
    """A document in which one sub-structure appears several times (YAML anchors/aliases)."""
    part = draw(_VALUES)
    doc = draw(_DOCUMENT)
    feats = doc.get("features") if isinstance(doc, dict) else None
    if isinstance(feats, list):
        feats.extend([{"name": "x", "transform": part, "source": part}] * draw(st.integers(1, 4)))
    return _yaml(doc)


def _bomb(levels: int, width: int, where: str) -> str:
    text = "a0: &a0 [lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]\n" for i in range(1, levels))
    return text + f"features:\n  - {{name: x, transform: identity, {where}: *a{levels - 1}}}\n"


_TEXTS = st.one_of(
    st.builds(_bomb, st.integers(1, 12), st.integers(1, 12), st.sampled_from(["transform", "source", "fill", "parts"])),
    st.builds(lambda n, o, c: o * n + c * n, st.integers(1, 100_000), st.sampled_from(["[", "{a: ", "- "]),
              st.sampled_from(["]", "}", ""])),
    st.builds(lambda k, v: f"features:\n  - {{name: x, transform: identity, {k}: {v}, {k}: {v}}}\n",
              st.sampled_from(_KEYS), st.sampled_from(["1", "a", "null"])),
    st.builds(lambda n, d: f"features:\n  - {{name: x, transform: identity, fill: {d * n}}}\n",
              st.integers(1, 20_000), st.sampled_from(["9", "1:", "0x1", "0b1", "1_"])),
    st.builds(_yaml, _DOCUMENT),
    _shared(),
)


@st.composite
def _damaged(draw, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(b)))
        b[i:i] = draw(st.sampled_from([b"\xff", b"\xc3", b"&a ", b"*a ", b"<<: ", b"{", b"[", b"\x00", b"\xed\xa0\x80",  # a UTF-8 encoded surrogate
                                       b"\n  - ", b"!!python/object:os.system "]))
    return bytes(b)


@st.composite
def hostile_configs(draw) -> tuple[str, bytes]:
    """``(suffix, bytes)`` of a config file: ``.yaml`` or ``.json``."""
    if draw(st.booleans()):
        doc = draw(_DOCUMENT)
        suffix = draw(st.sampled_from([".yaml", ".json"]))
        text = json.dumps(doc, default=str) if suffix == ".json" else _yaml(doc)
        data = text.encode("utf-8", "surrogatepass")
    else:
        data = draw(_TEXTS).encode("utf-8", "surrogatepass")
        suffix = draw(st.sampled_from([".yaml", ".yml", ".json"]))
    if draw(st.booleans()):
        data = draw(_damaged(data))
    return suffix, data


def config_target(case: tuple[str, bytes]) -> None:
    """The property: ``load_config`` loads the file or raises a short ``ConfigError`` naming it."""
    suffix, data = case
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            load_config(path)
        except ConfigError as e:
            # Every problem is listed (at most MAX_PROBLEMS), each naming the file, each short.
            assert str(e).startswith(str(path)) and 1 <= len(e.problems) <= MAX_PROBLEMS, str(e)[:300]
            assert all(p.startswith(str(path)) and len(p) < CONFIG_MESSAGE_CHARS for p in e.problems), str(e)[:300]
