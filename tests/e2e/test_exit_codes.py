"""The exit codes the README documents, one test each, through the real doit on the toy
target (two fast stages: make -> check)."""

from __future__ import annotations

import fcntl

import pytest

from .conftest import Project
from .test_toy_target import toy_project

pytestmark = pytest.mark.e2e

FAILING = 'import sys\nprint("this rule fails on purpose")\nsys.exit(1)\n'


@pytest.fixture
def toy(tmp_path) -> Project:  # noqa: ANN001
    return Project(toy_project(tmp_path / "proj"), tmp_path / "store")


def test_0_when_everything_asked_for_is_there_and_passed(toy: Project) -> None:
    assert toy.doit("check").returncode == 0
    assert toy.doit("check").returncode == 0  # and up to date


def test_1_when_a_named_stage_fails(toy: Project) -> None:
    (toy.root / "rules/toy/check.py").write_text(FAILING)
    run = toy.doit("check:toy-model")
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.outcomes() == {"make:toy-model": "built", "check:toy-model": "failed"}


def test_2_when_a_stage_of_a_group_fails(toy: Project) -> None:
    (toy.root / "rules/toy/check.py").write_text(FAILING)
    run = toy.doit("check")  # the group `check` could not complete: doit's task error
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.outcomes() == {"make:toy-model": "built", "check:toy-model": "failed"}


def test_1_when_a_toolchain_keeps_a_named_stage_from_running(toy: Project) -> None:
    (toy.root / "toolchain/host.toml").write_text(
        '[toolchain]\nkind = "host"\n\n[packages]\ndoit = "0.0.1"\n')
    run = toy.doit("make:toy-model")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "packages.doit: version 0.0.1 required" in run.stdout


def test_3_for_a_broken_target_file(toy: Project) -> None:
    toy.edit("targets/toy.toml", 'rule = "toy/check.py"', 'rule = "toy/missing.py"')
    run = toy.doit("make:toy-model")
    assert run.returncode == 3 and run.stdout == "", run.stdout + run.stderr
    assert "targets/toy.toml: stages[1].rule: rules/toy/missing.py does not exist" in run.stderr


def test_2_when_a_stage_cannot_run_because_its_upstream_failed(toy: Project) -> None:
    (toy.root / "rules/toy/make.py").write_text(FAILING)
    run = toy.doit("check:toy-model")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.outcomes() == {"make:toy-model": "failed"}


def test_3_for_an_unknown_task(toy: Project) -> None:
    run = toy.doit("chekc:toy-model")
    assert run.returncode == 3 and "did you mean check:toy-model" in run.stderr, run.stderr


def test_3_for_a_broken_model_file_that_is_named(toy: Project) -> None:
    toy.edit("models/toy-model.toml", 'word = "toy"', 'word = 5')
    run = toy.doit("check:toy-model")
    assert run.returncode == 3, run.stdout + run.stderr
    assert run.stderr.startswith("ERROR: models/toy-model.toml: stages.make.word")


def test_3_for_a_bad_settings_file(toy: Project) -> None:
    (toy.root / "hefbuild.toml").write_text("[cache]\ntimeout = \"forever\"\n")
    run = toy.doit("check")
    assert run.returncode == 3 and "hefbuild.toml: cache.timeout" in run.stderr, run.stderr


def test_3_when_another_doit_holds_the_project_and_no_wait_is_asked(toy: Project) -> None:
    assert toy.doit("check").returncode == 0
    lock = toy.root / ".hefbuild" / "lock"
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        run = toy.doit("check", env={"HEFBUILD_NO_WAIT": "1"})
    assert run.returncode == 3, run.stdout + run.stderr
    assert "another doit is running in this project" in run.stderr
