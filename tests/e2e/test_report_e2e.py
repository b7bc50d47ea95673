"""`doit report` and build/trace.json after real doit runs of the tiny cpu-ort model."""

from __future__ import annotations

import json
from html import escape

import pytest
from report.browser import ARTIFACTS, check_picture, chromium_or_skip, dump_dom, screenshot

from .conftest import Project, tiny_tasks

pytestmark = pytest.mark.e2e
STAGES = ("fetch", "export", "quantize", "compile", "verify")


def report_of(project: Project) -> str:
    run = project.doit("report")
    assert run.returncode == 0, run.stdout + run.stderr
    page = project.root / "build/report/index.html"
    assert run.stdout.strip() == str(page)
    return page.read_text()


def test_doit_report_shows_the_chain_and_the_check(project: Project):
    page = report_of(project)
    for stage in STAGES:
        assert f'<tr data-stage="{stage}"><td>{stage}</td>' in page
        key = project.manifest(f"{stage}:tiny-llama")["key"]
        assert key[:12] in page
    report = json.loads((project.root / "build/tiny-llama/verify/report.json").read_text())
    assert f"{report['mean_teacher_forced_agreement']:.3f} (minimum" in page
    for row in report["prompts"]:
        assert escape(row["prompt"]) in page
        assert escape(row["candidate_text"]) in page and escape(row["reference_text"]) in page
        assert f"{row['teacher_forced_agreement']:.3f}" in page
    assert "http://" not in page and "https://" not in page
    # The hub models of this repository are not built, and the page says why.
    unbuilt = page[page.index('<section class="unbuilt">'):]
    assert '<li data-model="smollm2"><b>smollm2</b>: manual: a hub model' in unbuilt
    assert "not locked: its source is not pinned" in unbuilt
    assert f"verify: {report['method']} ONNX Runtime against float32 transformers</h3>" in page


def test_each_invocation_leaves_its_trace(project: Project):
    trace = json.loads((project.root / "build/trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    # The fixture's last invocation restored the whole chain into a fresh build/.
    assert {e["name"] for e in spans} == tiny_tasks()
    assert {e["args"]["outcome"] for e in spans} == {"restored"}
    assert all(e["dur"] == round(e["args"]["seconds"] * 1e6) for e in spans)
    written = (project.root / "build/trace.json").read_bytes()
    for _ in range(2):  # two no-ops: nothing ran, so the trace of the restore stays
        again = project.doit("verify:tiny-llama")
        assert again.returncode == 0 and set(again.outcomes().values()) == {"uptodate"}
        assert (project.root / "build/trace.json").read_bytes() == written
    (kept,) = sorted((project.root / "build/traces").glob("*.json"))
    assert kept.read_bytes() == written
    # 13: no other test builds it into the store all e2e tests share, so verify runs here
    project.edit("models/tiny-llama.toml", "max_new_tokens = 16", "max_new_tokens = 13")
    rebuilt = project.doit("verify:tiny-llama")
    assert rebuilt.returncode == 0 and rebuilt.tasks("built") == {"verify:tiny-llama"}
    trace = json.loads((project.root / "build/trace.json").read_text())
    assert [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"] == ["verify:tiny-llama"]
    assert len(list((project.root / "build/traces").glob("*.json"))) == 2


def test_the_report_of_a_real_build_in_a_browser(project: Project, tmp_path):
    browser = chromium_or_skip()
    report_of(project)
    page = project.root / "build/report/index.html"
    dom = dump_dom(browser, tmp_path / "profile", page)
    report = json.loads((project.root / "build/tiny-llama/verify/report.json").read_text())
    assert f"{report['mean_teacher_forced_agreement']:.3f}" in dom
    assert all(f'data-stage="{s}"' in dom for s in STAGES)
    check_picture(screenshot(browser, tmp_path / "profile", page, ARTIFACTS / "report-e2e.png"))
