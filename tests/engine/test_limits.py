"""Limits and the watchdog on the host executor, with real (tiny) rule programs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.errors import RuleFailed

from .helpers import MODEL, edit, model_toml

FETCH = f"fetch:{MODEL}"

WRITE_CHECKPOINT = """
import json, sys, pathlib
action = json.loads(pathlib.Path(sys.argv[1]).read_text())
out = pathlib.Path(action["out"]) / "checkpoint"
out.mkdir(parents=True)
(out / "config.json").write_text("{}")
"""


def fetch_rule(root: Path, body: str) -> None:
    (root / "rules" / "fetch.py").write_text(body + WRITE_CHECKPOINT)


def test_silent_stage_gets_heartbeats_in_log_events_and_terminal(root, store, monkeypatch):
    monkeypatch.setenv("HEFBUILD_HEARTBEAT_S", "0.3")
    monkeypatch.setenv("HEFBUILD_SILENCE_S", "0.5")
    fetch_rule(root, "import time\nprint('loading', flush=True)\ntime.sleep(1.6)\n")
    said: list[str] = []
    engine = Engine(load_project(root, store=store), progress=said.append)
    assert engine.run(FETCH)["outcome"] == "built"
    assert any("no output for" in line and "idle" in line for line in said), said
    assert all(line.startswith(f"[hefbuild] {FETCH}: ") for line in said)
    assert any(line.endswith(": loading") for line in said)  # the last output line
    events = [json.loads(x) for x in (root / "build/events.jsonl").read_text().splitlines()]
    beats = [e for e in events if "heartbeat" in e]
    assert len(beats) >= 2 and all(e["task"] == FETCH for e in beats)
    fields = {"elapsed_s", "cpu_cores", "rss_mb", "silent_s", "last_line", "message"}
    assert fields <= set(beats[0]["heartbeat"])
    log = (root / f"build/{MODEL}/fetch/log.txt").read_text()
    assert "[hefbuild] heartbeat: no output for" in log and "loading" in log


# Spins until it has used 1.5 s of CPU and its own log (its stdout) holds a heartbeat that
# calls it busy, for at most 20 s. A loaded machine can only delay that beat, so the test
# does not flake; a watchdog that calls a spinning stage idle never writes it, and fails.
SPIN_UNTIL_CALLED_BUSY = r"""
import re, time
log = open("/proc/self/fd/1", "rb")
said, check, deadline = b"", 0.0, time.monotonic() + 20
while time.monotonic() < deadline:
    if time.process_time() >= check:
        check = time.process_time() + 0.05
        said += log.read()
        if time.process_time() >= 1.5 and re.search(rb"busy \(\d", said):
            break
"""


def test_busy_stage_heartbeat_says_a_core_is_busy(root, store, monkeypatch):
    monkeypatch.setenv("HEFBUILD_HEARTBEAT_S", "0.4")
    monkeypatch.setenv("HEFBUILD_SILENCE_S", "0.3")
    fetch_rule(root, SPIN_UNTIL_CALLED_BUSY)
    said: list[str] = []
    Engine(load_project(root, store=store), progress=said.append).run(FETCH)
    assert any(re.search(r"busy \(\d\.\d cores since its last output\)", line)
               for line in said), said
    manifest = json.loads((root / f"build/{MODEL}/fetch/manifest.json").read_text())
    assert manifest["cpu_seconds"] >= 1.0


def test_memory_hog_is_killed_at_its_cap_with_the_peak(root, store):
    edit(model_toml(root), "[stages.quantize]", '[stages.fetch]\nmemory = "150m"\n\n'
                                                 "[stages.quantize]")
    fetch_rule(root, "import time\nblob = bytearray(400 * 2**20)\nfor i in range(0, len(blob),"
                     " 4096):\n    blob[i] = 1\ntime.sleep(5)\n")
    engine = Engine(load_project(root, store=store))
    with pytest.raises(RuleFailed) as err:
        engine.run(FETCH)
    message = str(err.value)
    assert "killed at its memory cap of 150 MiB (peak" in message
    peak = float(message.split("(peak ")[1].split(" MiB")[0])
    assert peak > 150
    assert not (root / f"build/{MODEL}/fetch").exists()
    assert not any(store.glob("v1/results/*/*.json"))


def test_sleeping_stage_is_killed_at_its_timeout(root, store):
    edit(model_toml(root), "[stages.quantize]", '[stages.fetch]\ntimeout = "1s"\n\n'
                                                 "[stages.quantize]")
    fetch_rule(root, "import time\ntime.sleep(60)\n")
    engine = Engine(load_project(root, store=store))
    with pytest.raises(RuleFailed) as err:
        engine.run(FETCH)
    assert f"{FETCH}: killed at its timeout of 1 s" in str(err.value)
    assert not any(store.glob("v1/results/*/*.json"))


def test_limits_come_from_the_toolchain_when_the_model_is_silent(root, store):
    from hefbuild.plan.limits import stage_limits

    host = root / "toolchain" / "host.toml"
    host.write_text(host.read_text() + '\n[limits]\ntimeout = "2h"\nmemory = "1g"\n')
    engine = Engine(load_project(root, store=store))
    action, tc = engine.actions[FETCH], engine.project.toolchains["host"]
    assert stage_limits(action, tc).timeout_s == 7200
    assert stage_limits(action, tc).memory_bytes == 2**30
    edit(model_toml(root), "[stages.quantize]", '[stages.fetch]\nmemory = "2g"\n\n'
                                                 "[stages.quantize]")
    engine = Engine(load_project(root, store=store))
    assert stage_limits(engine.actions[FETCH], tc).memory_bytes == 2 * 2**30


def test_limits_are_not_part_of_the_key(root, store):
    before = Engine(load_project(root, store=store)).key_of
    key1 = before(Engine(load_project(root, store=store)).actions[FETCH]).hex
    edit(model_toml(root), "[stages.quantize]", '[stages.fetch]\ntimeout = "3h"\n\n'
                                                 "[stages.quantize]")
    engine = Engine(load_project(root, store=store))
    assert engine.key_of(engine.actions[FETCH]).hex == key1
