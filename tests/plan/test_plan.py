"""The plan as pure data, and which rule code enters a key."""

from __future__ import annotations

from pathlib import Path

import pytest
from samples import SYNTHETIC

from hefbuild.plan.actions import artifact_task, plan_model, plan_project, rule_code_files


@pytest.fixture
def actions(model, proj):
    (proj / "toolchain" / "x.toml").write_text('[toolchain]\nkind = "host"\n')
    return {a.stage: a for a in plan_model(model(SYNTHETIC + '\n[stages.compile]\n'
                                                 'toolchain = "x"\n'))}


def test_cpu_ort_plans_five_actions_in_order(model):
    actions = plan_model(model(SYNTHETIC))
    assert [a.task for a in actions] == [
        "fetch:m", "export:m", "quantize:m", "compile:m", "verify:m"]


def test_upstreams(actions):
    assert {s: a.upstream for s, a in actions.items()} == {
        "fetch": (), "export": ("fetch",), "quantize": ("fetch", "export"),
        "compile": ("quantize",), "verify": ("fetch", "compile")}


def test_rules_outputs_and_dirs(actions):
    quantize = actions["quantize"]
    assert quantize.rule == "cpu_ort/quantize.py"
    assert quantize.outputs == ("model.int8.onnx",)
    assert quantize.out_dir == "build/m/quantize"
    assert actions["fetch"].outputs == ("checkpoint/",)


def test_file_params(actions, model):
    assert actions["quantize"].file_params == {}  # weight-only int8 reads no calibration file
    qdq = {a.stage: a for a in plan_model(model(SYNTHETIC + '\n[stages.quantize]\n'
                                                'method = "static_qdq"\n'))}
    assert qdq["quantize"].file_params == {"calibration": "data/calibration/tiny-stories.txt"}
    assert actions["fetch"].file_params == {"corpus": "data/corpus/tiny-stories.txt"}
    assert actions["verify"].file_params == {}


def test_only_fetch_sees_the_source(actions):
    assert actions["fetch"].source["synthetic"]["seed"] == 1
    assert all(a.source is None for s, a in actions.items() if s != "fetch")


def test_stage_toolchain_override(actions):
    assert {s: a.toolchain for s, a in actions.items()} == {
        "fetch": "host", "export": "host", "quantize": "host", "compile": "x", "verify": "host"}


def test_params_are_resolved(actions):
    assert actions["verify"].params["max_new_tokens"] == 16
    assert actions["compile"].params == {"optimization_level": "extended"}


def test_hub_fetch_has_no_file_params(model):
    hub = '[model]\ntarget = "cpu-ort"\n[source]\nhub = "org/n"\nrevision = "main"\n'
    fetch = plan_model(model(hub))[0]
    assert fetch.file_params == {}
    assert fetch.source == {"hub": "org/n", "revision": "main", "files": {}}


def test_plan_project_and_artifact(load, proj):
    (proj / "models" / "n.toml").write_text(SYNTHETIC)
    project = load(SYNTHETIC)
    assert len(plan_project(project)) == 10
    assert artifact_task(project.models["n"]) == "compile:n"


# -- rule_code_files -----------------------------------------------------------------------


def write(rules: Path, rel: str, text: str = "") -> Path:
    path = rules / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    rules = tmp_path / "rules"
    write(rules, "common/__init__.py")
    write(rules, "common/action.py", "import json\n")
    write(rules, "common/determinism.py", "from common.action import load_action\n")
    write(rules, "common/compare.py")
    write(rules, "common/unused.py")
    return rules


def names(rules: Path, files: list[Path]) -> list[str]:
    return [p.relative_to(rules).as_posix() for p in files]


def test_rule_without_helpers_is_just_itself(rules):
    write(rules, "fetch.py", "import os\n")
    assert names(rules, rule_code_files(rules, "fetch.py")) == ["fetch.py"]


def test_helpers_are_found_transitively(rules):
    write(rules, "cpu_ort/compile.py", "from common.determinism import ort_session\n")
    assert names(rules, rule_code_files(rules, "cpu_ort/compile.py")) == [
        "common/__init__.py", "common/action.py", "common/determinism.py", "cpu_ort/compile.py"]


def test_from_common_import_several_modules(rules):
    write(rules, "v.py", "from common import compare, action\nimport common.compare\n")
    assert names(rules, rule_code_files(rules, "v.py")) == [
        "common/__init__.py", "common/action.py", "common/compare.py", "v.py"]


def test_import_cycles_terminate(rules):
    write(rules, "common/action.py", "from common.determinism import x\n")
    write(rules, "r.py", "from common.action import y\n")
    assert names(rules, rule_code_files(rules, "r.py")) == [
        "common/__init__.py", "common/action.py", "common/determinism.py", "r.py"]


def test_missing_rule_gives_nothing(rules):
    assert rule_code_files(rules, "cpu_ort/nope.py") == []


# -- every import spelling of a helper puts it in the key (else its edits rebuild nothing) --


