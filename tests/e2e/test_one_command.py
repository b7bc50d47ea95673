"""`hefbuild`, the console script the package installs: doit with the project's dodo.py
from any folder of the project, and `--help` that prints usage (for `doit <command>
--help` too). Real runs on the toy target."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import AsInCi, Project
from .test_toy_target import toy_project

pytestmark = pytest.mark.e2e

HEFBUILD = Path(sys.executable).parent / "hefbuild"  # where pip put the console script


@pytest.fixture
def toy(tmp_path: Path) -> Project:
    return AsInCi(toy_project(tmp_path / "proj"), tmp_path / "store")


def hefbuild(project: Project, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(HEFBUILD), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=project.env(None))


def test_the_package_installs_the_script_and_it_works_from_a_sub_folder(toy: Project) -> None:
    assert HEFBUILD.is_file(), "no hefbuild script: pip install -e . installs it"
    models = toy.root / "models"
    listed = hefbuild(toy, models, "list")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert listed.stdout == toy.doit("list").stdout  # what doit says at the root

    built = hefbuild(toy, models, "check:toy-model")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (toy.root / "build/toy-model/check/report.json").is_file()  # at the root, not here
    assert not (models / "build").exists() and not (models / ".hefbuild").exists()
    assert "built      check:toy-model" in built.stdout

    report = hefbuild(toy, toy.root / "rules" / "toy", "report")
    assert report.returncode == 0, report.stdout + report.stderr
    assert report.stdout.strip() == str(toy.root / "build/report/index.html")
    assert hefbuild(toy, models, "status").stdout == toy.doit("status").stdout


def test_outside_a_project_it_says_so_in_one_line(toy: Project, tmp_path: Path) -> None:
    away = tmp_path / "elsewhere"
    away.mkdir()
    run = hefbuild(toy, away, "list")
    assert run.returncode == 3
    assert run.stderr.startswith("ERROR: ") and len(run.stderr.splitlines()) == 1, run.stderr
    assert "dodo.py" in run.stderr
    assert hefbuild(toy, away, "--help").returncode == 0  # help needs no project


def test_help_prints_usage_for_hefbuild_and_each_command(toy: Project) -> None:
    usage = hefbuild(toy, toy.root / "models", "--help")
    assert usage.returncode == 0, usage.stderr
    for command in ("explain", "status", "report", "gc", "list", "clean"):
        assert f"  hefbuild {command} " in usage.stdout, usage.stdout
    for args in (("gc", "--help"), ("status", "-h"), ("help", "gc")):
        shown = hefbuild(toy, toy.root, *args)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert f"USAGE\n    hefbuild {args[0] if args[0] != 'help' else args[1]} " \
            in shown.stdout, shown.stdout
    task = hefbuild(toy, toy.root, "check:toy-model", "--help")
    assert task.returncode == 0 and task.stdout.startswith("check:toy-model  "), task.stdout


def test_doit_command_help_prints_usage_not_its_parser(toy: Project) -> None:
    for command in ("gc", "report", "store", "cache-key", "explain", "status", "forget"):
        shown = toy.doit(command, "--help")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "Error parsing" not in shown.stderr and "CmdOption" not in shown.stderr
        # (`python -m doit` names itself `-m`)
        assert re.search(rf"^USAGE\n    \S+ {command}\b", shown.stdout, re.M), shown.stdout
