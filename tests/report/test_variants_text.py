"""`doit report --variants <model>`'s table: the page's sweep rows as text, parameters that
differ first. And which parameters count as differing."""

from __future__ import annotations

import pytest

from hefbuild.errors import HefbuildError
from hefbuild.report.model import ModelReport, Stage, StageState
from hefbuild.report.variants import param_rows
from hefbuild.report.variants_text import sweep_lines, sweep_named
from hefbuild.report.write import current_report

from .sweep_samples import BASE, INT4, METHODS, QDQ, SWEEP, sweep_chains, write_sweep


@pytest.fixture
def report(tmp_path):
    return current_report(write_sweep(tmp_path), sweep_chains())[0]


def test_the_sweep_prints_what_differs_first_then_stages_then_checks(report):
    lines = sweep_lines(sweep_named(report, INT4))  # a variant names its base's sweep
    assert lines[0] == f"{BASE}: recipe sweep, 3 side by side"
    assert lines[1].split() == list(SWEEP)
    assert lines[2].split() == ["quantize.method", *(METHODS[m] for m in SWEEP)]
    assert lines[3].split() == ["quantize.samples", "32", "32", "16"]
    assert lines[4] == ""
    assert lines[5].startswith("fetch (shared)") and lines[5].count("01010101") == 3
    verify = next(ln for ln in lines if ln.startswith("verify "))
    assert verify.split()[1:4] == ["built,", "5.00", "s,"] and "failed, 5.00 s" in verify
    assert lines[-1].split() == ["verify:", "verdict", "passed", "FAILED", "passed"]
    columns = [lines[1].index(m) for m in SWEEP]  # every row lines up under its model
    assert [lines[2].index(METHODS[m]) for m in SWEEP] == columns


def test_a_model_without_a_sweep_is_one_line_naming_those_that_have_one(report):
    with pytest.raises(HefbuildError, match=r"no recipe sweep of 'never'.*here: tiny-llama\)"):
        sweep_named(report, "never")


def test_a_value_that_only_names_its_own_model_is_no_difference():
    def member(name: str, placement: str, level: int) -> ModelReport:
        return ModelReport(name, "t", (Stage("compile", StageState.MISSING),), (), (), (), None,
                           {"compile": {"placement": placement, "level": level}})

    rows = param_rows([member(BASE, f"placements/{BASE}.alls", 1),
                       member(QDQ, f"placements/{QDQ}.alls", 2)])
    assert [(r.stage, r.name, r.values) for r in rows] == [("compile", "level", ("1", "2"))]
