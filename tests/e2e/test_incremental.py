"""The incremental-build contract, on real runs of doit over the tiny cpu-ort models."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from .conftest import Project, assert_consistent, copy_project, tiny_tasks

pytestmark = pytest.mark.e2e


def test_first_build_runs_every_stage_then_nothing(built_store):
    _, first, second = built_store
    assert first.outcomes() == {t: "built" for t in tiny_tasks()}
    assert second.returncode == 0
    assert second.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    for run in (first, second):  # the check's verdict is shown whether it ran or not
        assert "verify:tiny-llama: passed, lowest teacher-forced agreement 1.000" in run.stdout
    for event in first.events:
        assert event["key"] and len(event["key"]) == 64
        assert event["seconds"] > 0 and event["peak_rss_mb"] > 0


def test_fresh_checkout_restores_everything_without_running_a_rule(project: Project):
    restored = project.doit("verify:tiny-llama")  # the fixture's run restored; this is a no-op
    assert restored.outcomes() == {t: "uptodate" for t in tiny_tasks()}
    first = project._events()[: len(tiny_tasks())]
    assert {e["task"]: e["outcome"] for e in first} == {t: "restored" for t in tiny_tasks()}


def test_rm_build_restores_with_zero_rule_runs(project: Project, tmp_path: Path):
    import shutil

    shutil.rmtree(project.root / "build")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 0
    assert run.outcomes() == {t: "restored" for t in tiny_tasks()}
    model = project.root / "build/tiny-llama/compile/model.opt.onnx"
    assert not os.access(model, os.W_OK) or os.geteuid() == 0
    assert model.stat().st_mode & 0o222 == 0  # read-only
    assert model.stat().st_nlink >= 2  # hard link into the store
    assert_consistent(project)


def test_verify_param_change_reruns_only_verify(project: Project):
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 12")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 0, run.stderr
    assert run.tasks("built") == {"verify:tiny-llama"}
    assert run.tasks("uptodate") == tiny_tasks() - {"verify:tiny-llama"}
    assert_consistent(project)


def test_quantize_param_change_then_revert_restores(project: Project):
    # A parameter of the default method (weight_only_int8); a static_qdq-only one such as
    # `samples` is left out of its key (tests/e2e/test_bad_input.py).
    project.edit("models/tiny-llama.toml", "block_size = 32", "block_size = 64")
    changed = project.doit("verify:tiny-llama")
    assert changed.returncode == 0, changed.stderr
    downstream = {"quantize:tiny-llama", "compile:tiny-llama", "verify:tiny-llama"}
    assert changed.tasks("built") == downstream
    assert changed.tasks("uptodate") == {"fetch:tiny-llama", "export:tiny-llama"}

    project.edit("models/tiny-llama.toml", "block_size = 64", "block_size = 32")
    reverted = project.doit("verify:tiny-llama")
    assert reverted.returncode == 0
    assert reverted.tasks("restored") == downstream
    assert reverted.tasks("built") == set()
    assert_consistent(project)


def test_touch_runs_nothing(project: Project):
    later = time.time() + 5
    for rel in ("data/calibration/tiny-stories.txt", "data/corpus/tiny-stories.txt",
                "rules/cpu_ort/quantize.py", "models/tiny-llama.toml",
                "build/tiny-llama/export/model.onnx"):
        os.utime(project.root / rel, (later, later))
    run = project.doit("verify:tiny-llama")
    assert run.outcomes() == {t: "uptodate" for t in tiny_tasks()}


def test_same_size_edit_with_restored_mtime_is_seen(project: Project):
    path = project.root / "rules/cpu_ort/compile.py"
    st = path.stat()
    text = path.read_text()
    swapped = text.replace("a", "e", 1)
    assert len(swapped) == len(text) and swapped != text
    path.write_text(swapped)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # what `cp -p` or `tar x` leave
    run = project.doit("verify:tiny-llama")
    assert "compile:tiny-llama" in run.tasks("built")


def test_rule_code_change_reruns_that_stage_and_cuts_off(project: Project):
    rule = project.root / "rules/cpu_ort/compile.py"
    rule.write_text(rule.read_text() + "\n# a comment changes the code digest, not the output\n")
    run = project.doit("verify:tiny-llama")
    assert run.returncode == 0
    assert run.tasks("built") == {"compile:tiny-llama"}
    assert "verify:tiny-llama" in run.tasks("uptodate")  # identical bytes: early cutoff
    assert_consistent(project)


def test_corrupted_store_object_is_rebuilt(tmp_path: Path, built_store):
    import shutil

    store = tmp_path / "store"
    shutil.copytree(built_store[0], store)
    proj = copy_project(tmp_path / "project", store)
    assert proj.doit("verify:tiny-llama").returncode == 0
    digest = proj.manifest("compile:tiny-llama")["outputs"]["model.opt.onnx"]["digest"]
    obj = store / "v1" / "objects" / digest[:2] / digest[2:]
    shutil.rmtree(proj.root / "build")
    obj.chmod(0o644)
    with open(obj, "r+b") as f:
        f.seek(100)
        f.write(b"\x00corrupt\x00")
    run = proj.doit("verify:tiny-llama")
    assert run.returncode == 0, run.stderr
    assert run.outcomes()["compile:tiny-llama"] == "built"
    assert proj.manifest("compile:tiny-llama")["outputs"]["model.opt.onnx"]["digest"] == digest
    assert_consistent(proj)


def test_two_concurrent_invocations_leave_a_consistent_state(project: Project):
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 10")
    first = project.popen("verify:tiny-llama")
    time.sleep(0.3)
    second = project.popen("verify:tiny-llama")
    out1, err1 = first.communicate(timeout=300)
    out2, err2 = second.communicate(timeout=300)
    assert first.returncode == 0 and second.returncode == 0, err1 + err2
    assert "waiting for another doit" in err1 + err2
    built = [e for e in project._events() if e["outcome"] == "built"]
    assert [e["task"] for e in built] == ["verify:tiny-llama"]  # built once, not twice
    assert_consistent(project)


def test_no_wait_fails_fast_while_another_runs(project: Project):
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 9")
    first = project.popen("verify:tiny-llama")
    lock = project.root / ".hefbuild" / "lock"
    deadline = time.monotonic() + 120
    # Not a fixed sleep: on a busy machine the first doit may need seconds to take the lock.
    while time.monotonic() < deadline and first.poll() is None:
        if lock.exists() and lock.read_text().strip() == str(first.pid):
            break
        time.sleep(0.05)
    assert first.poll() is None, "the first doit ended before it was seen holding the lock"
    second = project.doit("verify:tiny-llama", env={"HEFBUILD_NO_WAIT": "1"})
    first.communicate(timeout=300)
    assert second.returncode != 0
    assert "another doit is running in this project" in second.stderr


def test_explain_names_the_changed_parameter(project: Project):
    assert "up to date" in project.doit("explain", "verify:tiny-llama").stdout
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 20")
    out = project.doit("explain", "verify:tiny-llama").stdout
    assert "params.max_new_tokens: 16 -> 20" in out
    assert "rules/cpu_ort/verify.py would run" in out
    project.edit("models/tiny-llama.toml", "block_size = 32", "block_size = 128")
    out = project.doit("explain", "verify:tiny-llama").stdout
    assert "upstream quantize:tiny-llama" in out


def test_explain_says_restorable(project: Project):
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 12")
    assert project.doit("verify:tiny-llama").returncode == 0
    project.edit("models/tiny-llama.toml", "max_new_tokens = 12", "max_new_tokens = 16")
    out = project.doit("explain", "verify:tiny-llama").stdout
    assert "params.max_new_tokens: 12 -> 16" in out
    assert "is in the store: it would be restored" in out


def test_manifest_and_log_record_what_happened(project: Project):
    manifest = project.manifest("quantize:tiny-llama")
    desc = manifest["description"]
    assert set(desc["inputs"]) >= {"export/model.onnx", "fetch/checkpoint/config.json"}
    # weight-only int8: no calibration text, so no file and no calibration parameters
    assert desc["files"] == {} and desc["params"]["block_size"] == 32
    assert "samples" not in desc["params"]
    fetched = project.manifest("fetch:tiny-llama")["description"]
    assert fetched["files"]["corpus"]["path"] == "data/corpus/tiny-stories.txt"
    assert desc["toolchain"]["packages"]["torch"].startswith("2.13.0")
    assert manifest["peak_rss_mb"] > 0 and manifest["build_seconds"] > 0
    assert (project.root / "build/tiny-llama/quantize/log.txt").stat().st_size > 0
    text = (project.root / "build/tiny-llama/quantize/manifest.json").read_text()
    assert str(project.root) not in text and str(project.store) not in text


def test_tiny_qwen2_builds_and_passes_its_check(project: Project):
    run = project.doit("verify:tiny-qwen2")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.outcomes() == {t: "built" for t in tiny_tasks("tiny-qwen2")}
    assert "verify:tiny-qwen2: passed" in run.stdout
    import json

    report = json.loads((project.root / "build/tiny-qwen2/verify/report.json").read_text())
    assert report["passed"] and report["mean_agreement"] >= 0.5
    assert_consistent(project, "tiny-qwen2")
