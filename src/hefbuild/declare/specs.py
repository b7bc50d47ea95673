"""Model declarations as typed values: `models/*.toml` (toolchains: toolchains.py, targets:
targets.py).

Loading checks every key against a schema and raises `SpecError` naming the file, the
key path and what was expected; nothing is built from a file that did not load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import SpecError
from .declfile import COMMIT_RE, SHA256_RE, _only_keys, _table, read_toml
from .mistakes import Mistakes
from .names import NAME_MAX, fits_name_max, key_part, model_name_problem
from .names import shown as shown_name
from .params import ParamDef, check_params, condition_text, conditions, shown_value
from .params import ParamType as T
from .resources import KEY as RESOURCES
from .resources import merged, parse_resources
from .targets import COMMON_STAGE_KEYS, StageDef, TargetSpec, load_targets
from .variants import VARIANT_SEP, merge_stages, parse_variants, variant_name

SYNTHETIC_KEYS: dict[str, ParamDef] = {
    "architecture": ParamDef(T.STR, required=True, choices=("llama", "qwen2", "mistral", "qwen3")),
    "seed": ParamDef(T.INT, required=True),
    "hidden_size": ParamDef(T.INT, 64, minimum=8),
    "intermediate_size": ParamDef(T.INT, 128, minimum=8),
    "num_hidden_layers": ParamDef(T.INT, 2, minimum=1),
    "num_attention_heads": ParamDef(T.INT, 4, minimum=1),
    "num_key_value_heads": ParamDef(T.INT, 2, minimum=1),
    "head_dim": ParamDef(T.INT, minimum=1),
    "vocab_size": ParamDef(T.INT, 384, minimum=300),
    # Rows of the embedding / lm_head when larger than the tokenizer (a >32000 vocabulary
    # exercises a compiler's lm_head split without a huge tokenizer).
    "model_vocab_size": ParamDef(T.INT, minimum=300),
    "max_position_embeddings": ParamDef(T.INT, 256, minimum=16),
    "rope_theta": ParamDef(T.FLOAT, minimum=1.0),
    "tie_word_embeddings": ParamDef(T.BOOL),
    "sliding_window": ParamDef(T.INT, minimum=1),
    "train_steps": ParamDef(T.INT, 0, minimum=0),
    "corpus": ParamDef(T.FILE, "data/corpus/tiny-stories.txt"),
}


@dataclass(frozen=True)
class SourceSpec:
    """Where the checkpoint comes from: a pinned hub revision, a local checkpoint folder, or a
    synthetic recipe. A hub or local source is fixed-output: every file's SHA-256 is known
    (declared under [source.files] or read from its lock file)."""

    hub: str | None = None
    revision: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # name -> sha256
    synthetic: dict[str, Any] | None = None
    # A local checkpoint folder, absolute (as declared: `~` expanded, relative to the
    # project root). Only fetch reads it; it never enters a key, so moving it changes nothing.
    path: str | None = None
    lock: str | None = None  # project-relative lock file, when not models/<model>.lock.json

    @property
    def pinned(self) -> bool:
        if self.synthetic is not None:
            return True
        if self.path is not None:
            return bool(self.files)
        return (self.revision is not None and COMMIT_RE.match(self.revision) is not None
                and bool(self.files))


@dataclass(frozen=True)
class StageLimits:
    """Where a stage runs and under which limits (from the model, else the toolchain)."""

    timeout_s: float | None = None
    memory_bytes: int | None = None
    gpu: bool = False
    resources: dict[str, float] = field(default_factory=dict)  # the target's, then the model's


@dataclass(frozen=True)
class ModelSpec:
    name: str
    file: str  # project-relative, for error lines
    target: str
    pipeline: TargetSpec  # the target's declaration, shared by its models
    toolchain: str
    source: SourceSpec
    stages: dict[str, dict[str, Any]]  # stage -> resolved params (defaults applied)
    stage_toolchains: dict[str, str]
    description: str = ""
    stage_limits: dict[str, StageLimits] = field(default_factory=dict)
    # A variant (`<model>@<name>`, from `[variants.<name>]`) names the model it derives from;
    # a base model carries its variants, fully resolved (the project lists them as models).
    variant_of: str = ""
    variants: tuple[ModelSpec, ...] = ()
    # Why this model is left out of groups and default runs (`doit`, `doit verify`); its
    # tasks run when named. Empty: an ordinary model.
    manual: str = ""
    # One warning line per parameter the file sets that no rule reads (left out of the key).
    unread: tuple[str, ...] = ()
    # The files it was loaded from (its TOML and its lock, there or not), project-relative,
    # each with its stat signature taken before it was read: what the no-op's verdicts of
    # its tasks depend on, in place of every model file (engine/fastpath.py).
    declared: tuple[tuple[str, bytes], ...] = field(default=(), compare=False)


def load_model(path: Path, root: Path, toolchains: set[str],
               targets: dict[str, TargetSpec] | None = None) -> ModelSpec:
    """`targets`: the project's, loaded once for all its models (else read here)."""
    shown = path.relative_to(root).as_posix()
    shown = shown if shown.isprintable() else repr(shown)  # a newline in a file name
    targets = load_targets(root) if targets is None else targets
    doc = read_toml(path, shown)
    if VARIANT_SEP in path.stem:
        raise SpecError(shown, "", f"a model file name without {VARIANT_SEP!r} (it separates "
                        f"a model from its variant in task names)")
    problem = model_name_problem(path.stem)
    if problem:
        raise SpecError(shown, "", problem)
    model = _table(doc, "model", shown, "model")
    mistakes = Mistakes()  # every independent mistake of the file, reported together
    with mistakes.check():
        _only_keys(doc, {"model", "source", "stages", "variants"}, shown, "")
    with mistakes.check():
        _only_keys(model, {"target", "toolchain", "description", "chat", "manual"}, shown,
                   "model")
    target = model.get("target")
    if target not in targets:
        mistakes.found.append(SpecError(shown, "model.target", "one of "
                                        + ", ".join(sorted(targets)) + f", got {target!r}"))
    toolchain, chat, manual, source = "host", False, "", SourceSpec()
    with mistakes.check():
        toolchain = _toolchain_name(model.get("toolchain", "host"), toolchains, shown,
                                    "model.toolchain")
    with mistakes.check():
        chat = _chat(model, shown)
    with mistakes.check():
        manual = _manual(model, shown)
    pipeline = targets.get(target) if isinstance(target, str) else None
    # A target without a source stage reads no checkpoint: its models need no [source].
    needs_source = "source" in doc or (pipeline is not None
                                       and pipeline.source_stage() is not None)
    with mistakes.check():
        if needs_source:
            source = _load_source(_table(doc, "source", shown, "source"), shown, root)
    if pipeline is None:  # its stages cannot be read without the target that declares them
        mistakes.raise_any()
    given: dict[str, Any] = {}
    with mistakes.check():
        given = _table(doc, "stages", shown, "stages")
    head = ModelSpec(path.stem, shown, target, pipeline, toolchain, source, {}, {},
                     str(model.get("description", "")), manual=manual)
    model_tc = toolchain if "toolchain" in model else None
    base, unread = head, {}
    with mistakes.check():
        base, unread = _staged(head, given, "stages", model_tc, toolchains, root, chat)
    variants, variant_unread = [], []
    for v in _parsed_variants(doc, shown, mistakes):
        with mistakes.check():
            spec, v_unread = _staged(
                replace(head, name=variant_name(head.name, v.name), variant_of=head.name),
                merge_stages(given, v.stages), f"variants.{v.name}.stages", model_tc,
                toolchains, root, chat)
            variants.append(spec)
            variant_unread.append((v, v_unread))
    mistakes.raise_any()
    for spec in (base, *variants):
        _check_keeps(spec)
    notes = unread_notes(unread, variant_unread)
    return replace(base, variants=tuple(variants), unread=notes)


