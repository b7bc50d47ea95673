"""A venv toolchain's environment, created on its first stage: heartbeats of its own, an
`env` event with its seconds, and none of its time in the stage's (event, manifest, line).
The creation is real processes (tests/fakes/venv_python.py stands in for python and pip);
the stage itself runs in the fake executor."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fakes.venv_python import write_fake_python

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.report.table import task_line
from hefbuild.store.events import read_events

from .helpers import MODEL, TASKS, edit, model_toml

EXPORT = f"export:{MODEL}"
ROUNDING = 0.01  # events keep seconds to 1e-4 and env seconds to 1e-3


@pytest.fixture
def venv_project(root: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """export runs in toolchain `pinned`, of kind venv, on the stand-in base python."""
    python = write_fake_python(workdir / "base" / "python3")
    (root / "toolchain" / "pinned.requirements.txt").write_text("numpy==2.1.3\n")
    (root / "toolchain" / "pinned.toml").write_text(
        f'[toolchain]\nkind = "venv"\npython = "{python}"\n'
        'requirements = "toolchain/pinned.requirements.txt"\n')
    edit(model_toml(root), "[stages.quantize]", '[stages.export]\ntoolchain = "pinned"\n\n'
         "[stages.quantize]")
    monkeypatch.setenv("HEFBUILD_HEARTBEAT_S", "0")
    monkeypatch.setenv("FAKE_PIP_GO", str(workdir / "go"))
    return root


def test_creating_the_env_beats_and_is_kept_out_of_the_stages_time(venv_project, store, fake,
                                                                   workdir):
    said: list[str] = []

    def progress(line: str) -> None:
        said.append(line)
        if "creating venv toolchain pinned, pip install:" in line and "Collecting" in line:
            (workdir / "go").touch()  # the beat was shown: the stand-in pip may finish

    engine = Engine(load_project(venv_project, store=store), executor=fake, progress=progress)
    engine.run(TASKS[0])
    began = time.monotonic()
    values = engine.run(EXPORT)
    wall = time.monotonic() - began
    lines, _ = read_events(venv_project / "build" / "events.jsonl")
    beats = [e["heartbeat"] for e in lines if e.get("task") == EXPORT and "heartbeat" in e]
    assert any(b.get("env") == "pinned" and "Collecting numpy==2.1.3" in b["message"]
               for b in beats)
    (env,) = [e for e in lines if "env" in e and "outcome" not in e]
    assert (env["env"], env["task"], env["created"]) == ("pinned", EXPORT, True)
    (built,) = [e for e in lines if e.get("task") == EXPORT and "outcome" in e]
    assert (built["env"], built["env_s"]) == ("pinned", env["seconds"]) and env["seconds"] > 0
    # The stage's own time and the environment's are two parts of one wall time, not
    # one counted twice.
    manifest = json.loads((venv_project / "build" / MODEL / "export/manifest.json").read_text())
    assert built["seconds"] + env["seconds"] <= wall + ROUNDING
    assert manifest["seconds"] + env["seconds"] <= wall + ROUNDING
    assert values["seconds"] + values["env_s"] <= wall + ROUNDING
    assert "getting venv toolchain pinned ready" in task_line(EXPORT, values)
    assert fake.ran == list(TASKS[:2])


def test_an_env_already_there_costs_the_stage_nothing(venv_project, store, fake, workdir):
    (workdir / "go").touch()
    engine = Engine(load_project(venv_project, store=store), executor=fake)
    engine.run(TASKS[0])
    engine.run(EXPORT)
    engine.run(EXPORT, force=True)
    lines, _ = read_events(venv_project / "build" / "events.jsonl")
    assert len([e for e in lines if "env" in e and "outcome" not in e]) == 1
    last = [e for e in lines if e.get("task") == EXPORT and "outcome" in e][-1]
    assert "env_s" not in last
