"""The task table (cli/tasktable.py) made from the loaded declarations: what doit is told
of each task, as plain records (`cli/tasks.py` turns a record into doit's dict)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..declare.checks import check_facts
from ..declare.project import Project
from ..declare.specs import ModelSpec
from ..declare.targets import Keep
from ..execute.toolchain import stamp_recipe
from ..plan.actions import Action, artifact_task, plan_model, task_name
from ..plan.projectcache import named_files, shared_stamp_of, stamp_of
from .tasktable import Record, TaskTable, new_table


def make_table(project: Project, models: Iterable[str],
               previous: TaskTable | None = None) -> TaskTable:
    """A table with the groups of `models`; the groups of `previous` (a table whose stamp
    holds) are kept."""
    table = previous or _new(project)
    for name in models:
        if not table.covers([name]):
            table.add_group(name, model_group(project, project.models[name]))
    return table


def _new(project: Project) -> TaskTable:
    cache = project.settings.cache
    files = [str(p) for p in (cache.signing_key, cache.ca_bundle) if p is not None]
    head = {
        "models": list(project.models),
        "broken": dict(project.broken),
        "recipes": {n: stamp_recipe(tc) for n, tc in project.toolchains.items()},
        "images": list(image_records(project)),
        "uploads": bool(cache.remote and cache.upload),
        "shared": shared_stamp_of(project),
    }
    named = project.named or named_files(project)
    return new_table(str(project.paths.root), stamp_of(project), named, files, head)


def model_group(project: Project, model: ModelSpec) -> dict:
    actions = plan_model(model)
    spec = model.pipeline
    check = spec.check
    return {
        "records": [*(stage_record(a) for a in actions), *target_records(model),
                    *lock_records(model)],
        "toolchains": {a.task: a.toolchain for a in actions},
        "upstream": {a.task: [task_name(u, model.name) for u in a.upstream] for a in actions},
        "target": model.target,
        "checks": check_facts(spec),
        "docs": _doc_pairs(model),
        "manual": bool(model.manual),
        "variant_of": model.variant_of or "",
        "example": task_name(check or spec.stages[-1].name, model.name),
        "default": task_name(check, model.name) if spec.default_checks and check else "",
        "unread": list(getattr(model, "unread", ())),  # a variant's are its base model's
    }


def stage_record(action: Action) -> Record:
    """No file_dep: the rule's code and file parameters are in the key, which the uptodate
    check compares (and doit would stat and look up each file a second time)."""
    deps = tuple(task_name(up, action.model) for up in (*action.upstream, *action.after))
    return ("stage", action.stage, action.model, (action.task,), deps,
            f"{action.stage} {action.model} ({action.target}, toolchain {action.toolchain})")


def target_records(model: ModelSpec) -> Iterator[Record]:
    """The target's alias of its artifact (`<alias>:<model>`) and its keep tasks."""
    art, producer = model.pipeline.artifact, artifact_task(model)
    if art and art.alias and producer:
        where = f"build/{model.name}/{art.stage}/{art.file}"
        yield ("alias", art.alias, model.name, (producer, art.file), (producer,),
               f"the {art.alias} of {model.name} ({where})")
    for keep in keeps(model):
        dest = keep.dest.format(model=model.name)
        yield ("keep", keep.name, model.name,
               (model.name, keep.name, keep.stage, keep.output, keep.dest),
               (task_name(keep.stage, model.name),),
               f"keep {keep.stage}'s {keep.output} of {model.name} in the project ({dest})")


def lock_records(model: ModelSpec) -> Iterator[Record]:
    if model.variant_of:
        return  # its source and lock are the base model's: `lock:<base>`
    source = model.source
    if source.hub:
        yield ("lock", "lock", model.name, (model.name,), (),
               f"pin {source.hub}@{source.revision} to a commit and file digests (needs "
               f"hub access or the revision cached)")
    elif source.path:
        yield ("lock", "lock", model.name, (model.name,), (),
               f"record the sha256 of every checkpoint file in {source.path}")


def image_records(project: Project) -> Iterator[Record]:
    for tc in project.toolchains.values():
        if tc.kind == "docker" and "context" in tc.image:
            yield ("image", "image", tc.name, (tc.name,), (),
                   f"build the image of toolchain {tc.name} from {tc.image['context']} and "
                   f"pin its ID in toolchain/{tc.name}.lock.json")


def keeps(model: ModelSpec) -> list[Keep]:
    """A variant keeps an output only where the file is its own (`{model}` in the dest names
    `<model>@<variant>`): it must never overwrite the base model's file."""
    return [k for k in model.pipeline.keep if not model.variant_of or "{model}" in k.dest]


def _doc_pairs(model: ModelSpec) -> list[tuple[str, str]]:
    """What the target says of each of its groups (`doit list`)."""
    spec = model.pipeline
    pairs = [(s.name, s.group_doc) for s in spec.stages]
    if spec.artifact and spec.artifact.alias:
        pairs.append((spec.artifact.alias, spec.artifact.group_doc))
    return pairs + [(k.name, k.group_doc) for k in spec.keep]
