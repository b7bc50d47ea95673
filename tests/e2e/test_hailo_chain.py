"""The hailo10h chain through real doit, with the Dataflow Compiler played by the test double
in tests/fakes (its HEF says FAKE-HEF: nothing here is a real compiler result). The fidelity
stage is real: a CPU emulation of the recipe on ONNX Runtime, run before compile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from fakes.toolchains import FAKE_DFC_TOOLCHAIN

from .conftest import REPO, Project, copy_project

pytestmark = pytest.mark.e2e

MODEL = "tiny-hailo-llama"
# What `hef:` builds: compile's inputs, and fidelity (with the reference it reads) before it.
CHAIN = ("fetch", "export", "parse", "resources", "optimize", "reference", "fidelity", "compile")
FAKE_DFC = FAKE_DFC_TOOLCHAIN


@pytest.fixture(scope="module")
def hailo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hailo-store")


@pytest.fixture
def hailo(tmp_path: Path, hailo_store: Path) -> Project:
    project = copy_project(tmp_path / "project", hailo_store)
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", project.root / "models")
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC)
    run = project.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stdout + run.stderr
    return project


def tasks(*stages: str) -> set[str]:
    return {f"{s}:{MODEL}" for s in stages}


def test_hef_builds_the_whole_chain_and_is_marked_fake(hailo: Project):
    first = hailo._events()[: len(CHAIN)]
    assert {e["task"] for e in first} == tasks(*CHAIN)
    order = [e["task"] for e in first]
    assert order.index(f"fidelity:{MODEL}") < order.index(f"compile:{MODEL}")
    hef = hailo.root / "build" / MODEL / "compile" / "model.hef"
    assert hef.read_bytes().startswith(b"FAKE-HEF")
    log = (hef.parent / "log.txt").read_text()
    assert "hailo_sdk_client is the FAKE test double" in log
    again = hailo.doit(f"hef:{MODEL}")
    assert again.outcomes() == {t: "uptodate" for t in tasks(*CHAIN)}


def test_compile_parameter_reruns_only_compile(hailo: Project):
    hailo.edit(f"models/{MODEL}.toml", "[stages.export]",
               "[stages.compile]\nauto_spatial_reshapes = true\n\n[stages.export]")
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == tasks("compile")
    script = (hailo.root / "build" / MODEL / "compile" / "compile_script.alls").read_text()
    assert "enable_auto_spatial_reshapes" not in script


def test_recipe_edit_reruns_optimize_fidelity_and_compile(hailo: Project):
    recipe = hailo.root / "rules/hailo/recipes/optimize.alls"
    recipe.write_text(recipe.read_text().replace("a8_w4", "a8_w8"))
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == tasks("optimize", "fidelity", "compile")
    assert run.tasks("uptodate") == tasks("fetch", "export", "parse", "resources", "reference")
    report = json.loads((hailo.root / "build" / MODEL / "fidelity" / "fidelity.json").read_text())
    assert report["kind"] == "cpu-emulation"
    assert set(report["quantized"]["weights"]) == {"int8"}  # no a8_w4 line left
    script = (hailo.root / "build" / MODEL / "optimize" / "model_script.alls").read_text()
    assert "precision_mode=a8_w8" in script and "a8_w4" not in script


def test_recipe_comment_reruns_optimize_and_cuts_off_at_compile(hailo: Project):
    recipe = hailo.root / "rules/hailo/recipes/optimize.alls"
    recipe.write_text(recipe.read_text() + "\n# a note: the rendered script is unchanged\n")
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == tasks("optimize")  # same outputs: fidelity, compile stay
    assert run.tasks("uptodate") == tasks(*(s for s in CHAIN if s != "optimize"))


def test_export_parameter_reruns_everything_from_export(hailo: Project):
    hailo.edit(f"models/{MODEL}.toml", "prefill_size = 8", "prefill_size = 16")
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == tasks(*(s for s in CHAIN[1:] if s != "reference"))
    assert run.tasks("uptodate") == tasks("fetch", "reference")  # reference reads fetch only
    config = (hailo.root / "build" / MODEL / "resources" / "hailo-config.json").read_text()
    assert '"prefill_input_tokens_count": 16' in config


def test_replayed_placement_is_fed_back_to_compile(hailo: Project):
    saved = hailo.doit(f"placement:{MODEL}")
    assert saved.returncode == 0, saved.stderr
    placement = hailo.root / "placements" / f"{MODEL}.auto.alls"
    auto = hailo.root / "build" / MODEL / "compile" / "model.auto.alls"
    assert placement.read_bytes() == auto.read_bytes()
    hailo.edit(f"models/{MODEL}.toml", "[stages.export]",
               "[stages.compile]\nreplay_placement = true\n\n[stages.export]")
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == tasks("compile")
    desc = hailo.manifest(f"compile:{MODEL}")["description"]
    assert desc["files"]["placement"]["path"] == f"placements/{MODEL}.auto.alls"


def test_fidelity_threshold_reruns_fidelity_and_not_compile(hailo: Project):
    report = hailo.root / "build" / MODEL / "fidelity" / "fidelity.json"
    before = json.loads(report.read_text())
    hailo.edit(f"models/{MODEL}.toml", "[stages.export]",
               "[stages.fidelity]\nmin_prefill_cosine = 0.5\n\n[stages.export]")
    run = hailo.doit(f"hef:{MODEL}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.tasks("built") == tasks("fidelity")
    assert run.tasks("uptodate") == tasks(*(s for s in CHAIN if s != "fidelity"))
    after = json.loads(report.read_text())
    # The figures do not depend on a threshold; only the proposal's target does.
    assert after.pop("proposal")["target_worst_prefill_cosine"] == 0.5
    before.pop("proposal")
    assert after == before


def test_a_failing_fidelity_gate_leaves_compile_unbuilt(tmp_path: Path, hailo_store: Path):
    project = copy_project(tmp_path / "gated", hailo_store)
    model = project.root / "models" / f"{MODEL}.toml"
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", model)
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC)
    project.edit(f"models/{MODEL}.toml", "[stages.export]",
                 "[stages.fidelity]\nmin_prefill_cosine = 1.0\n\n[stages.export]")
    run = project.doit(f"hef:{MODEL}")
    assert run.returncode != 0
    assert run.outcomes()[f"fidelity:{MODEL}"] == "failed"
    assert f"compile:{MODEL}" not in run.outcomes()
    assert not (project.root / "build" / MODEL / "compile").exists()
    assert "min_prefill_cosine 1 on prompt" in run.stdout + run.stderr
    log = (project.root / "build" / MODEL / "fidelity.failed.log").read_text()
    assert '"kind": "cpu-emulation"' in log  # the report of the failed run, in its log
