"""A stage's log: streamed whole to `build/<model>/<stage>.running.log` while the rule runs
(so a person can `tail -f` it, on the project's disk even when the store's is full), then
kept in the store bounded: the head and the tail of an oversized log, with one line saying
how much was cut from the middle."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from ..declare.params import parse_size

DEFAULT_MAX = 4 << 20
_CHUNK = 1 << 20


def log_limit() -> int:
    """`HEFBUILD_LOG_MAX` (e.g. "16m"), else 4 MiB."""
    try:
        return max(4096, parse_size(os.environ.get("HEFBUILD_LOG_MAX", DEFAULT_MAX)))
    except ValueError:
        return DEFAULT_MAX


def bound_log(src: Path, dest: Path, max_bytes: int) -> int:
    """Copy `src` to `dest`, keeping at most `max_bytes` of it; returns the bytes cut."""
    size = src.stat().st_size if src.exists() else 0
    if size <= max_bytes:
        if src.exists():
            shutil.copyfile(src, dest)
        else:
            dest.write_bytes(b"")
        return 0
    half = max_bytes // 2
    cut = size - 2 * half
    with open(src, "rb") as f, open(dest, "wb") as out:
        _copy(f, out, half)
        out.write(f"\n[hefbuild: {cut} bytes ({cut / (1 << 20):.1f} MiB) cut from the middle "
                  f"of this log; the limit is HEFBUILD_LOG_MAX={max_bytes}]\n".encode())
        f.seek(size - half)
        _copy(f, out, half)
    return cut


def _copy(f, out, n: int) -> None:  # noqa: ANN001 - binary files
    while n > 0:
        chunk = f.read(min(_CHUNK, n))
        if not chunk:
            return
        out.write(chunk)
        n -= len(chunk)


FAILED_OUTPUT_MAX = 16 << 20


def keep_failed_outputs(declared: tuple[str, ...], out: Path, dest: Path) -> list[str]:
    """Copy the declared output files a failed rule did write (reports, not models: each at
    most 16 MiB) from its scratch `out` to `dest`, replacing what an earlier failure left."""
    shutil.rmtree(dest, ignore_errors=True)
    kept = []
    for rel in declared:
        src = out / rel
        if rel.endswith("/") or src.is_symlink() or not src.is_file():
            continue
        if src.stat().st_size > FAILED_OUTPUT_MAX:
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest / rel)
        kept.append(rel)
    return kept


class LogFollower:
    """`doit -v 2`: the running stage's log, line by line as it grows, to the terminal
    (heartbeats are printed on their own, so they are skipped here)."""

    def __init__(self, path: Path, write: Callable[[str], None], skip: str,
                 poll_s: float = 0.2) -> None:
        self.path, self.write, self.skip, self.poll_s = path, write, skip, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._offset = 0
        self._partial = b""

    def __enter__(self) -> LogFollower:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._drain(final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._drain()

    def _drain(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        self._offset += len(chunk)
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = b"" if final else lines.pop()
        for raw in lines:
            line = raw.decode(errors="replace").rstrip()
            if line and not line.startswith(self.skip):
                self.write(f"   | {line}")
