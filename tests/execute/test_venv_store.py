"""The environments of venv toolchains in a store: counted (size, when made, how long it
took), and removed by gc only when no registered project declares them and nobody uses or
creates them. Environments are made by venvs.ensure with the stand-in python
(tests/fakes/venv_python.py): real folders, real locks."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

import pytest
from fakes.venv_python import write_fake_python

from hefbuild.execute import venvs
from hefbuild.execute.venv_store import Naming, declared_names, installed, remove_unnamed
from hefbuild.store.storelock import register_project


@pytest.fixture
def python(tmp_path: Path) -> Path:
    return write_fake_python(tmp_path / "base" / "python3")


@pytest.fixture
def v1(tmp_path: Path) -> Path:
    return tmp_path / "store" / "v1"


def declare(project: Path, name: str, pins: str, python: Path) -> venvs.VenvSpec:
    """A project at `project` whose toolchain/<name>.toml is a venv toolchain of `pins`."""
    (project / "toolchain").mkdir(parents=True, exist_ok=True)
    (project / "toolchain" / f"{name}.requirements.txt").write_text(pins)
    (project / "toolchain" / f"{name}.toml").write_text(
        f'[toolchain]\nkind = "venv"\npython = "{python}"\n'
        f'requirements = "toolchain/{name}.requirements.txt"\n')
    return venvs.VenvSpec(name, str(python), project / "toolchain" / f"{name}.requirements.txt")


def create(spec: venvs.VenvSpec, v1: Path) -> str:
    """Its environment in the store; the folder's name."""
    base = venvs.probe_base(spec.python)
    ident = venvs.identity(spec, base)
    return venvs.ensure(spec, ident, base, v1 / "venvs", lambda m: None).python.parent.parent.name


def test_the_store_counts_each_environment(tmp_path, python, v1):
    name = create(declare(tmp_path / "a", "ov", "numpy==2.1.3\n", python), v1)
    crashed = v1 / "venvs" / f".tmp-{name}-999999"
    (crashed / "lib").mkdir(parents=True)
    (crashed / "lib" / "half.py").write_text("x" * 5000)
    found = {e.name: e for e in installed(v1 / "venvs")}
    assert set(found) == {name, crashed.name}
    env = found[name]
    assert env.complete and env.toolchain == "ov" and env.seconds is not None
    assert env.size == sum(p.stat().st_size for p in (v1 / "venvs" / name).rglob("*")
                           if p.is_file() and not p.is_symlink())
    assert not found[crashed.name].complete and found[crashed.name].size == 5000
    assert found[crashed.name].digest == name


def test_gc_removes_only_what_no_registered_project_declares(tmp_path, python, v1):
    a, b = tmp_path / "a", tmp_path / "b"
    mine = create(declare(a, "ov", "numpy==2.1.3\n", python), v1)
    theirs = create(declare(b, "tools", "numpy==1.26.4\n", python), v1)
    orphan = create(venvs.VenvSpec("old", str(python), _lock(tmp_path, "numpy==1.0.0\n")), v1)
    register_project(v1, b)  # another project sharing the store
    naming = declared_names(v1, [a])
    assert naming == Naming(frozenset({mine, theirs}))
    done = remove_unnamed(v1 / "venvs", naming)
    assert [e.name for e in done.removed] == [orphan]
    assert {e.name for e in installed(v1 / "venvs")} == {mine, theirs}
    assert not (v1 / "venvs" / f"{orphan}.log").exists()
    declare(b, "tools", "numpy==1.26.5\n", python)  # b's lock moved on: its old env is unnamed
    done = remove_unnamed(v1 / "venvs", declared_names(v1, [a]))
    assert [e.name for e in done.removed] == [theirs]
    assert [e.name for e in installed(v1 / "venvs")] == [mine]


def test_an_environment_in_use_or_being_created_stays(tmp_path, python, v1):
    spec = declare(tmp_path / "a", "ov", "numpy==2.1.3\n", python)
    base = venvs.probe_base(spec.python)
    ident = venvs.identity(spec, base)
    with venvs.using(spec, ident, base, v1 / "venvs", lambda m: None) as ready:
        name = ready.python.parent.parent.name
        done = remove_unnamed(v1 / "venvs", Naming(frozenset()))
        assert [e.name for e in done.busy] == [name] and done.removed == []
    with open(v1 / "venvs" / f"{name}.lock", "a+") as creating:
        fcntl.flock(creating, fcntl.LOCK_EX)  # as a creator holds it
        assert remove_unnamed(v1 / "venvs", Naming(frozenset())).busy
    assert [e.name for e in remove_unnamed(v1 / "venvs", Naming(frozenset())).removed] == [name]
    assert installed(v1 / "venvs") == []


def test_names_that_cannot_be_known_keep_every_finished_environment(tmp_path, python, v1):
    a = tmp_path / "a"
    name = create(declare(a, "ov", "numpy==2.1.3\n", python), v1)
    crashed = v1 / "venvs" / f".tmp-{name}-999999"
    crashed.mkdir()
    (a / "toolchain" / "ov.requirements.txt").unlink()  # its identity cannot be computed
    register_project(v1, a)
    naming = declared_names(v1)
    assert naming.names == frozenset() and len(naming.unsure) == 1
    assert str(a) in naming.unsure[0]
    done = remove_unnamed(v1 / "venvs", naming, dry_run=True)
    assert [e.name for e in done.unsure] == [name] and [e.name for e in done.removed] == \
        [crashed.name]
    assert crashed.exists()  # a dry run removes nothing
    remove_unnamed(v1 / "venvs", naming)
    assert [e.name for e in installed(v1 / "venvs")] == [name]
    shutil.rmtree(a)  # a project that is gone names nothing and is forgotten
    assert declared_names(v1) == Naming(frozenset())


def _lock(tmp_path: Path, pins: str) -> Path:
    path = tmp_path / "elsewhere" / "old.requirements.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(pins)
    return path
