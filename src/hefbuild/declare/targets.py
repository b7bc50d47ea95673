"""Target platforms as declarations: `targets/<name>.toml`.

A target is its stage chain and nothing else the engine has to know: each stage names its
rule program (under `rules/`), the upstream stages whose outputs it reads (`inputs`), the
stages that must merely succeed first (`after`), the outputs it must leave (a trailing `/`
is a non-empty folder), its typed parameters, and the toolchain it runs in unless a model
says otherwise; a stage may name one of its outputs as the report a person reads (`report`,
with the title the report page gives it). The `[target]` table says which stage is the
model's check, whether checks are doit's default tasks, what a device check's report names
as the device and as its test double, which stage's file is the deployable artifact (and
the alias task that names it), and `[[keep]]` which outputs may be copied into the project
tree. `[watch]`
(with `[[watch.phases]]`) is the table that names a running stage's phase from its log
lines (phases.py): handed to the watch of every stage of the target.

A project's own `targets/` wins; a target it does not declare is taken from the targets
that come with hefbuild (the `targets/` folder of its source tree), so a project holding
only models and toolchains builds as before.

Loading checks every key and raises `SpecError` naming the file and the key path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import _only_keys, _table, names, one_of, read_toml, string, table_list
from .layout import BUILTIN_TARGETS, TARGETS_DIR
from .param_groups import group_tables
from .param_schema import parse_params
from .params import ParamDef
from .params import ParamType as T
from .phases import PhaseTable, parse_watch
from .resources import KEY as RESOURCES
from .resources import parse_resources

# Keys every [stages.<stage>] table of a model accepts besides the stage's own parameters:
# where it runs and under which limits. `timeout` and `memory` never enter a key (they
# decide whether a stage finishes, not what it makes); `gpu` does (a CPU-only run differs).
COMMON_STAGE_KEYS = {
    "toolchain": ParamDef(T.STR, doc="toolchain the stage runs in (a file in toolchain/)"),
    "timeout": ParamDef(T.DURATION, doc="kill the stage after this long (not part of the key)"),
    "memory": ParamDef(T.SIZE, doc="kill the stage above this resident memory (not part of "
                                   "the key)"),
    "gpu": ParamDef(T.BOOL, doc="whether the stage gets a GPU (part of the key)"),
}

_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
# `{method}` in a report_title: the report's own field of that name (report/checks.py).
TITLE_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_TOP_KEYS = {"target", "stages", "keep", "watch"}
_TARGET_KEYS = {"description", "artifact", "check", "default_checks", "test_double", "device"}
_ARTIFACT_KEYS = {"alias", "stage", "file", "group_doc"}
_STAGE_KEYS = {"name", "rule", "inputs", "after", "outputs", "toolchain", "gpu", "source",
               "group_doc", "report", "report_title", "params", "param_groups", "code",
               RESOURCES}
_KEEP_KEYS = {"name", "stage", "output", "dest", "group_doc"}



@dataclass(frozen=True)
class StageReport:
    """The output of a stage a person reads (a JSON file), and how the report page heads it."""

    file: str
    title: str = ""


@dataclass(frozen=True)
class StageDef:
    name: str
    rule: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: dict[str, ParamDef] = field(default_factory=dict)
    toolchain: str = "host"
    gpu: bool = False  # wants a GPU; a model may say otherwise
    # Stages that must succeed before this one runs, whose outputs it does not read: an
    # order (and a gate), not an input, so they are neither in its key nor mounted.
    after: tuple[str, ...] = ()
    source: bool = False  # reads the model's [source] (the only stage with network access)
    group_doc: str = ""  # what `doit list` says of the group of this stage
    report: StageReport | None = None  # shown on the report page (`doit report`)
    resources: dict[str, float] = field(default_factory=dict)  # where it may run (no key)
    # Files under rules/ the rule runs or ships but does not import (a script it copies to
    # a device): part of its code, so in its key and sent with it to a cluster node.
    code: tuple[str, ...] = ()


@dataclass(frozen=True)
class Artifact:
    """The deployable file: `stage`'s output `file`; `alias:<model>` names it, if set."""

    stage: str
    file: str
    alias: str = ""
    group_doc: str = ""


@dataclass(frozen=True)
class Keep:
    """A task `name:<model>` copying `stage`'s `output` to the project file `dest`."""

    name: str
    stage: str
    output: str
    dest: str  # project-relative; `{model}` is the model's name
    group_doc: str = ""


@dataclass(frozen=True)
class TargetSpec:
    name: str
    file: str  # shown in errors
    stages: tuple[StageDef, ...]
    description: str = ""
    check: str | None = None  # the stage whose report.json is the model's verdict
    default_checks: bool = False  # the check tasks are doit's default tasks
    # What answered a check whose report says `device.fake`: named in its verdict line.
    test_double: str = ""
    # What answered a device check whose report does not say `device.fake`.
    device: str = ""
    artifact: Artifact | None = None
    keep: tuple[Keep, ...] = ()
    phases: PhaseTable | None = None  # names a running stage's phase from its log lines

    def stage_defs(self) -> dict[str, StageDef]:
        return {s.name: s for s in self.stages}

    def source_stage(self) -> str | None:
        return next((s.name for s in self.stages if s.source), None)