def _parsed_variants(doc: dict[str, Any], shown: str, mistakes: Mistakes) -> list:
    with mistakes.check():
        return parse_variants(doc.get("variants", {}), shown)
    return []


def _chat(model: dict[str, Any], shown: str) -> bool:
    chat = model.get("chat", False)
    if not isinstance(chat, bool):
        raise SpecError(shown, "model.chat", f"true or false, got {chat!r}")
    return chat


Unread = dict[tuple[str, str], str]  # (stage, key) -> the line that says so, from its prefix


def unread_notes(base: Unread, variants: list[tuple[Any, Unread]]) -> tuple[str, ...]:
    """One warning line per parameter written in the file that no rule reads: a base
    `[stages]` key counts as read when any variant taking it reads it (a sweep's base may
    set what only some variants' methods read)."""
    notes = []
    for (stage, key), line in base.items():
        takers = [u for v, u in variants if key not in v.stages.get(stage, {})]
        if all((stage, key) in u for u in takers):
            notes.append(line)
    for v, u in variants:
        notes += [line for (stage, key), line in u.items() if key in v.stages.get(stage, {})]
    return tuple(notes)


def _manual(model: dict[str, Any], shown: str) -> str:
    reason = model.get("manual", "")
    if not isinstance(reason, str) or "\n" in reason or (reason == "" and "manual" in model):
        raise SpecError(shown, "model.manual", "one line saying why the model is left out of "
                        f"groups (it builds when named), got {reason!r}"[:160])
    return reason.strip()


