"""convert.infer: drafted configs stay within what the config accepts."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from convert.config import load_config
from convert.infer import infer_config, render_yaml
from convert.spec import MAX_FEATURE_SIZE
from pipelines.cli import app

LONG = MAX_FEATURE_SIZE * 4


def _records(n: int = 5) -> list[dict]:
    return [{"nums": list(range(LONG)), "tags": [f"t{i % 7}" for i in range(LONG)],
             "body": " ".join(f"w{i}_{j}" for j in range(LONG)), "short": [1, 2, 3]} for i in range(n)]


def test_suggested_max_len_is_capped_and_the_comment_says_so(tmp_path):
    config, drafts = infer_config(_records())
    by = {d.path: d for d in drafts}
    for path in ("nums", "tags", "body"):
        assert by[path].entry["max_len"] == MAX_FEATURE_SIZE, by[path]
        assert f"capped at the limit {MAX_FEATURE_SIZE}" in by[path].comment and f"{LONG}" in by[path].comment
    assert by["short"].entry["max_len"] == 3 and "capped" not in by["short"].comment
    draft = tmp_path / "draft.yaml"
    draft.write_text(render_yaml(config, drafts))
    assert {f.name: f.max_len for f in load_config(draft).features}["body"] == MAX_FEATURE_SIZE


def test_infer_cli_draft_of_long_lists_loads_back(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _records(3)))
    r = CliRunner().invoke(app, ["infer", "-i", str(data)])
    assert r.exit_code == 0, r.output
    yaml_text = r.stdout
    assert f"max_len: {MAX_FEATURE_SIZE}" in yaml_text and "capped" in yaml_text
    draft = tmp_path / "draft.yaml"
    draft.write_text(yaml_text)
    assert all(f.max_len is None or f.max_len <= MAX_FEATURE_SIZE for f in load_config(draft).features)
