"""The event log: whole lines or nothing, a reader that skips what is damaged."""

from __future__ import annotations

import errno
import json
import os

import hefbuild.store.events as events
from hefbuild.store.events import EventLog, Outcome, read_events


def test_an_append_never_glues_onto_a_torn_tail(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"task": "a", "outcome": "built"}\n{"task": "b", "outc')  # cut mid-line
    EventLog(path).append("c", "k", Outcome.BUILT, 1.0, 10.0)
    lines, damaged = read_events(path)
    assert damaged == 1
    assert [e["task"] for e in lines] == ["a", "c"]


def test_a_short_write_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    EventLog(path).append("a", "k", Outcome.BUILT, 1.0, 10.0)
    before = path.read_bytes()
    real_write = os.write

    def disk_full(fd, data):  # noqa: ANN001, ANN202 - writes half, then the disk is full
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(events.os, "write", disk_full)
    EventLog(path).append("b", "k", Outcome.BUILT, 1.0, 10.0)  # no exception: dropped
    assert path.read_bytes() == before
    monkeypatch.setattr(events.os, "write", real_write)
    EventLog(path).append("c", "k", Outcome.BUILT, 1.0, 10.0)
    lines, damaged = read_events(path)
    assert damaged == 0 and [e["task"] for e in lines] == ["a", "c"]


def test_an_unwritable_log_does_not_fail_the_caller(tmp_path):
    path = tmp_path / "ro" / "events.jsonl"
    path.parent.mkdir()
    os.chmod(path.parent, 0o555)
    try:
        if os.access(path.parent, os.W_OK):
            return  # root ignores the mode; the short-write test covers the logic
        EventLog(path).append("a", "k", Outcome.BUILT, 1.0, 10.0)
    finally:
        os.chmod(path.parent, 0o755)


def test_every_line_written_is_whole_json(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    for i in range(50):
        log.append(f"t{i}", "k", Outcome.UPTODATE, 0.1, 1.0, note="x" * i)
    log.summary({"uptodate": 50}, [f"t{i}" for i in range(50)])
    assert all(json.loads(line) for line in path.read_text().splitlines())
