"""The feature config: what to do with each input field.

A config is a YAML (safe-loaded) or JSON file::

    label: {source: label, dtype: int64}   # or {source: gender, transform: vocabulary}
    features:
      - {name: age, transform: zscore}
      - {name: country, source: user.country, transform: vocabulary, top_k: 1000}
      - {name: tags, transform: vocabulary, max_len: 8}
      - {name: title, transform: text, max_len: 16}
      - {name: user, source: user_id, transform: hash, buckets: 4096}

Everything is validated here, before any pipeline starts, so a typo fails in
a second with a message naming the feature and what is allowed, not an hour
into a Dataflow job. One ConfigError lists every problem of a config (near
misses get a "did you mean"), so it is fixed in one round; ``TRANSFORM_TABLE``
says which options each transform takes, and any other is an error.

This module loads a config file (YAML safely, JSON) and is where the config's
public names are imported from; the concepts live beside it:
``convert.config_model`` (limits, transform table, ``Config`` and its parts),
``convert.config_checks`` (``parse_config``: every problem of a raw config)
and ``convert.paths`` (the ``source`` path grammar).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from convert.config_checks import MAX_PROBLEMS, parse_config, show_value
from convert.config_model import (
    COMMON_OPTIONS,
    DRIFT_MEASURES,
    F32_MAX,
    LABEL_DTYPES,
    MAX_BUCKETIZE_BUCKETS,
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_CONFIG_NODES,
    MAX_HASH_BUCKETS,
    MAX_MIN_FREQUENCY,
    MAX_NAME_CHARS,
    MAX_NUMBER_CHARS,
    MAX_OOV_BUCKETS,
    MAX_TOP_K,
    NAN_POLICIES,
    NUMERIC_TRANSFORMS,
    TIMESTAMP_PARTS,
    TIMESTAMP_UNITS,
    TRANSFORM_TABLE,
    TRANSFORMS,
    Config,
    ConfigError,
    FeatureConfig,
    LabelConfig,
    TransformInfo,
)
from convert.paths import (
    EACH,
    ENTRIES,
    KEYS,
    PathError,
    Step,
    count_path,
    is_list_step,
    is_multi_path,
    one_value_path,
    parse_path,
    render_path,
)

__all__ = [
    "COMMON_OPTIONS",
    "Config",
    "ConfigError",
    "DRIFT_MEASURES",
    "EACH",
    "ENTRIES",
    "F32_MAX",
    "FeatureConfig",
    "KEYS",
    "LABEL_DTYPES",
    "LabelConfig",
    "MAX_BUCKETIZE_BUCKETS",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "MAX_HASH_BUCKETS",
    "MAX_MIN_FREQUENCY",
    "MAX_NAME_CHARS",
    "MAX_NUMBER_CHARS",
    "MAX_OOV_BUCKETS",
    "MAX_PROBLEMS",
    "MAX_TOP_K",
    "NAN_POLICIES",
    "NUMERIC_TRANSFORMS",
    "PathError",
    "Step",
    "TIMESTAMP_PARTS",
    "TIMESTAMP_UNITS",
    "TRANSFORMS",
    "TRANSFORM_TABLE",
    "TransformInfo",
    "count_path",
    "is_list_step",
    "is_multi_path",
    "load_config",
    "one_value_path",
    "parse_config",
    "parse_path",
    "render_path",
]


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses what a config never needs and an
    attacker would use: alias expansion past ``MAX_CONFIG_NODES`` nodes (a
    kilobyte "billion laughs" expands to gigabytes once anything walks it),
    recursive aliases, nesting past ``MAX_CONFIG_DEPTH``, numbers longer than
    ``MAX_NUMBER_CHARS`` and duplicate keys (YAML keeps the last silently)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0  # nodes composed so far, an alias counting as its anchor's expansion
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, once composed
        self._checked: set[int] = set()

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_CONFIG_NODES:
            raise ConfigError(f"line {mark.line + 1}: the document expands to more than {MAX_CONFIG_NODES:,} nodes "
                              f"(YAML aliases repeating aliases?); write the config out without them")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            target = self.anchors.get(event.anchor)
            if target is not None:
                if id(target) not in self._sizes:
                    raise ConfigError(f"line {event.start_mark.line + 1}: alias *{event.anchor} refers to a node "
                                      f"that contains it (a recursive structure); a config is a tree")
                self._count(self._sizes[id(target)], event.start_mark)
            return super().compose_node(parent, index)
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_CONFIG_DEPTH:
            raise ConfigError(f"line {mark.line + 1}: nested too deeply (more than {MAX_CONFIG_DEPTH} levels)")
        start = self._nodes
        self._count(1, mark)
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = self._nodes - start
        return node

    def flatten_mapping(self, node: Any) -> None:
        # Check a mapping's own keys before merge keys (``<<: *base``) add the
        # base's pairs, which the mapping's own keys legitimately override.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in seen:
                    raise ConfigError(f"line {line}: duplicate key {show_value(key)} (first at line {seen[key]}); "
                                      f"each key may appear once in a mapping")
                seen[key] = line
        super().flatten_mapping(node)

    def _number(self, node: Any) -> None:
        if len(node.value) > MAX_NUMBER_CHARS:
            raise ConfigError(f"line {node.start_mark.line + 1}: a number of {len(node.value):,} characters; "
                              f"numbers in a config have at most {MAX_NUMBER_CHARS}")

    def construct_yaml_int(self, node: Any) -> int:
        self._number(node)
        return super().construct_yaml_int(node)

    def construct_yaml_float(self, node: Any) -> float:
        self._number(node)
        return super().construct_yaml_float(node)


_ConfigLoader.add_constructor("tag:yaml.org,2002:int", _ConfigLoader.construct_yaml_int)
_ConfigLoader.add_constructor("tag:yaml.org,2002:float", _ConfigLoader.construct_yaml_float)


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError(f"duplicate key {show_value(k)} in a JSON object; each key may appear once")
        out[k] = v
    return out


def _parse_text(text: str, is_json: bool) -> Any:
    """The document in ``text``; ConfigError (without the file name) for anything wrong."""
    try:
        if is_json:
            return json.loads(text, object_pairs_hook=_json_object)
        loader = _ConfigLoader(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except RecursionError:
        raise ConfigError("nested too deeply") from None
    except (ValueError, yaml.YAMLError) as e:  # ValueError: also ints past Python's 4300-digit limit
        if isinstance(e, ConfigError):
            raise
        msg = str(e)  # parser messages quote the offending text: cut a long one
        msg = msg if len(msg) <= 2000 else msg[:2000] + " ..."
        raise ConfigError(f"not valid {'JSON' if is_json else 'YAML'}: {msg}") from e


def load_config(path: str | Path) -> Config:
    """Load and validate a YAML or JSON config file (``.json`` is JSON, anything else YAML).

    Raises ConfigError, naming the file, for every problem: unreadable, larger
    than ``MAX_CONFIG_BYTES``, not UTF-8, not valid YAML/JSON, duplicate keys,
    alias bombs or nesting past the limits above, and any invalid entry.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from e
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{p}: larger than {MAX_CONFIG_BYTES:,} bytes; a feature config is a few KB (is this the right file?)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"{p}: not UTF-8 text (invalid byte {data[e.start]:#04x} at line {line}); save the config as UTF-8") from None
    if not text.strip():  # e.g. `recordprep infer ... > features.yaml` after infer failed
        raise ConfigError(f"{p}: the config file is empty; write one (docs/feature-config.md) or draft it with "
                          f"`recordprep infer -i DATA > {p.name}` and check that infer succeeded")
    try:
        raw = _parse_text(text, p.suffix == ".json")
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None
    return parse_config(raw, source=str(p))
