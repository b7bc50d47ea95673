"""The lock step of hub and local models: every checkpoint file's SHA-256 (and, for a hub
branch, the commit it names now).

This is the only place that asks the hub what a name means now; builds read only the
lock file it writes (`models/<name>.lock.json`, or the shared `source.lock`), so their
keys never depend on the network. Hub files are listed by the hub's own metadata (LFS
files carry their SHA-256); small files are downloaded at the pinned commit and hashed.
Without the hub (offline, or unreachable), a revision already in the Hugging Face cache is
locked from there. A local folder is listed and hashed where it is.

Which files a lock keeps is `checkpoint_files`: what loading, tokenizing and templating
read, and nothing else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from ..declare.project import Project
from ..digest import sha256_file
from ..errors import HefbuildError

# Read by transformers to load a causal LM, its tokenizer and its chat template.
KEPT_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".tiktoken", ".jinja")
# Weights, best first: the first kind a snapshot has is kept, the others dropped
# (PyTorch pickles only without safetensors; other frameworks' only without either).
WEIGHT_TIERS = ((".safetensors",), (".bin", ".pt", ".pth"), (".h5", ".msgpack", ".gguf"))
# Documentation whatever its suffix (README.txt, LICENSE.txt, ...).
DOC_STEMS = ("readme", "license", "licence", "notice", "copying", "changelog", "use_policy",
             "requirements", "citation")
# Sub-folders holding another format's copy of the model (ONNX, OpenVINO, Core ML, the
# original Meta/Mistral layout): never what transformers loads.
OTHER_FORMAT_DIRS = ("onnx", "openvino", "coreml", "tflite", "mlx", "gguf", "original")
# Pickles of a training run, not of the model.
TRAINING_STATE = ("training_args", "optimizer", "scheduler", "rng_state", "trainer_state")


def checkpoint_files(names: Iterable[str]) -> list[str]:
    """The files of a snapshot (relative names, `/`-separated) that a lock keeps, sorted.

    Kept: `*.json` (config, generation_config, tokenizer, tokenizer_config,
    special_tokens_map, ...), `*.safetensors` (+ index), `tokenizer.model` and other
    sentencepiece `*.model`, `*.txt` (merges, vocab), `*.tiktoken`, `*.jinja` chat
    templates, in sub-folders too. Weights of one kind only: safetensors, else PyTorch
    `*.bin`/`*.pt`, else `*.h5`/`*.msgpack`/`*.gguf`; a weight index (`*.bin.index.json`)
    goes with its weights, and Mistral's `consolidated*` duplicate is dropped beside the
    transformers shards. Dropped: hidden files (`.gitattributes`), documentation, images,
    ONNX and other exports, training state, code.
    """
    paths = sorted({PurePosixPath(n.replace("\\", "/")) for n in names})
    candidates = [p for p in paths if _may_keep(p)]
    weights = [p for p in candidates if _weight_kind(p) is not None]
    tier = min((_weight_kind(p) for p in weights), default=None)
    kept_weights = {p for p in weights if _weight_kind(p) == tier}
    if any(not p.name.startswith("consolidated") for p in kept_weights):
        kept_weights = {p for p in kept_weights if not p.name.startswith("consolidated")}
    kept = [p for p in candidates if p in kept_weights
            or _weight_kind(p) is None and _index_kind(p) is None
            or _index_kind(p) is not None and _indexed_weights_kept(p, kept_weights)]
    return sorted(p.as_posix() for p in kept)


def _may_keep(p: PurePosixPath) -> bool:
    if not p.parts or any(part.startswith(".") for part in p.parts):
        return False
    if any(part.lower() in OTHER_FORMAT_DIRS for part in p.parts[:-1]):
        return False
    stem = p.name.split(".")[0].lower()
    if stem in DOC_STEMS or stem.startswith(TRAINING_STATE):
        return False
    return p.suffix in KEPT_SUFFIXES or _weight_kind(p) is not None


def _weight_kind(p: PurePosixPath) -> int | None:
    for tier, suffixes in enumerate(WEIGHT_TIERS):
        if p.suffix in suffixes:
            return tier
    return None


def _index_kind(p: PurePosixPath) -> int | None:
    """`model.safetensors.index.json` -> 0, `pytorch_model.bin.index.json` -> 1, else None."""
    if not p.name.endswith(".index.json"):
        return None
    return _weight_kind(PurePosixPath(p.name[: -len(".index.json")]))


def _indexed_weights_kept(index: PurePosixPath, kept: set[PurePosixPath]) -> bool:
    stem = index.name[: -len(".index.json")].rsplit(".", 1)[0]
    return any(w.parent == index.parent and w.name.startswith(stem)
               and _weight_kind(w) == _index_kind(index) for w in kept)


# ---------------------------------------------------------------- locking


def lock_model(project: Project, name: str) -> dict[str, Any]:
    model = project.models[name]
    src = model.source
    if src.path is not None:
        files = _local_digests(name, Path(src.path))
        lock: dict[str, Any] = {"source": "path", "files": files}
        summary: dict[str, Any] = {"files": len(files)}
    elif src.hub is not None:
        revision, files, where = _hub_digests(project, name)
        lock = {"hub": src.hub, "requested_revision": _requested(project, name),
                "revision": revision, "files": files}
        summary = {"revision": revision, "files": len(files), "from": where}
    else:
        raise HefbuildError(f"lock:{name}: a synthetic model has nothing to lock")
    out = project.paths.root / src.lock if src.lock else \
        project.paths.models / f"{name}.lock.json"
    tmp = out.with_name(f".{out.name}.{os.getpid()}")
    tmp.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    tmp.replace(out)
    return {**summary, "lock": _shown_path(out, project.paths.root)}


def _shown_path(path: Path, root: Path) -> str:
    """The lock file as the user names it: under the project, relative to its root."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def _local_digests(name: str, folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        raise HefbuildError(f"lock:{name}: source folder {folder} does not exist")
    found = [p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()]
    kept = checkpoint_files(found)
    if not kept:
        raise HefbuildError(f"lock:{name}: no checkpoint files (config, weights, tokenizer) "
                            f"in {folder}")
    return {rel: sha256_file(folder / rel).hex for rel in kept}