def load_targets(root: Path | None) -> dict[str, TargetSpec]:
    """The project's targets, and hefbuild's own for every name the project lacks."""
    found: dict[str, Path] = {}
    folders = [BUILTIN_TARGETS] + ([root / TARGETS_DIR] if root is not None else [])
    for folder in folders:
        for path in sorted(folder.glob("*.toml")) if folder.is_dir() else ():
            found[path.stem] = path  # later folders (the project's) win
    own = root / TARGETS_DIR if root is not None else None
    return {name: load_target(path, root if own and path.parent == own else None)
            for name, path in sorted(found.items())}


def stage_defs(root: Path | None, target: str) -> dict[str, StageDef]:
    """A target's stages by name (for tests and tools that want one chain)."""
    return load_targets(root)[target].stage_defs()


def load_target(path: Path, root: Path | None = None) -> TargetSpec:
    """One target file; `root`: the project it belongs to, whose rules/ must hold its rules."""
    shown = _shown(path, root)
    doc = read_toml(path, shown)
    _only_keys(doc, _TOP_KEYS, shown, "")
    head = _table(doc, "target", shown, "target")
    _only_keys(head, _TARGET_KEYS, shown, "target")
    stages = _stages(doc.get("stages"), shown, root)
    names = [s.name for s in stages]
    check = head.get("check")
    if check is not None and check not in names:
        raise SpecError(shown, "target.check", one_of("a stage of this target", names, check))
    default_checks = head.get("default_checks", False)
    if not isinstance(default_checks, bool):
        raise SpecError(shown, "target.default_checks", f"true or false, got {default_checks!r}")
    if default_checks and check is None:
        raise SpecError(shown, "target.default_checks", "needs target.check (the stage run)")
    artifact = _artifact(head.get("artifact"), stages, shown)
    keep = tuple(_keep(k, i, stages, shown) for i, k in enumerate(table_list(doc, "keep", shown)))
    _no_clash(stages, artifact, keep, shown)
    return TargetSpec(path.stem, shown, stages, string(head, "description", shown, "target"),
                      check, default_checks, string(head, "test_double", shown, "target"),
                      string(head, "device", shown, "target"), artifact, keep,
                      parse_watch(doc.get("watch"), shown))


def _shown(path: Path, root: Path | None) -> str:
    try:
        return path.relative_to(root if root is not None else BUILTIN_TARGETS.parent).as_posix()
    except ValueError:
        return str(path)


def _stages(value: Any, shown: str, root: Path | None) -> tuple[StageDef, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, dict) for v in value):
        raise SpecError(shown, "stages", "a non-empty array of tables ([[stages]])")
    stages: list[StageDef] = []
    for i, table in enumerate(value):
        stages.append(_stage(table, f"stages[{i}]", [s.name for s in stages], shown, root))
    names = [s.name for s in stages]
    for i, s in enumerate(stages):
        for dep in s.after:
            if dep not in names or dep == s.name:
                raise SpecError(shown, f"stages[{i}].after",
                                one_of("another stage of this target", names, dep))
    _no_cycle(stages, shown)
    if sum(s.source for s in stages) > 1:
        raise SpecError(shown, "stages", "at most one stage with source = true")
    return tuple(stages)


def _stage(table: dict[str, Any], where: str, earlier: list[str], shown: str,
           root: Path | None) -> StageDef:
    _only_keys(table, _STAGE_KEYS, shown, where)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(shown, f"{where}.name", f"a lower-case name like 'make', got {name!r}")
    if name in earlier:
        raise SpecError(shown, f"{where}.name", f"stage {name!r} is declared twice")
    rule = string(table, "rule", shown, where)
    if not rule:
        raise SpecError(shown, f"{where}.rule", "the stage's program, a path under rules/")
    if root is not None and not (root / "rules" / rule).is_file():
        raise SpecError(shown, f"{where}.rule", f"rules/{rule} does not exist")
    code = names(table, "code", where, shown)
    for extra in code:
        if root is not None and not (root / "rules" / extra).is_file():
            raise SpecError(shown, f"{where}.code", f"files under rules/; rules/{extra} "
                            f"does not exist")
    inputs = names(table, "inputs", where, shown)
    for up in inputs:
        if up not in earlier:
            raise SpecError(shown, f"{where}.inputs",
                            one_of(f"a stage declared before {name}", earlier, up))
    outputs = names(table, "outputs", where, shown)
    if not outputs:
        raise SpecError(shown, f"{where}.outputs", "at least one output file (or folder/)")
    flags = {k: table.get(k, False) for k in ("gpu", "source")}
    for key, flag in flags.items():
        if not isinstance(flag, bool):
            raise SpecError(shown, f"{where}.{key}", f"true or false, got {flag!r}")
    own = table.get("params", {})
    if not isinstance(own, dict):
        raise SpecError(shown, f"{where}.params", f"a table of parameters, got {own!r}"[:120])
    grouped = group_tables(table, where, shown, BUILTIN_TARGETS, root, set(COMMON_STAGE_KEYS))
    params = parse_params({**grouped, **own}, f"stages.{name}.params", shown,
                          COMMON_STAGE_KEYS)
    return StageDef(name, rule, inputs, outputs, params,
                    string(table, "toolchain", shown, where, "host"), flags["gpu"],
                    names(table, "after", where, shown), flags["source"],
                    string(table, "group_doc", shown, where),
                    _report(table, name, outputs, where, shown),
                    parse_resources(table.get(RESOURCES, {}), shown, f"{where}.{RESOURCES}"),
                    code)


