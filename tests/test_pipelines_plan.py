"""Input discovery (``pipelines.plan.discover``): directories, literal names, globs, non-regular files."""

from __future__ import annotations

import os
import socket

import pytest

from pipelines.plan import InputError, discover, plan_units


def _paths(patterns: list[str]) -> list[str]:
    return [f.path for f in discover(patterns)]


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A data directory (two data files, a config, a hidden and a ``_`` file, a subdirectory)."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (d / "a.jsonl").write_text('{"x": 1}\n')
    (d / "b.avro").write_bytes(b"Obj\x01")
    (d / "features.yaml").write_text("features: []\n")
    (d / ".a.jsonl.swp").write_text("")
    (d / "_SUCCESS").write_text("")
    (d / "sub" / "c.jsonl").write_text('{"x": 3}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("form", ["d", "d/", "{root}/d", "{root}/d/"])
def test_a_directory_with_or_without_slash_is_its_data_files(tree, form):
    given = form.format(root=tree)
    base = given.rstrip("/")
    assert _paths([given]) == [f"{base}/a.jsonl", f"{base}/b.avro"]


def test_an_existing_name_with_glob_characters_is_taken_literally(tree):
    (tree / "br[1].jsonl").write_text("literal\n")
    (tree / "br1.jsonl").write_text("globbed\n")
    assert _paths(["br[1].jsonl"]) == ["br[1].jsonl"]
    assert _paths([str(tree / "br[1].jsonl")]) == [str(tree / "br[1].jsonl")]
    assert _paths(["br[[]1].jsonl"]) == ["br[1].jsonl"]  # the documented escapes
    (tree / "st*r.jsonl").write_text("star\n")
    (tree / "stXr.jsonl").write_text("not the star\n")
    assert _paths(["st[*]r.jsonl"]) == ["st*r.jsonl"]
    (tree / "br[1].jsonl").unlink()
    assert _paths(["br[1].jsonl"]) == ["br1.jsonl"]  # no such file: a glob


def test_hidden_names_are_skipped_by_directories_and_globs_not_when_named(tree):
    assert _paths(["d/*"]) == ["d/a.jsonl", "d/b.avro", "d/features.yaml"]
    assert _paths(["d/_SUCCESS"]) == ["d/_SUCCESS"]


def test_a_relative_glob_in_the_current_directory_matches(tree):
    (tree / "x.jsonl").write_text("{}\n")
    (tree / "y.jsonl").write_text("{}\n")
    assert _paths(["*.jsonl"]) == ["x.jsonl", "y.jsonl"]
    assert _paths(["./*.jsonl"]) == ["./x.jsonl", "./y.jsonl"]
    assert _paths(["d/*.jsonl"]) == ["d/a.jsonl"]  # one segment: not the subdirectory's


def test_symlinks_to_regular_files_are_inputs(tree):
    os.symlink(tree / "d" / "a.jsonl", tree / "link.jsonl")
    os.symlink(tree / "d" / "a.jsonl", tree / "d" / "z.jsonl")
    assert _paths(["link.jsonl"]) == ["link.jsonl"]
    assert _paths(["d"]) == ["d/a.jsonl", "d/b.avro", "d/z.jsonl"]


def test_a_broken_symlink_is_named(tree):
    os.symlink(tree / "gone.jsonl", tree / "d" / "z.jsonl")
    with pytest.raises(InputError, match=r"d/z\.jsonl is a broken symlink"):
        discover(["d"])


@pytest.mark.parametrize("where", ["direct", "directory", "glob"])
def test_a_fifo_is_refused_with_its_name_and_kind(tree, where):
    os.mkfifo(tree / "d" / "pipe.jsonl")
    given = {"direct": "d/pipe.jsonl", "directory": "d", "glob": "d/*.jsonl"}[where]
    with pytest.raises(InputError, match=r"d/pipe\.jsonl is a FIFO \(named pipe\), not a regular file"):
        discover([given])


def test_other_special_files_are_refused(tree):
    with pytest.raises(InputError, match="input /dev/null is a character device"):
        discover(["/dev/null"])
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind("d/s.json")
        with pytest.raises(InputError, match=r"d/s\.json is a socket"):
            discover(["d"])
    finally:
        s.close()


def test_special_files_without_a_data_suffix_are_skipped_in_a_directory(tree):
    os.mkfifo(tree / "d" / "control")
    assert _paths(["d"]) == ["d/a.jsonl", "d/b.avro"]


def test_no_match_is_an_input_error(tree):
    for pat in ("nope.jsonl", "nope*.jsonl", "d/sub/*.avro"):
        with pytest.raises(InputError, match="matched no files"):
            discover([pat])


def test_a_file_removed_after_listing_is_an_input_error(tree):
    big = tree / "d" / "a.jsonl"
    big.write_text('{"x": 1}\n' * 1000)
    files = discover(["d/a.jsonl"])
    big.unlink()
    with pytest.raises(InputError, match=r"cannot read input d/a\.jsonl"):
        plan_units(files, 2)  # two units: the file is cut, so its head is read


@pytest.mark.slow
def test_gcs_prefixes_and_literal_object_names(remote_stack, tmp_path):
    """On gs:// (emulator): a prefix with or without slash is its data objects; an object
    whose name has glob characters is taken literally."""
    local = tmp_path / "up"
    (local / "pfx").mkdir(parents=True)
    for name in ("pfx/a.jsonl", "pfx/b.avro", "pfx/notes.txt", "pfx/_SUCCESS", "br[1].jsonl", "br1.jsonl"):
        (local / name).write_text("{}\n")
    root = remote_stack.upload_dir(local, "plan-discover")
    data = [f"{root}/pfx/a.jsonl", f"{root}/pfx/b.avro"]
    assert _paths([f"{root}/pfx"]) == data
    assert _paths([f"{root}/pfx/"]) == data
    assert _paths([f"{root}/br[1].jsonl"]) == [f"{root}/br[1].jsonl"]
    assert _paths([f"{root}/br[[]1].jsonl"]) == [f"{root}/br[1].jsonl"]
    assert _paths([f"{root}/br*.jsonl"]) == [f"{root}/br1.jsonl", f"{root}/br[1].jsonl"]
    with pytest.raises(InputError, match="matched no files"):
        discover([f"{root}/nothing-here"])
