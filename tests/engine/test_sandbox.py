"""Host stages in bubblewrap: a hostile rule's every attempt to reach outside fails, nothing
it starts outlives it, and an honest rule builds as before.

These run real rules through the real host executor (no fake): the rule programs below
replace the dummy rules of the tiny project.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from pathlib import Path

import psutil
import pytest

from hefbuild.engine import Engine
from hefbuild.executors.sandbox import bwrap_path
from hefbuild.project import load_project

from .helpers import MODEL

pytestmark = pytest.mark.skipif(
    bwrap_path() is None and os.environ.get("CI") != "true",
    reason="bubblewrap missing (.ci/run installs it)")

FETCH_RULE = """
import json, os, sys
action = json.load(open(sys.argv[1]))
os.makedirs(os.path.join(action["out"], "checkpoint"))
seen = {"token": os.environ.get("HF_TOKEN")}
open(os.path.join(action["out"], "checkpoint", "seen.json"), "w").write(json.dumps(seen))
"""

HOSTILE_RULE = """
import json, os, socket, sys, time
action = json.load(open(sys.argv[1]))
targets = json.loads(os.environ["HOSTILE_TARGETS"]) if "HOSTILE_TARGETS" in os.environ else {}
probe = json.load(open(os.path.join(action["inputs"]["fetch"], "checkpoint", "probe.json")))
tried = {}
for name, path in probe["write"].items():
    try:
        open(path, "w").write("pwned")
        tried[name] = "WROTE"
    except OSError as exc:
        tried[name] = type(exc).__name__
for name, path in probe["read"].items():
    try:
        open(path).read()
        tried[name] = "READ"
    except OSError as exc:
        tried[name] = type(exc).__name__
try:
    socket.create_connection(("127.0.0.1", probe["port"]), timeout=2).close()
    tried["socket"] = "CONNECTED"
except OSError as exc:
    tried["socket"] = type(exc).__name__
tried["token"] = os.environ.get("HF_TOKEN")
if os.fork() == 0:  # a daemon: double fork, new session, ignores SIGTERM
    os.setsid()
    if os.fork() == 0:
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)",
                                  probe["marker"]])
    os._exit(0)
time.sleep(0.3)
out = action["out"]
open(os.path.join(out, "model.onnx"), "w").write("onnx")
open(os.path.join(out, "export_report.json"), "w").write(json.dumps(tried, sort_keys=True))
"""


class Listener:
    """A server on the host's loopback that the sandboxed rule must not reach."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()
        self._thread.join(5)


def hostile_project(root: Path, tmp_path: Path, port: int, marker: str) -> dict:
    (root / "rules" / "fetch.py").write_text(FETCH_RULE)
    (root / "rules" / "cpu_ort" / "export.py").write_text(HOSTILE_RULE)
    other = tmp_path / "other-project" / "build" / "m" / "export"
    other.mkdir(parents=True)
    (other / "model.onnx").write_text("someone else's")
    home = Path(os.environ.get("HOME", "/root"))
    probe = {
        "write": {"project": str(root / "models" / "pwned.toml"),
                  "home": str(home / f".hefbuild-pwned-{marker}"),
                  "store": str(tmp_path / "store" / "v1" / "results" / "pwned.json"),
                  "input": str(root / "build" / MODEL / "fetch" / "checkpoint" / "seen.json")},
        "read": {"other_project": str(other / "model.onnx"),
                 "project_toml": str(root / "models" / f"{MODEL}.toml")},
        "port": port, "marker": marker,
    }
    return probe


def run_pipeline(root: Path, store: Path, probe: dict, monkeypatch) -> dict:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_for_fetch_only")
    engine = Engine(load_project(root, store=store))
    engine.run(f"fetch:{MODEL}")
    probe_file = root / "build" / MODEL / "fetch" / "checkpoint" / "probe.json"
    # The probe rides along in fetch's output folder (read-only input of export).
    os.chmod(probe_file.parent, 0o755)
    probe_file.write_text(json.dumps(probe))
    return engine


def daemons(marker: str) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if marker in (p.info["cmdline"] or [])]


def test_a_hostile_rule_reaches_nothing_outside_its_stage(root, store, tmp_path, monkeypatch):
    listener = Listener()
    marker = f"hefbuild-daemon-{uuid.uuid4().hex}"
    try:
        probe = hostile_project(root, tmp_path, listener.port, marker)
        engine = run_pipeline(root, store, probe, monkeypatch)
        # export's inputs changed by the probe file: rebuild export with a fresh engine
        engine = Engine(load_project(root, store=store))
        assert engine.run(f"export:{MODEL}")["outcome"] == "built"
        tried = json.loads((root / "build" / MODEL / "export" / "export_report.json").read_text())
        assert listener.accepted == 0
    finally:
        listener.close()
        for pid in daemons(marker):
            psutil.Process(pid).kill()
    for name in probe["write"]:
        assert tried[name] != "WROTE", f"the rule wrote {name}: {tried}"
    for name in probe["read"]:
        assert tried[name] != "READ", f"the rule read {name}: {tried}"
    assert tried["socket"] != "CONNECTED"
    assert tried["token"] is None  # HF_TOKEN reaches fetch alone
    seen = json.loads((root / "build" / MODEL / "fetch" / "checkpoint" / "seen.json").read_text())
    assert seen["token"] == "hf_secret_for_fetch_only"
    assert not (root / "models" / "pwned.toml").exists()
    assert not Path(probe["write"]["home"]).exists()
    assert not list((store / "v1" / "results").glob("pwned*"))
    assert daemons(marker) == []  # the double-forked daemon ended with its stage
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    assert manifest["sandbox"] == "bwrap"


def test_unsandboxed_by_choice_warns_once_and_still_ends_every_process(
        root, store, tmp_path, monkeypatch):
    monkeypatch.setenv("HEFBUILD_SANDBOX", "0")
    marker = f"hefbuild-daemon-{uuid.uuid4().hex}"
    listener = Listener()
    try:
        probe = hostile_project(root, tmp_path, listener.port, marker)
        probe["write"] = {}  # unsandboxed it could: do not let it try
        run_pipeline(root, store, probe, monkeypatch)
        engine = Engine(load_project(root, store=store))
        assert engine.run(f"export:{MODEL}")["outcome"] == "built"
    finally:
        listener.close()
        alive = daemons(marker)
        for pid in alive:
            psutil.Process(pid).kill()
    assert alive == []  # the reaper killed the setsid double-forked daemon
    assert sum("without a sandbox" in w for w in engine.warnings) == 1
    manifest = json.loads((root / "build" / MODEL / "export" / "manifest.json").read_text())
    assert manifest["sandbox"] == "none"


def test_without_bubblewrap_a_host_stage_refuses_to_run_unless_opted_out(
        root, store, monkeypatch):
    import hefbuild.executors.sandbox as sandbox
    from hefbuild.errors import StageError

    (root / "rules" / "fetch.py").write_text(FETCH_RULE)
    monkeypatch.setattr(sandbox, "bwrap_path", lambda: None)
    with pytest.raises(StageError, match="apt-get install bubblewrap"):
        Engine(load_project(root, store=store)).run(f"fetch:{MODEL}")
    monkeypatch.setenv("HEFBUILD_SANDBOX", "false")
    assert Engine(load_project(root, store=store)).run(f"fetch:{MODEL}")["outcome"] == "built"