def _report(table: dict[str, Any], name: str, outputs: tuple[str, ...], where: str,
            shown: str) -> StageReport | None:
    """`report` names an output the report page reads as JSON: a file, not a folder."""
    file = string(table, "report", shown, where)
    title = string(table, "report_title", shown, where)
    if "{" in TITLE_FIELD.sub("", title) or "}" in TITLE_FIELD.sub("", title):
        raise SpecError(shown, f"{where}.report_title", f"text with `{{field}}` naming a "
                        f"top-level field of the report (e.g. {{method}}), got {title!r}")
    if not file:
        if title:
            raise SpecError(shown, f"{where}.report_title", "needs report (the file it heads)")
        return None
    files = [o for o in outputs if o.endswith(".json")]
    if file not in files:
        raise SpecError(shown, f"{where}.report", one_of(f"a JSON file among the outputs of "
                                                          f"{name}", files, file))
    return StageReport(file, title)


def _no_cycle(stages: list[StageDef], shown: str) -> None:
    """`after` may point forward (compile waits for fidelity); it must not loop back."""
    deps = {s.name: (*s.inputs, *s.after) for s in stages}
    state: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise SpecError(shown, "stages", "a cycle: " + " -> ".join((*path, name)))
        state[name] = 1
        for dep in deps[name]:
            visit(dep, (*path, name))
        state[name] = 2

    for s in stages:
        visit(s.name, ())


def _output_of(stage: Any, output: Any, stages: tuple[StageDef, ...], shown: str,
               where: str, out_key: str) -> StageDef:
    by_name = {s.name: s for s in stages}
    if stage not in by_name:
        raise SpecError(shown, f"{where}.stage", one_of("a stage of this target",
                                                         list(by_name), stage))
    if output not in by_name[stage].outputs:
        raise SpecError(shown, f"{where}.{out_key}",
                        one_of(f"an output of {stage}", list(by_name[stage].outputs), output))
    return by_name[stage]


def _artifact(value: Any, stages: tuple[StageDef, ...], shown: str) -> Artifact | None:
    if value is None:
        return None
    where = "target.artifact"
    if not isinstance(value, dict):
        raise SpecError(shown, where, "a table {stage, file, alias}")
    _only_keys(value, _ARTIFACT_KEYS, shown, where)
    _output_of(value.get("stage"), value.get("file"), stages, shown, where, "file")
    alias = string(value, "alias", shown, where)
    if alias and not _NAME_RE.match(alias):
        raise SpecError(shown, f"{where}.alias", f"a lower-case name, got {alias!r}")
    return Artifact(value["stage"], value["file"], alias, string(value, "group_doc", shown, where))


def _keep(table: dict[str, Any], i: int, stages: tuple[StageDef, ...], shown: str) -> Keep:
    where = f"keep[{i}]"
    _only_keys(table, _KEEP_KEYS, shown, where)
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise SpecError(shown, f"{where}.name", f"a lower-case task name, got {name!r}")
    _output_of(table.get("stage"), table.get("output"), stages, shown, where, "output")
    dest = string(table, "dest", shown, where)
    if not dest or Path(dest).is_absolute() or ".." in Path(dest).parts:
        raise SpecError(shown, f"{where}.dest", f"a project-relative path, got {dest!r}")
    return Keep(name, table["stage"], table["output"], dest, string(table, "group_doc", shown,
                                                                   where))


def _no_clash(stages: tuple[StageDef, ...], artifact: Artifact | None, keep: tuple[Keep, ...],
              shown: str) -> None:
    """Task names are `<name>:<model>`: an alias or a keep task may not be a stage too."""
    taken = {s.name for s in stages}
    extra = [("target.artifact.alias", artifact.alias)] if artifact and artifact.alias else []
    extra += [(f"keep[{i}].name", k.name) for i, k in enumerate(keep)]
    for where, name in extra:
        if name in taken:
            raise SpecError(shown, where, f"a name no stage or other task has, got {name!r}")
        taken.add(name)


