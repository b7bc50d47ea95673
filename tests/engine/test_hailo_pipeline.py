"""The hailo10h chain through the engine (fake executor): what each kind of edit re-runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes.fake_executor import FakeExecutor

from hefbuild.declare.project import load_project
from hefbuild.engine.engine import Engine
from hefbuild.errors import SpecError

from .helpers import HOST_TOML, REPO, edit

MODEL = "tiny-hailo"
# In an order doit could run them: compile waits for fidelity (`after`), which reads reference.
STAGES = ("fetch", "export", "parse", "resources", "optimize", "reference", "fidelity",
          "compile", "verify")
TASKS = tuple(f"{s}:{MODEL}" for s in STAGES)
RULES = ("fetch.py", *(f"hailo/{s}.py" for s in STAGES[1:]))
MODEL_TOML = """\
[model]
target = "hailo10h"

[source.synthetic]
architecture = "llama"
seed = 7

[stages.export]
seq_len = 32
prefill_size = 8
cache_size = 32

[stages.compile]
compiler_optimization_level = 0
"""


@pytest.fixture
def hailo_root(workdir: Path) -> Path:
    root = workdir / "hailo-proj"
    (root / "models").mkdir(parents=True)
    (root / "models" / f"{MODEL}.toml").write_text(MODEL_TOML)
    (root / "toolchain").mkdir()
    for name in ("host", "hailo-dfc-5.3.0", "hailo10h-device"):
        (root / "toolchain" / f"{name}.toml").write_text(HOST_TOML)
    shutil.copytree(REPO / "data", root / "data")
    for rule in RULES:
        path = root / "rules" / rule
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# dummy rule {rule}\n")
    recipes = root / "rules" / "hailo" / "recipes"
    recipes.mkdir()
    (recipes / "optimize.alls").write_text("model_optimization_flavor(optimization_level=0)\n")
    (recipes / "compile.alls").write_text("performance_param(compiler_optimization_level=0)\n")
    return root


def build(root: Path, store: Path) -> tuple[list[str], FakeExecutor]:
    fake = FakeExecutor()
    engine = Engine(load_project(root, store=store), executor=fake)
    outcomes = [engine.run(t)["outcome"] for t in TASKS]
    return outcomes, fake


def rebuilt_after(root: Path, store: Path, change) -> list[str]:
    assert build(root, store)[0] == ["built"] * len(TASKS)
    change()
    outcomes, fake = build(root, store)
    assert build(root, store)[0] == ["uptodate"] * len(TASKS)  # and then nothing
    return fake.stages_ran()


def test_compile_parameter_reruns_compile_and_verify(hailo_root, store):
    model = hailo_root / "models" / f"{MODEL}.toml"
    ran = rebuilt_after(hailo_root, store, lambda: edit(
        model, "compiler_optimization_level = 0", "compiler_optimization_level = 1"))
    assert ran == ["compile", "verify"]


def test_recipe_edit_reruns_optimize_and_what_reads_it(hailo_root, store):
    recipe = hailo_root / "rules/hailo/recipes/optimize.alls"
    ran = rebuilt_after(hailo_root, store, lambda: recipe.write_text(
        recipe.read_text() + "post_quantization_optimization(finetune, policy=disabled)\n"))
    assert ran == ["optimize", "fidelity", "compile", "verify"]


def test_fidelity_threshold_reruns_fidelity_and_not_compile(hailo_root, store):
    """compile runs after fidelity but does not read it: the gate's figures and thresholds
    never enter compile's key."""
    model = hailo_root / "models" / f"{MODEL}.toml"
    ran = rebuilt_after(hailo_root, store, lambda: model.write_text(
        model.read_text() + "\n[stages.fidelity]\nmin_prefill_cosine = 0.5\n"))
    assert ran == ["fidelity"]


def test_compile_script_edit_reruns_compile(hailo_root, store):
    script = hailo_root / "rules/hailo/recipes/compile.alls"
    ran = rebuilt_after(hailo_root, store, lambda: script.write_text(
        script.read_text() + "allocator_param(enable_auto_spatial_reshapes=False)\n"))
    assert ran == ["compile", "verify"]


def test_export_parameter_reruns_everything_from_export(hailo_root, store):
    model = hailo_root / "models" / f"{MODEL}.toml"
    ran = rebuilt_after(hailo_root, store, lambda: edit(model, "seq_len = 32", "seq_len = 64"))
    assert ran == [s for s in STAGES[1:] if s != "reference"]  # reference reads fetch only


def test_replay_placement_needs_the_placement_file(hailo_root, store):
    model = hailo_root / "models" / f"{MODEL}.toml"
    edit(model, "compiler_optimization_level = 0", "replay_placement = true")
    with pytest.raises(SpecError) as err:
        load_project(hailo_root, store=store)
    assert f"stages.compile.placement: file 'placements/{MODEL}.auto.alls'" in str(err.value)


def test_replayed_placement_is_an_input_by_content(hailo_root, store):
    placement = hailo_root / "placements" / f"{MODEL}.auto.alls"
    placement.parent.mkdir()
    placement.write_text("place(layer1, cluster=0)\n")
    model = hailo_root / "models" / f"{MODEL}.toml"
    edit(model, "compiler_optimization_level = 0", "replay_placement = true")
    outcomes, fake = build(hailo_root, store)
    assert outcomes == ["built"] * len(TASKS)
    compile_action = fake.actions[STAGES.index("compile")]
    assert compile_action["files"]["placement"] == str(placement)
    assert compile_action["params"]["placement"] == f"placements/{MODEL}.auto.alls"
    assert "placement" not in fake.actions[STAGES.index("optimize")]["files"]


def test_placement_content_change_reruns_compile(hailo_root, store):
    placement = hailo_root / "placements" / f"{MODEL}.auto.alls"
    placement.parent.mkdir()
    placement.write_text("place(layer1, cluster=0)\n")
    edit(hailo_root / "models" / f"{MODEL}.toml", "compiler_optimization_level = 0",
         "replay_placement = true")
    ran = rebuilt_after(hailo_root, store, lambda: placement.write_text("place(l1, cluster=1)\n"))
    assert ran == ["compile", "verify"]
