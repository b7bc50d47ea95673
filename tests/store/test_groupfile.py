"""A file of named groups: written whole and atomically, read back group by group; a
damaged file or group is absent, never an error and never other bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from hefbuild.store.groupfile import read_groups, write_groups

GROUPS = {f"model-{i}": bytes([i % 251]) * (i * 37) for i in range(50)}


@pytest.fixture
def written(tmp_path: Path) -> Path:
    path = tmp_path / "state" / "groups.bin"
    write_groups(path, {"format": 1, "stamp": "abc"}, GROUPS)
    return path


def test_every_group_reads_back_as_written(written: Path):
    meta, groups = read_groups(written)
    assert meta == {"format": 1, "stamp": "abc"}
    assert dict(groups) == GROUPS
    assert list(groups) == list(GROUPS) and len(groups) == len(GROUPS)
    assert groups["model-7"] == GROUPS["model-7"] and "model-99" not in groups


def test_set_and_deleted_groups_shadow_the_file_until_written_again(written: Path):
    _, groups = read_groups(written)
    groups["model-1"] = b"new"
    del groups["model-2"]
    groups["extra"] = b"x"
    assert groups["model-1"] == b"new" and "model-2" not in groups
    with pytest.raises(KeyError):
        del groups["model-2"]
    assert read_groups(written)[1]["model-2"] == GROUPS["model-2"]  # the file is as it was
    write_groups(written, "meta", groups)
    again = read_groups(written)[1]
    assert again["model-1"] == b"new" and again["extra"] == b"x" and "model-2" not in again


def test_a_reader_keeps_the_file_it_mapped_while_a_writer_replaces_it(written: Path):
    _, before = read_groups(written)
    write_groups(written, "meta", {"model-3": b"replaced"})
    assert before["model-3"] == GROUPS["model-3"]
    assert read_groups(written)[1]["model-3"] == b"replaced"


@pytest.mark.parametrize("damage", ["empty", "not ours", "cut header", "cut groups"])
def test_a_damaged_file_is_none_or_lacks_the_damaged_groups(written: Path, damage: str):
    whole = written.read_bytes()
    written.write_bytes({"empty": b"", "not ours": b"PK\x03\x04" + whole[4:],
                         "cut header": whole[:12], "cut groups": whole[:-100]}[damage])
    found = read_groups(written)
    if damage != "cut groups":
        assert found is None
        return
    _, groups = found
    last = list(GROUPS)[-1]
    assert groups.get(last) is None  # cut short: absent, not a shorter group
    assert groups["model-10"] == GROUPS["model-10"]


def test_no_file_is_none(tmp_path: Path):
    assert read_groups(tmp_path / "absent.bin") is None


def test_a_failed_write_leaves_the_old_file_and_no_temporary(written: Path, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("hefbuild.store.groupfile.os.replace", broken)
    with pytest.raises(OSError):
        write_groups(written, "meta", {"a": b"b"})
    assert read_groups(written)[1]["model-5"] == GROUPS["model-5"]
    assert sorted(p.name for p in written.parent.iterdir()) == ["groups.bin"]


def test_a_dead_writers_temporary_is_swept_and_a_live_ones_kept(written: Path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = written.with_name(f".{written.name}.{done.stdout.strip()}")  # its process ended
    live = written.with_name(f".{written.name}.1")  # init: always running
    dead.write_bytes(b"half")
    live.write_bytes(b"half")
    write_groups(written, "meta", {"a": b"b"})
    assert not dead.exists() and live.exists()
    assert read_groups(written)[1]["a"] == b"b"
