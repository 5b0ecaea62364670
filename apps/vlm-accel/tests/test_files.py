"""Output files: written whole or not at all, with the mode of a plain open(), parent
directories created the same way by every command."""

from __future__ import annotations

import os
import stat

import pytest
from vlm_accel.errors import CliError
from vlm_accel.files import check_output, write_file, write_files


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_files_get_the_umask_mode_and_missing_parents(tmp_path, umask_022):
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    out = tmp_path / "new" / "dir" / "a.json"
    write_files({out: "{}", tmp_path / "b.png": lambda f: f.write(b"png")})
    assert out.read_text() == "{}" and (tmp_path / "b.png").read_bytes() == b"png"
    assert _mode(out) == _mode(tmp_path / "b.png") == _mode(plain) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.png", "new", "plain.txt"]


def test_a_failing_writer_changes_nothing_and_leaves_no_temporary_file(tmp_path):
    keep = tmp_path / "a.json"
    keep.write_text("old")

    def broken(f):
        f.write(b"half")
        raise RuntimeError("drawing failed")

    with pytest.raises(RuntimeError, match="drawing failed"):
        write_files({keep: "new", tmp_path / "b.png": broken})
    assert keep.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_a_directory_in_the_way_leaves_no_temporary_file(tmp_path):
    (tmp_path / "out.json").mkdir()
    with pytest.raises(IsADirectoryError):
        write_file(tmp_path / "out.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


@pytest.mark.parametrize(
    "make,msg",
    [
        (lambda t: t, "expected a file path, got the directory"),
        (lambda t: (t / "f").write_text("file") and t / "f" / "x.json", "is a file"),
    ],
    ids=["directory", "under-a-file"],
)
def test_check_output_refuses_and_creates_nothing(tmp_path, make, msg):
    path = make(tmp_path)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(CliError, match=msg) as e:
        check_output(path, "--out")
    assert str(e.value).startswith("--out: ")
    assert sorted(tmp_path.iterdir()) == before


def test_check_output_accepts_a_missing_directory_without_creating_it(tmp_path):
    path = tmp_path / "a" / "b" / "c.png"
    assert check_output(path, "--out") == path
    assert list(tmp_path.iterdir()) == []
