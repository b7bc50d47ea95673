"""End-to-end runs of the real `doit` on copies of this project, with a private store."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from session_once import once_per_session

from hefbuild.execute.sandbox import bwrap_path
from hefbuild.store.events import expand_summaries, read_events

REPO = Path(__file__).resolve().parents[2]
PROJECT_PARTS = ("dodo.py", "pyproject.toml", "models", "toolchain", "rules", "data", "images",
                 "placements")


@dataclass
class DoitRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict]

    def outcomes(self) -> dict[str, str]:
        return {e["task"]: e["outcome"] for e in self.events if "outcome" in e}

    def tasks(self, outcome: str) -> set[str]:
        return {t for t, o in self.outcomes().items() if o == outcome}


@dataclass
class Project:
    root: Path
    store: Path
    # The Python that runs doit; another user's: (setpriv ..., their interpreter).
    python: tuple[str, ...] = (sys.executable,)

    def doit(self, *args: str, timeout: float = 600, env: dict | None = None) -> DoitRun:
        before = len(self._events())
        done = subprocess.run(
            [*self.python, "-m", "doit", *args], cwd=self.root, capture_output=True,
            text=True, timeout=timeout, env=self.env(env),
        )
        return DoitRun(done.returncode, done.stdout, done.stderr, self._events()[before:])

    def popen(self, *args: str) -> subprocess.Popen:
        """doit started in the background, which a test may interrupt (Ctrl-C is SIGINT)."""
        return subprocess.Popen([*self.python, "-m", "doit", *args], cwd=self.root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=self.env(None), preexec_fn=_interruptible)

    def env(self, extra: dict | None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEFBUILD_")}
        env["HEFBUILD_STORE"] = str(self.store)
        if bwrap_path() is None and os.environ.get("CI") != "true":
            env["HEFBUILD_SANDBOX"] = "0"  # no bubblewrap here (CI installs it): opt out
        env.update(extra or {})
        return env

    def _events(self) -> list[dict]:
        path = self.root / "build" / "events.jsonl"
        if not path.exists():
            return []
        lines, damaged = read_events(path)
        assert damaged == 0, f"{damaged} damaged lines in {path}"
        return expand_summaries(lines)  # not the heartbeats of running stages

    def edit(self, rel: str, old: str, new: str) -> None:
        path = self.root / rel
        text = path.read_text()
        assert old in text, f"{old!r} not in {rel}"
        path.write_text(text.replace(old, new, 1))

    def manifest(self, task: str) -> dict:
        stage, model = task.split(":")
        return json.loads((self.root / "build" / model / stage / "manifest.json").read_text())


class AsInCi(Project):
    """Runs doit as CI does: without the two variables our shells set (unbuffered output
    would hide a line printed late, at exit)."""

    def env(self, extra: dict | None) -> dict:
        env = super().env(extra)
        for name in ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE"):
            env.pop(name, None)
        return env


def _interruptible() -> None:
    """In the child, before exec: SIGINT back to its default. An ignored signal stays ignored
    across exec, and pytest run as a background job of a script or under nohup has SIGINT
    ignored, so its doit would never see the Ctrl-C of a test (and Python installs no
    KeyboardInterrupt handler where SIGINT starts ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def copy_project(dest: Path, store: Path) -> Project:
    dest.mkdir(parents=True, exist_ok=True)
    for part in PROJECT_PARTS:
        src = REPO / part
        if src.is_dir():
            shutil.copytree(src, dest / part, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / part)
    return Project(dest, store)


TINY = ("fetch", "export", "quantize", "compile", "verify")


def tiny_tasks(model: str = "tiny-llama") -> set[str]:
    return {f"{s}:{model}" for s in TINY}


def _build_tiny_llama(folder: Path) -> None:
    project = copy_project(folder / "project", folder / "store")
    first = project.doit("verify:tiny-llama")
    assert first.returncode == 0, first.stdout + first.stderr
    second = project.doit("verify:tiny-llama")
    (folder / "runs.json").write_text(json.dumps([asdict(first), asdict(second)]))


@pytest.fixture(scope="session")
def built_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, DoitRun, DoitRun]:
    """A store holding one full build of tiny-llama, plus the first and second runs.

    Built once for the whole session (every worker), then copied: each worker's tests
    build their edits into their own store, so no test sees another worker's builds."""
    shared = once_per_session(tmp_path_factory, "e2e-tiny-llama", _build_tiny_llama)
    first, second = (DoitRun(**run) for run in json.loads((shared / "runs.json").read_text()))
    store = tmp_path_factory.mktemp("first") / "store"
    shutil.copytree(shared / "store", store, symlinks=True)
    return store, first, second


@pytest.fixture
def project(tmp_path: Path, built_store: tuple[Path, DoitRun, DoitRun]) -> Project:
    """A fresh copy of the project, sharing the store that already holds tiny-llama."""
    proj = copy_project(tmp_path / "project", built_store[0])
    restored = proj.doit("verify:tiny-llama")
    assert restored.returncode == 0, restored.stdout + restored.stderr
    return proj


def assert_consistent(project: Project, model: str = "tiny-llama") -> None:
    """The oracle: nothing left to do, and every output matches its recorded digest."""
    again = project.doit(f"verify:{model}")
    assert again.returncode == 0, again.stderr
    assert again.outcomes() == {t: "uptodate" for t in tiny_tasks(model)}
    import hashlib

    for task in tiny_tasks(model):
        manifest = project.manifest(task)
        stage_dir = project.root / "build" / model / task.split(":")[0]
        for rel, out in manifest["outputs"].items():
            digest = hashlib.sha256((stage_dir / rel).read_bytes()).hexdigest()
            assert digest == out["digest"], f"{task}: {rel} does not match its manifest"
