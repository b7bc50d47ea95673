"""A stage container never outlives its doit: killed with -9, the doit's container ends
itself (lifeline.py sees the FIFO doit held close), with no later hefbuild invocation; and
the next docker executor of this machine removes what containers of dead doits left
(stopped ones, and running ones whose lifeline could not work), never a container whose
owner may be alive or that belongs to another machine."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hefbuild.execute.base import StageRun, Watch
from hefbuild.execute.docker import (
    HOST,
    OWNER,
    OWNER_START,
    PID_NS,
    STAGE,
    UNKNOWN,
    DockerExecutor,
    container_config,
    owner_gone,
    owner_labels,
    process_start,
)
from hefbuild.execute.lifeline import GONE_LINE

from .conftest import LABEL, SESSION, docker_host

# The doit that dies: one docker stage whose rule sleeps, run by the executor itself.
CHILD = r"""
import sys
from pathlib import Path
from hefbuild.execute.base import StageRun, Watch
from hefbuild.execute.docker import DockerExecutor

scratch, image = Path(sys.argv[1]), sys.argv[2]
stage = StageRun(task="fetch:orphan", interpreter="python3",
                 rules_dir=scratch.parent / "rules", rule="sleep.py", action={}, inputs={},
                 files={}, scratch=scratch, env={}, image=image)
