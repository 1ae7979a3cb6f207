"""convert.config against hostile and careless configs: every problem is a short
``ConfigError`` (exit 2 from the CLI) found before any work starts, in bounded
memory and time; nothing a config names escapes the output directory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from _config_strategies import config_target, hostile_configs
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from convert.config import (
    F32_MAX,
    MAX_BUCKETIZE_BUCKETS,
    MAX_CONFIG_BYTES,
    MAX_HASH_BUCKETS,
    MAX_MIN_FREQUENCY,
    MAX_OOV_BUCKETS,
    MAX_TOP_K,
    ConfigError,
    load_config,
    parse_config,
)
from convert.spec import MAX_FEATURE_SIZE
from pipelines.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

#: Address space for the CLI in a child process: enough for Beam's imports, far
#: below what an expanded billion laughs (gigabytes) needs.
CHILD_MEMORY = 1 << 30


def _bomb(where: str, levels: int = 9) -> str:
    """A ~1 KB YAML whose ``where`` value expands to 10**levels strings."""
    text = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, levels))
    return text + f"features:\n  - {{name: x, transform: identity, {where}: *a{levels - 1}}}\n"


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"x": 1, "c": "a"}\n{"x": 2, "c": "b"}\n')
    return p


def _write(tmp_path: Path, text: str | bytes, name: str = "cfg.yaml") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode() if isinstance(text, str) else text)
    return p


def _cli(data: Path, cfg: Path, out: Path, *extra: str):
    return runner.invoke(app, ["convert", "-i", str(data), "-c", str(cfg), "-o", str(out), *extra])


def _feature_error(feature: dict) -> str:
    with pytest.raises(ConfigError) as ei:
        parse_config({"features": [feature]}, source="cfg.yaml")
    return str(ei.value)


# ------------------------------------------------------ memory: alias bombs


@pytest.mark.parametrize("where", ["transform", "source"])
def test_billion_laughs_fails_fast_with_exit_2_in_bounded_memory(tmp_path, data, where):
    cfg = _write(tmp_path, _bomb(where))
    assert cfg.stat().st_size < 1500

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    p = subprocess.run([str(ROOT / ".venv" / "bin" / "recordprep"), "convert", "-i", str(data), "-c", str(cfg),
                        "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, preexec_fn=limit, cwd=tmp_path)
    assert p.returncode == 2, p.stderr[-2000:]
    assert str(cfg) in p.stderr and "expands to more than" in p.stderr and "alias" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr) < 2000
    assert not (tmp_path / "out").exists()


def test_error_messages_quote_values_cut_short():
    """A value shared a billion times (as YAML aliases build it) or a huge string is quoted in a few lines."""
    lol = ["lol"] * 10
    for _ in range(8):
        lol = [lol] * 10
    for feature in ({"name": "x", "transform": lol}, {"name": "x", "transform": "identity", "source": lol},
                    {"name": "x", "transform": "z" * 500_000}, {"name": "x", "transform": "identity", "fill": 10**5000},
                    {"name": "x", "transform": "identity", **{f"k{i}": 1 for i in range(10_000)}}):
        msg = _feature_error(feature)
        assert "feature 'x'" in msg and len(msg) < 1000, msg[:3000]


@pytest.mark.parametrize("text, words", [
    ("a: &a [*a]\nfeatures: []\n", ["line 1", "alias *a", "recursive"]),
    ("features:\n  - {name: x, transform: identity, fill: 1" + ":1" * 300_000 + "}\n", ["line 2", "number", "100"]),
    ("features:\n  - {name: x, transform: identity, fill: " + "9" * 5000 + "}\n", ["line 2", "number"]),
])
def test_yaml_constructs_a_config_never_needs_are_refused(tmp_path, text, words):
    with pytest.raises(ConfigError) as ei:
        load_config(_write(tmp_path, text))
    for w in words:
        assert w in str(ei.value), str(ei.value)


def test_config_file_size_is_bounded(tmp_path):
    big = _write(tmp_path, "features:\n  - {name: x, transform: identity}\n" + "#" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match=r"larger than 1,048,576 bytes"):
        load_config(big)
    ok = _write(tmp_path, "features:\n  - {name: x, transform: identity}\n" + "#" * 100_000, "ok.yaml")
    assert load_config(ok).features[0].name == "x"


# ------------------------------------------------------------- duplicate keys


def test_duplicate_yaml_keys_name_the_key_and_lines(tmp_path):
    cfg = _write(tmp_path, "features:\n  - name: x\n    transform: zscore\n    transform: vocabulary\n")
    with pytest.raises(ConfigError, match=r"cfg\.yaml: line 4: duplicate key 'transform' \(first at line 3\)"):
        load_config(cfg)
    top = _write(tmp_path, "features: []\nfeatures:\n  - {name: x, transform: identity}\n", "top.yaml")
    with pytest.raises(ConfigError, match="duplicate key 'features'"):
        load_config(top)


def test_duplicate_json_keys_name_the_key(tmp_path):
    cfg = _write(tmp_path, '{"features": [{"name": "x", "transform": "zscore", "transform": "vocabulary"}]}', "c.json")
    with pytest.raises(ConfigError, match=r"c\.json: duplicate key 'transform'"):
        load_config(cfg)


def test_yaml_merge_keys_may_still_be_overridden(tmp_path):
    cfg = _write(tmp_path, textwrap.dedent("""
        features:
          - &base {name: a, transform: clip, clip_min: 0, clip_max: 1}
          - {<<: *base, name: b, clip_max: 2}
    """))
    b = load_config(cfg).features[1]
    assert (b.name, b.transform, b.clip_min, b.clip_max) == ("b", "clip", 0.0, 2.0)


# ------------------------------------------- exit 2, not Python's messages


@pytest.mark.parametrize("name, text, words", [
    ("mixed.yaml", "{1: a, features: [{name: x, transform: identity}]}", ["keys must be strings", "1"]),
    ("mixed2.yaml", "features:\n  - {name: x, transform: identity, 7: b}\n", ["features[0]", "keys must be strings"]),
    ("deep.yaml", "[" * 100_000 + "]" * 100_000, ["nested too deeply"]),
    ("deep.json", "[" * 100_000 + "]" * 100_000, ["nested too deeply"]),
    ("latin1.yaml", "features:\n  - {name: caf\xe9, transform: identity}\n".encode("latin-1"),
     ["not UTF-8", "0xe9", "line 2"]),
    ("dup.yaml", "features:\n  - {name: x, name: y, transform: identity}\n", ["duplicate key 'name'"]),
])
def test_malformed_config_exits_2_with_a_config_message(tmp_path, data, name, text, words):
    cfg = _write(tmp_path, text, name)
    r = _cli(data, cfg, tmp_path / "out")
    assert r.exit_code == 2, r.output
    assert f"error: {cfg}:" in r.output and "Traceback" not in r.output
    for w in words:
        assert w in r.output, r.output
    assert len(r.output) < 2000


# ----------------------------------------------------------------- ranges


@pytest.mark.parametrize("feature, key, limit", [
    ({"transform": "vocabulary", "max_len": 1_000_000}, "max_len", MAX_FEATURE_SIZE),
    ({"transform": "identity", "max_len": True}, "max_len", MAX_FEATURE_SIZE),
    ({"transform": "bucketize", "num_buckets": 10**12}, "num_buckets", MAX_BUCKETIZE_BUCKETS),
    ({"transform": "bucketize", "num_buckets": True}, "num_buckets", MAX_BUCKETIZE_BUCKETS),
    ({"transform": "hash", "buckets": 2**63}, "buckets", MAX_HASH_BUCKETS),
    ({"transform": "cross", "sources": ["a", "b"], "buckets": 10**30}, "buckets", MAX_HASH_BUCKETS),
    ({"transform": "vocabulary", "num_oov_buckets": 10**11}, "num_oov_buckets", MAX_OOV_BUCKETS),
    ({"transform": "vocabulary", "top_k": 10**10}, "top_k", MAX_TOP_K),
    ({"transform": "text", "max_len": 4, "min_frequency": 2**63}, "min_frequency", MAX_MIN_FREQUENCY),
])
def test_integer_options_past_their_limit_name_option_and_limit(feature, key, limit):
    msg = _feature_error({"name": "f", **feature})
    assert "feature 'f'" in msg and repr(key) in msg and f"<= {limit:,}" in msg, msg


def test_integer_options_at_their_limit_are_accepted():
    cfg = parse_config({"features": [
        {"name": "a", "transform": "vocabulary", "max_len": MAX_FEATURE_SIZE, "num_oov_buckets": MAX_OOV_BUCKETS,
         "top_k": MAX_TOP_K, "min_frequency": MAX_MIN_FREQUENCY},
        {"name": "b", "transform": "bucketize", "num_buckets": MAX_BUCKETIZE_BUCKETS},
        {"name": "c", "transform": "hash", "buckets": MAX_HASH_BUCKETS},
    ]})
    assert [f.name for f in cfg.features] == ["a", "b", "c"]


def test_huge_num_oov_buckets_exits_2_before_any_output(tmp_path, data):
    cfg = _write(tmp_path, "features:\n  - {name: c, transform: vocabulary, num_oov_buckets: 100000000000}\n")
    r = _cli(data, cfg, tmp_path / "out")
    assert r.exit_code == 2 and "'num_oov_buckets'" in r.output and "100,000" in r.output, r.output
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------- float32 constants


@pytest.mark.parametrize("feature, key", [
    ({"transform": "identity", "fill": 1.0e300}, "fill"),
    ({"transform": "identity", "fill": -3.5e38}, "fill"),
    ({"transform": "identity", "fill": 10**39}, "fill"),
    ({"transform": "identity", "fill": 10**400}, "fill"),
    ({"transform": "clip", "clip_min": float("inf"), "clip_max": float("inf")}, "clip_min"),
    ({"transform": "clip", "clip_max": float("-inf")}, "clip_max"),
    ({"transform": "clip", "clip_min": 0, "clip_max": 1e39}, "clip_max"),
    ({"transform": "clip", "clip_min": float("nan")}, "clip_min"),
    ({"transform": "clip", "clip_min": True}, "clip_min"),
])
def test_numeric_constants_must_fit_float32(feature, key):
    msg = _feature_error({"name": "f", **feature})
    assert "feature 'f'" in msg and repr(key) in msg and "float32" in msg, msg


def test_numeric_constants_at_float32_max_are_accepted_and_clip_order_checked():
    f = parse_config({"features": [{"name": "f", "transform": "clip", "clip_min": -F32_MAX, "clip_max": F32_MAX,
                                    "fill": -F32_MAX}]}).features[0]
    assert (f.clip_min, f.clip_max, f.fill) == (-F32_MAX, F32_MAX, -F32_MAX)
    msg = _feature_error({"name": "f", "transform": "clip", "clip_min": 2, "clip_max": 1})
    assert "'clip_min' (2.0) must be <= 'clip_max' (1.0)" in msg


def test_inf_fill_and_clip_in_yaml_exit_2(tmp_path, data):
    for text in ("features:\n  - {name: x, transform: identity, fill: 1.0e+300}\n",
                 "features:\n  - {name: x, transform: clip, clip_min: .inf, clip_max: .inf}\n"):
        r = _cli(data, _write(tmp_path, text), tmp_path / "out")
        assert r.exit_code == 2 and "float32" in r.output and "feature 'x'" in r.output, r.output


# ----------------------------------------------------- names are file names


@pytest.mark.parametrize("name", ["a/../../../x", "a/..", "a/./b", "a//b", "a/", "x" * 201])
def test_feature_names_that_are_not_safe_file_names_are_rejected(name):
    msg = _feature_error({"name": name, "transform": "vocabulary"})
    assert "features[0]" in msg and "'name'" in msg, msg


def test_label_name_with_dot_dot_component_is_rejected():
    with pytest.raises(ConfigError, match=r"label: 'name' 'y/\.\.'"):
        parse_config({"features": [{"name": "x", "transform": "identity"}], "label": {"source": "y", "name": "y/.."}})


def test_a_name_below_another_names_vocabulary_file_exits_2_naming_both(tmp_path, data):
    cfg = _write(tmp_path, "features:\n  - {name: a, source: c, transform: vocabulary}\n"
                           "  - {name: a.txt/b, source: c, transform: vocabulary}\n")
    r = _cli(data, cfg, tmp_path / "out")
    assert r.exit_code == 2 and "'a'" in r.output and "'a.txt/b'" in r.output, r.output
    assert "vocab/a.txt" in r.output, r.output
    assert not (tmp_path / "out").exists()


def test_a_feature_below_the_label_vocabulary_file_is_rejected():
    with pytest.raises(ConfigError, match=r"'y' and 'y\.txt/z/w' clash"):
        parse_config({"features": [{"name": "y.txt/z/w", "source": "c", "transform": "hash", "buckets": 8}],
                      "label": {"source": "y", "transform": "vocabulary"}})


def test_names_sharing_a_directory_still_load():
    cfg = parse_config({"features": [{"name": "a/b", "source": "c", "transform": "vocabulary"},
                                     {"name": "a/c.txt", "source": "c", "transform": "vocabulary"},
                                     {"name": "a.txt", "source": "c", "transform": "vocabulary"}]})
    assert [f.name for f in cfg.features] == ["a/b", "a/c.txt", "a.txt"]


def test_names_with_plain_path_components_still_load():
    cfg = parse_config({"features": [{"name": "user/country.code", "source": "c", "transform": "vocabulary"}]})
    assert cfg.features[0].name == "user/country.code"


def test_escaping_feature_name_exits_2_and_writes_nothing(tmp_path, data):
    work = tmp_path / "work"
    work.mkdir()
    cfg = _write(tmp_path, "features:\n  - {name: a/../../../x, source: c, transform: vocabulary}\n")
    r = _cli(data, cfg, work / "out")
    assert r.exit_code == 2 and "'a/../../../x'" in r.output and "'..'" in r.output, r.output
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml", "d.jsonl", "work"] and os.listdir(work) == []


# ---------------------------------------------------------------- property


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(hostile_configs())
def test_hostile_configs_load_or_raise_config_error(case):
    """The ``config`` target of tests/fuzz_records.py, a few examples in the normal suite."""
    config_target(case)


@pytest.mark.slow
def test_fuzz_driver_runs_the_config_target():
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzz_records.py"), "--seconds", "1",
                        "--examples-per-round", "30", "--seed", "3", "--target", "config"],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ok   config      round 0: 30 examples" in p.stdout and "no failure" in p.stdout, p.stdout
