"""A run says why: each stage's line names what made it run (or `same bytes upstream` when
early cutoff kept it), counts how far the run is, and the end line has the wall time and,
in a parallel run, the critical path. `doit status` says `failed` with the error and log,
takes task names, and names a broken model file's error; `doit clean --dry-run` lists what
it would remove; `doit lock:<m>` ends with the lock file and the end line. Real doit runs
on the toy target (two stages of tiny rules), so each takes a fraction of a second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .conftest import AsInCi, Project
from .test_toy_target import toy_project

pytestmark = pytest.mark.e2e

MODEL_TOML = "models/toy-model.toml"


@pytest.fixture
def toy2(tmp_path: Path) -> Project:
    """The toy project with a second model beside toy-model."""
    root = toy_project(tmp_path / "proj")
    text = (root / MODEL_TOML).read_text()
    (root / "models/toy-other.toml").write_text(text.replace('word = "toy"', 'word = "other"'))
    return AsInCi(root, tmp_path / "store")


def stage_lines(stdout: str) -> list[str]:
    return [ln for ln in stdout.splitlines()
            if re.match(r"^(\[ *\d+/\d+\]|   ) ?(built|restored|remote|up to date|failed) ", ln)]


def line_of(stdout: str, task: str) -> str:
    found = [ln for ln in stage_lines(stdout) if re.search(rf" {re.escape(task)}\b", ln)]
    assert len(found) == 1, stdout
    return found[0]


def end_line(stdout: str) -> str:
    return [ln for ln in stdout.splitlines() if ln.startswith("hefbuild: ")][-1]


def test_each_stage_line_says_why_it_ran_and_how_far_the_run_is(toy2: Project) -> None:
    first = toy2.doit("check")
    assert first.returncode == 0, first.stdout + first.stderr
    lines = stage_lines(first.stdout)
    assert sorted(ln[:6] for ln in lines) == ["[1/4] ", "[2/4] ", "[3/4] ", "[4/4] "], lines
    assert all(ln.endswith(" — new") for ln in lines), lines
    assert re.search(r", 0 failed in \d+(\.\d+)? s$", end_line(first.stdout)), first.stdout

    toy2.edit(MODEL_TOML, 'word = "toy"', 'word = "toy"\ntimes = 3')
    param = toy2.doit("check:toy-model")
    assert param.returncode == 0, param.stdout + param.stderr
    assert line_of(param.stdout, "make:toy-model").startswith("[1/2] built      make:toy-model")
    assert line_of(param.stdout, "make:toy-model").endswith(" — params.times 2 → 3")
    assert line_of(param.stdout, "check:toy-model").endswith(
        " — upstream make/thing.txt changed")

    rule = toy2.root / "rules/toy/make.py"
    rule.write_text(rule.read_text() + "# the code changes, its output not\n")
    cutoff = toy2.doit("check:toy-model")
    assert cutoff.returncode == 0, cutoff.stdout + cutoff.stderr
    assert line_of(cutoff.stdout, "make:toy-model").endswith(" — rules/toy/make.py changed")
    assert line_of(cutoff.stdout, "check:toy-model") == \
        "[2/2] up to date check:toy-model — same bytes upstream"

    again = toy2.doit("check:toy-model")  # nothing upstream ran: nothing to explain
    assert line_of(again.stdout, "check:toy-model") == "[2/2] up to date check:toy-model"
    alone = toy2.doit("make:toy-model")  # one stage: no count
    assert stage_lines(alone.stdout) == ["   up to date make:toy-model"], alone.stdout


def test_a_parallel_run_ends_with_its_critical_path(toy2: Project) -> None:
    parallel = toy2.doit("-n", "2", "check")
    assert parallel.returncode == 0, parallel.stdout + parallel.stderr
    # each check waits for its own make, and the chain that ended last set the run's end
    assert re.search(r" 0 failed in \S+ s; critical path: make:(toy-\w+) \S+ s → check:\1 "
                     r"\S+ s$", end_line(parallel.stdout)), parallel.stdout
    toy2.edit(MODEL_TOML, 'word = "toy"', 'word = "again"')
    serial = toy2.doit("check")
    assert serial.returncode == 0, serial.stdout + serial.stderr
    assert " in " in end_line(serial.stdout) and "critical path" not in serial.stdout


def test_status_after_a_failure_says_failed_with_its_error_and_log(toy2: Project) -> None:
    assert toy2.doit("check").returncode == 0
    toy2.edit(MODEL_TOML, 'word = "toy"', 'word = ""')  # no words: the check fails
    failed = toy2.doit("check:toy-model")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert line_of(failed.stdout, "check:toy-model").startswith("[2/2] failed     ")

    status = toy2.doit("status")
    assert status.returncode == 0, status.stderr
    assert re.search(r"^toy-model\s+ok\s+FAILED$", status.stdout, re.MULTILINE), status.stdout
    error = ("rules/toy/check.py failed (exit 1): (no output); "
             "log: build/toy-model/check.failed.log")
    assert f"   check:toy-model: failed: {error}\n" in status.stdout, status.stdout
    assert status.stdout.endswith("hefbuild status: 3 up to date, 1 failed\n")

    named = toy2.doit("status", "check:toy-model")  # a task, as `doit explain` takes it
    assert named.returncode == 0, named.stderr
    assert named.stdout == f"check:toy-model  FAILED   {error}\nhefbuild status: 1 failed\n"
    group = toy2.doit("status", "check", "thing:toy-other")  # a group and an alias
    assert group.returncode == 0, group.stderr
    rows = [ln.split()[:2] for ln in group.stdout.splitlines()[:-1]]
    assert rows == [["check:toy-model", "FAILED"], ["check:toy-other", "ok"],
                    ["make:toy-other", "ok"]], group.stdout

    toy2.edit("targets/toy.toml", "default = 0.5", "default = 0.0")  # the gate moves
    moved = toy2.doit("status", "check:toy-model")  # another key: the failure is history
    assert moved.stdout.startswith("check:toy-model  new      no result in build/"), moved.stdout


def test_status_naming_a_broken_model_file_prints_its_error(toy2: Project) -> None:
    (toy2.root / "models/toy-broken.toml").write_text('[model]\ntarget = "toy"\ncolour = 1\n')
    named = toy2.doit("status", "toy-broken")
    assert named.returncode == 3, named.stdout + named.stderr
    assert named.stdout == ""
    assert named.stderr.startswith("ERROR: models/toy-broken.toml: model.colour: unknown key")
    typo = toy2.doit("status", "toy-modle")
    assert typo.returncode == 3
    assert "ERROR: no model or task 'toy-modle' in this project; did you mean toy-model" \
        in typo.stderr


def test_clean_dry_run_lists_what_it_would_remove_and_removes_nothing(toy2: Project) -> None:
    assert toy2.doit("check:toy-model").returncode == 0
    dry = toy2.doit("clean", "--dry-run", "make:toy-model")
    assert dry.returncode == 0, dry.stderr
    assert "make:toy-model: would remove build/toy-model/make; the store keeps its result" \
        in dry.stdout
    assert (toy2.root / "build/toy-model/make/thing.txt").is_file()
    real = toy2.doit("clean", "make:toy-model")
    assert "make:toy-model: removed build/toy-model/make" in real.stdout, real.stdout
    assert not (toy2.root / "build/toy-model/make").exists()


def test_lock_ends_with_the_lock_file_and_the_end_line(toy2: Project, tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text("{}\n")
    (toy2.root / "models/toy-local.toml").write_text(
        f'[model]\ntarget = "toy"\n\n[source]\npath = "{folder}"\n')
    locked = toy2.doit("lock:toy-local")
    assert locked.returncode == 0, locked.stdout + locked.stderr
    lines = locked.stdout.splitlines()
    assert "   locked     lock:toy-local  models/toy-local.lock.json: 1 file" in lines, lines
    assert lines[-1].startswith("hefbuild: 0 built, 0 restored, 0 from remote, 0 up to date, "
                                "0 failed in "), lines
    assert (toy2.root / "models/toy-local.lock.json").is_file()
