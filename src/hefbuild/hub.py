"""The lock step of hub models: a branch name -> a commit, and every file's SHA-256.

This is the only place that asks the hub what a name means now; builds read only the
lock file it writes (`models/<name>.lock.json`), so their keys never depend on the
network. Files are listed by the hub's own metadata (LFS files carry their SHA-256);
small files are downloaded at the pinned commit and hashed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .digest import sha256_file
from .errors import HefbuildError
from .project import Project

# Enough for transformers + tokenizers to load a causal LM offline.
WANTED_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".tiktoken", ".py")
SKIPPED = ("README.md", ".gitattributes")


def lock_model(project: Project, name: str) -> dict[str, Any]:
    model = project.models[name]
    src = model.source
    api, download = _hub_client()
    try:
        info = api.model_info(src.hub, revision=src.revision, files_metadata=True)
    except Exception as exc:  # the hub client raises many unrelated types
        raise HefbuildError(f"lock:{name}: cannot reach the hub for {src.hub}@{src.revision}: "
                            f"{_short(exc)}; locking needs network access") from exc
    files = {}
    for sibling in sorted(info.siblings, key=lambda s: s.rfilename):
        fname = sibling.rfilename
        if fname in SKIPPED or "/" in fname or not fname.endswith(WANTED_SUFFIXES):
            continue
        lfs = getattr(sibling, "lfs", None)
        if lfs is not None and getattr(lfs, "sha256", None):
            files[fname] = lfs.sha256
        else:
            path = download(src.hub, fname, revision=info.sha)
            files[fname] = sha256_file(Path(path)).hex
    lock = {"hub": src.hub, "requested_revision": _requested(project, name),
            "revision": info.sha, "files": files}
    out = project.paths.models / f"{name}.lock.json"
    out.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    return {"revision": info.sha, "files": len(files)}


def _requested(project: Project, name: str) -> str:
    from .specs import read_toml

    path = project.paths.models / f"{name}.toml"
    return read_toml(path, f"models/{name}.toml")["source"]["revision"]


def _hub_client():  # noqa: ANN202 - huggingface_hub is imported only when locking
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError as exc:
        raise HefbuildError("lock needs huggingface_hub: pip install huggingface_hub") from exc
    return HfApi(), hf_hub_download


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
