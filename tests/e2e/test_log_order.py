"""Every line goes out when it happens, in order, into a pipe as into a terminal: what a CI
log shows. Run through `| cat` with PYTHONUNBUFFERED removed, as on a real runner (our
machines set it, which hides the problem): a stage found up to date is said before the
next stage's `building` line, not at exit; and no line carries a carriage return."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import Project
from .test_toy_target import toy_project

pytestmark = pytest.mark.e2e

SLOW_CHECK = '''"""check (toy, slow): prints, waits, prints again, then writes its report."""
import json, sys, time
from pathlib import Path
action = json.loads(Path(sys.argv[1]).read_text())
print("check: reading", flush=True)
time.sleep(2.5)
words = (Path(action["inputs"]["make"]) / "thing.txt").read_text().split()
(Path(action["out"]) / "report.json").write_text(json.dumps(
    {"passed": bool(words), "mean_agreement": 1.0, "prompts": ["thing"],
     "min_token_agreement": action["params"]["min_token_agreement"]}))
'''


def piped(project: Project, *args: str) -> list[str]:
    env = project.env({"HEFBUILD_HEARTBEAT_S": "1"})
    env.pop("PYTHONUNBUFFERED", None)
    cmd = " ".join([sys.executable, "-m", "doit", *args])
    done = subprocess.run(["sh", "-c", f"{cmd} 2>&1 | cat"], cwd=project.root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "\r" not in done.stdout
    return done.stdout.splitlines()


def index(lines: list[str], *words: str) -> int:
    return next(i for i, ln in enumerate(lines) if all(w in ln for w in words))


def test_lines_reach_a_pipe_in_the_order_they_happen(tmp_path) -> None:
    root = toy_project(tmp_path / "proj")
    (root / "rules/toy/check.py").write_text(SLOW_CHECK)
    project = Project(root, tmp_path / "store")
    assert project.doit("make:toy-model").returncode == 0
    lines = piped(project, "check")
    up_to_date = index(lines, "up to date", "make:toy-model")
    building = index(lines, "check:toy-model", "building")
    heartbeat = index(lines, "[hefbuild] check:toy-model:", "elapsed", "MiB")
    built = index(lines, "built", "check:toy-model")
    assert up_to_date < building < heartbeat < built, lines
