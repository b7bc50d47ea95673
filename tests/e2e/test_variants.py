"""A recipe sweep through real doit: three variants of the tiny hailo10h model, each
overriding an optimize parameter (one a file parameter), built two at a time. What comes
before optimize is built once and restored for the other variants; optimize and what reads
it are built once per variant; `doit report` puts the variants side by side. The Dataflow
Compiler is the test double of tests/fakes (as in test_hailo_chain.py)."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest
from fakes.toolchains import FAKE_DFC_TOOLCHAIN

from .conftest import REPO, Project, copy_project

pytestmark = pytest.mark.e2e

MODEL = "tiny-hailo-llama"
VARIANTS = ("a", "b", "c")
# Upstream of the overrides (reference reads fetch only): one key for every variant.
SHARED = ("fetch", "export", "parse", "resources", "reference")
PER_VARIANT = ("optimize", "fidelity", "compile")
SWEEP = """
[variants.a.stages.optimize]
calibration_size = 8

[variants.b.stages.optimize]
calibration_size = 16

[variants.c.stages.optimize]
calibration = "data/calibration/sweep.txt"
"""


def names(*variants: str) -> list[str]:
    return [f"{MODEL}@{v}" for v in variants]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Project, object]:
    base = tmp_path_factory.mktemp("sweep")
    project = copy_project(base / "project", base / "store")
    model = project.root / "models" / f"{MODEL}.toml"
    shutil.copy(REPO / "tests/hailo_models" / f"{MODEL}.toml", model)
    model.write_text(model.read_text() + SWEEP)
    (project.root / "toolchain/hailo-dfc-5.3.0.toml").write_text(FAKE_DFC_TOOLCHAIN)
    calibration = (project.root / "data/calibration/tiny-stories.txt").read_text()
    lines = calibration.splitlines()
    (project.root / "data/calibration/sweep.txt").write_text("\n".join(lines[::-1]) + "\n")
    run = project.doit("-n", "2", *(f"hef:{m}" for m in names(*VARIANTS)))
    assert run.returncode == 0, run.stdout + run.stderr
    return project, run


def outcomes_of(run, stage: str) -> list[str]:
    return sorted(run.outcomes()[f"{stage}:{m}"] for m in names(*VARIANTS))


def test_shared_stages_are_built_once_and_restored_for_the_other_variants(sweep):
    project, run = sweep
    for stage in SHARED:
        assert outcomes_of(run, stage) == ["built", "restored", "restored"], stage
    for stage in PER_VARIANT:
        assert outcomes_of(run, stage) == ["built"] * 3, stage
    built = [e for e in run.events if e.get("outcome") == "built"]
    assert len(built) == len(SHARED) + 3 * len(PER_VARIANT)  # each key built once
    assert len({e["key"] for e in built}) == len(built)
    for task in run.tasks("restored"):  # the task line says so, not `built`
        line = rf"^\[\s*\d+/\d+\]\s+restored\s+{re.escape(task)}\s"
        assert re.search(line, run.stdout, re.M), task


def test_shared_stages_hold_one_key_and_the_same_bytes(sweep):
    project, _ = sweep
    for stage in SHARED:
        manifests = [project.manifest(f"{stage}:{m}") for m in names(*VARIANTS)]
        assert len({m["key"] for m in manifests}) == 1, stage
        trees = [_tree(project.root / "build" / m / stage) for m in names(*VARIANTS)]
        assert trees[0] and trees[0] == trees[1] == trees[2], stage
    for stage in PER_VARIANT:
        keys = {project.manifest(f"{stage}:{m}")["key"] for m in names(*VARIANTS)}
        assert len(keys) == 3, stage
    c = project.manifest(f"optimize:{MODEL}@c")["description"]["files"]["calibration"]
    assert c["path"] == "data/calibration/sweep.txt"


def _tree(folder: Path) -> dict[str, str]:
    """Every output file's digest (not the manifest and log: they say how it got there)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in ("manifest.json", "log.txt")}


def test_the_base_model_restores_the_shared_stages_and_the_report_compares(sweep):
    project, _ = sweep
    again = project.doit(*(f"hef:{m}" for m in names(*VARIANTS)))
    assert again.returncode == 0 and set(again.outcomes().values()) == {"uptodate"}
    base = project.doit(f"hef:{MODEL}")
    assert base.returncode == 0, base.stdout + base.stderr
    # The test double's optimize ignores the calibration text: the base's outputs are c's
    # (same calibration_size), so compile's key is c's too and it is restored (early cutoff).
    assert base.tasks("restored") == {f"{s}:{MODEL}" for s in (*SHARED, "compile")}
    assert base.tasks("built") == {f"optimize:{MODEL}", f"fidelity:{MODEL}"}
    assert project.manifest(f"compile:{MODEL}")["key"] == \
        project.manifest(f"compile:{MODEL}@c")["key"]
    report = project.doit("report")
    assert report.returncode == 0, report.stdout + report.stderr
    page = (project.root / "build/report/index.html").read_text()
    start = page.index(f'<section class="sweep" id="sweep-{MODEL}"')
    section = page[start:page.index("</section>", start)]
    columns = re.findall(r'<th data-column="([^"]+)">', section.split("</tr>")[0])
    assert columns == [MODEL, *names(*VARIANTS)]  # the base first
    for stage in SHARED:
        assert f'<tr data-stage="{stage}" class="shared">' in section, stage
    for stage in ("optimize", "fidelity", "compile"):
        assert f'<tr data-stage="{stage}">' in section, stage
    checks = section[section.index('<table class="sweep-checks">'):]
    assert "Once upon a time" in checks and "teacher-forced agreement" in checks
    rows = re.findall(r'<tr data-check="fidelity">(.*?)</tr>', checks)
    assert rows and all(len(re.findall(r'<td class="num', r)) == 4 for r in rows)
    # What the variants change leads the table, on the page and in the terminal: optimize's
    # overrides, and fidelity's calibration, which inherits optimize's.
    differ = ["optimize.calibration", "optimize.calibration_size", "fidelity.calibration",
              "fidelity.calibration_size"]
    assert re.findall(r'<tr class="param" data-param="([^"]+)">', section) == differ
    assert section.index('<tr class="param"') < section.index('<tr data-stage="fetch"')
    shown = project.doit("report", "--variants", f"{MODEL}@b")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{MODEL}: recipe sweep, 4 side by side"
    assert lines[1].split() == [MODEL, *names(*VARIANTS)]
    params = {ln.split()[0]: ln.split()[1:] for ln in lines[2:lines.index("")]}
    assert list(params) == differ
    default = "data/calibration/tiny-stories.txt"
    assert params["optimize.calibration"] == [default] * 3 + ["data/calibration/sweep.txt"]
    assert params["optimize.calibration_size"] == ["32", "8", "16", "32"]
    stages = lines[lines.index("") + 1:]
    assert {ln.split()[0] for ln in stages if ln.split()[1:2] == ["(shared)"]} == set(SHARED)
    unknown = project.doit("report", "--variants", "tiny-llama")
    assert unknown.returncode == 3 and "no recipe sweep of 'tiny-llama'" in unknown.stderr
