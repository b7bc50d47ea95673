"""Toolchains of kind `venv`: a second Python environment that hefbuild makes from a lock file.

A `venv` toolchain declares a base interpreter and a requirements lock (every package, its
dependencies included, pinned with `==`). Its identity, in every key of its stages, is one
digest of the lock file's bytes and of the base interpreter's version, implementation and
platform: like a docker toolchain's image ID, it names the environment without it having to
exist (a restore from the store never creates it).

On disk, under the store's `v1/`:

    v1/venvs/<d>/                 the environment of digest d (first 32 hex), read-only to stages
    v1/venvs/<d>/hefbuild-venv.json   written last: only a folder holding it is trusted
    v1/venvs/<d>.lock             flock(2) target: one creator per digest, others wait
    v1/venvs/<d>.use              flock(2) target: held shared by every stage running in
                                  <d>/, exclusive by `doit gc --venvs` while it removes it
    v1/venvs/<d>.log              the output of the last creation (python -m venv, pip)
    v1/venvs/.tmp-<d>-<pid>/      a creation in progress; renamed to <d>/ when complete

A crash leaves a `.tmp-` folder, never a trusted `<d>/`; the next creator removes it. The
lock files stay when an environment is removed: a process may hold one open, and a new
file under the same name would be a second lock. The environment is made outside any
sandbox (it needs the package index), like `doit image:`, with heartbeats while pip runs.
What is deliberately not in the identity: where the base interpreter is installed (two
pythons of one version and platform with one lock make the same environment).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import StageError

if TYPE_CHECKING:  # at run time imported where a venv is made: a no-op needs only stamps
    from .base import Watch

MARKER = "hefbuild-venv.json"
DIGEST_HEX = 32
CREATE_TIMEOUT_S = 3600

_BASE_PROBE = ("import json, os, platform, sys, sysconfig; print(json.dumps({"
               "'python': platform.python_version(), 'implementation': sys.implementation.name,"
               " 'platform': sysconfig.get_platform(),"
               " 'executable': os.path.realpath(sys.executable)}))")


class VenvError(StageError):
    """The environment of a venv toolchain could not be made."""


@dataclass(frozen=True)
class VenvSpec:
    """What a venv toolchain file declares: `python` (the base) and `requirements` (the lock,
    project-relative)."""

    toolchain: str
    python: str
    requirements: Path


def probe_base(python: str) -> dict[str, str]:
    """Version, implementation, platform and real path of the base interpreter."""
    found = shutil.which(python)
    if found is None:
        raise VenvError(f"toolchain: base interpreter {python!r} not found on PATH")
    try:
        done = subprocess.run([found, "-c", _BASE_PROBE], capture_output=True, text=True,
                              check=True, timeout=60)
        return json.loads(done.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        raise VenvError(f"cannot run base interpreter {found}: {exc}") from exc


def identity(spec: VenvSpec, base: dict[str, str]) -> dict[str, Any]:
    """The toolchain identity that enters every key of the venv toolchain's stages."""
    try:
        lock = hashlib.sha256(spec.requirements.read_bytes()).hexdigest()
    except OSError as exc:
        raise VenvError(f"toolchain {spec.toolchain}: lock file {spec.requirements} cannot be "
                        f"read ({exc.strerror})") from exc
    pinned = {"lock": f"sha256:{lock}", "python": base["python"],
              "implementation": base["implementation"], "platform": base["platform"]}
    canonical = json.dumps(pinned, sort_keys=True, separators=(",", ":")).encode()
    return {"kind": "venv", **pinned, "venv": f"sha256:{hashlib.sha256(canonical).hexdigest()}"}


def venv_dir(venvs_root: Path, ident: dict[str, Any]) -> Path:
    return venvs_root / ident["venv"].removeprefix("sha256:")[:DIGEST_HEX]


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def is_complete(folder: Path) -> bool:
    """Trusted: created to the end (marker written last) and its python still resolves."""
    return (folder / MARKER).is_file() and python_of(folder).resolve().exists()


@dataclass(frozen=True)
class Ready:
    """An environment ready to run stages in, and what getting it ready cost this call."""

    python: Path
    # Spent creating it, or waiting for another process that did; None: it was there.
    seconds: float | None = None
    created: bool = False  # this call made it


