"""hefbuild as doit tasks: the task dicts and the actions they run.

`dodo.py` calls `project_tasks(root)` and gets `DOIT_CONFIG` plus one task creator. Task
actions and up-to-date checks are module-level functions taking (root, task) so they
survive pickling under `doit -n N -P process`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed

from .doit_hooks import DigestChecker, HefbuildReporter
from .errors import HefbuildError
from .plan import Action, artifact_task, task_name
from .project import STATE_DIR, Project
from .selection import models_named
from .session import actions_at, engine_for, fast_path_at, only_models, project_at

_interrupted: list[str] = []  # the task Ctrl-C stopped; later ones (doit -c) do not start


def run_task(root: str, task: str) -> dict[str, Any] | TaskFailed:
    if _interrupted:
        return TaskFailed(f"{task}: not started, the run was interrupted at {_interrupted[0]}")
    try:
        return engine_for(root).run(task, force=forced(task, sys.argv[1:]))
    except HefbuildError as exc:
        return TaskFailed(str(exc))
    except KeyboardInterrupt:
        _interrupted.append(task)
        return TaskFailed(f"{task}: interrupted (Ctrl-C); the stage was stopped and nothing "
                          f"of it was recorded")


def forced(task: str, argv: list[str]) -> bool:
    """`doit -a TASK` rebuilds TASK itself, as in doit; its dependencies are still
    restored or left as they are (re-running a 4-hour compile to re-check a device
    is never what `-a verify:x` means)."""
    if not {"-a", "--always-execute"} & set(argv):
        return False
    named = {a for a in argv if not a.startswith("-")}
    return task in named or task.split(":")[0] in named


def check_uptodate(root: str, task: str) -> bool:
    """The last verdict while nothing it read changed; else the engine decides."""
    try:
        action = actions_at(root)[task]
        if fast_path_at(root).answer(task, action.toolchain) is not None:
            return True
        return engine_for(root).is_uptodate(task)
    except KeyboardInterrupt:
        print(f"hefbuild: interrupted (Ctrl-C) while checking {task}", file=sys.stderr)
        raise SystemExit(130) from None


# doit inspects every uptodate callable's signature once per task (for its magic `task`
# and `values` arguments); a signature set once is returned without re-deriving it.
check_uptodate.__signature__ = inspect.signature(check_uptodate)  # type: ignore[attr-defined]


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
    selected = models_named(sys.argv[1:], set(project.models), set(project.toolchains))
    only_models(str(project.paths.root), selected)
    config = {
        # doit's own records decide nothing here (the uptodate check compares keys, and the
        # project lock keeps one doit per project): one JSON file read once beats a query
        # and a JSON decode per task.
        "dep_file": f"{STATE_DIR}/doit.json",
        "backend": "json",
        "check_file_uptodate": DigestChecker.bound_to(str(project.paths.root)),
        "reporter": HefbuildReporter.bound_to(str(project.paths.root)),
        "default_tasks": [task_name("verify", m.name) for m in project.models.values()
                          if m.target == "cpu-ort"],
    }

    def task_hefbuild() -> Iterator[dict]:
        yield from _task_dicts(project, selected)

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


def _task_dicts(project: Project, selected: set[str] | None) -> Iterator[dict]:
    root = str(project.paths.root)
    yield from _image_tasks(project)
    by_model: dict[str, list[Action]] = {}
    for action in actions_at(root).values():
        by_model.setdefault(action.model, []).append(action)
    for model in project.models.values():
        if selected is not None and model.name not in selected:
            continue
        for action in by_model.get(model.name, []):
            yield _stage_task(project, action)
        if model.target == "hailo10h":
            yield {"basename": "hef", "name": model.name, "actions": None,
                   "task_dep": [artifact_task(model)],
                   "doc": f"the HEF of {model.name} (build/{model.name}/compile/model.hef)"}
            yield {"basename": "placement", "name": model.name,
                   "actions": [(save_placement, [root, model.name])],
                   "task_dep": [artifact_task(model)], "uptodate": [False],
                   "doc": f"keep the compiler's placement of {model.name} for replay "
                          f"(placements/{model.name}.auto.alls)"}
        if model.source.hub:
            yield {"basename": "lock", "name": model.name,
                   "actions": [(lock_hub_model, [root, model.name])], "uptodate": [False],
                   "doc": f"pin {model.source.hub}@{model.source.revision} to a commit "
                          f"and file digests (needs hub access or the revision cached)"}
        elif model.source.path:
            yield {"basename": "lock", "name": model.name,
                   "actions": [(lock_hub_model, [root, model.name])], "uptodate": [False],
                   "doc": f"record the sha256 of every checkpoint file in "
                          f"{model.source.path}"}


def _stage_task(project: Project, action: Action) -> dict:
    """No file_dep: the rule's code and file parameters are in the key, which the uptodate
    check compares (and doit would stat and look up each file a second time)."""
    root = str(project.paths.root)
    return {
        "basename": action.stage,
        "name": action.model,
        "actions": [(run_task, [root, action.task])],
        "uptodate": [(check_uptodate, [root, action.task])],
        "task_dep": [task_name(up, action.model) for up in action.upstream],
        "doc": f"{action.stage} {action.model} ({action.target}, toolchain {action.toolchain})",
    }
