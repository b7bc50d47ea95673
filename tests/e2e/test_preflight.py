"""A toolchain that is not ready stops, before any stage starts, exactly the tasks that need
it (issue 23: "fail before the hours"), through the real doit. The hailo10h test model is
built with the real Dataflow Compiler toolchain, whose image is not pinned in a copy of the
project; the tiny cpu-ort model beside it needs nothing missing."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import pytest
from fakes.toolchains import FAKE_DFC_TOOLCHAIN
from tree_digest import sha256_tree

from .conftest import REPO, DoitRun, Project, copy_project, tiny_tasks

pytestmark = pytest.mark.e2e

HAILO = "tiny-hailo-llama"
CPU = "tiny-llama"
NO_IMAGE = ("toolchain/hailo-dfc-5.3.0.toml: no pinned image (toolchain/hailo-dfc-5.3.0.lock."
            "json); build and pin it with `doit image:hailo-dfc-5.3.0`")
HEADLINE = ("ERROR: this run needs a toolchain that is not ready; no task that needs it starts, "
            "nor what only those tasks need:")
NEEDED = f"  {NO_IMAGE} (needed by " + ", ".join(
    f"{s}:{HAILO}" for s in ("parse", "resources", "optimize", "compile")) + ")"


def hailo_project(path: Path, store: Path) -> Project:
    project = copy_project(path, store)
    shutil.copy(REPO / "tests/hailo_models" / f"{HAILO}.toml", project.root / "models")
    assert not (project.root / "toolchain/hailo-dfc-5.3.0.lock.json").exists()
    return project


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("preflight-store")


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory, store: Path) -> tuple[Project, DoitRun]:
    """One run of both models: the hailo one refused, the cpu-ort one built (into `store`)."""
    project = hailo_project(tmp_path_factory.mktemp("both") / "project", store)
    return project, project.doit(f"hef:{HAILO}", f"verify:{CPU}")


def test_a_model_whose_toolchain_is_missing_does_not_stop_the_other(both):
    project, run = both
    assert run.returncode == 2, run.stdout + run.stderr  # a named task's upstream failed
    assert run.outcomes() == {t: "built" for t in tiny_tasks(CPU)}
    assert not (project.root / "build" / HAILO).exists()  # not even its fetch ran
    lines = run.stdout.splitlines()
    assert lines[:2] == [HEADLINE, NEEDED]  # said before anything starts
    assert [line for line in lines if line.startswith("ERROR")] == [HEADLINE]  # one error
    assert f"failed     parse:{HAILO} — not started: {NO_IMAGE}" in run.stdout
    table = next(line for line in lines if f"hef:{HAILO}" in line and "not runnable" in line)
    assert table.split(f"hef:{HAILO}", 1)[1].strip() == f"parse:{HAILO} failed: {NO_IMAGE}"
    assert any(line.strip().startswith(f"passed       verify:{CPU}") for line in lines)


@pytest.mark.parametrize("jobs", [(), ("-n", "2")], ids=["serial", "parallel"])
def test_a_hef_without_its_image_runs_no_stage_at_all(tmp_path: Path, store: Path, both,
                                                      jobs: tuple[str, ...]):
    assert both[1].outcomes()  # the shared store holds a build: it must stay as it is
    project = hailo_project(tmp_path / "project", store)
    before = sha256_tree(store)
    run = project.doit(*jobs, f"hef:{HAILO}")
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout.splitlines()[:2] == [HEADLINE, NEEDED]
    assert run.events == [] and "building" not in run.stderr
    assert not (project.root / "build").exists()  # no manifest, no stage folder, no event
    assert sha256_tree(store) == before


DEVICE = """\
[toolchain]
kind = "ssh"
host = "127.0.0.1"
user = "nobody"
port = {port}
interpreter = "/usr/bin/python3"

[pins]
hailort = "5.3.0"
firmware = "5.3.0"
"""


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens on it once closed


def test_a_check_whose_device_does_not_answer_builds_nothing_for_it(tmp_path: Path,
                                                                    store: Path):
    project = hailo_project(tmp_path / "project", store)
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC_TOOLCHAIN)
    port = closed_port()
    (project.root / "toolchain/hailo10h-device.toml").write_text(DEVICE.format(port=port))
    run = project.doit(f"verify:{HAILO}")
    assert run.returncode == 1, run.stdout + run.stderr  # the named task itself is refused
    lines = run.stdout.splitlines()
    assert lines[1].startswith(f"  toolchain/hailo10h-device.toml: device host 127.0.0.1:{port} "
                               f"does not answer (")
    assert lines[1].endswith(f"(needed by verify:{HAILO})")
    assert run.events == [] and not (project.root / "build").exists()
