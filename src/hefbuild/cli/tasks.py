"""hefbuild as doit tasks: the task dicts and the actions they run.

`dodo.py` calls `project_tasks(root)` and gets `DOIT_CONFIG` plus one task creator. Task
actions and up-to-date checks are module-level functions taking (root, task) so they
survive pickling under `doit -n N -P process`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from doit.exceptions import TaskFailed

from ..declare.layout import STATE_DIR, VARIANT_SEP
from ..errors import HefbuildError
from . import gcpause
from .depfile import SlimCodec
from .hooks import DigestChecker, HefbuildReporter
from .selection import left_out, models_named, unknown_task
from .session import (
    actions_at,
    engine_for,
    fast_path_at,
    forced,
    only_models,
    project_at,
    use_table,
)
from .stagemark import STAGE
from .tasktable import Record, TaskTable, read_table
from .uptodate import UptodateCheck

_interrupted: list[str] = []  # the task Ctrl-C stopped; later ones (doit -c) do not start


def run_task(root: str, task: str, refused: str = "") -> dict[str, Any] | TaskFailed:
    """One stage, through the engine; `refused` is the preflight's reason it cannot start
    (cli/preflight.py sets it: the stage fails at once, before the engine is loaded)."""
    if refused:
        return TaskFailed(f"{task}: not started: {refused}")
    if _interrupted:
        return TaskFailed(f"{task}: not started, the run was interrupted at {_interrupted[0]}")
    try:
        engine, worker = engine_for(root), _in_worker()
        if worker:  # other workers wrote stages since this one last looked at any file
            engine.fast.forget_all()
        values = engine.run(task, force=forced(task, sys.argv[1:]))
        if worker:  # the verdict goes with the result to the process that saves it
            values = {**values, "verdict": engine.fast.portable(task)}
        return values
    except HefbuildError as exc:
        return TaskFailed(str(exc))
    except KeyboardInterrupt:
        _interrupted.append(task)
        return TaskFailed(f"{task}: interrupted (Ctrl-C); the stage was stopped and nothing "
                          f"of it was recorded")


def _in_worker() -> bool:
    """In a worker process of `doit -n N` (doit's default `-P process`)."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def lock_hub_model(root: str, model: str) -> dict[str, Any] | TaskFailed:
    from ..execute.hub import lock_model

    try:
        return lock_model(project_at(root), model)
    except HefbuildError as exc:
        return TaskFailed(str(exc))


def keep_output(root: str, model: str, name: str, stage: str, output: str,
                dest: str) -> dict[str, Any] | TaskFailed:
    """Copy a stage's last output into the project tree (a target's [[keep]]), where a
    parameter of a later build can name it (e.g. a placement to replay)."""
    src = Path(root) / "build" / model / stage / output
    rel = dest.format(model=model)
    target = Path(root) / rel
    failed = fetch_output(root, f"{stage}:{model}", output)
    if failed is not None:
        return failed
    if not src.is_file():
        return TaskFailed(f"{name}:{model}: no {stage} result in build/{model}/{stage}/")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_bytes(src.read_bytes())
    tmp.replace(target)
    return {name: rel}


def fetch_output(root: str, task: str, output: str) -> TaskFailed | None:
    """An output a person asked for (an artifact alias, a keep task) is in build/, even
    when the run left its bytes in the remote cache (`download = "minimal"`). A no-op
    reads one manifest and never loads the engine."""
    from ..engine.keys import IN_REMOTE, MANIFEST
    from ..store.events import read_json

    manifest = read_json(Path(root) / actions_at(root)[task].out_dir / MANIFEST)
    if manifest is None or output not in manifest.get(IN_REMOTE, ()):
        return None
    try:
        engine_for(root).fetch_outputs(task, [output])
    except HefbuildError as exc:
        return TaskFailed(str(exc))
    return None


def clean_stage(root: str, task: str, dryrun: bool = False) -> None:
    """`doit clean TASK`: the stage's folders leave build/; its result stays in the store,
    so the next `doit TASK` restores it without running the rule. With `--dry-run` (doit
    passes `dryrun` to a clean action that takes it) it says what it would remove."""
    import shutil

    from ..store.projectlock import ProjectLock

    if dryrun:
        where = _shown(root, _stage_folders(root, task)) or "nothing"
        print(f"{task}: would remove {where}; the store keeps its result")
        return
    lock = ProjectLock(Path(root) / STATE_DIR / "lock")
    lock.acquire(True, lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        gone = _stage_folders(root, task)
        for path in gone:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        fast = fast_path_at(root)
        fast.drop(task)
        fast.save()
    finally:
        lock.release()
    print(f"{task}: removed {_shown(root, gone) or 'nothing to remove'}; the store keeps its "
          f"result (`doit {task}` restores it)")


def _stage_folders(root: str, task: str) -> list[Path]:
    """What a stage has in build/: its result, and what its last failed run left."""
    action = actions_at(root)[task]
    folder = Path(root) / "build" / action.model
    return [p for p in (folder / action.stage, folder / f"{action.stage}.failed",
                        folder / f"{action.stage}.failed.log") if p.exists()]


def _shown(root: str, paths: list[Path]) -> str:
    return ", ".join(p.relative_to(root).as_posix() for p in paths)


def project_tasks(root: Path) -> tuple[dict[str, Any], Callable[[], Iterator[dict]]]:
    """DOIT_CONFIG and the task creator for the project at `root`; exits on bad input.
    Garbage collection pauses until doit has made every task (`gcpause`)."""
    gcpause.pause()
    try:
        return _project_tasks(root)
    except BaseException:
        gcpause.resume()
        raise


def _project_tasks(root: Path) -> tuple[dict[str, Any], Callable[[], Iterator[dict]]]:
    root_s = str(root.absolute())
    table = _table(root_s, None)
    selected = models_named(sys.argv[1:], set(table.models) | set(table.broken),
                            set(table.toolchains))
    table = _table(root_s, table, table.models if selected is None else
                   [m for m in table.models if m in selected])
    _say_declaration_problems(table, selected)
    selected = _without_manual(table, selected)
    # With `selected`, every task word already names a task of one of those models.
    typo = unknown_task(sys.argv[1:], task_names(table, selected))
    if typo is not None:
        print(f"ERROR: {typo}", file=sys.stderr)
        raise SystemExit(3)
    only_models(root_s, selected)
    use_table(root_s, table)
    config = {
        # A failed model must not stop the others (doit -c): each group ends with a table.
        "continue": True,
        # doit's own records decide nothing here (the uptodate check compares keys, and the
        # project lock keeps one doit per project): one JSON file read once beats a query
        # and a JSON decode per task.
        "dep_file": f"{STATE_DIR}/doit.json",
        "backend": "json",
        "codec_cls": SlimCodec,  # without the stages' results, which nothing reads back
        "check_file_uptodate": DigestChecker.bound_to(root_s),
        "reporter": HefbuildReporter.bound_to(root_s),
        # Named tasks run without the defaults: with `selected`, no other model is read.
        "default_tasks": [] if selected is not None else _default_tasks(table),
    }

    def task_hefbuild() -> Iterator[dict]:
        try:
            yield from _task_dicts(table, selected)
        finally:  # doit made a Task of each dict as it came: all of them are made
            gcpause.resume()

    task_hefbuild.__doc__ = "hefbuild stages (models/*.toml)"
    return config, task_hefbuild


def _table(root: str, table: TaskTable | None, models: list[str] = ()) -> TaskTable:
    """The task table with the groups of `models`: the last one while nothing it was made
    from changed, else made from the declarations (their errors end the run here)."""
    table = table or read_table(root)
    if table is not None and table.covers(models):
        return table
    from .tablemake import make_table

    try:
        project = project_at(root)
    except HefbuildError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    project.paths.state.mkdir(exist_ok=True)
    table = make_table(project, models, table)
    if models:  # the first call, for the names of the models, has no group to keep yet
        table.save()
    return table


def _default_tasks(table: TaskTable) -> list[str]:
    groups = (table.group(m) for m in table.models)
    return [g["default"] for g in groups if g["default"] and not g["manual"]]


def task_names(table: TaskTable, only: set[str] | None = None) -> set[str]:
    """Every task and group name the project's declarations make (no plan needed); with
    `only`, those of these models (and every image task)."""
    models = table.models if only is None else [m for m in sorted(only) if m in table.models]
    names = {n for rec in table.records(models) for n in (rec[1], f"{rec[1]}:{rec[2]}")}
    images = {f"image:{rec[2]}" for rec in table.images}
    return names | images | ({"image"} if images else set())


def _say_declaration_problems(table: TaskTable, selected: set[str] | None) -> None:
    """A bad model file named on the command line stops the run with its one line (nothing
    is built or stored); any other one is one warning line, and its tasks are left out. Then
    a warning line per parameter a model of the run sets that no rule reads."""
    named = sorted(m for m in table.broken if selected is not None and m in selected
                   or m in _variants_named(sys.argv[1:]))
    if named:
        print(f"ERROR: {table.broken[named[0]]}", file=sys.stderr)
        raise SystemExit(3)
    for error in table.broken.values():
        print(f"WARNING: {error} (its tasks are left out)", file=sys.stderr)
    for model in _of_run(table, selected):
        for line in table.group(model)["unread"]:
            print(f"WARNING: {line}", file=sys.stderr)


def _of_run(table: TaskTable, selected: set[str] | None) -> list[str]:
    """The models of a run, in the declarations' order."""
    return table.models if selected is None else [m for m in table.models if m in selected]


def _without_manual(table: TaskTable, selected: set[str] | None) -> set[str] | None:
    """A run of groups or defaults leaves out the manual models (said once, with why);
    naming one of their tasks runs it. Named tasks alone create only their models anyway."""
    if selected is not None:
        return selected
    out = left_out(sys.argv[1:], {m for m in table.models if table.group(m)["manual"]})
    if not out:
        return selected
    names = sorted(n for n in out if not table.group(n)["variant_of"])
    print(f"hefbuild: left out of this run, as their [model] manual says: {', '.join(names)} "
          f"(name a task to build one, e.g. `doit {table.group(names[0])['example']}`)",
          file=sys.stderr)
    return set(table.models) - out


def _variants_named(argv: list[str]) -> set[str]:
    """The base models of the variants a command line names (`<task>:<model>@<variant>`): a
    broken base file is the variant's error too."""
    return {w.partition(":")[2].partition(VARIANT_SEP)[0] for w in argv
            if VARIANT_SEP in w.partition(":")[2]}


def build_toolchain_image(root: str, name: str) -> dict[str, Any] | TaskFailed:
    from ..execute.images import build_image

    try:
        return build_image(project_at(root), name)
    except HefbuildError as exc:
        return TaskFailed(str(exc))


def check_image_current(root: str, name: str) -> bool:
    from ..execute.images import image_is_current

    return image_is_current(project_at(root), name)


def group_docs(table: TaskTable, models: list[str]) -> dict[str, str]:
    """What `doit list` says of each group: the first target (by name) of these models'
    that says it."""
    docs: dict[str, str] = {}
    seen: set[str] = set()  # models of one target share its docs: each is read once
    for model in sorted(models, key=lambda m: table.group(m)["target"]):
        group = table.group(model)
        if group["target"] in seen:
            continue
        seen.add(group["target"])
        for name, doc in group["docs"]:
            if doc:
                docs.setdefault(name, doc)
    return {**docs, **GROUP_DOCS}


# What `doit list` says of the groups hefbuild itself makes (a group: every model's task).
GROUP_DOCS = {
    "lock": "pin each hub or local model's files (commit and SHA-256s)",
    "image": "build and pin each docker toolchain's image",
}


def _group_heads(basenames: set[str], docs: dict[str, str]) -> Iterator[dict]:
    """A dict with `name: None` is doit's group task itself: its own description."""
    for base in sorted(basenames):
        yield {"basename": base, "name": None,
               "doc": docs.get(base, f"the {base} stage of every model")}


def _task_dicts(table: TaskTable, selected: set[str] | None) -> Iterator[dict]:
    root, models = table.root, _of_run(table, selected)
    records = [*table.images, *table.records(models)]
    yield from _group_heads({r[1] for r in records}, group_docs(table, models))
    for record in records:
        yield task_dict(root, record)


def task_dict(root: str, record: Record) -> dict:
    """The doit task of a record of the task table."""
    kind, basename, name, args, deps, doc = record
    if kind == "stage":
        return _stage_dict(root, basename, name, args[0], deps, doc)
    task = {"basename": basename, "name": name, "doc": doc,
            "actions": [(_ACTIONS[kind], [root, *args])]}
    if deps:
        task["task_dep"] = list(deps)
    if kind == "image":
        task["uptodate"] = [(check_image_current, [root, *args])]
    elif kind != "alias":  # an alias always brings its file (a no-op reads one manifest)
        task["uptodate"] = [False]
    return task


def _stage_dict(root: str, stage: str, model: str, task: str, deps: tuple, doc: str) -> dict:
    return {
        "basename": stage,
        "name": model,
        "actions": [(run_task, [root, task])],
        "uptodate": [UptodateCheck(root, task)],
        "task_dep": list(deps),
        "clean": [(clean_stage, [root, task])],
        "doc": doc,
        "meta": _STAGE_META,
    }


_STAGE_META = {"hefbuild": STAGE}  # what the reporter knows a stage task by (one dict for all)
_ACTIONS = {"image": build_toolchain_image, "alias": fetch_output, "keep": keep_output,
            "lock": lock_hub_model}
