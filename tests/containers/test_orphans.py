"""A stage container never outlives its doit: a doit killed with -9 leaves its container
running, and the next docker executor of this machine removes it before its own first stage,
never a container whose owner may be alive or that belongs to another machine."""

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

from hefbuild.executors.base import StageRun, Watch
from hefbuild.executors.docker import (
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

from .conftest import LABEL, SESSION, docker_host

# The doit that dies: one docker stage whose rule sleeps, run by the executor itself.
CHILD = r"""
import sys
from pathlib import Path
from hefbuild.executors.base import StageRun, Watch
from hefbuild.executors.docker import DockerExecutor

scratch, image = Path(sys.argv[1]), sys.argv[2]
stage = StageRun(task="fetch:orphan", interpreter="sh", rules_dir=scratch.parent / "rules",
                 rule="sleep.sh", action={}, inputs={}, files={}, scratch=scratch, env={},
                 image=image)
DockerExecutor().run_stage(stage)
"""


def stage_in(root: Path, name: str, rule: str, image: str) -> StageRun:
    scratch = root / name
    for sub in ("out", "work"):
        (scratch / sub).mkdir(parents=True)
    return StageRun(task=f"fetch:{name}", interpreter="sh", rules_dir=root / "rules", rule=rule,
                    action={}, inputs={}, files={}, scratch=scratch, env={}, image=image)


def start_child(root: Path, image: str) -> subprocess.Popen:
    env = dict(os.environ)
    if docker_host():
        env["DOCKER_HOST"] = docker_host()
    stage_in(root, "child", "sleep.sh", image)
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


def test_killed_doit_leaves_a_container_that_the_next_executor_removes(
        tmp_path: Path, docker_client, busybox_image):
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules/sleep.sh").write_text("echo sleeping\nsleep 300\n")
    (tmp_path / "rules/echo.sh").write_text("echo next stage\n")
    ours = owner_labels()
    started: list[str] = []
    proc = start_child(tmp_path, busybox_image)
    try:
        orphan = wait_running(docker_client, proc, tmp_path)
        started.append(orphan.id)
        assert orphan.labels[OWNER_START] == process_start(proc.pid)
        assert orphan.labels[HOST] == ours[HOST]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        time.sleep(1)
        orphan.reload()
        assert orphan.status == "running"  # the bug: nothing outlives doit's `finally` but this

        live = sleeper(docker_client, busybox_image, ours)  # this process: alive
        reused = sleeper(docker_client, busybox_image, {**ours, OWNER_START: "1"})  # pid reused
        dead = {**ours, OWNER: str(proc.pid), OWNER_START: "1"}
        foreign = sleeper(docker_client, busybox_image, {**dead, HOST: "another-machine"})
        other_ns = sleeper(docker_client, busybox_image, {**dead, PID_NS: "pid:[1]"})
        started += [live.id, reused.id, foreign.id, other_ns.id]

        said: list[dict] = []
        stage = replace(stage_in(tmp_path, "next", "echo.sh", busybox_image),
                        watch=Watch(emit=said.append))
        result = DockerExecutor(docker_client).run_stage(stage)

        assert result.returncode == 0
        assert is_gone(docker_client, orphan.id)
        assert is_gone(docker_client, reused.id)
        for kept in (live, foreign, other_ns):
            kept.reload()
            assert kept.status == "running", kept.labels
        log = stage.log_path.read_text()
        line = next(ln for ln in log.splitlines() if ln.startswith("hefbuild: removed "))
        assert "containers left by a doit that died: " in line
        assert orphan.name in line and reused.name in line
        assert not {live.name, foreign.name, other_ns.name} & set(line.split(": ")[1].split(", "))
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
