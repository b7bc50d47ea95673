"""hefbuild as doit tasks: the task dicts, the file checker, the reporter and the lock.

`dodo.py` calls `project_tasks(root)` and gets `DOIT_CONFIG` plus one task creator. Task
actions and up-to-date checks are module-level functions taking (root, task) so they
survive pickling under `doit -n N -P process`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

from doit.dependency import FileChangedChecker
from doit.exceptions import TaskFailed
from doit.reporter import ConsoleReporter

from .errors import HefbuildError
from .events import Outcome, peak_rss_mb, read_json
from .lock import ProjectLock
from .plan import Action, artifact_task, plan_model, rule_code_files, task_name
from .project import STATE_DIR, Project, load_project


@cache
def project_at(root: str) -> Project:
    return load_project(Path(root))


@cache
def engine_for(root: str):  # noqa: ANN201 - Engine is imported lazily to keep `list` fast
    from .engine import Engine

    return Engine(project_at(root), progress=_to_terminal)


def _to_terminal(line: str) -> None:
    """Heartbeats reach the person at the terminal at once (doit buffers task stdout)."""
    print(line, file=sys.__stderr__, flush=True)


def run_task(root: str, task: str) -> dict[str, Any] | TaskFailed:
    try:
        return engine_for(root).run(task, force=forced(task, sys.argv[1:]))
    except HefbuildError as exc:
        return TaskFailed(str(exc))


def forced(task: str, argv: list[str]) -> bool:
    """`doit -a TASK` rebuilds TASK itself, as in doit; its dependencies are still
    restored or left as they are (re-running a 4-hour compile to re-check a device
    is never what `-a verify:x` means)."""
    if not {"-a", "--always-execute"} & set(argv):
        return False
    named = {a for a in argv if not a.startswith("-")}
    return task in named or task.split(":")[0] in named


def check_uptodate(root: str, task: str) -> bool:
    return engine_for(root).is_uptodate(task)


def lock_hub_model(root: str, model: str) -> dict[str, Any] | TaskFailed:
    from .hub import lock_model

    try:
        return lock_model(project_at(root), model)
    except HefbuildError as exc:
        return TaskFailed(str(exc))


def save_placement(root: str, model: str) -> dict[str, Any] | TaskFailed:
    """Copy the last compile's `.auto.alls` to placements/, where `replay_placement` reads it."""
    src = Path(root) / "build" / model / "compile" / "model.auto.alls"
    dest = Path(root) / "placements" / f"{model}.auto.alls"
    if not src.is_file():
        return TaskFailed(f"placement:{model}: no compile result in build/{model}/compile/")
    dest.parent.mkdir(exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    tmp.write_bytes(src.read_bytes())
    tmp.replace(dest)
    return {"placement": f"placements/{model}.auto.alls"}


def project_tasks(root: Path) -> tuple[dict[str, Any], Callable[[], Iterator[dict]]]:
    """DOIT_CONFIG and the task creator for the project at `root`; exits on bad input."""
    try:
        project = project_at(str(root.absolute()))
    except HefbuildError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    (project.paths.state).mkdir(exist_ok=True)
    config = {
        "dep_file": f"{STATE_DIR}/doit.sqlite3",
        "backend": "sqlite3",
        "check_file_uptodate": DigestChecker.bound_to(str(project.paths.root)),
        "reporter": HefbuildReporter.bound_to(str(project.paths.root)),
        "default_tasks": [task_name("verify", m.name) for m in project.models.values()
                          if m.target == "cpu-ort"],
    }

    def task_hefbuild() -> Iterator[dict]:
        yield from _task_dicts(project)

    task_hefbuild.__doc__ = "hefbuild stages (models/*.toml)"
    return config, task_hefbuild


def build_toolchain_image(root: str, name: str) -> dict[str, Any] | TaskFailed:
    from .images import build_image

    try:
        return build_image(project_at(root), name)
    except HefbuildError as exc:
        return TaskFailed(str(exc))


def check_image_current(root: str, name: str) -> bool:
    from .images import image_is_current

    return image_is_current(project_at(root), name)


def _image_tasks(project: Project) -> Iterator[dict]:
    root = str(project.paths.root)
    for tc in project.toolchains.values():
        if tc.kind == "docker" and "context" in tc.image:
            yield {"basename": "image", "name": tc.name,
                   "actions": [(build_toolchain_image, [root, tc.name])],
                   "uptodate": [(check_image_current, [root, tc.name])],
                   "doc": f"build the image of toolchain {tc.name} from {tc.image['context']} "
                          f"and pin its ID in toolchain/{tc.name}.lock.json"}


def _task_dicts(project: Project) -> Iterator[dict]:
    root = str(project.paths.root)
    yield from _image_tasks(project)
    for model in project.models.values():
        for action in plan_model(model):
            yield _stage_task(project, action)
        if model.target == "hailo10h":
            yield {"basename": "hef", "name": model.name, "actions": None,
                   "task_dep": [artifact_task(model)],
                   "doc": f"the HEF of {model.name} (build/{model.name}/compile/model.hef)"}
        if model.target == "hailo10h":
            yield {"basename": "placement", "name": model.name,
                   "actions": [(save_placement, [root, model.name])],
                   "task_dep": [artifact_task(model)], "uptodate": [False],
                   "doc": f"keep the compiler's placement of {model.name} for replay "
                          f"(placements/{model.name}.auto.alls)"}
        if model.source.hub:
            yield {"basename": "lock", "name": model.name,
                   "actions": [(lock_hub_model, [root, model.name])], "uptodate": [False],
                   "doc": f"pin {model.source.hub}@{model.source.revision} to a commit "
                          f"and file digests (needs hub access)"}


def _stage_task(project: Project, action: Action) -> dict:
    root = str(project.paths.root)
    code = _rule_files(project.paths.rules, action.rule)
    return {
        "basename": action.stage,
        "name": action.model,
        "actions": [(run_task, [root, action.task])],
        "uptodate": [(check_uptodate, [root, action.task])],
        "task_dep": [task_name(up, action.model) for up in action.upstream],
        "file_dep": code + [str(project.paths.root / p) for p in action.file_params.values()],
        "doc": f"{action.stage} {action.model} ({action.target}, toolchain {action.toolchain})",
    }


@cache
def _rule_files_cached(rules_dir: str, rule: str) -> tuple[str, ...]:
    return tuple(str(p) for p in rule_code_files(Path(rules_dir), rule))


def _rule_files(rules_dir: Path, rule: str) -> list[str]:
    return list(_rule_files_cached(str(rules_dir), rule))


class DigestChecker(FileChangedChecker):
    """doit file_dep checker on SHA-256 content, through hefbuild's stat cache.

    doit's MD5 checker trusts an unchanged mtime (missing same-size edits that restore
    it) and re-hashes a touched file on every run until the task runs again; this one
    re-hashes only when (size, mtime, ctime, inode) changed, once.
    """

    root: str = ""

    @classmethod
    def bound_to(cls, root: str) -> type[DigestChecker]:
        return type("DigestChecker", (cls,), {"root": root})

    def _digest(self, path: str) -> str:
        return engine_for(self.root).stats.digest(Path(path)).hex

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: Any) -> bool:
        return state != self._digest(file_path)

    def get_state(self, dep: str, current_state: Any) -> str | None:
        digest = self._digest(dep)
        return None if digest == current_state else digest


