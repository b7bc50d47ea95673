"""gc on a real store in a temp dir: what it deletes, what build/ folders pin, the lock
between builds and gc, and the `doit gc` / `doit store` commands."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine.helpers import REPO

from hefbuild.cli.gc import format_size
from hefbuild.errors import StoreError
from hefbuild.store.gc import GcPolicy, collect, store_summary
from hefbuild.store.statcache import StatCache
from hefbuild.store.store import Record, Store
from hefbuild.store.storelock import StoreLock, register_project, registered_projects

FORK = multiprocessing.get_context("fork")


def key_of(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def put(store: Store, name: str, payload: bytes, last_used: float | None = None) -> Record:
    out, log = store.put_bytes(payload), store.put_bytes(f"log of {name}\n".encode())
    rec = Record(key_of(name), "compile", {"model.bin": out}, log.digest, {}, 1.0, 1.0)
    store.put_record(rec)
    if last_used is not None:
        os.utime(record_path(store, rec.key), (last_used, last_used))
    return rec


def record_path(store: Store, key: str) -> Path:
    return store.root / "results" / key[:2] / f"{key}.json"


def digests(rec: Record) -> list[str]:
    return [o.digest for o in rec.outputs.values()] + [rec.log]


def link_build(store: Store, rec: Record, stage_dir: Path) -> None:
    """What the engine leaves in build/<model>/<stage>/: linked outputs and a manifest."""
    for rel, out in rec.outputs.items():
        store.materialize(out.digest, stage_dir / rel)
    store.materialize(rec.log, stage_dir / "log.txt")
    outputs = {rel: {"digest": o.digest, "size": o.size} for rel, o in rec.outputs.items()}
    (stage_dir / "manifest.json").write_text(json.dumps({"key": rec.key, "outputs": outputs}))


def present(store: Store, rec: Record) -> bool:
    return record_path(store, rec.key).exists() and all(
        store.object_path(d).exists() for d in digests(rec))


def gone(store: Store, rec: Record) -> bool:
    return not record_path(store, rec.key).exists() and not any(
        store.object_path(d).exists() for d in digests(rec))


def size_limit(n: int | None) -> GcPolicy:
    return GcPolicy(n, None, time.time())


@pytest.fixture
def cas(workdir: Path) -> Store:
    return Store(workdir / "store", StatCache(workdir / "state.sqlite3"))


@pytest.fixture
def three(cas: Store) -> list[Record]:
    now = time.time()
    return [put(cas, name, name.encode() * 100, now - age)
            for name, age in (("old", 3000), ("mid", 2000), ("new", 1000))]


def test_collect_removes_the_least_recently_used_and_their_objects(cas, three):
    old, mid, new = three
    plan = collect(cas.root, size_limit(sum(cas.object_path(d).stat().st_size
                                            for d in digests(new))))
    assert plan.drop_records == [old.key, mid.key]
    assert gone(cas, old) and gone(cas, mid)
    assert present(cas, new) and cas.intact(new)
    assert plan.freed_bytes > 0 and plan.kept_bytes == store_summary(cas.root).total_bytes


def test_age_limit(cas, three):
    old, mid, new = three
    collect(cas.root, GcPolicy(None, 1500, time.time()))
    assert gone(cas, old) and gone(cas, mid) and present(cas, new)


def test_objects_hard_linked_from_an_unknown_build_survive(cas, three, workdir):
    old = three[0]
    link_build(cas, old, workdir / "elsewhere" / "build" / "m" / "compile")
    plan = collect(cas.root, size_limit(0))
    assert not record_path(cas, old.key).exists()  # a link pins objects, not records
    assert all(cas.verify(d) for d in digests(old))
    assert plan.pinned_objects == 2 and plan.kept_bytes > 0


def test_everything_a_registered_projects_manifest_names_survives(cas, three, workdir):
    old, mid, new = three
    project = workdir / "proj"
    stage = project / "build" / "m" / "compile"
    link_build(cas, old, stage)
    shutil.rmtree(stage)
    stage.mkdir(parents=True)  # copies, as when the store is on another filesystem
    outputs = {"model.bin": {"digest": old.outputs["model.bin"].digest, "size": 1}}
    (stage / "manifest.json").write_text(json.dumps({"key": old.key, "outputs": outputs}))
    register_project(cas.root, project)
    plan = collect(cas.root, size_limit(0))
    assert present(cas, old) and cas.intact(old)  # record, output and the record's log
    assert gone(cas, mid) and gone(cas, new)
    assert plan.pinned_records == 1


def test_a_deleted_project_no_longer_pins(cas, three, workdir):
    project = workdir / "proj"
    link_build(cas, three[0], project / "build" / "m" / "compile")
    register_project(cas.root, project)
    assert registered_projects(cas.root) == [project]
    shutil.rmtree(project)
    collect(cas.root, size_limit(0))
    assert gone(cas, three[0])
    assert registered_projects(cas.root) == []
    assert list((cas.root / "projects").iterdir()) == []


def test_register_project_writes_one_entry_once(cas, workdir):
    project = workdir / "proj"
    project.mkdir()
    register_project(cas.root, project)
    entry, = (cas.root / "projects").iterdir()
    assert entry.name == hashlib.sha256(str(project).encode()).hexdigest()[:16] + ".json"
    assert json.loads(entry.read_text()) == {"root": str(project)}
    before = entry.stat().st_mtime_ns
    register_project(cas.root, project)
    assert entry.stat().st_mtime_ns == before
    (cas.root / "projects" / "garbage.json").write_text("{not json")
    assert registered_projects(cas.root) == [project]
    assert not (cas.root / "projects" / "garbage.json").exists()


def test_a_corrupt_record_is_removed_and_its_objects_with_it(cas, three):
    old = three[0]
    record_path(cas, old.key).write_text("{not json")
    plan = collect(cas.root, size_limit(None))
    assert plan.drop_records == [old.key]
    assert gone(cas, old) and present(cas, three[1]) and present(cas, three[2])


def test_dry_run_deletes_nothing_and_plans_what_a_real_run_does(cas, three):
    before = sorted(p for p in cas.root.rglob("*") if p.name != "gc.lock")
    dry = collect(cas.root, size_limit(0), dry_run=True)
    assert sorted(p for p in cas.root.rglob("*") if p.name != "gc.lock") == before
    assert collect(cas.root, size_limit(0)).drop_records == dry.drop_records
    assert all(gone(cas, rec) for rec in three)


def test_files_already_gone_do_not_fail_collect(cas, three, monkeypatch):
    import hefbuild.store.gc as gc

    real_pins = gc.pins

    def pins_then_vanish(v1_root: Path) -> tuple[set[str], set[str]]:
        record_path(cas, three[0].key).unlink()
        cas.object_path(three[0].log).unlink()
        return real_pins(v1_root)

    monkeypatch.setattr(gc, "pins", pins_then_vanish)
    assert len(collect(cas.root, size_limit(0)).drop_records) == 3
    assert all(gone(cas, rec) for rec in three)


def test_stale_tmp_entries_are_removed(cas):
    old_dir, old_file, fresh = (cas.root / "tmp" / n for n in ("scratch-old", "x.json", "new"))
    (old_dir / "out").mkdir(parents=True)
    (old_dir / "out" / "half.bin").write_bytes(b"half")
    old_file.write_text("{}")
    fresh.mkdir()
    day_ago = time.time() - 25 * 3600
    for path in (old_dir / "out" / "half.bin", old_dir / "out", old_dir, old_file):
        os.utime(path, (day_ago, day_ago))
    collect(cas.root, size_limit(None))
    assert [p.name for p in (cas.root / "tmp").iterdir()] == ["new"]


def test_store_summary_lists_the_largest_results(cas, three):
    big = put(cas, "big", b"B" * 10_000)
    summary = store_summary(cas.root, top=2)
    assert (summary.objects, summary.records) == (8, 4)
    assert summary.total_bytes == sum(p.stat().st_size
                                      for p in (cas.root / "objects").rglob("*") if p.is_file())
    assert [r.key for r in summary.largest][0] == big.key and len(summary.largest) == 2
    assert summary.largest[0].stage == "compile"


# -- the lock ------------------------------------------------------------------------


def _hold_shared(v1_root: Path, held, release) -> None:  # noqa: ANN001 - mp events
    with StoreLock(v1_root).shared():
        held.set()
        release.wait(30)


@pytest.fixture
def holder(cas: Store):
    held, release = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_hold_shared, args=(cas.root, held, release))
    child.start()
    assert held.wait(10)
    yield release
    release.set()
    child.join(10)


def test_exclusive_without_waiting_fails_while_a_build_holds_the_lock(cas, holder):
    with pytest.raises(StoreError, match="in use by a build"), \
            StoreLock(cas.root).exclusive(wait=False):
        pass
    with StoreLock(cas.root).shared():
        pass  # builds do not exclude each other
    holder.set()
    with StoreLock(cas.root).exclusive():
        pass  # the build has released it
    with StoreLock(cas.root).exclusive(wait=False):
        pass


def test_exclusive_says_once_that_it_waits(cas, holder):
    said: list[str] = []

    def waiting(message: str) -> None:
        said.append(message)
        holder.set()  # now the build finishes

    with StoreLock(cas.root).exclusive(on_wait=waiting):
        pass
    assert len(said) == 1 and said[0].startswith("waiting for a build to finish writing")


def _build_loop(store_root: Path, project: Path, seconds: float, report: Path) -> None:
    """A build that keeps writing: objects, a record, links and a manifest per round, plus
    an unused record that gc may take; the lock held shared for each round."""
    store = Store(store_root, StatCache(project / "state.sqlite3"))
    lock, written, deadline, i = StoreLock(store.root), [], time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        with lock.shared():
            out = store.put_bytes(f"model {i} {os.getpid()}".encode())
            time.sleep(0.001)  # widen the window in which gc could see an orphan
            log = store.put_bytes(f"log {i}".encode())
            rec = Record(key_of(f"round {i}"), "compile", {"model.bin": out}, log.digest, {},
                         0.0, 0.0)
            store.put_record(rec)
            link_build(store, rec, project / "build" / f"m{i}" / "compile")
            put(store, f"unused {i}", f"unused {i}".encode())
        written.append(rec.key)
        i += 1
        time.sleep(0.002)
    report.write_text(json.dumps(written))


def test_gc_running_beside_a_build_loses_nothing_the_build_linked(cas, workdir):
    project, report = workdir / "proj", workdir / "written.json"
    project.mkdir()
    register_project(cas.root, project)
    child = FORK.Process(target=_build_loop, args=(cas.root.parent, project, 2.0, report))
    child.start()
    plans = []
    while child.is_alive():
        plans.append(collect(cas.root, size_limit(0)))
    child.join()
    assert child.exitcode == 0
    written = json.loads(report.read_text())
    assert len(written) > 10 and len(plans) > 2
    assert sum(len(p.drop_records) for p in plans) > 0  # gc did run between the rounds
    for i, key in enumerate(written):
        rec = cas.get_record(key)
        assert rec is not None and cas.intact(rec), f"round {i}: gc broke {key}"
        linked = project / "build" / f"m{i}" / "compile" / "model.bin"
        assert hashlib.sha256(linked.read_bytes()).hexdigest() == rec.outputs["model.bin"].digest


# -- the commands --------------------------------------------------------------------


def doit(root: Path, store: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
    env["HEFBUILD_STORE"] = str(store)
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_doit_store_and_doit_gc(root, cas, three):
    for part in ("dodo.py", "pyproject.toml"):
        shutil.copy(REPO / part, root / part)
    size = format_size(store_summary(cas.root).total_bytes)
    shown = doit(root, cas.root.parent, "store")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:3] == [
        f"store: {cas.root}", f"size: {size} in all: {size} in 6 objects, 3 results; 0 B in "
        f"0 environments of venv toolchains (venvs/)", "largest results:"]
    assert three[2].key[:16] in shown.stdout
    for args, error in ((("gc",), "ERROR: gc needs a limit: --max-size SIZE"),
                        (("gc", "--max-size", "ten"), "ERROR: --max-size: a size such as 10G")):
        bad = doit(root, cas.root.parent, *args)
        assert bad.returncode == 3 and bad.stderr.startswith(error), bad.stderr
        assert len(bad.stderr.splitlines()) == 1
    (root / "hefbuild.toml").write_text('[gc]\nmax_size = "0"\n')  # the bound nodes keep too
    dry = doit(root, cas.root.parent, "gc", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.startswith("gc: would remove 3 results"), dry
    done = doit(root, cas.root.parent, "gc", "--max-size", "0")
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"gc: removed 3 results and 6 objects, {size} freed; kept 0 B "
                           f"(0 results and 0 objects pinned by build/ folders)\n")
    assert all(gone(cas, rec) for rec in three)


def test_doit_store_counts_environments_and_gc_venvs_removes_the_undeclared(root, cas, three,
                                                                        tmp_path):
    """A store whose size is mostly environments says so; `doit gc --venvs` removes the one
    no project declares (this project's is kept), and leaves every result alone."""
    from fakes.venv_python import write_fake_python

    from hefbuild.execute import venvs

    for part in ("dodo.py", "pyproject.toml"):
        shutil.copy(REPO / part, root / part)
    python = write_fake_python(tmp_path / "base" / "python3")
    lock = root / "toolchain" / "ov.requirements.txt"
    lock.write_text("numpy==2.1.3\n")
    (root / "toolchain" / "ov.toml").write_text(
        f'[toolchain]\nkind = "venv"\npython = "{python}"\n'
        'requirements = "toolchain/ov.requirements.txt"\n')
    old = tmp_path / "old.requirements.txt"
    old.write_text("numpy==1.0.0\n")
    made = {}
    for name, spec in (("ov", venvs.VenvSpec("ov", str(python), lock)),
                       ("old", venvs.VenvSpec("old", str(python), old))):
        base = venvs.probe_base(str(python))
        folder = venvs.ensure(spec, venvs.identity(spec, base), base, cas.root / "venvs",
                              lambda m: None).python.parent.parent
        (folder / "lib.so").write_bytes(b"\0" * 3_000_000)  # environments outweigh results
        made[name] = folder
    shown = doit(root, cas.root.parent, "store")
    assert shown.returncode == 0, shown.stderr
    size_line = shown.stdout.splitlines()[1]
    assert "in 2 environments of venv toolchains (venvs/)" in size_line
    assert size_line.startswith("size: 5.7 MiB in all:"), size_line
    rows = [ln.split() for ln in shown.stdout.splitlines() if ln.endswith(made["ov"].name)]
    assert rows and rows[0][0:2] == ["2.9", "MiB"] and "ov" in rows[0]
    done = doit(root, cas.root.parent, "gc", "--venvs")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].startswith(
        "gc: removed 1 environment of venv toolchains, 2.9 MiB freed; kept 1 (1 named"), done
    assert not made["old"].exists() and made["ov"].exists()
    assert all(present(cas, rec) for rec in three)  # --venvs alone: results stay
