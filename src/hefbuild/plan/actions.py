"""The plan: one `Action` per (model, stage), as pure data derived from the declarations.

Planning reads no file contents and starts no process: digests are taken later, when a
task's up-to-date check or action runs, so `doit list` costs only TOML parsing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..declare.params import ParamType
from ..declare.project import Project
from ..declare.specs import ModelSpec, StageLimits

if TYPE_CHECKING:
    import ast


@dataclass(frozen=True)
class Action:
    model: str
    stage: str
    target: str
    rule: str  # path under rules/
    upstream: tuple[str, ...]  # stage names of the same model
    outputs: tuple[str, ...]
    params: dict[str, Any]
    file_params: dict[str, str]  # param name -> project-relative path
    source: dict[str, Any] | None  # only the target's source stage sees it; others see its outputs
    toolchain: str
    limits: StageLimits = StageLimits()
    # Stages of the same model that must succeed first; not inputs: neither in the key
    # nor mounted (doit orders by them, the engine never looks at them).
    after: tuple[str, ...] = ()
    code: tuple[str, ...] = ()  # more files of the rule's code, under rules/ (targets.py)

    @property
    def task(self) -> str:
        return task_name(self.stage, self.model)

    @property
    def out_dir(self) -> str:
        return f"build/{self.model}/{self.stage}"


def task_name(stage: str, model: str) -> str:
    return f"{stage}:{model}"


def plan_model(model: ModelSpec) -> list[Action]:
    actions = []
    for sdef in model.pipeline.stages:
        params = model.stages[sdef.name]
        files = {k: v for k, v in params.items()
                 if k in sdef.params and sdef.params[k].type is ParamType.FILE}
        source = _source_description(model) if sdef.source else None
        if source and "synthetic" in source and "corpus" in source["synthetic"]:
            files["corpus"] = source["synthetic"]["corpus"]
        limits = model.stage_limits.get(sdef.name)  # loading sets each stage's
        actions.append(Action(
            model.name, sdef.name, model.target, sdef.rule, sdef.inputs, sdef.outputs,
            params, files, source, model.stage_toolchains[sdef.name],
            StageLimits(gpu=sdef.gpu) if limits is None else limits, sdef.after, sdef.code,
        ))
    return actions


def _source_description(model: ModelSpec) -> dict[str, Any]:
    src = model.source
    if src.synthetic is not None:
        return {"synthetic": dict(src.synthetic)}
    if src.path is not None:  # the files' names and digests, never where the folder is
        return {"local": True, "files": dict(src.files)}
    return {"hub": src.hub, "revision": src.revision, "files": dict(src.files)}


def plan_project(project: Project) -> dict[str, Action]:
    return {a.task: a for m in project.models.values() for a in plan_model(m)}


def artifact_task(model: ModelSpec) -> str | None:
    """The task whose output is the model's deployable file, if its target names one."""
    art = model.pipeline.artifact
    return task_name(art.stage, model.name) if art else None


def rule_code_files(rules_dir: Path, rule: str, code: tuple[str, ...] = ()) -> list[Path]:
    """The rule file, its declared `code` files and the `rules/common` modules they import,
    transitively."""
    common = rules_dir / "common"
    seen: dict[Path, None] = {}
    todo = [rules_dir / rule, *(rules_dir / c for c in code)]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen[path] = None
        in_common = path.parent == common
        st = path.stat()
        imports = _common_imports(path, in_common, st.st_mtime_ns, st.st_size)
        todo += [common / f"{name}.py" for name in imports]
    if len(seen) > 1 and (common / "__init__.py").is_file():
        seen[common / "__init__.py"] = None
    return sorted(seen)


@lru_cache(maxsize=1024)
def _common_imports(path: Path, in_common: bool, mtime_ns: int, size: int) -> frozenset[str]:
    """Names of `rules/common` modules that a file imports, in any import spelling.
    Memoized per file version: many rules import the same helpers."""
    import ast  # 6 ms: only paid when a rule's code is looked at

    try:
        tree = ast.parse(_import_statements(path.read_text(encoding="utf-8")))
    except SyntaxError:
        return frozenset()  # the rule will fail when run; its own bytes are still in the key
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names
                      if a.name.startswith("common.")}
        elif isinstance(node, ast.ImportFrom):
            names |= _from_import(node, in_common)
    return frozenset(names)


def _import_statements(source: str) -> str:
    """Only the import statements of a module, dedented: parsing the whole file with `ast`
    on every doit invocation would cost more than the rest of a no-op build."""
    kept: list[str] = []
    open_paren = False
    for line in source.splitlines():
        stripped = line.strip()
        if open_paren or stripped.startswith(("import ", "from ")):
            kept.append(stripped)
            open_paren = (open_paren or "(" in stripped) and ")" not in stripped
            if stripped.endswith("\\"):
                open_paren = True
    return "\n".join(kept)


def _from_import(node: ast.ImportFrom, in_common: bool) -> set[str]:
    module = node.module or ""
    relative_to_common = in_common and node.level == 1
    if node.level == 0 and module == "common" or relative_to_common and not module:
        return {a.name for a in node.names}  # from common import x / from . import x
    if node.level == 0 and module.startswith("common."):
        return {module.split(".")[1]}
    if relative_to_common:
        return {module.split(".")[0]}  # from .x import y
    return set()
