"""pipelines.options and the shard count: invalid numbers are usage errors (exit 2), never a
run that plans millions of shards."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from convert.spec import MAX_SHARDS
from pipelines.cli import app
from pipelines.options import ConvertOptions, OptionsError
from pipelines.plan import InputError, default_num_shards

runner = CliRunner()


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"x": {i}}}\n' for i in range(100)))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("features:\n  - {name: x, transform: identity}\n")
    return data, cfg


@pytest.mark.parametrize("mb", [float("nan"), float("inf"), 0.0, -1.0])
def test_target_shard_mb_must_be_finite_and_positive(mb):
    with pytest.raises(OptionsError, match="--target-shard-mb must be a finite number > 0"):
        ConvertOptions(inputs=("a",), config="c", output="o", target_shard_mb=mb)


def test_shard_count_past_the_limit_is_an_error_not_clamped():
    assert default_num_shards(1 << 30, 128.0) == 16  # ordinary sizes unchanged
    assert default_num_shards(MAX_SHARDS << 20, 1.0) == MAX_SHARDS
    with pytest.raises(InputError, match=r"--target-shard-mb.*--num-shards"):
        default_num_shards((MAX_SHARDS + 1) << 20, 1.0)
    with pytest.raises(InputError, match=f"more than {MAX_SHARDS:,}"):
        default_num_shards(1000, 5e-324)


@pytest.mark.parametrize("mb, words", [
    ("1e-9", ["--target-shard-mb 1e-09", "--num-shards", f"more than {MAX_SHARDS:,}"]),
    ("nan", ["--target-shard-mb", "finite"]),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_tiny_or_nan_target_shard_mb_exits_2(files, tmp_path, mb, words, dry_run):
    data, cfg = files
    r = runner.invoke(app, ["convert", "-i", str(data), "-c", str(cfg), "-o", str(tmp_path / "out"),
                            "--target-shard-mb", mb, *(["--dry-run"] if dry_run else [])])
    assert r.exit_code == 2, r.output
    for w in words:
        assert w in r.output, r.output
    assert "Traceback" not in r.output and not (tmp_path / "out").exists()


def test_beam_flags_are_read_in_one_place_for_every_form():
    from pipelines import remote, staging
    from pipelines.local import runner
    from pipelines.options import beam_flag

    args = ["--runner", "DataflowRunner", "--hdfs_full_urls", "--environment_type=PROCESS", "--runner=Direct"]
    assert beam_flag(args, "--runner") == "Direct"  # the last one wins, as in Beam
    assert beam_flag(args, "--hdfs_full_urls") == ""  # a switch
    assert beam_flag(args, "--environment_type") == "PROCESS"
    assert beam_flag(args, "--environment") is None and beam_flag(args, "--hdfs_host") is None  # no prefixes
    # the places that read them agree with it
    assert not staging.needs_staging("DataflowRunner", ["--environment_type", "LOOPBACK"])
    assert staging.needs_staging("DataflowRunner", ["--environment_type_extra=LOOPBACK"])
    assert runner.beam_sets_workers(("--direct_num_workers=4",)) and not runner.beam_sets_workers(("--direct_num_workers_x=4",))
    assert remote.hdfs_beam_args(["hdfs://nn/x"], ["--hdfs_host=h", "--hdfs_port", "1", "--hdfs_user=u", "--hdfs_full_urls"]) == []
