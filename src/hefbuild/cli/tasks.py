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

from ..declare.project import STATE_DIR, Project
from ..declare.specs import ModelSpec
from ..declare.targets import Keep
from ..declare.variants import VARIANT_SEP
from ..errors import HefbuildError
from ..plan.actions import Action, artifact_task, task_name
from . import gcpause
from .depfile import SlimCodec
from .hooks import DigestChecker, HefbuildReporter
from .selection import left_out, models_named, unknown_task
from .session import actions_at, engine_for, fast_path_at, forced, only_models, project_at
from .stagemark import STAGE
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
        return engine_for(root).run(task, force=forced(task, sys.argv[1:]))
    except HefbuildError as exc:
        return TaskFailed(str(exc))
    except KeyboardInterrupt:
        _interrupted.append(task)
        return TaskFailed(f"{task}: interrupted (Ctrl-C); the stage was stopped and nothing "
                          f"of it was recorded")


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
    failed = fetch_output(root, task_name(stage, model), output)
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
    try:
        project = project_at(str(root.absolute()))
    except HefbuildError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    (project.paths.state).mkdir(exist_ok=True)
    selected = models_named(sys.argv[1:], set(project.models) | set(project.broken),
                            set(project.toolchains))
    _say_declaration_problems(project, selected)
    selected = _without_manual(project, selected)
    # With `selected`, every task word already names a task of one of those models.
    typo = unknown_task(sys.argv[1:], task_names(project, selected))
    if typo is not None:
        print(f"ERROR: {typo}", file=sys.stderr)
        raise SystemExit(3)
    only_models(str(project.paths.root), selected)
    config = {
        # A failed model must not stop the others (doit -c): each group ends with a table.
        "continue": True,
        # doit's own records decide nothing here (the uptodate check compares keys, and the
        # project lock keeps one doit per project): one JSON file read once beats a query
        # and a JSON decode per task.
        "dep_file": f"{STATE_DIR}/doit.json",
        "backend": "json",
        "codec_cls": SlimCodec,  # without the stages' results, which nothing reads back
        "check_file_uptodate": DigestChecker.bound_to(str(project.paths.root)),
        "reporter": HefbuildReporter.bound_to(str(project.paths.root)),
        # Named tasks run without the defaults: with `selected`, no other model is read.
        "default_tasks": [] if selected is not None else _default_tasks(project),
    }

    def task_hefbuild() -> Iterator[dict]:
        try:
            yield from _task_dicts(project, selected)
        finally:  # doit made a Task of each dict as it came: all of them are made
            gcpause.resume()

    task_hefbuild.__doc__ = "hefbuild stages (models/*.toml)"
    return config, task_hefbuild


def _default_tasks(project: Project) -> list[str]:
    return [task_name(m.pipeline.check, m.name) for m in project.models.values()
            if m.pipeline.default_checks and m.pipeline.check and not m.manual]


def task_names(project: Project, only: set[str] | None = None) -> set[str]:
    """Every task and group name the project's declarations make (no plan needed); with
    `only`, those of these models (and every image task)."""
    names: set[str] = set()
    models = project.models.values() if only is None else \
        [project.models[m] for m in sorted(only) if m in project.models]
    for model in models:
        bases = [s.name for s in model.pipeline.stages] + _extra_bases(model)
        if (model.source.hub or model.source.path) and not model.variant_of:
            bases.append("lock")
        names |= set(bases) | {f"{b}:{model.name}" for b in bases}
    images = {f"image:{tc.name}" for tc in project.toolchains.values()
              if tc.kind == "docker" and "context" in tc.image}
    return names | images | ({"image"} if images else set())


def _say_declaration_problems(project: Project, selected: set[str] | None) -> None:
    """A bad model file named on the command line stops the run with its one line (nothing
    is built or stored); any other one is one warning line, and its tasks are left out. Then
    a warning line per parameter a model of the run sets that no rule reads."""
    named = sorted(m for m in project.broken if selected is not None and m in selected
                   or m in _variants_named(sys.argv[1:]))
    if named:
        print(f"ERROR: {project.broken[named[0]]}", file=sys.stderr)
        raise SystemExit(3)
    for error in project.broken.values():
        print(f"WARNING: {error} (its tasks are left out)", file=sys.stderr)
    # Every model's at once when the run has them all (the project cache decodes them in
    # one go: one by one first, each would be decoded twice).
    models = project.models.values() if selected is None else \
        [project.models[m] for m in project.models if m in selected]
    for model in models:
        # a variant's are its base model's
        for line in getattr(model, "unread", ()):
            print(f"WARNING: {line}", file=sys.stderr)


def _without_manual(project: Project, selected: set[str] | None) -> set[str] | None:
    """A run of groups or defaults leaves out the manual models (said once, with why);
    naming one of their tasks runs it. Named tasks alone create only their models anyway."""
    if selected is not None:
        return selected
    out = left_out(sys.argv[1:], {n for n, m in project.models.items() if m.manual})
    if not out:
        return selected
    names = sorted(n for n in out if not project.models[n].variant_of)
    print(f"hefbuild: left out of this run, as their [model] manual says: {', '.join(names)} "
          f"(name a task to build one, e.g. `doit {_example(project, names[0])}`)",
          file=sys.stderr)
    return set(project.models) - out


