"""One doit at a time per project: an exclusive lock held for the whole invocation."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ..errors import HefbuildError


class ProjectLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    def acquire(self, wait: bool, say: Callable[[str], None]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held open for the whole run
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            if not wait:
                f.close()
                raise HefbuildError(f"another doit is running in this project (pid {holder}); "
                                    f"unset HEFBUILD_NO_WAIT to wait for it") from None
            say(f"hefbuild: waiting for another doit in this project (pid {holder}) to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file is not None:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
            self._file = None