def _check_keeps(model: ModelSpec) -> None:
    """A target's keep destination that names `{model}` fits the file system with this
    model's name (a long variant name plus a long suffix could not be written), with room
    for the `.tmp` it is written through."""
    for keep in model.pipeline.keep:
        dest = keep.dest.format(model=model.name)
        if "{model}" in keep.dest and not fits_name_max(dest + ".tmp"):
            where = f"variants.{key_part(model.name.partition(VARIANT_SEP)[2])}" \
                if model.variant_of else ""
            raise SpecError(model.file, where, f"a shorter name: target {model.target} keeps "
                            f"{keep.output} as {shown_name(dest)}, a file name over "
                            f"{NAME_MAX} bytes")


def _staged(head: ModelSpec, table: dict[str, Any], prefix: str, model_tc: str | None,
            toolchains: set[str], root: Path, chat: bool) -> tuple[ModelSpec, Unread]:
    """`head` with its stages resolved from `table`, which is at `prefix` in its file, and
    the parameters written there that no rule reads."""
    stages, stage_tcs, limits, unread = _load_stages(
        table, head.pipeline.stage_defs(), model_tc, toolchains, head.file, root, head.name,
        chat, prefix)
    return replace(head, stages=stages, stage_toolchains=stage_tcs, stage_limits=limits), unread


def _toolchain_name(value: Any, known: set[str], shown: str, key: str) -> str:
    if not isinstance(value, str) or value not in known:
        names = ", ".join(sorted(known))
        raise SpecError(shown, key, f"a toolchain declared in toolchain/ ({names}), got {value!r}")
    return value


def _load_source(table: dict[str, Any], shown: str, root: Path) -> SourceSpec:
    _only_keys(table, {"hub", "revision", "files", "synthetic", "path", "lock"}, shown,
               "source")
    if "synthetic" in table:
        if "hub" in table or "path" in table:
            other = "hub + revision" if "hub" in table else "path"
            raise SpecError(shown, "source", f"either {other} or [source.synthetic], not both")
        if "lock" in table or "files" in table:
            key = "lock" if "lock" in table else "files"
            raise SpecError(shown, f"source.{key}", "only with source.hub or source.path "
                            "(a synthetic model is made, not downloaded)")
        synthetic = _table(table, "synthetic", shown, "source.synthetic")
        params = check_params(synthetic, SYNTHETIC_KEYS, shown, "source.synthetic", root)
        return SourceSpec(synthetic=params)
    if "hub" in table and "path" in table:
        raise SpecError(shown, "source", "either hub + revision or path, not both")
    files = _table(table, "files", shown, "source.files")
    for name, sha in files.items():
        if not isinstance(sha, str) or not SHA256_RE.match(sha):
            raise SpecError(shown, f"source.files.{name}", "a sha256 hex digest")
    lock = _source_lock(table.get("lock"), shown)
    if "path" in table:
        if "revision" in table:
            raise SpecError(shown, "source.revision", "only with source.hub (a local folder "
                            "has no revisions: its files' digests pin it)")
        folder = _source_folder(table["path"], shown, root)
        return SourceSpec(path=folder, files=dict(files), lock=lock)
    hub, revision = table.get("hub"), table.get("revision")
    if isinstance(hub, str) and _looks_like_path(hub):
        raise SpecError(shown, "source.hub", f"a hub repository id like 'org/name', got "
                        f"{hub!r} (a local folder? use source.path)")
    if not isinstance(hub, str) or "/" not in hub:
        raise SpecError(shown, "source.hub", "a hub repository id like 'org/name' "
                        "(or source.path, or a [source.synthetic] table)")
    if not isinstance(revision, str) or not revision:
        raise SpecError(shown, "source.revision", "a 40-hex commit hash of the hub repository")
    return SourceSpec(hub=hub, revision=revision, files=dict(files), lock=lock)


