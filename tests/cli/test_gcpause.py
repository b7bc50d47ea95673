"""Garbage collection pauses while doit makes the tasks and is on again once it made them,
or once loading failed; a caller's own choice to keep it off is left as it was. A run pauses
it again while it decides which tasks are up to date: until a task runs (or a forked worker
starts), or the run ends."""

from __future__ import annotations

import gc
import io
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from e2e.conftest import Project, built_store, copy_project, project  # noqa: F401 - fixtures

from hefbuild.cli import gcpause
from hefbuild.cli.hooks import HefbuildReporter
from hefbuild.cli.stagemark import STAGE
from hefbuild.cli.tasks import project_tasks


@pytest.fixture(autouse=True)
def collecting():
    assert gc.isenabled()
    yield
    gcpause.resume()
    gc.enable()


def test_collection_is_back_once_every_task_is_made(tmp_path: Path, monkeypatch):
    root = copy_project(tmp_path / "project", tmp_path / "store").root
    monkeypatch.setattr(sys, "argv", ["doit", "verify:tiny-llama"])
    _, creator = project_tasks(root)
    assert not gc.isenabled()  # while doit turns the dicts into tasks
    tasks = list(creator())
    assert tasks and gc.isenabled()


def test_collection_is_back_when_loading_fails(tmp_path: Path, monkeypatch):
    root = copy_project(tmp_path / "project", tmp_path / "store").root
    monkeypatch.setattr(sys, "argv", ["doit", "verify:no-such-model"])
    with pytest.raises(SystemExit):
        project_tasks(root)
    assert gc.isenabled()


def test_a_caller_that_turned_collection_off_keeps_it_off():
    gc.disable()
    gcpause.pause()
    gcpause.resume()
    assert not gc.isenabled()


def test_a_forked_worker_collects_from_its_start():
    gcpause.pause()
    pid = os.fork()
    if pid == 0:  # a `doit -n N` worker: it runs stages
        os._exit(0 if gc.isenabled() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not gc.isenabled()  # the run itself is still deciding


def test_a_task_that_runs_collects_again(tmp_path: Path):
    reporter = HefbuildReporter.bound_to(str(tmp_path))(io.StringIO(), {})
    gcpause.pause()  # as `initialize` does
    reporter.execute_task(SimpleNamespace(name="verify:m", meta={"hefbuild": STAGE}))
    assert gc.isenabled()


# A no-op run, counting the collections from the reporter's start to its end.
_COUNTING = """
import gc, sys
from doit.doit_cmd import DoitMain
from hefbuild.cli.hooks import HefbuildReporter
from hefbuild.cli.stagemark import STAGE

made = []
initialize, complete_run = HefbuildReporter.initialize, HefbuildReporter.complete_run

def counting(self, *args):
    gc.callbacks.append(lambda phase, info: phase == "start" and made.append(info))
    initialize(self, *args)

def ending(self):
    print(f"collections={len(made)} paused={not gc.isenabled()}", file=sys.stderr)
    complete_run(self)
    print(f"collecting={gc.isenabled()}", file=sys.stderr)

HefbuildReporter.initialize, HefbuildReporter.complete_run = counting, ending
sys.exit(DoitMain().run(sys.argv[1:]))
"""


def test_a_no_op_run_decides_every_task_without_a_collection(request: pytest.FixtureRequest):
    built_project: Project = request.getfixturevalue("project")  # tiny-llama, built
    done = subprocess.run([sys.executable, "-c", _COUNTING, "verify:tiny-llama"],
                          cwd=built_project.root, env=built_project.env(None),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 up to date" in done.stdout + done.stderr
    assert "collections=0 paused=True" in done.stderr
    assert "collecting=True" in done.stderr
