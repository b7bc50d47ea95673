"""`doit image:<toolchain>`: build a docker toolchain's image and pin its ID in a lock file.

The lock (`toolchain/<name>.lock.json`, committed) is what keys use: the image ID, plus
the digest of the build context it was built from, so `doit image:X` knows when a rebuild
is due. User-supplied files named in the toolchain's `[wheels]` (e.g. the Dataflow
Compiler wheel from Hailo's Developer Zone, which is never committed) are checked against
their declared SHA-256 before anything is built.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .digest import canonical_json, sha256_bytes, sha256_file
from .errors import HefbuildError
from .project import Project
from .specs import ToolchainSpec
from .toolchain import image_lock_path, read_image_lock


def context_digest(context: Path) -> str:
    """One digest over every file of a build context (paths and contents)."""
    files = {p.relative_to(context).as_posix(): sha256_file(p).hex
             for p in sorted(context.rglob("*")) if p.is_file()}
    return sha256_bytes(canonical_json(files).encode()).hex


def check_wheels(project: Project, spec: ToolchainSpec) -> None:
    context = project.paths.root / spec.image["context"]
    for name, sha in sorted(spec.wheels.items()):
        path = context / name
        rel = path.relative_to(project.paths.root).as_posix()
        if not path.is_file():
            raise HefbuildError(
                f"{spec.file}: wheels.{name}: {rel} is missing; download it from Hailo's "
                f"Developer Zone (hailo.ai, an account is needed) and put it there; "
                f"its SHA-256 must be {sha}")
        actual = sha256_file(path).hex
        if not sha:
            raise HefbuildError(
                f"{spec.file}: wheels.{name}: no SHA-256 declared; {rel} has {actual}: check "
                f"it against Hailo's download page, then declare it in {spec.file}")
        if actual != sha:
            raise HefbuildError(f"{spec.file}: wheels.{name}: {rel} has SHA-256 {actual}, "
                                f"expected {sha} (a different release or a corrupt download)")


def image_is_current(project: Project, name: str) -> bool:
    spec = project.toolchains[name]
    lock = read_image_lock(project.paths.toolchains, spec)
    context = project.paths.root / spec.image["context"]
    if lock is None or lock.get("context_digest") != context_digest(context):
        return False
    from .executors.docker import connect

    try:
        connect().images.get(lock["image_id"])
    except Exception:  # not found, or no engine: either way, not current
        return False
    return True


def build_image(project: Project, name: str) -> dict[str, Any]:
    spec = project.toolchains[name]
    check_wheels(project, spec)
    context = project.paths.root / spec.image["context"]
    from .executors.docker import connect

    client = connect()
    network = os.environ.get("HEFBUILD_BUILD_NETWORK") or None
    try:
        image, _ = client.images.build(path=str(context), tag=spec.image["tag"], rm=True,
                                       network_mode=network)
    except Exception as exc:  # BuildError, APIError: say it in one line
        raise HefbuildError(f"image:{name}: docker build of {spec.image['context']} failed: "
                            f"{_first_line(exc)}") from exc
    lock = {"image_id": image.id, "tag": spec.image["tag"],
            "context_digest": context_digest(context)}
    path = image_lock_path(project.paths.toolchains, spec)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return {"image_id": image.id}


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
