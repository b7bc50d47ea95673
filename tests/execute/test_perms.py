"""A rule's locked files are opened up to their owner before they are collected, and nothing
else is touched (test_sandbox builds through it as a normal user)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hefbuild.execute.perms import owner_readable


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_locked_files_and_folders_become_the_owner_s_to_read_and_move(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "outside.txt"
    (out / "locked" / "deeper").mkdir(parents=True)
    (out / "sealed").mkdir()
    outside.write_text("not the rule's")
    files = {out / "model.onnx": 0o000, out / "locked" / "deeper" / "w.bin": 0o000,
             out / "sealed" / "log.txt": 0o200, out / "shared.json": 0o644}
    for path, bits in files.items():
        path.write_text("x")
        path.chmod(bits)
    os.chmod(outside, 0o000)
    (out / "link").symlink_to(outside)
    for folder, bits in ((out / "locked" / "deeper", 0), (out / "locked", 0),
                         (out / "sealed", 0o500)):
        folder.chmod(bits)
    owner_readable(out)
    assert {p.relative_to(out).as_posix(): mode(p) for p in files} == {
        "model.onnx": 0o400, "locked/deeper/w.bin": 0o400, "sealed/log.txt": 0o600,
        "shared.json": 0o644}
    assert [mode(out / d) for d in ("locked", "locked/deeper", "sealed")] == [0o700] * 3
    assert mode(outside) == 0o000  # a symlink is not followed


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to make a file of another owner")
def test_a_file_of_another_owner_is_left_alone(tmp_path):
    theirs = tmp_path / "theirs.bin"
    theirs.write_text("x")
    theirs.chmod(0)
    os.chown(theirs, 65534, 65534)
    owner_readable(tmp_path)
    assert mode(theirs) == 0


def test_a_missing_or_linked_folder_is_nothing_to_do(tmp_path):
    owner_readable(tmp_path / "none")
    target = tmp_path / "target"
    target.mkdir(mode=0o500)
    (tmp_path / "alias").symlink_to(target)
    owner_readable(tmp_path / "alias")
    assert mode(target) == 0o500
