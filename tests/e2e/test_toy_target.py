"""A target declared only in a project's `targets/` builds through doit: no engine change.

The toy target has two stages with tiny rules that write files; its check's report drives
the verdict line and the group table like any other target's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .conftest import REPO, Project

pytestmark = pytest.mark.e2e

TOY_TARGET = '''
[target]
description = "two stages declared by this project alone"
check = "check"
default_checks = true
artifact = { alias = "thing", stage = "make", file = "thing.txt", group_doc = "every toy thing" }

[[keep]]
name = "keep-thing"
stage = "make"
output = "thing.txt"
dest = "kept/{model}.txt"

[[stages]]
name = "make"
rule = "toy/make.py"
inputs = []
outputs = ["thing.txt"]
group_doc = "every toy model's thing"

[stages.params.word]
type = "str"
default = "hello"
doc = "what make writes"

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
group_doc = "every toy model's check"

[stages.params.min_token_agreement]
type = "float"
default = 0.5
min = 0.0
max = 1.0
doc = "the gate"
'''

MAKE = '''"""make (toy): write the word, `times` times."""
import json, sys
from pathlib import Path
action = json.loads(Path(sys.argv[1]).read_text())
p = action["params"]
(Path(action["out"]) / "thing.txt").write_text(" ".join([p["word"]] * p["times"]) + "\\n")
'''

CHECK = '''"""check (toy): the thing has words; a report like any check's."""
import json, sys
from pathlib import Path
action = json.loads(Path(sys.argv[1]).read_text())
words = (Path(action["inputs"]["make"]) / "thing.txt").read_text().split()
agreement = 1.0 if words else 0.0
report = {"passed": agreement >= action["params"]["min_token_agreement"],
          "mean_agreement": agreement, "prompts": ["thing"],
          "min_token_agreement": action["params"]["min_token_agreement"]}
(Path(action["out"]) / "report.json").write_text(json.dumps(report))
sys.exit(0 if report["passed"] else 1)
'''

MODEL = '''[model]
target = "toy"
description = "a model of the toy target: it has no source stage, so no [source]"

[stages.make]
word = "toy"
'''


def toy_project(root: Path) -> Path:
    for rel, text in {"targets/toy.toml": TOY_TARGET, "rules/toy/make.py": MAKE,
                      "rules/toy/check.py": CHECK, "models/toy-model.toml": MODEL,
                      "toolchain/host.toml": '[toolchain]\nkind = "host"\n'}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    shutil.copy2(REPO / "dodo.py", root / "dodo.py")
    return root


@pytest.fixture
def toy(tmp_path: Path) -> Project:
    return Project(toy_project(tmp_path / "proj"), tmp_path / "store")


def test_a_target_declared_in_the_project_builds_then_is_up_to_date(toy: Project) -> None:
    first = toy.doit("check")
    assert first.returncode == 0, first.stdout + first.stderr
    assert first.outcomes() == {"make:toy-model": "built", "check:toy-model": "built"}
    assert (toy.root / "build/toy-model/make/thing.txt").read_text() == "toy toy\n"
    verdict = "check:toy-model: passed, mean token agreement 1.00 over 1 prompts (minimum 0.5 per "
    verdict += "prompt)"
    assert verdict in first.stdout
    table = first.stdout[first.stdout.index("checks:"):]
    assert "passed" in table and "check:toy-model" in table and "1 passed" in table

    again = toy.doit("check")
    assert again.returncode == 0, again.stdout + again.stderr
    assert set(again.outcomes().values()) == {"uptodate"}
    assert verdict in again.stdout  # the verdict is said while the check stays up to date

    default = toy.doit()  # default_checks: `doit` alone runs every toy model's check
    assert default.returncode == 0 and set(default.outcomes().values()) == {"uptodate"}


def test_its_parameters_enter_the_key_and_its_extra_tasks_exist(toy: Project) -> None:
    assert toy.doit("check").returncode == 0
    toy.edit("models/toy-model.toml", 'word = "toy"', 'word = "toy"\ntimes = 3')
    rerun = toy.doit("check")
    assert rerun.outcomes() == {"make:toy-model": "built", "check:toy-model": "built"}

    listed = toy.doit("list")
    assert listed.returncode == 0, listed.stderr
    for line in ("make ", "check ", "thing ", "keep-thing "):
        assert any(row.startswith(line) for row in listed.stdout.splitlines()), listed.stdout
    assert "every toy model's thing" in listed.stdout

    alias = toy.doit("thing")
    assert alias.returncode == 0, alias.stdout + alias.stderr
    assert "build/toy-model/make/thing.txt" in alias.stdout  # the artifact table's row
    kept = toy.doit("keep-thing:toy-model")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert (toy.root / "kept/toy-model.txt").read_text() == "toy toy toy\n"
    report = json.loads((toy.root / "build/toy-model/check/report.json").read_text())
    assert report["passed"] is True
