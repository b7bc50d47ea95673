"""A stage container ends itself when the doit that runs it dies: both ends of one FIFO.

doit's end (`hold`): a FIFO in the stage's scratch folder, opened read-write and
close-on-exec (so no rule or other child inherits it) and kept open while the container
runs, with one byte written into it. The kernel closes it however doit ends, `kill -9` and
the OOM killer included, and no extra process is needed to notice.

The container's end (this file, run by the toolchain's python as the container's command,
stdlib only and old-Python friendly): `python lifeline.py FIFO RULE-ARGV...`. It opens the
FIFO and reads the byte, starts the rule in a process group of its own, and waits in a
thread for end-of-file, which comes when no writer is left: doit is gone, so the rule's
group is killed and the container stops (its remains are removed by the next reap).

A FIFO that gives no byte (a daemon in a VM, whose bind mount does not reach this kernel's
pipe, or a doit that died before the container started) disarms the lifeline instead of
killing a healthy stage; the reap of containers of dead doits is then the only guard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ARMED = b"1"
GONE_LINE = "hefbuild: the doit that ran this stage is gone; stopping the rule"


@contextmanager
def hold(path: Path) -> Iterator[Path]:
    """doit's end: make the FIFO at `path`, hold it open (read-write, so opening never
    blocks) with the arming byte in it, while the block runs. Where no FIFO can be made
    (a file system without them), an empty file: the container's end is disarmed."""
    path.unlink(missing_ok=True)  # never write into a FIFO already there (it would block)
    try:
        os.mkfifo(path, 0o600)
    except OSError:
        path.write_bytes(b"")
        yield path
        return
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.write(fd, ARMED)
        yield path
    finally:
        os.close(fd)


def _arm(fifo: str) -> int | None:
    """The container's end, opened, once its arming byte is read; None: no lifeline."""
    try:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # never waits for a writer
    except OSError:
        return None
    os.set_blocking(fd, True)  # a read now waits for the byte, or sees no writer: EOF
    if os.read(fd, 1) != ARMED:
        os.close(fd)
        return None
    return fd


def _watch(fd: int, rule: subprocess.Popen) -> None:
    while os.read(fd, 4096):  # nothing more is written: this returns at EOF only
        pass
    print(GONE_LINE, file=sys.stderr, flush=True)
    _kill_group(rule, signal.SIGKILL)


def _kill_group(rule: subprocess.Popen, sig: int) -> None:
    with suppress(ProcessLookupError):  # the rule ended meanwhile
        os.killpg(rule.pid, sig)


def main(argv: list[str]) -> int:
    fifo, command = argv[1], argv[2:]
    fd = _arm(fifo)
    rule = subprocess.Popen(command, start_new_session=True)
    # PID 1 of a container ignores signals it has no handler for: pass `docker stop` on.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: _kill_group(rule, signum))
    if fd is not None:
        threading.Thread(target=_watch, args=(fd, rule), daemon=True).start()
    code = rule.wait()
    return 128 - code if code < 0 else code  # killed by a signal: as a shell reports it


if __name__ == "__main__":
    sys.exit(main(sys.argv))
