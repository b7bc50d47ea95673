"""Bad declarations: one line naming file, key and expectation; nothing built or stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import Project

pytestmark = pytest.mark.e2e


def snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    files = {}
    for root in roots:
        for p in sorted(root.rglob("*")) if root.exists() else []:
            if p.is_file():
                st = p.stat()
                files[str(p)] = (st.st_size, st.st_mtime_ns)
    return files


QUANTIZE_KEYS = {"method", "block_size", "symmetric", "exclude", "calibration", "samples",
                 "seq_len", "seed", "per_channel", "op_types", "activation_type", "weight_type",
                 "toolchain", "timeout", "memory", "gpu"}

CASES = [
    ("models/tiny-llama.toml", "[model]", "[model",
     "models/tiny-llama.toml: malformed TOML"),
    ("models/tiny-llama.toml", 'target = "cpu-ort"', 'target = "cpu-ort"\ncolour = "red"',
     "models/tiny-llama.toml: model.colour: unknown key"),
    ("models/tiny-llama.toml", "block_size = 32", 'block_size = "many"',
     "models/tiny-llama.toml: stages.quantize.block_size: expected an integer"),
    ("models/tiny-llama.toml", "[stages.quantize]", "[stages.optimise]\n[stages.quantize]",
     "models/tiny-llama.toml: stages.optimise: unknown key"),
    ("models/tiny-llama.toml", "[stages.quantize]", '[stages.quantize]\ntoolchain = "gpu-box"',
     "models/tiny-llama.toml: stages.quantize.toolchain: a toolchain declared in toolchain/"),
    ("models/tiny-llama.toml", "block_size = 32",
     'method = "static_qdq"\ncalibration = "data/calibration/missing.txt"',
     "models/tiny-llama.toml: stages.quantize.calibration: file 'data/calibration/missing.txt'"
     " does not exist"),
    ("models/tiny-llama.toml", "min_token_agreement = 0.5", "min_token_agreement = 1.5",
     "models/tiny-llama.toml: stages.verify.min_token_agreement: expected a number <= 1.0"),
    ("models/smollm2.toml", "[stages.optimize]",
     '[stages.optimize]\nrecipe = "rules/hailo/recipes/missing.alls"',
     "models/smollm2.toml: stages.optimize.recipe: file 'rules/hailo/recipes/missing.alls'"
     " does not exist"),
    ("toolchain/host.toml", 'kind = "host"', 'kind = "vm"',
     "toolchain/host.toml: toolchain.kind: one of"),
    # Values that used to pass the schema and fail later with a traceback, or never:
    ("models/tiny-llama.toml", "min_token_agreement = 0.5", "min_token_agreement = inf",
     "models/tiny-llama.toml: stages.verify.min_token_agreement: expected a number, got float"
     " inf"),
    ("models/tiny-llama.toml", "min_token_agreement = 0.5", "min_token_agreement = nan",
     "models/tiny-llama.toml: stages.verify.min_token_agreement: expected a number, got float"
     " nan"),
    ("models/tiny-llama.toml", "block_size = 32", "block_size = " + "[" * 5000 + "]" * 5000,
     "models/tiny-llama.toml: nested too deeply"),
    ("models/tiny-llama.toml", 'prompts = ["Once upon a time there was a tiny mouse", '
     '"The children played", "Sam had a blue kite"]', "prompts = []",
     "models/tiny-llama.toml: stages.verify.prompts: expected a list of at least 1 strings"),
    ("models/tiny-llama.toml", 'target = "cpu-ort"', 'target = "npu9000"',
     "models/tiny-llama.toml: model.target: one of cpu-ort, hailo10h, openvino, got 'npu9000'"),
    ("toolchain/host.toml", "[env]", '[limits]\ntimeout = "nan"\n\n[env]',
     "toolchain/host.toml: limits.timeout: expected a duration"),
    ("toolchain/host.toml", "[env]", '[env]\nHF_TOKEN = "hf_not_here"',
     "toolchain/host.toml: env.HF_TOKEN: no secrets in a toolchain's environment"),
    # Names that became paths too long for the file system, or task names with a newline:
    ("models/tiny-llama.toml", "[stages.quantize]",
     f"[variants.{'v' * 300}.stages.quantize]\nsamples = 16\n\n[stages.quantize]",
     f"models/tiny-llama.toml: variants.\"{'v' * 40}…\": a variant name matching "
     "[a-z0-9][a-z0-9_-]* of at most 64 characters"),
    ("models/tiny-qwen2.toml", "[stages.quantize]",
     '[variants."ok\\n".stages.quantize]\nsamples = 16\n\n[stages.quantize]',
     'models/tiny-qwen2.toml: variants."ok\\n": a variant name matching'),
]


@pytest.mark.parametrize(("rel", "old", "new", "expected"), CASES,
                         ids=[c[3].split(": ", 1)[1][:40] for c in CASES])
def test_bad_declaration_gives_one_line_and_changes_nothing(
    project: Project, rel: str, old: str, new: str, expected: str
):
    before = snapshot(project.root / "build", project.store)
    project.edit(rel, old, new)
    # A bad toolchain stops everything; a bad model file only what names that model.
    named = rel in ("models/tiny-llama.toml",) or rel.startswith("toolchain/")
    for args in (["verify:tiny-llama"], ["list"]):
        run = project.doit(*args)
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1, run.stderr
        assert "Traceback" not in run.stdout + run.stderr
        if rel.startswith("toolchain/") or named and args != ["list"]:
            assert run.returncode != 0
            assert lines[0].startswith(f"ERROR: {expected}"), lines[0]
        else:  # the others' tasks are there; this model's one line is a warning
            assert run.returncode == 0, run.stdout + run.stderr
            assert lines[0].startswith(f"WARNING: {expected}"), lines[0]
            assert lines[0].endswith("(its tasks are left out)")
    after = snapshot(project.root / "build", project.store)
    if not named:  # a no-op run of the others: only the run's own records grow
        after, before = (without_run_records(x) for x in (after, before))
    assert after == before


def without_run_records(files: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    return {k: v for k, v in files.items()
            if not Path(k).name.startswith(("events", "trace")) or "/build/" not in k}


def test_unpinned_hub_revision_is_refused_before_anything_runs(project: Project):
    before = snapshot(project.root / "build", project.store)
    run = project.doit("fetch:smollm2")
    assert run.returncode == 1
    errors = [ln for ln in (run.stdout + run.stderr).splitlines() if ln.startswith("ERROR")]
    assert errors == [errors[0]] and "models/smollm2.toml: source.revision" in errors[0]
    assert "doit lock:smollm2" in errors[0]
    assert snapshot(project.root / "build", project.store) == before


def test_lock_without_network_says_so(project: Project):
    run = project.doit("lock:tinystories", env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert run.returncode == 1
    assert "cannot reach the hub" in run.stdout + run.stderr
    assert not (project.root / "models/tinystories.lock.json").exists()


def test_a_toml_file_that_is_not_utf8_is_one_line(project: Project):
    path = project.root / "models" / "tiny-llama.toml"
    path.write_bytes(path.read_bytes().replace(b"# A tiny", b"# A \xff tiny", 1))
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 3 and "Traceback" not in run.stderr
    assert run.stderr.strip().startswith("ERROR: models/tiny-llama.toml: not UTF-8 text")


def test_a_file_parameter_linking_outside_the_project_is_refused(project: Project):
    before = snapshot(project.root / "build", project.store)
    link = project.root / "data" / "calibration" / "outside.txt"
    link.symlink_to("/etc/passwd")
    project.edit("models/tiny-llama.toml", "block_size = 32",
                 'method = "static_qdq"\ncalibration = "data/calibration/outside.txt"')
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 3
    assert "stages.quantize.calibration: a file inside the project" in run.stderr
    assert snapshot(project.root / "build", project.store) == before


def test_a_package_pin_that_no_longer_holds_is_never_up_to_date(project: Project):
    project.edit("toolchain/host.toml", 'torch = "2.13.0"', 'torch = "2.12.0"')
    explain = project.doit("explain", "verify:tiny-llama")
    assert "would fail" in explain.stdout and "torch: version 2.12.0 required" in explain.stdout
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 2  # doit's code when tasks were left unrun after a failure
    assert "packages.torch: version 2.12.0 required, 2.13.0" in run.stdout
    assert "Traceback" not in run.stdout + run.stderr


def test_a_bad_model_file_blocks_only_its_own_tasks(project: Project):
    # One good model is enough to show the others go on; the OpenVINO one would make its
    # venv toolchain here (a minute), which tests/e2e/test_openvino.py already does.
    (project.root / "models/tiny-llama-ov.toml").unlink()
    project.edit("models/tiny-qwen2.toml", "[model]", "[model]\ncolour = 'red'")
    listed = project.doit("list")
    assert "verify:tiny-llama" not in listed.stdout  # groups only without --all
    assert listed.returncode == 0 and "verify" in listed.stdout
    run = project.doit("verify")
    assert "WARNING: models/tiny-qwen2.toml: model.colour: unknown key" in run.stderr
    table = run.stdout[run.stdout.index("checks:"):]
    assert "passed       verify:tiny-llama" in table
    assert "not runnable verify:tiny-qwen2" in table and "model.colour: unknown key" in table
    own = project.doit("verify:tiny-qwen2")
    assert own.returncode == 3
    assert own.stderr.strip().startswith("ERROR: models/tiny-qwen2.toml: model.colour: unknown "
                                         "key")


def test_status_and_report_leave_out_a_model_whose_variant_name_is_too_long(project: Project):
    project.edit("models/tiny-qwen2.toml", "[stages.quantize]",
                 f"[variants.{'v' * 300}.stages.quantize]\nsamples = 16\n\n[stages.quantize]")
    expected = (f"models/tiny-qwen2.toml: variants.\"{'v' * 40}…\": a variant name matching "
                "[a-z0-9][a-z0-9_-]* of at most 64 characters, got ")
    status = project.doit("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "Traceback" not in status.stdout + status.stderr
    assert status.stderr.startswith(f"WARNING: {expected}"), status.stderr
    assert len(status.stderr.splitlines()) == 1
    named = project.doit("status", "tiny-qwen2")  # named: its error, as a run naming it
    assert named.returncode == 3 and named.stdout == "", named.stdout
    assert named.stderr.startswith(f"ERROR: {expected}"), named.stderr
    rows = {line.split()[0]: line.split()[1:] for line in status.stdout.splitlines() if line}
    assert rows["tiny-llama"] == ["ok"] * 5, status.stdout  # the other models: as they are
    report = project.doit("report")
    assert report.returncode == 0, report.stdout + report.stderr
    page = (project.root / "build/report/index.html").read_text()
    assert 'data-model="tiny-llama"' in page


def test_a_misspelt_task_gets_the_closest_names(project: Project):
    run = project.doit("verfy:tiny-llama")
    assert run.returncode == 3
    assert run.stderr.strip().startswith("ERROR: no task 'verfy:tiny-llama'; did you mean "
                                         "verify:tiny-llama")


def test_every_mistake_of_a_model_file_in_one_run(project: Project):
    before = snapshot(project.root / "build", project.store)
    project.edit("models/tiny-llama.toml", 'target = "cpu-ort"', 'target = "cpu-ort"\ncolour = 1')
    project.edit("models/tiny-llama.toml", "block_size = 32", "block_sise = 32")
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 0")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 3
    assert run.stderr.splitlines() == [
        "ERROR: models/tiny-llama.toml: 3 mistakes",
        "  models/tiny-llama.toml: model.colour: unknown key (expected one of: chat, "
        "description, manual, target, toolchain)",
        "  models/tiny-llama.toml: stages.quantize.block_sise: unknown key (expected one of: "
        + ", ".join(sorted(QUANTIZE_KEYS)) + ")",
        "  models/tiny-llama.toml: stages.verify.max_new_tokens: expected an integer >= 1"]
    assert snapshot(project.root / "build", project.store) == before


def test_a_parameter_the_method_does_not_read_is_a_warning_and_rebuilds_nothing(
        project: Project):
    project.edit("models/tiny-llama.toml", "block_size = 32", "block_size = 32\nsamples = 8")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 0 and set(run.outcomes().values()) == {"uptodate"}
    assert ('WARNING: models/tiny-llama.toml: stages.quantize.samples is not read: only method = '
            '"static_qdq" reads it (here method = "weight_only_int8"), so it is left out of the '
            'key and changing it rebuilds nothing') in run.stderr.splitlines()