def test_parenthesised_import_of_helpers(rules):
    write(rules, "v.py", "from common import (\n    compare,\n    action,\n)\n")
    assert names(rules, rule_code_files(rules, "v.py")) == [
        "common/__init__.py", "common/action.py", "common/compare.py", "v.py"]


def test_aliased_import_of_a_helper(rules):
    write(rules, "v.py", "from common import compare as cmp\n")
    assert names(rules, rule_code_files(rules, "v.py")) == [
        "common/__init__.py", "common/compare.py", "v.py"]


def test_relative_import_between_helpers(rules):
    write(rules, "common/determinism.py", "from .action import load_action\n")
    write(rules, "r.py", "from common.determinism import ort_session\n")
    assert "common/action.py" in names(rules, rule_code_files(rules, "r.py"))


# -- the repository's own stages: every file a stage runs is in its key ----------------------

REPO = Path(__file__).resolve().parents[2]
# Stages whose rule was split into modules, and the modules they now run.
SPLIT = {
    ("hailo10h", "verify"): (
        "common/hailo_verify_retry.py", "common/hailo_verify_files.py",
        "common/hailo_verify_audit.py", "common/hailo_verify_compare.py",
        "common/hailo_verify_logs.py", "hailo/device_check.py", "hailo/device_check_errors.py",
        "hailo/device_check_versions.py", "hailo/device_check_audit.py",
        "hailo/device_check_generate.py"),
    ("hailo10h", "fidelity"): (
        "common/hailo_fidelity_plan.py", "common/hailo_fidelity_graphs.py",
        "common/hailo_fidelity_compare.py", "common/hailo_fidelity_emulation.py"),
    ("hailo10h", "export"): (
        "common/hailo_graph.py", "common/hailo_graph_spec.py", "common/hailo_graph_export.py"),
    ("cpu-ort", "quantize"): ("common/ort_calibration.py", "common/onnx_untie.py"),
}


def rule_key(rules: Path, target: str, stage: str) -> str:
    """The key of a stage whose rule code is `rules` and all else fixed: the rule digests
    the engine puts in it (engine/keys.py) are the only part that varies."""
    from hefbuild.declare.targets import stage_defs
    from hefbuild.digest import sha256_file
    from hefbuild.plan.key import ActionKey, describe

    sdef = stage_defs(REPO, target)[stage]
    digests = {p.relative_to(rules).as_posix(): sha256_file(p).hex
               for p in rule_code_files(rules, sdef.rule, sdef.code)}
    return ActionKey.of(describe(stage=stage, outputs=sdef.outputs, rule=digests, inputs={},
                                 files={}, params={}, source=None, toolchain={}, env={})).hex


@pytest.fixture(scope="module")
def repo_rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    copy = tmp_path_factory.mktemp("repo") / "rules"
    shutil.copytree(REPO / "rules", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize(("target", "stage", "module"),
                         [(t, s, m) for (t, s), mods in SPLIT.items() for m in mods])
def test_a_split_stages_key_covers_each_of_its_modules(repo_rules: Path, target: str,
                                                       stage: str, module: str) -> None:
    before = rule_key(repo_rules, target, stage)
    path = repo_rules / module
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"# edited\n")
        assert rule_key(repo_rules, target, stage) != before, f"{module} is not in the key"
    finally:
        path.write_bytes(original)
    assert rule_key(repo_rules, target, stage) == before


def _imported(path: Path) -> set[str]:
    """Every module name a file imports, at any depth (a full parse, unlike the scanner's)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            if node.module == "common":
                names |= {f"common.{a.name}" for a in node.names}
    return names


def _project_module(rules: Path, script_dir: Path, name: str) -> Path | None:
    """The file under rules/ an import resolves to, run as the engine runs a rule (the rule's
    folder first on sys.path, then rules/), or None for a library."""
    parts = name.split(".")
    if parts[0] == "common":
        path = rules / "common" / f"{parts[1]}.py" if len(parts) > 1 else None
        return path if path is not None and path.is_file() else None
    for folder in (script_dir, rules):
        if (folder / f"{parts[0]}.py").is_file():
            return folder / f"{parts[0]}.py"
    return None


@pytest.mark.parametrize("target", ["cpu-ort", "hailo10h", "openvino"])
def test_every_file_a_stage_runs_is_in_its_key(target: str) -> None:
    from hefbuild.declare.targets import stage_defs

    rules = REPO / "rules"
    for sdef in stage_defs(REPO, target).values():
        keyed = set(rule_code_files(rules, sdef.rule, sdef.code))
        for path in keyed:
            script_dir = path.parent if path.parent != rules / "common" else \
                (rules / sdef.rule).parent
            for name in _imported(path):
                module = _project_module(rules, script_dir, name)
                assert module is None or module in keyed, \
                    f"{target} {sdef.name}: {path.relative_to(rules)} imports {name}, " \
                    f"not in the key"
