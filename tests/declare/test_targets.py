"""Target files (`targets/<name>.toml`): hefbuild's own load as the chains they were, and
each kind of mistake in one is one line naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from samples import HOST_TOML

from hefbuild.declare.params import ParamType
from hefbuild.declare.project import load_project
from hefbuild.declare.targets import StageReport, load_target, load_targets
from hefbuild.errors import SpecError

REPO = Path(__file__).resolve().parents[2]

GOOD = '''
[target]
check = "check"
device = "a toy device"
artifact = { alias = "thing", stage = "make", file = "thing.txt" }

[[stages]]
name = "make"
rule = "toy/make.py"
inputs = []
outputs = ["thing.txt"]

[stages.params.times]
type = "int"
default = 2
min = 1
doc = "how often"

[[stages]]
name = "check"
rule = "toy/check.py"
inputs = ["make"]
outputs = ["report.json"]
report = "report.json"
report_title = "the toy against itself"
'''


@pytest.fixture
def write(tmp_path: Path):
    for rule in ("toy/make.py", "toy/check.py"):
        (tmp_path / "rules" / rule).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "rules" / rule).write_text("# toy\n")
    (tmp_path / "targets").mkdir()

    def write(text: str):
        path = tmp_path / "targets" / "toy.toml"
        path.write_text(text)
        return load_target(path, tmp_path)

    return write


def test_a_good_target_loads(write) -> None:
    spec = write(GOOD)
    assert [s.name for s in spec.stages] == ["make", "check"]
    assert spec.stage_defs()["check"].inputs == ("make",)
    assert spec.stage_defs()["make"].params["times"].type is ParamType.INT
    assert spec.artifact is not None and spec.artifact.alias == "thing"
    assert spec.check == "check" and spec.source_stage() is None
    assert spec.stage_defs()["check"].report == StageReport("report.json",
                                                            "the toy against itself")
    assert spec.stage_defs()["make"].report is None and spec.device == "a toy device"


BAD = [
    (GOOD.replace("[target]", "[target]\ncolour = 1"),
     "targets/toy.toml: target.colour: unknown key (expected one of: artifact, check, "),
    (GOOD + "\n[colour]\n", "targets/toy.toml: colour: unknown key"),
    (GOOD.replace('rule = "toy/make.py"', 'rule = "toy/make.py"\ncolour = 1'),
     "targets/toy.toml: stages[0].colour: unknown key"),
    (GOOD.replace("toy/check.py", "toy/nope.py"),
     "targets/toy.toml: stages[1].rule: rules/toy/nope.py does not exist"),
    (GOOD.replace('inputs = ["make"]', 'inputs = ["nope"]'),
     "targets/toy.toml: stages[1].inputs: a stage declared before check (make), got 'nope'"),
    (GOOD.replace('inputs = []', 'inputs = ["check"]'),  # a later stage
     "targets/toy.toml: stages[0].inputs: a stage declared before make (none declared), "
     "got 'check'"),
    (GOOD.replace('name = "check"', 'name = "make"'),
     "targets/toy.toml: stages[1].name: stage 'make' is declared twice"),
    (GOOD.replace('type = "int"', 'type = "integer"'),
     "targets/toy.toml: stages.make.params.times.type: one of (int, float, bool, str, "
     "str_list, file, duration, size), got 'integer'"),
    (GOOD.replace("default = 2", 'default = "2"'),
     "targets/toy.toml: stages.make.params.times.default: expected an integer, got str '2'"),
    (GOOD.replace("default = 2", "default = 0"),
     "targets/toy.toml: stages.make.params.times.default: expected an integer >= 1"),
    (GOOD.replace('doc = "how often"', 'doc = "how often"\nwhen = "nope"'),
     "targets/toy.toml: stages.make.params.times.when: a bool parameter of the same stage"),
    (GOOD.replace('alias = "thing", stage = "make"', 'alias = "thing", stage = "nope"'),
     "targets/toy.toml: target.artifact.stage: a stage of this target (make, check), "
     "got 'nope'"),
    (GOOD.replace('file = "thing.txt" }', 'file = "other.txt" }'),
     "targets/toy.toml: target.artifact.file: an output of make (thing.txt), got 'other.txt'"),
    (GOOD.replace('alias = "thing"', 'alias = "check"'),
     "targets/toy.toml: target.artifact.alias: a name no stage or other task has"),
    (GOOD.replace('check = "check"', 'check = "verify"'),
     "targets/toy.toml: target.check: a stage of this target (make, check), got 'verify'"),
    (GOOD.replace('outputs = ["thing.txt"]', 'outputs = ["thing.txt"]\nafter = ["check"]'),
     "targets/toy.toml: stages: a cycle: make -> check -> make"),
    (GOOD.replace('outputs = ["report.json"]', 'outputs = []'),
     "targets/toy.toml: stages[1].outputs: at least one output"),
    (GOOD.replace("[stages.params.times]", "[stages.params.gpu]"),
     "targets/toy.toml: stages.make.params.gpu: a name of its own"),
    (GOOD.replace('report = "report.json"', 'report = "thing.txt"'),
     "targets/toy.toml: stages[1].report: a JSON file among the outputs of check "
     "(report.json), got 'thing.txt'"),
    (GOOD.replace('outputs = ["report.json"]', 'outputs = ["report.json", "out/"]')
     .replace('report = "report.json"', 'report = "out/"'),
     "targets/toy.toml: stages[1].report: a JSON file among the outputs of check "
     "(report.json), got 'out/'"),
    (GOOD.replace('report = "report.json"', "report = true"),
     "targets/toy.toml: stages[1].report: a string, got True"),
    (GOOD.replace('report = "report.json"\n', ""),
     "targets/toy.toml: stages[1].report_title: needs report (the file it heads)"),
    (GOOD.replace('"the toy against itself"', '"the toy {method against itself"'),
     "targets/toy.toml: stages[1].report_title: text with `{field}` naming a top-level field "
     "of the report (e.g. {method}), got 'the toy {method against itself'"),
    (GOOD.replace('device = "a toy device"', "device = 10"),
     "targets/toy.toml: target.device: a string, got 10"),
    (GOOD.replace('rule = "toy/make.py"', 'rule = "toy/make.py"\ncode = ["toy/gone.py"]'),
     "targets/toy.toml: stages[0].code: files under rules/; rules/toy/gone.py does not exist"),
    (GOOD.replace('rule = "toy/make.py"', 'rule = "toy/make.py"\nresources = { GPU = 0 }'),
     "targets/toy.toml: stages[0].resources.GPU: a positive number, got 0"),
    ("[target]\n", "targets/toy.toml: stages: a non-empty array of tables ([[stages]])"),
    ("[[stages]\n", "targets/toy.toml: malformed TOML"),
]


@pytest.mark.parametrize(("text", "error"), BAD)
def test_each_mistake_is_one_line_naming_file_and_key(write, text: str, error: str) -> None:
    with pytest.raises(SpecError) as err:
        write(text)
    assert str(err.value).startswith(error), str(err.value)
    assert "\n" not in str(err.value)


def test_a_bad_target_file_stops_the_project_and_a_model_names_only_known_targets(
        tmp_path: Path) -> None:
    root = tmp_path / "proj"
    for rel, text in {"toolchain/host.toml": HOST_TOML, "targets/toy.toml": "[target\n",
                      "models/m.toml": '[model]\ntarget = "toy"\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    with pytest.raises(SpecError, match=r"^targets/toy.toml: malformed TOML"):
        load_project(root, store=tmp_path / "store", strict=False)
    (root / "targets" / "toy.toml").unlink()
    with pytest.raises(SpecError, match=r"^models/m.toml: model.target: one of cpu-ort, "
                                        r"hailo10h, openvino, got 'toy'"):
        load_project(root, store=tmp_path / "store")


def test_a_project_target_wins_over_hefbuilds_own_of_that_name(tmp_path: Path) -> None:
    (tmp_path / "rules" / "toy").mkdir(parents=True)
    for rule in ("make.py", "check.py"):
        (tmp_path / "rules" / "toy" / rule).write_text("# toy\n")
    (tmp_path / "targets").mkdir()
    (tmp_path / "targets" / "cpu-ort.toml").write_text(GOOD)
    targets = load_targets(tmp_path)
    assert [s.name for s in targets["cpu-ort"].stages] == ["make", "check"]
    assert "hailo10h" in targets  # the others still come with hefbuild


def test_hefbuilds_own_targets_name_rules_that_exist() -> None:
    for spec in load_targets(REPO).values():
        for stage in spec.stages:
            assert (REPO / "rules" / stage.rule).is_file(), (spec.name, stage.rule)
            assert all(p.doc for p in stage.params.values()), (spec.name, stage.name)


def test_hefbuilds_own_checks_declare_the_report_the_page_reads() -> None:
    for spec in load_targets(None).values():
        check = spec.stage_defs()[spec.check] if spec.check else None
        assert check is not None and check.report is not None, spec.name
        assert check.report.file in check.outputs and check.report.title, spec.name
