"""A declared output that is not a regular file (a symlink, a FIFO, a socket, a device, a
folder where a file is declared or a file where a folder is) is refused with what was
found, nothing is stored, and build/ is left as it was. Nothing is followed or opened."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.errors import MissingOutput
from hefbuild.execute.sandbox import bwrap_path

from .helpers import MODEL

FETCH, EXPORT = f"fetch:{MODEL}", f"export:{MODEL}"
WHO = f"{EXPORT}: rules/cpu_ort/export.py"
FETCH_WHO = f"{FETCH}: rules/fetch.py"


def symlink(path: Path) -> None:
    os.symlink("../x", path)


def fifo(path: Path) -> None:
    os.mkfifo(path)


def unix_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as sock:  # the file stays after the socket closes
        sock.bind(str(path))


def char_device(path: Path) -> None:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # what /dev/null is
    except PermissionError:
        pytest.skip("making a device node needs CAP_MKNOD")


def folder(path: Path) -> None:
    path.mkdir()
    (path / "inside.bin").write_bytes(b"x")


def regular(path: Path) -> None:
    path.write_bytes(b"a file")


def dir_symlink(path: Path) -> None:
    os.symlink(Path(__file__).parent, path)  # files outside the stage, if it were followed


class Leaving(FakeExecutor):
    """Writes the outputs, then puts `make(path)` where `stage` wrote `rel`."""

    def __init__(self, stage: str, rel: str, make: Callable[[Path], None]) -> None:
        super().__init__()
        self.stage, self.rel, self.make = stage, rel, make

    def _write_outputs(self, action):
        super()._write_outputs(action)
        if action["stage"] == self.stage:
            path = Path(action["out"]) / self.rel
            if path.is_dir() and not path.is_symlink():
                for child in sorted(path.iterdir()):
                    child.unlink()
                path.rmdir()
            else:
                path.unlink(missing_ok=True)
            self.make(path)


CASES = [
    ("export", "model.onnx", symlink,
     f"{WHO} wrote declared output model.onnx as a symlink (to ../x); outputs must be regular "
     "files"),
    ("export", "model.onnx", fifo,
     f"{WHO} wrote declared output model.onnx as a FIFO; outputs must be regular files"),
    ("export", "model.onnx", unix_socket,
     f"{WHO} wrote declared output model.onnx as a socket; outputs must be regular files"),
    ("export", "model.onnx", char_device,
     f"{WHO} wrote declared output model.onnx as a character device; outputs must be regular "
     "files"),
    ("export", "model.onnx", folder,
     f"{WHO} wrote declared output model.onnx as a folder; it is declared a file (a folder "
     "output is declared as model.onnx/)"),
    ("fetch", "checkpoint", regular,
     f"{FETCH_WHO} wrote declared output folder checkpoint/ as a regular file; it is declared "
     "a folder of regular files"),
    ("fetch", "checkpoint", dir_symlink,
     f"{FETCH_WHO} wrote declared output folder checkpoint/ as a symlink (to "
     f"{Path(__file__).parent}); it is declared a folder of regular files"),
    ("fetch", "checkpoint/sub/pipe", fifo,
     f"{FETCH_WHO} left a FIFO checkpoint/sub/pipe in declared output folder checkpoint/; "
     "outputs must be regular files"),
    ("fetch", "checkpoint/sock", unix_socket,
     f"{FETCH_WHO} left a socket checkpoint/sock in declared output folder checkpoint/; "
     "outputs must be regular files"),
]


def in_build(root: Path) -> set[str]:
    """What build/<model>/ holds, every level."""
    folder = root / "build" / MODEL
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")} \
        if folder.exists() else set()


def _prepare(rel: str, make: Callable[[Path], None]) -> Callable[[Path], None]:
    """`make`, after the folders above `rel` (inside a declared folder) exist."""
    def run(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        make(path)
    return run


@pytest.mark.parametrize(("stage", "rel", "make", "expected"), CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2].__name__}" for c in CASES])
def test_an_output_of_another_kind_is_refused_saying_what_it_is(make_engine, root, stage, rel,
                                                               make, expected):
    engine = make_engine(Leaving(stage, rel, _prepare(rel, make)))
    if stage == "export":
        engine.run(FETCH)
    before = in_build(root)
    key = engine.decide(engine.actions[f"{stage}:{MODEL}"]).key
    with pytest.raises(MissingOutput) as err:
        engine.run(f"{stage}:{MODEL}")
    assert str(err.value) == expected
    assert not engine.store.has_record(key.hex)
    # The failed run's log, and the regular declared files it wrote (export's report), only.
    kept = {"export.failed", "export.failed/export_report.json"} if stage == "export" else set()
    assert in_build(root) - before == {f"{stage}.failed.log"} | kept
    assert not (root / "build" / MODEL / stage).exists()


def test_a_fifo_left_by_a_real_rule_is_refused_without_opening_it(make_engine, root, store,
                                                                   monkeypatch):
    """The rule runs for real (host executor, its sandbox); the FIFO has no writer, so
    opening it to read would block: a helper opens it to write after a while, so that a
    regression ends with a wrong outcome, not a hung test."""
    if bwrap_path() is None:  # the sandbox is not what is tested here
        monkeypatch.setenv("HEFBUILD_SANDBOX", "0")
    make_engine().run(FETCH)  # the fake writes fetch's checkpoint
    (root / "rules" / "cpu_ort" / "export.py").write_text(
        "import json, os, pathlib, sys\n"
        "out = pathlib.Path(json.loads(pathlib.Path(sys.argv[1]).read_text())['out'])\n"
        "os.mkfifo(out / 'model.onnx')\n"
        "(out / 'export_report.json').write_text('{}')\n")
    engine = Engine(load_project(root, store=store))
    stop = threading.Event()
    unblock = threading.Thread(target=_open_fifos_for_writing, args=(store, stop), daemon=True)
    unblock.start()
    try:
        with pytest.raises(MissingOutput) as err:
            engine.run(EXPORT)
    finally:
        stop.set()
        unblock.join()
    assert str(err.value) == (f"{WHO} wrote declared output model.onnx as a FIFO; outputs must "
                              "be regular files")
    assert not (root / "build" / MODEL / "export").exists()


def _open_fifos_for_writing(store: Path, stop: threading.Event) -> None:
    """After 30 s, give every FIFO in the store's scratch folders a writer that closes at
    once (a reader blocked in open() then reads end-of-file and goes on)."""
    if stop.wait(30):
        return
    with contextlib.suppress(OSError):  # no reader (ENXIO), or the scratch gone already
        for path in (store / "v1" / "tmp").rglob("*"):
            if stat.S_ISFIFO(os.lstat(path).st_mode):
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    print("a FIFO was still there after 30 s", file=sys.stderr)
