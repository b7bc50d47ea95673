"""Garbage collection pauses while doit makes the tasks and is on again once it made them,
or once loading failed; a caller's own choice to keep it off is left as it was."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest
from e2e.conftest import copy_project

from hefbuild.cli import gcpause
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
