"""Parameter groups (`targets/groups/<name>.toml`): parameters several stages share, declared
once; a stage's own declaration of a name wins; each mistake is one line naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from hefbuild.declare.targets import load_target, load_targets
from hefbuild.errors import SpecError

TARGET = '''
[target]
check = "check"

[[stages]]
name = "check"
rule = "toy/check.py"
inputs = []
outputs = ["report.json"]
param_groups = {groups}
{own}
'''

GATES = '''
[params.gate]
type = "str"
default = "strict"
choices = ["strict", "loose"]
doc = "how strict"

[params.minimum]
type = "float"
default = 0.9
min = 0.0
max = 1.0
applies = { gate = ["strict"] }
doc = "the bar"
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "rules/toy").mkdir(parents=True)
    (tmp_path / "rules/toy/check.py").write_text("# toy\n")
    (tmp_path / "targets/groups").mkdir(parents=True)
    (tmp_path / "targets/groups/gates.toml").write_text(GATES)
    return tmp_path


def load(root: Path, groups: str = '["gates"]', own: str = ""):
    path = root / "targets/toy.toml"
    path.write_text(TARGET.format(groups=groups, own=own))
    return load_target(path, root).stage_defs()["check"].params


def test_a_stage_gets_its_groups_parameters(project: Path):
    params = load(project)
    assert list(params) == ["gate", "minimum"]
    assert params["gate"].choices == ("strict", "loose")
    assert params["minimum"].applies == (("gate", ("strict",)),)


def test_a_stage_of_its_own_replaces_a_groups_parameter(project: Path):
    own = '[stages.params.minimum]\ntype = "float"\ndefault = 0.5\ndoc = "a lower bar"\n'
    params = load(project, own=own)
    assert params["minimum"].default == 0.5 and params["minimum"].applies == ()
    assert params["gate"].default == "strict"


def test_an_unknown_group_names_the_ones_there_are(project: Path):
    with pytest.raises(SpecError) as err:
        load(project, '["gatse"]')
    assert str(err.value).startswith("targets/toy.toml: stages[0].param_groups: ")
    assert "(check-gates, check-prompts, gates, teacher-forced), got 'gatse'" in str(err.value)


def test_a_mistake_in_a_group_file_names_that_file(project: Path):
    (project / "targets/groups/gates.toml").write_text(GATES.replace("max = 1.0", "max = 'x'"))
    with pytest.raises(SpecError, match=r"^targets/groups/gates\.toml: params\.minimum"):
        load(project)


def test_two_groups_may_not_declare_one_name(project: Path):
    (project / "targets/groups/more.toml").write_text(GATES.split("[params.minimum]")[0])
    with pytest.raises(SpecError, match="'gate' is in 'gates' and 'more'"):
        load(project, '["gates", "more"]')


def test_every_target_checks_with_the_same_declarations():
    """The gates are declared once: every target's check has the very same definitions."""
    targets = load_targets(None)
    cpu = targets["cpu-ort"].stage_defs()["verify"].params
    ov = targets["openvino"].stage_defs()["verify"].params
    hailo = targets["hailo10h"].stage_defs()
    shared = ("prompts", "max_new_tokens", "chat", "gate", "min_teacher_forced",
              "min_logit_cosine", "min_token_agreement", "near_tie")
    assert {n: cpu[n] for n in shared} == {n: ov[n] for n in shared}
    for name in ("min_token_agreement", "near_tie"):
        assert hailo["verify"].params[name] == cpu[name]
    for name in ("prompts", "max_new_tokens", "chat"):
        assert hailo["reference"].params[name] == cpu[name]
    assert "gate" not in hailo["verify"].params  # a device returns text: free-running only