def _looks_like_path(hub: str) -> bool:
    """`/data/ckpt`, `~/ckpt`, `./ckpt`, `a/b/c`, `C:\\ckpt`: a folder, not `org/name`."""
    return hub.startswith(("/", "~", ".")) or "\\" in hub or hub.count("/") > 1


def _source_folder(value: Any, shown: str, root: Path) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(shown, "source.path", "a checkpoint folder (absolute, ~/…, or "
                        "relative to the project root)")
    folder = Path(value).expanduser()
    if not folder.is_absolute():
        folder = root.absolute() / folder
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise SpecError(shown, "source.path", f"folder '{value}' {what}")
    return str(Path(os.path.normpath(folder)))


def _source_lock(value: Any, shown: str) -> str | None:
    """A lock shared by models of one repository and revision: `models/<name>.lock.json`
    (in models/, where the project cache sees it change)."""
    if value is None:
        return None
    rel = Path(value) if isinstance(value, str) else None
    if (rel is None or rel.is_absolute() or len(rel.parts) != 2 or rel.parts[0] != "models"
            or not rel.name.endswith(".lock.json") or rel.name == ".lock.json"):
        raise SpecError(shown, "source.lock",
                        f"a lock file models/<name>.lock.json, got {value!r}")
    return rel.as_posix()


def _load_stages(
    table: dict[str, Any], defs: dict[str, StageDef], model_tc: str | None,
    toolchains: set[str], shown: str, root: Path, model: str, chat: bool = False,
    prefix: str = "stages",
) -> tuple[dict[str, dict[str, Any]], dict[str, str], dict[str, StageLimits], Unread]:
    """`prefix`: where the tables are in the file (a variant's are under `variants.<name>`).
    Every stage is checked, and all their mistakes are raised together."""
    mistakes = Mistakes()
    with mistakes.check():
        _only_keys(table, defs, shown, prefix)
    stages, stage_tcs, limits, unread = {}, {}, {}, {}
    for name, sdef in defs.items():
        with mistakes.check():
            written = _table(table, name, shown, f"{prefix}.{name}")
            given = dict(written)
            if "chat" in sdef.params and "chat" not in given:
                given["chat"] = chat  # [model] chat: every stage that formats prompts
            given = {**{k: stages[p.inherit][k] for k, p in sdef.params.items()
                        if p.inherit in stages and k in stages[p.inherit]}, **given}
            schema = {**sdef.params, **COMMON_STAGE_KEYS}
            resources = merged(sdef.resources, parse_resources(
                given.pop(RESOURCES, {}), shown, f"{prefix}.{name}.resources"))
            resolved = check_params(given, schema, shown, f"{prefix}.{name}", root, model)
            for key in written:
                if key in sdef.params and key not in resolved:
                    unread[(name, key)] = _unread_line(shown, f"{prefix}.{name}.{key}",
                                                       sdef.params[key], resolved)
            tc = resolved.pop("toolchain") if "toolchain" in resolved \
                else model_tc or sdef.toolchain
            stage_tcs[name] = _toolchain_name(tc, toolchains, shown,
                                              f"{prefix}.{name}.toolchain")
            limits[name] = StageLimits(resolved.pop("timeout", None),
                                       resolved.pop("memory", None),
                                       resolved.pop("gpu", sdef.gpu), resources)
            stages[name] = resolved
    mistakes.raise_any()
    return stages, stage_tcs, limits, unread


def _unread_line(shown: str, key: str, pdef: ParamDef, resolved: dict[str, Any]) -> str:
    here = ", ".join(f"{n} = {shown_value(resolved.get(n))}" for n, _ in conditions(pdef))
    return (f"{shown}: {key} is not read: only {condition_text(pdef)} reads it (here "
            f"{here}), so it is left out of the key and changing it rebuilds nothing")