def _example(project: Project, model: str) -> str:
    spec = project.models[model]
    return task_name(spec.pipeline.check or spec.pipeline.stages[-1].name, model)


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


def _image_tasks(project: Project) -> Iterator[dict]:
    root = str(project.paths.root)
    for tc in project.toolchains.values():
        if tc.kind == "docker" and "context" in tc.image:
            yield {"basename": "image", "name": tc.name,
                   "actions": [(build_toolchain_image, [root, tc.name])],
                   "uptodate": [(check_image_current, [root, tc.name])],
                   "doc": f"build the image of toolchain {tc.name} from {tc.image['context']} "
                          f"and pin its ID in toolchain/{tc.name}.lock.json"}


def _extra_bases(model: ModelSpec) -> list[str]:
    """The target's alias and keep tasks, beside its stages."""
    art = model.pipeline.artifact
    return ([art.alias] if art and art.alias else []) + [k.name for k in _keeps(model)]


def _keeps(model: ModelSpec) -> list[Keep]:
    """A variant keeps an output only where the file is its own (`{model}` in the dest names
    `<model>@<variant>`): it must never overwrite the base model's file."""
    return [k for k in model.pipeline.keep if not model.variant_of or "{model}" in k.dest]


def group_docs(project: Project, selected: set[str] | None = None) -> dict[str, str]:
    """What `doit list` says of each group: the first target (by name) that says it (of
    the `selected` models' targets: no other model's are read)."""
    docs: dict[str, str] = {}
    seen: set[int] = set()  # models of one target share its pipeline: each is read once
    models = [project.models[n] for n in (project.models if selected is None else selected)
              if n in project.models]
    for model in sorted(models, key=lambda m: m.target):
        spec = model.pipeline
        if id(spec) in seen:
            continue
        seen.add(id(spec))
        pairs = [(s.name, s.group_doc) for s in spec.stages]
        if spec.artifact and spec.artifact.alias:
            pairs.append((spec.artifact.alias, spec.artifact.group_doc))
        pairs += [(k.name, k.group_doc) for k in spec.keep]
        for name, doc in pairs:
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


def _task_dicts(project: Project, selected: set[str] | None) -> Iterator[dict]:
    tasks = list(_model_task_dicts(project, selected))
    yield from _group_heads({t["basename"] for t in tasks}, group_docs(project, selected))
    yield from tasks


def _model_task_dicts(project: Project, selected: set[str] | None) -> Iterator[dict]:
    root = str(project.paths.root)
    yield from _image_tasks(project)
    by_model: dict[str, list[Action]] = {}
    for action in actions_at(root).values():
        by_model.setdefault(action.model, []).append(action)
    for name in project.models if selected is None else [m for m in project.models
                                                          if m in selected]:
        model = project.models[name]
        for action in by_model.get(model.name, []):
            yield _stage_task(project, action)
        yield from _target_task_dicts(root, model)
        if model.variant_of:
            continue  # its source and lock are the base model's: `lock:<base>`
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


def _target_task_dicts(root: str, model: ModelSpec) -> Iterator[dict]:
    """The target's alias of its artifact (`<alias>:<model>`) and its keep tasks."""
    art, producer = model.pipeline.artifact, artifact_task(model)
    if art and art.alias and producer:
        where = f"build/{model.name}/{art.stage}/{art.file}"
        yield {"basename": art.alias, "name": model.name,
               "actions": [(fetch_output, [root, producer, art.file])], "task_dep": [producer],
               "doc": f"the {art.alias} of {model.name} ({where})"}
    for keep in _keeps(model):
        dest = keep.dest.format(model=model.name)
        yield {"basename": keep.name, "name": model.name,
               "actions": [(keep_output, [root, model.name, keep.name, keep.stage,
                                          keep.output, keep.dest])],
               "task_dep": [task_name(keep.stage, model.name)], "uptodate": [False],
               "doc": f"keep {keep.stage}'s {keep.output} of {model.name} in the project "
                      f"({dest})"}


def _stage_task(project: Project, action: Action) -> dict:
    """No file_dep: the rule's code and file parameters are in the key, which the uptodate
    check compares (and doit would stat and look up each file a second time)."""
    root = str(project.paths.root)
    return {
        "basename": action.stage,
        "name": action.model,
        "actions": [(run_task, [root, action.task])],
        "uptodate": [UptodateCheck(root, action.task)],
        "task_dep": [task_name(up, action.model) for up in (*action.upstream, *action.after)],
        "clean": [(clean_stage, [root, action.task])],
        "doc": f"{action.stage} {action.model} ({action.target}, toolchain {action.toolchain})",
        "meta": _STAGE_META,
    }


_STAGE_META = {"hefbuild": STAGE}  # what the reporter knows a stage task by (one dict for all)
