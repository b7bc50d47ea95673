"""Nothing a killed or failed run leaves behind is kept, trusted or shared by accident."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

import hefbuild.engine.failures as failures_module
from hefbuild.errors import RuleFailed
from hefbuild.execute import ExecResult, StageRun

from .helpers import MODEL, TASKS, run_all

EXPORT = f"export:{MODEL}"


def dead_pid() -> int:
    """A pid that surely belongs to no process now (a child that has exited)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_scratch_folders_of_a_killed_run_are_swept(built, make_engine, store, fake):
    tmp = store / "v1" / "tmp"
    stale = tmp / f"scratch-{dead_pid()}-abc"
    (stale / "out").mkdir(parents=True)
    download = tmp / f"incoming-{dead_pid()}-xyz"
    download.write_bytes(b"half a blob")
    mine = tmp / f"scratch-{os.getpid()}-live"
    mine.mkdir()
    fake.ran.clear()
    make_engine().run(EXPORT, force=True)
    assert not stale.exists() and not download.exists()
    assert mine.exists()  # a live process's scratch is its own


def test_staging_folders_of_a_killed_run_are_swept(built, make_engine, root):
    stale = root / "build" / MODEL / f".export.new-{dead_pid()}"
    stale.mkdir()
    (stale / "model.onnx").write_text("half")
    make_engine().run(f"verify:{MODEL}", force=True)  # another stage: still swept
    assert not stale.exists()


def test_the_log_in_build_is_a_copy_not_the_store_object(built, root, store):
    log = root / "build" / MODEL / "export" / "log.txt"
    manifest = json.loads((log.parent / "manifest.json").read_text())
    record = json.loads(next((store / "v1" / "results").rglob(f"{manifest['key']}.json"))
                        .read_text())
    obj = store / "v1" / "objects" / record["log"][:2] / record["log"][2:]
    assert log.stat().st_ino != obj.stat().st_ino
    os.chmod(log, 0o644)
    log.write_text("edited by hand\n")
    assert obj.read_text() != "edited by hand\n"


class Chatty(FakeExecutor):
    """export prints `lines` lines, and checks where its log goes while it runs."""

    def __init__(self, lines: int) -> None:
        super().__init__()
        self.lines = lines
        self.seen: list[Path] = []

    def run_stage(self, request: StageRun) -> ExecResult:
        result = super().run_stage(request)
        if "export" in request.task:
            self.seen.append(request.log_path)
            assert request.log_path.exists()  # a person can tail -f it now
            with open(request.log_path, "w") as f:
                for i in range(self.lines):
                    f.write(f"line {i:08d} " + "x" * 80 + "\n")
        return result


def test_an_oversized_log_keeps_its_head_and_tail(make_engine, root, monkeypatch):
    monkeypatch.setenv("HEFBUILD_LOG_MAX", "64k")
    chatty = Chatty(100_000)  # ~9 MB
    engine = make_engine(chatty)
    engine.run(f"fetch:{MODEL}")
    engine.run(EXPORT)
    assert chatty.seen == [root / "build" / MODEL / "export.running.log"]
    assert not chatty.seen[0].exists()  # gone once the result is stored
    kept = (root / "build" / MODEL / "export" / "log.txt").read_text()
    assert len(kept) < 70_000
    assert kept.startswith("line 00000000") and "line 00099999" in kept
    assert "cut from the middle of this log" in kept


def test_a_failed_stage_keeps_its_whole_log_and_the_rules_peak(make_engine, root, fake):
    engine = make_engine()
    engine.run(f"fetch:{MODEL}")
    fake.fail.add("export")
    with pytest.raises(RuleFailed):
        engine.run(EXPORT)
    failed = root / "build" / MODEL / "export.failed.log"
    assert "gate failed" in failed.read_text()
    assert not (root / "build" / MODEL / "export.running.log").exists()
    event = json.loads((root / "build" / "events.jsonl").read_text().splitlines()[-1])
    assert event["outcome"] == "failed" and event["peak_rss_mb"] == 10.0  # the fake rule's


def test_a_full_store_disk_is_named_in_the_failure(make_engine, fake, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(failures_module.shutil, "disk_usage",
                        lambda path: usage(100 << 30, (100 << 30) - (5 << 20), 5 << 20))
    engine = make_engine()
    engine.run(f"fetch:{MODEL}")
    fake.fail.add("export")
    with pytest.raises(RuleFailed, match="the store's disk is full: 5 MiB free"):
        engine.run(EXPORT)


def test_run_all_still_builds_after_the_sweeps(make_engine, oracle):
    assert run_all(make_engine()) == ["built"] * len(TASKS)
    oracle()