def _hub_digests(project: Project, name: str) -> tuple[str, dict[str, str], str]:
    """(commit, file digests, "hub" or "cache") of the model's hub revision."""
    src = project.models[name].source
    try:
        return (*_from_hub(src.hub, src.revision), "hub")
    except _Unreachable as exc:
        cached = _from_cache(src.hub, src.revision)
        if cached is None:
            raise HefbuildError(f"lock:{name}: cannot reach the hub for {src.hub}@"
                                f"{src.revision}: {exc}; locking needs network access (or "
                                f"that revision in the Hugging Face cache)") from None
        return (*cached, "cache")


class _Unreachable(Exception):
    pass


def _from_hub(repo: str, revision: str) -> tuple[str, dict[str, str]]:
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError as exc:
        raise HefbuildError("lock needs huggingface_hub: pip install huggingface_hub") from exc
    if _hub_offline():
        raise _Unreachable("HF_HUB_OFFLINE is set")
    try:
        info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - the hub client raises many unrelated types
        raise _Unreachable(_short(exc)) from exc
    by_name = {s.rfilename: s for s in info.siblings or []}
    files = {}
    for fname in checkpoint_files(by_name):
        lfs = getattr(by_name[fname], "lfs", None)
        sha = lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
        if sha:
            files[fname] = sha
        else:
            try:
                path = hf_hub_download(repo, fname, revision=info.sha)
            except Exception as exc:  # noqa: BLE001
                raise HefbuildError(f"cannot download {fname} of {repo}@{info.sha} to hash "
                                    f"it: {_short(exc)}") from exc
            files[fname] = sha256_file(Path(path)).hex
    return info.sha, files


def _from_cache(repo: str, revision: str) -> tuple[str, dict[str, str]] | None:
    """The revision's snapshot in the Hugging Face cache, if it is there."""
    from huggingface_hub import snapshot_download

    try:
        snapshot = Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached, in any of the client's words
        return None
    commit = snapshot.name
    found = [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    kept = checkpoint_files(found)
    if not kept:
        return None
    return commit, {rel: sha256_file(snapshot / rel).hex for rel in kept}


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")


def _requested(project: Project, name: str) -> str:
    from ..declare.declfile import read_toml

    path = project.paths.models / f"{name}.toml"
    return read_toml(path, f"models/{name}.toml")["source"]["revision"]


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
