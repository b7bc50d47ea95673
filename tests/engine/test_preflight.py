"""The run's preflight (engine/preflight.py): which stages may run, which a missing toolchain
blocks, and what it says. No doit here; the doit side is tests/cli/test_preflight.py."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from hefbuild.declare.toolchains import ToolchainSpec, load_toolchain
from hefbuild.engine.preflight import blocked, may_run, refusal_text, toolchain_problem
from hefbuild.execute.reach import tcp_problem
from hefbuild.execute.toolchain import ToolchainResolver

M = "m"
# The hailo10h chain of one model as doit's task_dep has it (compile also waits for fidelity).
CHAIN = {
    "fetch": [], "export": ["fetch"], "reference": ["fetch"], "parse": ["export"],
    "resources": ["export", "parse"], "optimize": ["export", "resources"],
    "fidelity": ["export", "optimize", "reference"],
    "compile": ["export", "optimize", "fidelity"], "verify": ["export", "compile", "reference"],
}
DFC = ("parse", "resources", "optimize", "compile")


def chain(model: str = M) -> dict[str, list[str]]:
    return {f"{s}:{model}": [f"{u}:{model}" for u in ups] for s, ups in CHAIN.items()}


def named(*stages: str, model: str = M) -> set[str]:
    return {f"{s}:{model}" for s in stages}


# -- which stages may run --------------------------------------------------------------------

def test_a_no_op_may_run_nothing_so_it_checks_no_toolchain():
    assert may_run(chain(), lambda t: True) == set()


def test_a_stage_that_may_run_takes_everything_after_it():
    stale = {"parse:m"}
    assert may_run(chain(), lambda t: t not in stale) == \
        named("parse", "resources", "optimize", "fidelity", "compile", "verify")


def test_a_stage_after_one_that_may_run_is_not_asked():
    asked: list[str] = []

    def fresh(task: str) -> bool:
        asked.append(task)
        return task != "fetch:m"

    assert may_run(chain(), fresh) == set(chain())
    assert asked == ["fetch:m"]  # the fast path is not consulted for what follows it


# -- what a missing toolchain blocks ---------------------------------------------------------

def test_the_first_stage_needing_a_missing_toolchain_is_the_root_and_the_rest_follow_it():
    bad = {t: "no image" for t in named(*DFC)}
    result = blocked(chain(), bad)
    assert result.roots == {"parse:m": "no image"}
    assert result.downstream == named("resources", "optimize", "fidelity", "compile", "verify")
    # what hef and verify need besides: not blocked, but reached by no buildable task either
    assert not result.tasks & named("fetch", "export", "reference")


def test_a_missing_device_blocks_only_the_check():
    result = blocked(chain(), {"verify:m": "device down"})
    assert result.roots == {"verify:m": "device down"} and result.downstream == frozenset()


def test_another_model_is_not_blocked():
    deps = {**chain("a"), **chain("b")}
    result = blocked(deps, {t: "no image" for t in named(*DFC, model="a")})
    assert result.tasks == named("parse", "resources", "optimize", "fidelity", "compile",
                                 "verify", model="a")


def test_two_missing_toolchains_in_one_chain_make_one_root():
    bad = {**{t: "no image" for t in named(*DFC)}, "verify:m": "device down"}
    result = blocked(chain(), bad)
    assert set(result.roots) == {"parse:m"} and "verify:m" in result.downstream


def test_the_error_lists_each_missing_toolchain_with_its_fix_and_who_needs_it():
    text = refusal_text({"dfc": "toolchain/dfc.toml: no pinned image; run `doit image:dfc`",
                         "dev": "toolchain/dev.toml: device host pi:22 does not answer"},
                        {"dfc": [f"parse:m{i}" for i in range(8)], "dev": ["verify:m"]})
    head, *lines = text.splitlines()
    assert head.startswith("this run needs 2 toolchains that are not ready")
    assert lines == [
        "  toolchain/dev.toml: device host pi:22 does not answer (needed by verify:m)",
        "  toolchain/dfc.toml: no pinned image; run `doit image:dfc` (needed by parse:m0, "
        "parse:m1, parse:m2, parse:m3, parse:m4, parse:m5, … (2 more))",
    ]


# -- what is missing ---------------------------------------------------------------------------

@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "toolchain").mkdir()
    (tmp_path / "images/box").mkdir(parents=True)
    (tmp_path / "images/box/Dockerfile").write_text("FROM scratch\n")
    return tmp_path


def resolver(root: Path) -> ToolchainResolver:
    return ToolchainResolver(root / ".hefbuild/toolchains.json", root / "toolchain")


def toolchain(root: Path, name: str, text: str) -> ToolchainSpec:
    path = root / "toolchain" / f"{name}.toml"
    path.write_text(text)
    return load_toolchain(path, root)


DOCKER = '[toolchain]\nkind = "docker"\ncontext = "images/box"\n'


def test_a_docker_toolchain_without_its_image_lock_says_how_to_pin_it(project: Path):
    spec = toolchain(project, "box", DOCKER)
    assert toolchain_problem(spec, resolver(project)) == (
        "toolchain/box.toml: no pinned image (toolchain/box.lock.json); build and pin it "
        "with `doit image:box`")
    (project / "toolchain/box.lock.json").write_text(json.dumps({"image_id": "sha256:" + "a" * 64}))
    assert toolchain_problem(spec, resolver(project)) == ""


def test_a_host_toolchain_missing_a_pinned_version_says_so(project: Path):
    spec = toolchain(project, "dfc", '[toolchain]\nkind = "host"\n\n[packages]\n'
                     'doit = "0.0.1"\nno-such-distribution-xyz = "1.0"\n')
    problem = toolchain_problem(spec, resolver(project))
    assert problem.startswith("toolchain/dfc.toml: packages.doit: version 0.0.1 required, ")
    fine = toolchain(project, "ok", '[toolchain]\nkind = "host"\n\n[packages]\ndoit = "*"\n')
    assert toolchain_problem(fine, resolver(project)) == ""


def test_a_venv_toolchain_without_its_base_python_names_its_file(project: Path):
    (project / "toolchain/v.requirements.txt").write_text("numpy==2.1.3\n")
    spec = toolchain(project, "v", '[toolchain]\nkind = "venv"\npython = "python-nowhere-9"\n'
                     'requirements = "toolchain/v.requirements.txt"\n')
    assert toolchain_problem(spec, resolver(project)) == (
        "toolchain/v.toml: toolchain: base interpreter 'python-nowhere-9' not found on PATH")


DEVICE = ('[toolchain]\nkind = "ssh"\nhost = "pi.example"\nuser = "pi"\nport = 2222\n\n'
          '[pins]\nhailort = "5.3.0"\n')


def test_a_device_host_that_does_not_answer_blocks_with_how_to_point_elsewhere(
        project: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("HEFBUILD_DEVICE", raising=False)
    spec = toolchain(project, "dev", DEVICE)
    tried: list[tuple[str, int]] = []

    def refused(host: str, port: int) -> str:
        tried.append((host, port))
        return "Connection refused"

    problem = toolchain_problem(spec, resolver(project), refused)
    assert problem.startswith("toolchain/dev.toml: device host pi.example:2222 does not answer "
                              "(Connection refused); ")
    assert "HEFBUILD_DEVICE" in problem and tried == [("pi.example", 2222)]
    assert toolchain_problem(spec, resolver(project), lambda h, p: "") == ""
    assert toolchain_problem(spec, resolver(project), None) == ""  # a cluster: not from here


def test_hefbuild_device_names_the_host_tried(project: Path, monkeypatch: pytest.MonkeyPatch):
    spec = toolchain(project, "dev", DEVICE)
    monkeypatch.setenv("HEFBUILD_DEVICE", "ssh://ci@runner.example:22")
    problem = toolchain_problem(spec, resolver(project), lambda h, p: f"{h}:{p} refused")
    assert problem.startswith("HEFBUILD_DEVICE: device host runner.example:22 does not answer")
    monkeypatch.setenv("HEFBUILD_DEVICE", "local")  # a device on this machine: nothing to try
    assert toolchain_problem(spec, resolver(project), lambda h, p: "never") == ""


def test_a_closed_port_does_not_answer_and_an_open_one_does():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert tcp_problem("127.0.0.1", port) == ""
    start = time.monotonic()
    assert tcp_problem("127.0.0.1", port) != ""  # closed now: refused at once
    assert time.monotonic() - start < 2


def test_a_host_that_never_answers_is_given_up_on_in_time(monkeypatch: pytest.MonkeyPatch):
    release = threading.Event()

    def hang(*args: object, **kwargs: object) -> None:
        release.wait(5)  # a resolver that hangs; let go at the end of the test
        raise OSError("let go")

    monkeypatch.setattr(socket, "create_connection", hang)
    start = time.monotonic()
    try:
        assert tcp_problem("pi.example", 22, timeout=0.2) == "no answer within 0.2 s"
        assert time.monotonic() - start < 1
    finally:
        release.set()
