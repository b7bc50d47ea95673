"""`doit image:<toolchain>`: build a docker toolchain's image and pin its ID in a lock file.

The lock (`toolchain/<name>.lock.json`, committed) is what keys use: the image ID, plus
the digest of the build context it was built from, so `doit image:X` knows when a rebuild
is due. User-supplied files named in the toolchain's `[wheels]` (a proprietary wheel, never
committed; `toolchain.wheels_source` says where it is downloaded from) are checked against
their declared SHA-256 before anything is built.

The build's output reaches the terminal line by line as the engine sends it, each line
prefixed `[image:<toolchain>] ` (a Dataflow Compiler image takes many minutes); an error in
the stream becomes one line naming the Dockerfile step that failed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..declare.project import Project
from ..declare.toolchains import ToolchainSpec
from ..digest import canonical_json, sha256_bytes, sha256_file
from ..errors import HefbuildError
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
            check = (f"its SHA-256 must be {sha}" if sha else
                     f"then declare its SHA-256 under [wheels] in {spec.file}")
            source = spec.wheels_source or "its vendor"
            raise HefbuildError(
                f"{spec.file}: wheels.{name}: {rel} is missing; download it from {source} "
                f"and put it there; {check}")
        actual = sha256_file(path).hex
        if not sha:
            raise HefbuildError(
                f"{spec.file}: wheels.{name}: no SHA-256 declared; {rel} has {actual}: check "
                f"it against the download page, then declare it in {spec.file}")
        if actual != sha:
            raise HefbuildError(f"{spec.file}: wheels.{name}: {rel} has SHA-256 {actual}, "
                                f"expected {sha} (a different release or a corrupt download)")


def image_is_current(project: Project, name: str) -> bool:
    spec = project.toolchains[name]
    lock = read_image_lock(project.paths.toolchains, spec)
    context = project.paths.root / spec.image["context"]
    if lock is None or lock.get("context_digest") != context_digest(context):
        return False
    from .docker import connect

    try:
        connect().images.get(lock["image_id"])
    except Exception:  # not found, or no engine: either way, not current
        return False
    return True


def build_image(project: Project, name: str,
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build toolchain `name`'s image and pin its ID; `progress` gets each output line
    (default: the terminal)."""
    spec = project.toolchains[name]
    check_wheels(project, spec)
    context = project.paths.root / spec.image["context"]
    from .docker import connect

    client = connect()
    say = progress or _to_terminal
    output = BuildOutput(lambda line: say(f"[image:{name}] {line}"))
    network = os.environ.get("HEFBUILD_BUILD_NETWORK") or None
    failed = f"image:{name}: docker build of {spec.image['context']} failed"
    try:
        output.follow(client.api.build(path=str(context), tag=spec.image["tag"], rm=True,
                                       forcerm=True, network_mode=network, decode=True))
        image = None if output.error else client.images.get(output.image_id)
    except Exception as exc:  # APIError, a broken stream, an ID not found: say it in one line
        raise HefbuildError(f"{failed}: {_first_line(exc)}") from exc
    if image is None:
        raise HefbuildError(f"{failed}{output.where()}: {output.error}")
    lock = {"image_id": image.id, "tag": spec.image["tag"],
            "context_digest": context_digest(context)}
    path = image_lock_path(project.paths.toolchains, spec)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(lock, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)
    say(f"[image:{name}] pinned {image.id} in {path.relative_to(project.paths.root)}")
    return {"image_id": image.id}


@dataclass
class BuildOutput:
    """The engine's build stream (`APIClient.build(decode=True)` chunks) as whole lines for
    `say`, as they come; it remembers the current step, the error and the image ID."""

    say: Callable[[str], None]
    step: str = ""
    error: str | None = None
    image_id: str | None = None
    _partial: str = ""

    def follow(self, chunks: Iterable[dict[str, Any]]) -> None:
        for chunk in chunks:
            self.feed(chunk)
        self._lines("\n")  # a last line without its newline
        if self.error is None and self.image_id is None:
            self.error = "the build output names no image ID"

    def feed(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk or "errorDetail" in chunk:
            detail = chunk.get("errorDetail") or {}
            self.error = _first_line(str(detail.get("message") or chunk.get("error")))
        if isinstance(chunk.get("aux"), dict) and chunk["aux"].get("ID"):
            self.image_id = chunk["aux"]["ID"]
        if isinstance(chunk.get("stream"), str):
            self._lines(chunk["stream"])
        elif chunk.get("status") and "progress" not in chunk:  # pulls: not every byte count
            self.say(f"{chunk['id']}: {chunk['status']}" if chunk.get("id") else chunk["status"])

    def where(self) -> str:
        return f" at {self.step}" if self.step else ""

    def _lines(self, text: str) -> None:
        *whole, self._partial = (self._partial + text).split("\n")
        for line in (ln.rstrip() for ln in whole):
            if not line:
                continue
            if line.startswith("Step "):
                self.step = line
            built = re.fullmatch(r"Successfully built ([0-9a-f]+)", line)
            if built and self.image_id is None:  # engines that send no `aux` ID
                self.image_id = built.group(1)
            self.say(line)


def _to_terminal(line: str) -> None:
    """To the person at the terminal at once (doit buffers a task's stdout), as the
    engine's heartbeats do."""
    print(line, file=sys.__stderr__ or sys.stderr, flush=True)


def _first_line(exc: Exception | str) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
