"""The task table: read back only while everything it was made from is unchanged; the
tasks it gives are those the declarations give; no credential reaches it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from samples import SYNTHETIC

from hefbuild.cli.tablemake import make_table
from hefbuild.cli.tasks import task_dict
from hefbuild.cli.tasktable import read_table, settings_stamp
from hefbuild.plan.actions import plan_project
from hefbuild.plan.projectcache import load_project_cached

SECRET = "tok-5ecret-value"


@pytest.fixture
def saved(proj: Path, load, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project with models m and n whose table is on disk with both groups."""
    monkeypatch.setenv("HEFBUILD_STORE", str(proj.parent / "store"))
    for name in [n for n in os.environ if n.startswith("HEFBUILD_") and n != "HEFBUILD_STORE"]:
        monkeypatch.delenv(name)
    load(SYNTHETIC)
    (proj / "models" / "n.toml").write_text(SYNTHETIC)
    project = load_project_cached(proj)
    make_table(project, project.models).save()
    return proj


def dicts(table) -> list[dict]:
    return [task_dict(table.root, r) for r in (*table.images, *table.records(table.models))]


def test_the_table_read_back_gives_the_tasks_the_declarations_give(saved: Path):
    table = read_table(str(saved))
    assert table is not None and table.models == ["m", "n"]
    fresh = load_project_cached(saved)
    made = make_table(fresh, fresh.models)
    assert [_plain(d) for d in dicts(table)] == [_plain(d) for d in dicts(made)]
    assert table.toolchain_of("verify:n") == "host"
    verify = plan_project(fresh)["verify:n"]
    assert table.upstream_of("verify:n") == [f"{up}:n" for up in verify.upstream]
    assert table.is_stage("verify:n") and not table.is_stage("lock:n")
    assert table.toolchain_stamp("host") == made.toolchain_stamp("host")


def _plain(task: dict) -> dict:
    """A task dict with its uptodate check shown as what it calls (checks compare by id)."""
    return {k: [repr(u) for u in v] if k == "uptodate" else v for k, v in task.items()}


@pytest.mark.parametrize("change", [
    "edit a model", "add a model", "remove a lock-less model", "edit a toolchain",
    "write hefbuild.toml", "set a setting in the environment",
])
def test_any_change_of_what_it_was_made_from_makes_it_again(saved: Path, change: str,
                                                            monkeypatch: pytest.MonkeyPatch):
    if change == "edit a model":
        (saved / "models" / "n.toml").write_text(SYNTHETIC + "\n# edited\n")
    elif change == "add a model":
        (saved / "models" / "o.toml").write_text(SYNTHETIC)
    elif change == "remove a lock-less model":
        (saved / "models" / "n.toml").unlink()
    elif change == "edit a toolchain":
        host = saved / "toolchain" / "host.toml"
        host.write_text(host.read_text() + "\n")
    elif change == "write hefbuild.toml":
        (saved / "hefbuild.toml").write_text("sandbox = false\n")
    else:
        monkeypatch.setenv("HEFBUILD_REMOTE_TIMEOUT", "30")
    assert read_table(str(saved)) is None


def test_a_damaged_table_is_no_table_or_lacks_what_is_damaged(saved: Path):
    path = saved / ".hefbuild" / "tasks.bin"
    whole = path.read_bytes()
    for damaged in (whole[:100], b"", b"not a group file at all", b"HGF1\0\0\0\0"):
        path.write_bytes(damaged)
        assert read_table(str(saved)) is None
    path.write_bytes(whole[:-5])  # the last model's group is cut short
    table = read_table(str(saved))
    assert table is not None and table.covers(["m"]) and not table.covers(["n"])
    with pytest.raises(KeyError):
        table.group("n")


def test_a_credential_counts_by_its_presence_and_never_reaches_the_file(
        saved: Path, monkeypatch: pytest.MonkeyPatch):
    root = Path(saved)
    without = settings_stamp(root, [])
    with_one = settings_stamp(root, [], {**os.environ, "HEFBUILD_REMOTE_TOKEN": SECRET})
    with_other = settings_stamp(root, [], {**os.environ, "HEFBUILD_REMOTE_TOKEN": "other"})
    assert without != with_one == with_other
    url = "https://user:pa55-{}@cache.example.org/c"
    assert settings_stamp(root, [], {"HEFBUILD_REMOTE_CACHE": url.format(1)}) == \
        settings_stamp(root, [], {"HEFBUILD_REMOTE_CACHE": url.format(2)})
    monkeypatch.setenv("HEFBUILD_REMOTE_TOKEN", SECRET)
    project = load_project_cached(root)
    make_table(project, project.models).save()
    assert read_table(str(root)) is not None
    assert SECRET.encode() not in (root / ".hefbuild" / "tasks.bin").read_bytes()


def test_a_partial_table_gains_the_groups_a_later_run_makes(saved: Path):
    (saved / ".hefbuild" / "tasks.bin").unlink()
    project = load_project_cached(saved)
    make_table(project, ["m"]).save()
    table = read_table(str(saved))
    assert table is not None and table.covers(["m"]) and not table.covers(["n"])
    make_table(project, ["n"], table).save()
    again = read_table(str(saved))
    assert again is not None and again.covers(["m", "n"])
