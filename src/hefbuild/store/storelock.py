"""What builds and `doit gc` share in the store: one lock, and the list of projects.

On disk, under the store's `v1/`:

    v1/gc.lock                  flock(2) target: builds hold it shared while they write
                                objects and records and link them into build/; gc holds it
                                exclusive while it takes its inventory and deletes
    v1/projects/<h>.json        {"root": "<absolute project path>"}, h = the first 16 hex of
                                sha256(str(root)); a project whose build/ pins store entries

Machine-local state: absolute paths are fine here, the store is never shared between hosts.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

from ..errors import StoreError

LOCK_FILE = "gc.lock"
PROJECTS = "projects"


class StoreLock:
    """Many builds at once (shared), or one gc alone (exclusive), per store."""

    def __init__(self, v1_root: Path) -> None:
        self.path = v1_root / LOCK_FILE

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Held while a build writes objects and records and links them into build/."""
        f = self._open()
        try:
            fcntl.flock(f, fcntl.LOCK_SH)
            yield
        finally:
            f.close()  # closing the last descriptor releases the lock

    @contextmanager
    def exclusive(self, wait: bool = True,
                  on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Held by gc; says once that it waits for builds, or raises when `wait` is False."""
        f = self._open()
        try:
            self._lock_exclusive(f, wait, on_wait)
            yield
        finally:
            f.close()

    @contextmanager
    def exclusive_if_free(self) -> Iterator[bool]:
        """Exclusive when no build holds the store now (True), else nothing held (False):
        for a collection that can leave it to the next chance rather than wait."""
        f = self._open()
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            f.close()

    def _lock_exclusive(self, f: IO[str], wait: bool,
                        on_wait: Callable[[str], None] | None) -> None:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if not wait:
                raise StoreError(f"the store {self.path.parent.parent} is in use by a build "
                                 f"writing to it; run gc again when it has finished") from None
        if on_wait is not None:
            on_wait(f"waiting for a build to finish writing to the store "
                    f"{self.path.parent.parent} …")
        fcntl.flock(f, fcntl.LOCK_EX)

    def _open(self) -> IO[str]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, "a+")  # noqa: SIM115 - held open while locked
        except OSError as exc:
            raise StoreError(f"cannot open the store lock {self.path}: {exc.strerror}") from exc


def _entry(v1_root: Path, project_root: Path) -> Path:
    name = hashlib.sha256(str(project_root).encode()).hexdigest()[:16]
    return v1_root / PROJECTS / f"{name}.json"


def register_project(v1_root: Path, project_root: Path) -> None:
    """Remember a project whose build/ may pin store entries; a no-op when already known."""
    root = project_root.absolute()
    dest = _entry(v1_root, root)
    if dest.exists():
        return
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump({"root": str(root)}, f)
        os.replace(tmp, dest)
    except OSError as exc:
        raise StoreError(f"cannot register {root} in the store {v1_root.parent}: "
                         f"{exc.strerror}") from exc


def registered_projects(v1_root: Path) -> list[Path]:
    """The registered project roots that still exist; stale or unreadable entries are deleted."""
    roots = []
    for entry in sorted((v1_root / PROJECTS).glob("*.json")):
        root = _read_root(entry)
        if root is None or not root.is_dir():
            with suppress(OSError):
                entry.unlink()
            continue
        roots.append(root)
    return roots


def _read_root(entry: Path) -> Path | None:
    try:
        root = json.loads(entry.read_text())["root"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return Path(root) if isinstance(root, str) and Path(root).is_absolute() else None
