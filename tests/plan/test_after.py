"""Ordering-only dependencies (`StageDef.after`): doit runs them first, the key ignores them."""

from __future__ import annotations

from samples import SYNTHETIC

from hefbuild.cli.tablemake import stage_record
from hefbuild.cli.tasks import task_dict
from hefbuild.plan.actions import plan_model, plan_project

HAILO = SYNTHETIC.replace("cpu-ort", "hailo10h")


def hailo_project(load, proj):
    for name in ("hailo-dfc-5.3.0", "hailo10h-device"):
        (proj / "toolchain" / f"{name}.toml").write_text('[toolchain]\nkind = "host"\n')
    recipes = proj / "rules" / "hailo" / "recipes"
    recipes.mkdir(parents=True)
    for name in ("optimize.alls", "compile.alls"):
        (recipes / name).write_text("# recipe\n")
    return load(HAILO)


def test_compile_waits_for_fidelity_without_reading_it(load, proj):
    actions = {a.stage: a for a in plan_model(hailo_project(load, proj).models["m"])}
    assert actions["compile"].after == ("fidelity",)
    assert actions["compile"].upstream == ("export", "optimize")
    assert actions["fidelity"].upstream == ("export", "optimize", "reference")
    assert all(a.after == () for s, a in actions.items() if s != "compile")


def test_doit_orders_by_after_as_well_as_by_inputs(load, proj):
    project = hailo_project(load, proj)
    root, plan = str(proj), plan_project(project)
    task = task_dict(root, stage_record(plan["compile:m"]))
    assert task["task_dep"] == ["export:m", "optimize:m", "fidelity:m"]
    verify = task_dict(root, stage_record(plan["verify:m"]))
    assert verify["task_dep"] == ["export:m", "compile:m", "reference:m"]


def test_cpu_ort_has_no_ordering_only_dependency(model):
    assert all(a.after == () for a in plan_model(model(SYNTHETIC)))
