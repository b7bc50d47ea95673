"""The preflight on doit's own Task objects (cli/preflight.py), as the reporter runs it before
doit dispatches a task: on a copy of the project with a hailo10h test model and the real
Dataflow Compiler toolchain, whose image is not pinned here. Nothing runs a stage."""

from __future__ import annotations

from pathlib import Path

import pytest
from doit.exceptions import TaskFailed
from doit.loader import generate_tasks
from e2e.conftest import REPO, copy_project
from fakes.toolchains import FAKE_DFC_TOOLCHAIN

from hefbuild.cli.hooks import _stages_reached
from hefbuild.cli.preflight import preflight
from hefbuild.cli.session import table_at
from hefbuild.cli.tasks import _task_dicts, run_task

HAILO = "tiny-hailo-llama"
CPU = "tiny-llama"
NO_IMAGE = ("toolchain/hailo-dfc-5.3.0.toml: no pinned image (toolchain/hailo-dfc-5.3.0.lock."
            "json); build and pin it with `doit image:hailo-dfc-5.3.0`")


@pytest.fixture
def root(tmp_path: Path) -> str:
    project = copy_project(tmp_path / "project", tmp_path / "store")
    (project.root / "models" / f"{HAILO}.toml").write_bytes(
        (REPO / "tests/hailo_models" / f"{HAILO}.toml").read_bytes())
    return str(project.root)


def doit_tasks(root: str) -> dict:
    return {t.name: t for t in generate_tasks("task_hefbuild",
                                              _task_dicts(table_at(root), None))}


def run(root: str, *selected: str) -> tuple[dict, object]:
    tasks = doit_tasks(root)
    refused = preflight(root, tasks, _stages_reached(tasks, list(selected)), list(selected))
    return tasks, refused


def of(model: str, *stages: str) -> set[str]:
    return {f"{s}:{model}" for s in stages}


def test_a_hef_without_its_image_starts_nothing(root: str):
    tasks, refused = run(root, f"hef:{HAILO}")
    assert refused is not None
    assert refused.blocked.roots == {f"parse:{HAILO}": NO_IMAGE}
    assert f"  {NO_IMAGE} (needed by parse:{HAILO}, resources:{HAILO}, optimize:{HAILO}, " \
           f"compile:{HAILO})" in refused.message.splitlines()
    parse = tasks[f"parse:{HAILO}"]
    assert parse.task_dep == [] and parse.uptodate == []
    # what doit will reach now: the refused stage and what waits for it; no fetch, export or
    # reference spends its time for a chain that cannot finish
    assert _stages_reached(tasks, [f"hef:{HAILO}"]) == \
        of(HAILO, "parse", "resources", "optimize", "fidelity", "compile")
    assert tasks[f"fidelity:{HAILO}"].task_dep == [f"optimize:{HAILO}"]
    failed = run_task(*parse.actions[0].args)
    assert isinstance(failed, TaskFailed)
    assert failed.message == f"parse:{HAILO}: not started: {NO_IMAGE}"
    assert not (Path(root) / "build").exists()


def test_another_model_of_the_run_is_left_as_it_was(root: str):
    before = {n: list(t.task_dep) for n, t in doit_tasks(root).items()}
    tasks, refused = run(root, f"hef:{HAILO}", f"verify:{CPU}")
    assert refused is not None and set(refused.blocked.roots) == {f"parse:{HAILO}"}
    cpu = of(CPU, "fetch", "export", "quantize", "compile", "verify")
    assert {n: tasks[n].task_dep for n in cpu} == {n: before[n] for n in cpu}
    assert all(len(tasks[n].actions[0].args) == 2 for n in cpu)  # run_task(root, task)
    assert cpu <= _stages_reached(tasks, [f"hef:{HAILO}", f"verify:{CPU}"])


def test_a_ready_toolchain_changes_nothing(root: str):
    (Path(root) / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC_TOOLCHAIN)
    before = {n: list(t.task_dep) for n, t in doit_tasks(root).items()}
    tasks, refused = run(root, f"hef:{HAILO}")
    assert refused is None
    assert {n: t.task_dep for n, t in tasks.items()} == before


def test_only_a_task_known_up_to_date_with_all_before_it_skips_its_check(root: str,
                                                                        monkeypatch):
    """What the fast path answers up to date, with every task before it, doit is told is
    up to date; from the first task that may run on, each keeps its uptodate check (its
    upstream may be rebuilt first, so only the check after it can say)."""
    from hefbuild.cli.session import fast_path_at
    from hefbuild.cli.uptodate import UptodateCheck

    stale = f"quantize:{CPU}"
    monkeypatch.setattr(fast_path_at(root), "answer",
                        lambda task, toolchain: None if task == stale else "key")
    tasks, refused = run(root, f"verify:{CPU}")
    assert refused is None
    known = {n for n, t in tasks.items() if t.uptodate == [(True, None, None)]}
    assert known == of(CPU, "fetch", "export")
    for name in of(CPU, "quantize", "compile", "verify"):
        [(check, _, _)] = tasks[name].uptodate
        assert isinstance(check, UptodateCheck) and check.task == name
    monkeypatch.setattr(fast_path_at(root), "answer", lambda task, toolchain: "key")
    forced, _ = run(root, f"verify:{CPU}", "-a")  # `doit -a verify:m`: rebuilt, so checked
    assert isinstance(forced[f"verify:{CPU}"].uptodate[0][0], UptodateCheck)
    assert forced[f"compile:{CPU}"].uptodate == [(True, None, None)]


def test_a_stage_check_survives_pickling_and_says_what_it_checks(root: str):
    """`doit -P process` pickles the tasks; `doit info` prints a check that said no."""
    import pickle

    from hefbuild.cli.uptodate import UptodateCheck

    check = doit_tasks(root)[f"verify:{CPU}"].uptodate[0][0]
    again = pickle.loads(pickle.dumps(check))
    assert isinstance(again, UptodateCheck) and (again.root, again.task) == (root, f"verify:{CPU}")
    assert repr(again) == f"check_uptodate({root!r}, 'verify:{CPU}')"