DockerExecutor().run_stage(stage)
"""


def stage_in(root: Path, name: str, rule: str, image: str) -> StageRun:
    scratch = root / name
    for sub in ("out", "work"):
        (scratch / sub).mkdir(parents=True)
    return StageRun(task=f"fetch:{name}", interpreter="python3", rules_dir=root / "rules",
                    rule=rule, action={}, inputs={}, files={}, scratch=scratch, env={},
                    image=image)


def start_child(root: Path, image: str) -> subprocess.Popen:
    (root / "rules").mkdir(exist_ok=True)
    (root / "rules/sleep.py").write_text("import time\nprint('sleeping', flush=True)\n"
                                         "time.sleep(300)\n")
    env = dict(os.environ)
    if docker_host():
        env["DOCKER_HOST"] = docker_host()
    stage_in(root, "child", "sleep.py", image)
    with open(root / "child.log", "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-c", CHILD, str(root / "child"), image],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)


def wait_running(client: Any, proc: subprocess.Popen, root: Path) -> Any:
    filters = {"label": [f"{OWNER}={proc.pid}", f"{STAGE}=fetch:orphan"], "status": "running"}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = client.containers.list(filters=filters)
        if found:
            return found[0]
        if proc.poll() is not None:
            pytest.fail(f"the child exited {proc.returncode}: {(root / 'child.log').read_text()}")
        time.sleep(0.2)
    pytest.fail(f"no running container of the child: {(root / 'child.log').read_text()}")


def wait_rule_started(proc: subprocess.Popen, root: Path) -> None:
    """The rule said so in its log: the wrapper armed its lifeline before starting it."""
    log = root / "child" / "log.txt"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and "sleeping" in log.read_text():
            return
        if proc.poll() is not None:
            pytest.fail(f"the child exited {proc.returncode}: {(root / 'child.log').read_text()}")
        time.sleep(0.2)
    pytest.fail(f"the rule never started: {(root / 'child.log').read_text()}")


def kill_child(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def sleeper(client: Any, image: str, labels: dict[str, str]) -> Any:
    """A busybox `sleep 300` with these owner labels, as if a stage of that owner."""
    return client.containers.run(image, ["sleep", "300"], detach=True, network_mode="none",
                                 labels={STAGE: "fetch:planted", **labels, LABEL: SESSION})


def is_gone(client: Any, container_id: str) -> bool:
    import docker.errors

    try:
        client.containers.get(container_id)
    except docker.errors.NotFound:
        return True
    return False


def test_a_killed_doits_container_ends_itself(tmp_path: Path, docker_client, python_image):
    proc = start_child(tmp_path, python_image)
    container = None
    try:
        container = wait_running(docker_client, proc, tmp_path)
        wait_rule_started(proc, tmp_path)
        kill_child(proc)
        # No hefbuild runs from here on. Without the lifeline the rule sleeps on for 300 s
        # and this wait gives up (ReadTimeout): the test fails rather than hangs.
        status = container.wait(timeout=60)
        container.reload()
        assert container.status == "exited"
        assert status["StatusCode"] == 128 + signal.SIGKILL  # the rule, killed
        assert GONE_LINE in container.logs().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if container is not None:
            with contextlib.suppress(Exception):
                container.remove(force=True)


def test_the_next_executor_removes_what_dead_doits_left(
        tmp_path: Path, docker_client, busybox_image, python_image):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules/echo.py").write_text("print('next stage')\n")
    ours = owner_labels()
    started: list[str] = []
    proc = start_child(tmp_path, python_image)
    try:
        ended = wait_running(docker_client, proc, tmp_path)
        started.append(ended.id)
        assert ended.labels[OWNER_START] == process_start(proc.pid)
        assert ended.labels[HOST] == ours[HOST]
        wait_rule_started(proc, tmp_path)
        kill_child(proc)
        ended.wait(timeout=60)  # it ended itself; its stopped remains are the reap's
        dead = {**ours, OWNER: str(proc.pid), OWNER_START: ended.labels[OWNER_START]}
        # Running on: a container of that dead doit whose lifeline could not work.
        orphan = sleeper(docker_client, busybox_image, dead)
        live = sleeper(docker_client, busybox_image, ours)  # this process: alive
        reused = sleeper(docker_client, busybox_image, {**ours, OWNER_START: "1"})  # pid reused
        foreign = sleeper(docker_client, busybox_image, {**dead, HOST: "another-machine"})
        other_ns = sleeper(docker_client, busybox_image, {**dead, PID_NS: "pid:[1]"})
        started += [orphan.id, live.id, reused.id, foreign.id, other_ns.id]

        said: list[dict] = []
        stage = replace(stage_in(tmp_path, "next", "echo.py", python_image),
                        watch=Watch(emit=said.append))
        result = DockerExecutor(docker_client).run_stage(stage)

        assert result.returncode == 0
        for container in (ended, orphan, reused):
            assert is_gone(docker_client, container.id), container.labels
        for kept in (live, foreign, other_ns):
            kept.reload()
            assert kept.status == "running", kept.labels
        log = stage.log_path.read_text()
        line = next(ln for ln in log.splitlines() if ln.startswith("hefbuild: removed "))
        assert "containers left by a doit that died: " in line
        removed = set(line.rsplit(": ", 1)[1].split(", "))
        assert {ended.name, orphan.name, reused.name} <= removed  # (another's may be there)
        assert not {live.name, foreign.name, other_ns.name} & removed
        assert "next stage" in log
        assert said and said[0]["message"] == line.removeprefix("hefbuild: ")
        stage_left = docker_client.containers.list(
            all=True, filters={"label": [f"{STAGE}=fetch:next", f"{OWNER}={os.getpid()}"]})
        assert stage_left == []  # the stage's own container: removed after the stage
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for container_id in started:
            with contextlib.suppress(Exception):  # removed by the test already
                docker_client.containers.get(container_id).remove(force=True)


def test_an_owner_is_gone_only_when_certainly_dead_or_replaced():
    assert owner_gone("4242", "4242") is False  # same pid, same start: alive
    assert owner_gone("4242", None) is True  # no process with that pid
    assert owner_gone("4242", "9999") is True  # the pid now belongs to another process
    assert owner_gone("4242", UNKNOWN) is False  # a process we may not inspect: maybe it
    assert owner_gone(UNKNOWN, "9999") is False  # the owner's start was never known


def test_process_start_tells_a_process_from_its_corpse():
    me = process_start(os.getpid())
    assert me not in (None, UNKNOWN)
    assert process_start(os.getpid()) == me  # stable: the label compares equal later
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while process_start(child.pid) is not None:  # alive, then a zombie: dead to us
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        child.wait()
    assert process_start(child.pid) is None  # reaped: no such process


def test_every_stage_container_names_its_stage_owner_and_machine(tmp_path: Path):
    stage = StageRun(task="export:m", interpreter="python3", rules_dir=tmp_path, rule="r.py",
                     action={}, inputs={}, files={}, scratch=tmp_path, env={}, image="sha256:x")
    labels = container_config(stage, owner_labels())["labels"]
    assert labels[STAGE] == "export:m"
    assert labels[OWNER] == str(os.getpid())
    assert labels[OWNER_START] == process_start(os.getpid())
    assert labels[HOST] == os.uname().nodename
    assert labels[PID_NS] == os.readlink("/proc/self/ns/pid")