@contextmanager
def using(spec: VenvSpec, ident: dict[str, Any], base: dict[str, str], venvs_root: Path,
          say: Callable[[str], None], watch: Watch | None = None) -> Iterator[Ready]:
    """The environment, created first if missing, held in use (gc leaves it) until the
    block ends. In use is taken before it is checked: gc cannot remove it in between."""
    folder = venv_dir(venvs_root, ident)
    venvs_root.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".use"), "a+") as use:
        fcntl.flock(use, fcntl.LOCK_SH)
        yield ensure(spec, ident, base, venvs_root, say, watch)


def ensure(spec: VenvSpec, ident: dict[str, Any], base: dict[str, str], venvs_root: Path,
           say: Callable[[str], None], watch: Watch | None = None) -> Ready:
    """The python of the environment, created first if missing (one creator at a time)."""
    folder = venv_dir(venvs_root, ident)
    if is_complete(folder):
        return Ready(python_of(folder))
    start = time.monotonic()
    venvs_root.mkdir(parents=True, exist_ok=True)
    with open(folder.with_suffix(".lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"toolchain {spec.toolchain}: another process is creating its environment "
                f"{folder.name}; waiting")
            fcntl.flock(lock, fcntl.LOCK_EX)
        created = not is_complete(folder)  # the other creator may have finished meanwhile
        if created:
            from .base import Watch

            _create(spec, ident, base, folder, say, watch or Watch())
    return Ready(python_of(folder), time.monotonic() - start, created)


def _create(spec: VenvSpec, ident: dict[str, Any], base: dict[str, str], folder: Path,
            say: Callable[[str], None], watch: Watch) -> None:
    for stale in folder.parent.glob(f".tmp-{folder.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)  # a crashed creation: never trusted
    if folder.exists():
        shutil.rmtree(folder)  # no marker, or its base interpreter is gone
    tmp = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    log_path = folder.with_suffix(".log")
    say(f"toolchain {spec.toolchain}: creating its Python environment {folder} from "
        f"{spec.requirements.name} (once; this takes minutes); log: {log_path}")
    start = time.monotonic()
    log_path.write_text("")
    try:
        _run([base["executable"], "-m", "venv", str(tmp)], spec, log_path, watch)
        _run([str(python_of(tmp)), "-m", "pip", "install", "--no-input", "--no-deps",
              "--disable-pip-version-check", "-r", str(spec.requirements)], spec, log_path,
             watch)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    seconds = round(time.monotonic() - start, 1)
    marker = {**ident, "toolchain": spec.toolchain, "base_executable": base["executable"],
              "created_at": round(time.time()), "seconds": seconds}
    (tmp / MARKER).write_text(json.dumps(marker, sort_keys=True, indent=1) + "\n")
    os.replace(tmp, folder)
    say(f"toolchain {spec.toolchain}: environment {folder.name} created in {seconds:.0f} s")


def _run(argv: list[str], spec: VenvSpec, log_path: Path, watch: Watch) -> None:
    """One step of the creation, its output appended to the log, under the watchdog a stage
    runs under (heartbeats with pip's last line; the creation's timeout)."""
    from .host import HostExecutor

    with open(log_path, "a") as log:
        log.write(f"$ {' '.join(argv)}\n")
    step = "pip install" if argv[2:3] == ["pip"] else "python -m venv"  # named in each beat
    emit = watch.emit
    if emit is not None:
        watch = replace(watch, emit=lambda beat: emit({**beat, "step": step}))
    # pip's lines reach the log (and the heartbeat) as printed, not when its buffer fills.
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    from .base import ExecRequest

    request = ExecRequest(argv, log_path.parent, env, log_path, timeout_s=CREATE_TIMEOUT_S,
                          watch=watch)
    try:
        done = HostExecutor().run(request)
    except (OSError, subprocess.SubprocessError) as exc:
        raise VenvError(f"toolchain {spec.toolchain}: creating its environment failed "
                        f"({exc}); see {log_path}") from exc
    if done.killed_for:
        raise VenvError(f"toolchain {spec.toolchain}: creating its environment took over "
                        f"{CREATE_TIMEOUT_S} s and was stopped; see {log_path}")
    if done.returncode != 0:
        raise VenvError(f"toolchain {spec.toolchain}: `{Path(argv[0]).name} {argv[1]} "
                        f"{argv[2]}` exited {done.returncode} while creating its environment; "
                        f"see {log_path} (no network to the package index?)")