class HefbuildReporter(ConsoleReporter):
    """doit's console output, plus: the project lock, `uptodate` events, one-line errors."""

    root: str = ""

    @classmethod
    def bound_to(cls, root: str) -> type[HefbuildReporter]:
        return type("HefbuildReporter", (cls,), {"root": root})

    def __init__(self, outstream: Any, options: dict[str, Any]) -> None:
        super().__init__(outstream, options)
        self._lock = ProjectLock(Path(self.root) / STATE_DIR / "lock")

    def initialize(self, tasks: dict, selected_tasks: list) -> None:
        wait = os.environ.get("HEFBUILD_NO_WAIT", "") in ("", "0")
        try:
            self._lock.acquire(wait, lambda msg: print(msg, file=sys.stderr, flush=True))
        except HefbuildError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            raise SystemExit(3) from None
        super().initialize(tasks, selected_tasks)

    def skip_uptodate(self, task: Any) -> None:
        super().skip_uptodate(task)
        engine = engine_for(self.root)
        checked = engine.last_check.get(task.name)
        if checked is not None:
            decision, seconds = checked
            engine.events.append(task.name, decision.key.hex, Outcome.UPTODATE, seconds,
                                 peak_rss_mb())
        self._verdict(task)

    def add_success(self, task: Any) -> None:
        super().add_success(task)
        self._verdict(task)

    def _verdict(self, task: Any) -> None:
        """A check's result is what the user came for: say it, whatever ran or not."""
        if not task.name.startswith("verify:"):
            return
        model = task.name.split(":", 1)[1]
        report = read_json(Path(self.root) / "build" / model / "verify" / "report.json")
        if report is None:
            return
        verdict = "passed" if report.get("passed") else "FAILED"
        self.write(f"   {task.name}: {verdict}, mean token agreement "
                   f"{report.get('mean_agreement', 0):.2f} over {len(report.get('prompts', []))}"
                   f" prompts (minimum {report.get('min_token_agreement')}); "
                   f"build/{model}/verify/report.json\n")

    def add_failure(self, task: Any, fail: Any) -> None:
        if isinstance(fail, TaskFailed) and not fail.traceback:
            self.write(f"ERROR: {fail.message}\n")  # ours: already one line, no traceback
            return
        super().add_failure(task, fail)

    def complete_run(self) -> None:
        try:
            super().complete_run()
        finally:
            self._lock.release()
