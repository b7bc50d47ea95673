"""The heartbeat's ETA from earlier builds and its phase from the log, through the engine
with real (tiny) rule programs on the host executor."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fakes.toolchains import FAKES

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.store.history import read_durations

from .helpers import MODEL, REPO
from .test_limits import fetch_rule

FETCH = f"fetch:{MODEL}"
SLEEP = "import time\ntime.sleep(1.0)\n"


@pytest.fixture(autouse=True)
def fast_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEFBUILD_HEARTBEAT_S", "0.2")
    monkeypatch.setenv("HEFBUILD_SILENCE_S", "900")


def build(root: Path, store: Path, force: bool = False) -> tuple[str, list[str]]:
    said: list[str] = []
    engine = Engine(load_project(root, store=store), progress=said.append)
    outcome = engine.run(FETCH, force=force)["outcome"]
    return outcome, [line for line in said if "elapsed" in line or "of about" in line]


def events(root: Path) -> list[dict]:
    return [json.loads(x) for x in (root / "build/events.jsonl").read_text().splitlines()]


def test_a_second_build_gets_an_eta_from_the_first(root: Path, store: Path):
    fetch_rule(root, SLEEP)
    outcome, beats = build(root, store)
    assert outcome == "built" and beats and all(" elapsed, " in b for b in beats)
    [first] = read_durations(store / "v1")
    assert first["task"] == FETCH and first["seconds"] >= 1.0
    built = [e for e in events(root) if e.get("outcome") == "built"]
    assert (built[0]["rule"], built[0]["input_bytes"]) == (first["rule"], first["input_bytes"])

    outcome, beats = build(root, store, force=True)
    assert outcome == "built"
    usual = f"of about {int(first['seconds'])} s (1 earlier build), "
    assert beats and all(re.match(rf"\[hefbuild\] {FETCH}: \d+ s {re.escape(usual)}", b)
                         for b in beats), beats
    beat = [e for e in events(root) if "heartbeat" in e][-1]["heartbeat"]
    assert (beat["usual_s"], beat["usual_builds"]) == (round(first["seconds"], 1), 1)

    _, beats = build(root, store, force=True)
    assert "(median of 2 earlier builds)" in beats[-1]


def test_restores_add_no_history_and_a_rule_change_starts_afresh(root: Path, store: Path):
    fetch_rule(root, SLEEP)
    assert build(root, store)[0] == "built"
    shutil.rmtree(root / "build")
    assert build(root, store)[0] == "restored"
    assert len(read_durations(store / "v1")) == 1
    fetch_rule(root, "# another rule\n" + SLEEP)
    outcome, beats = build(root, store)
    assert outcome == "built" and beats and not any("of about" in b for b in beats)


# The DFC test double logs its compile progress (tests/fakes/hailo_sdk_client), then the
# rule waits for two heartbeats after it: the second one read the log after every line.
PLACING = r"""
import time
from hailo_sdk_client._runner import log_placement
log_placement(["tiny__prefill", "tiny__tbt"])
log = open("/proc/self/fd/1", "rb")
log.seek(0, 2)
said, deadline = b"", time.monotonic() + 20
while said.count(b"[hefbuild] heartbeat: ") < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
    said += log.read()
"""


def test_the_heartbeat_names_the_phase_the_dfc_logged(root: Path, store: Path):
    # The model's target (cpu-ort) declares no phase table: the project's own copy of it
    # takes hailo10h's `[watch]` (the end of that file), as a target of DFC stages would.
    hailo = (REPO / "targets" / "hailo10h.toml").read_text()
    (root / "targets").mkdir(exist_ok=True)
    (root / "targets" / "cpu-ort.toml").write_text(
        (REPO / "targets" / "cpu-ort.toml").read_text() + hailo[hailo.index("\n[watch]"):])
    # The double goes where the rule can import it (rules/ is on its path, in the sandbox).
    shutil.copytree(FAKES / "hailo_sdk_client", root / "rules" / "hailo_sdk_client",
                    ignore=shutil.ignore_patterns("__pycache__"))
    fetch_rule(root, PLACING)
    outcome, beats = build(root, store)
    assert outcome == "built"
    assert any("; phase: placement of tiny__tbt, context 0 (since " in b for b in beats), beats
    beat = [e for e in events(root) if "heartbeat" in e][-1]["heartbeat"]
    assert beat["phase"] == "placement of tiny__tbt, context 0"
    log = (root / f"build/{MODEL}/fetch/log.txt").read_text()
    assert "[INFO] Validating tiny__tbt_context_0 layer by layer" in log
