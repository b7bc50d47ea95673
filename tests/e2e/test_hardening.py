"""doit under stress, end to end: Ctrl-C mid-stage, threads sharing one engine."""

from __future__ import annotations

import signal
import time

import pytest

from .conftest import Project, copy_project, tiny_tasks

pytestmark = pytest.mark.e2e


def test_ctrl_c_in_a_stage_is_one_line_and_records_nothing(tmp_path, built_store):
    store = built_store[0]
    project = copy_project(tmp_path / "project", store)
    rule = project.root / "rules" / "cpu_ort" / "export.py"
    source = rule.read_text()  # a slow rule (and a new key: it builds)
    rule.write_text(source.replace("from __future__ import annotations\n",
                                   "from __future__ import annotations\nimport time\n"
                                   "time.sleep(120)\n", 1))
    proc = project.popen("verify:tiny-llama")
    running = project.root / "build" / "tiny-llama" / "export.running.log"
    deadline = time.monotonic() + 120
    while not running.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running.exists(), "export never started"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in out + err
    errors = [ln for ln in (out + err).splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and "interrupted (Ctrl-C)" in errors[0], out + err
    assert not (project.root / "build" / "tiny-llama" / "export").exists()
    assert (project.root / "build" / "tiny-llama" / "export.failed.log").exists()


# About 40 s: two whole chains from an empty store at once is the race it looks for.
def test_two_models_in_threads_on_an_empty_store(tmp_path):
    project = Project(copy_project(tmp_path / "p", tmp_path / "store").root, tmp_path / "store")
    run = project.doit("-n", "2", "-P", "thread", "verify:tiny-llama", "verify:tiny-qwen2",
                       timeout=900)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Traceback" not in run.stdout + run.stderr
    assert run.outcomes() == {t: "built" for t in tiny_tasks() | tiny_tasks("tiny-qwen2")}
    again = project.doit("verify:tiny-llama", "verify:tiny-qwen2")
    assert set(again.outcomes().values()) == {"uptodate"}
