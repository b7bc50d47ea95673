"""The build report from a hand-written build/: what it gathers and the page it writes."""

from __future__ import annotations

import json
import re
from html import escape

import pytest

from hefbuild.report.checks import CheckKind
from hefbuild.report.content import (
    build_report,
    invocations,
    last_outcomes,
    merge_history,
    snapshot,
)
from hefbuild.report.html import render
from hefbuild.report.model import HISTORY, StageState
from hefbuild.report.write import write_report

from .samples import (
    CHAINS,
    DEVICE_AGREEMENT,
    FREE_FIRST,
    HOSTILE,
    TF_FIRST,
    TF_SECOND,
    events,
    key,
    write_build,
)


@pytest.fixture
def report(tmp_path):
    root = write_build(tmp_path)
    return build_report(snapshot(root, CHAINS), CHAINS, "proj", "2026-01-01T00:00:00Z")


def models(report):
    return {m.name: m for m in report.models}


def section(page: str, model: str) -> str:
    start = page.index(f'<section class="model" id="model-{model}"')
    return page[start:page.index("</section>", start)]


def test_each_stage_shows_its_manifest_and_its_last_run(report):
    stages = {s.name: s for s in models(report)["tiny-llama"].stages}
    assert list(stages) == ["fetch", "export", "quantize", "compile", "verify"]
    export = stages["export"]
    assert export.state is StageState.RESTORED and export.key == key(2)
    assert export.seconds == 3.0 and export.peak_mb == 112.5
    assert export.last_run == "restored"  # its last line in the last invocation
    assert stages["verify"].last_run == "uptodate"  # named by the last summary


def test_a_model_without_anything_in_build_is_named_with_why(report):
    assert [(u.name, u.why) for u in report.unbuilt] == [
        ("never", ("no run has built it yet (`doit verify:never`)",))]
    hailo = {s.name: s.state for s in models(report)["tiny-hailo"].stages}
    assert hailo["verify"] is StageState.BUILT and hailo["parse"] is StageState.MISSING


def test_a_failed_verify_is_shown_from_its_failed_folder(report):
    broken = models(report)["broken"]
    verify = next(s for s in broken.stages if s.name == "verify")
    assert verify.state is StageState.FAILED and verify.key == key(30)
    assert verify.log == "build/broken/verify.failed.log" and "gate failed" in verify.error
    (check,) = broken.checks
    assert check.failed_run and check.passed is False and check.key == key(30)
    assert check.path == "build/broken/verify.failed/report.json"
    page = section(render(report), "broken")
    assert "The last run of verify FAILED" in page and "verify.failed/report.json" in page
    assert "badge fail" in page
    assert f"{TF_FIRST:.3f}" in page  # its figures are shown all the same


def test_the_cpu_check_figures_per_prompt(report):
    (check,) = models(report)["tiny-llama"].checks
    assert check.kind is CheckKind.COMPARISON and check.threshold == 0.9
    first = check.prompts[0]
    assert (first.teacher_forced, first.agreement, first.first_divergence) == \
        (TF_FIRST, FREE_FIRST, 3)
    assert first.generated_text == " there was a dog."
    page = section(render(report), "tiny-llama")
    assert f"{TF_FIRST:.3f}" in page and f"{FREE_FIRST:.3f}" in page and f"{TF_SECOND:.3f}" in page
    assert "<svg" in page and "gate 0.9" in page
    assert "there was a fox." in page and "there was a dog." in page


def test_the_test_double_is_never_shown_as_a_device(report):
    checks = {c.stage: c for c in models(report)["tiny-hailo"].checks}
    assert checks["verify"].kind is CheckKind.DEVICE and checks["verify"].fake_device
    page = section(render(report), "tiny-hailo")
    assert "TEST DOUBLE answered this check" in page and "NOT from a Hailo-10H device" in page
    assert "a Hailo-10H device</dd>" not in page
    assert "passed on the TEST DOUBLE, not a device" in page  # the badge, also in the header
    assert f"{DEVICE_AGREEMENT:.3f}" in page and " in a box" in page


def test_fidelity_is_labelled_an_estimate(report):
    checks = {c.stage: c for c in models(report)["tiny-hailo"].checks}
    assert checks["fidelity"].kind is CheckKind.ESTIMATE
    page = section(render(report), "tiny-hailo")
    assert "CPU emulation estimate of the recipe (not the chip)" in page
    assert "An estimate: ONNX Runtime emulating" in page
    assert "layer 1 weights w4 (logit cosine 0.9700)" in page  # the costliest first
    assert ("reaches the target in emulation: quantization_param([model/conv12, "
            "model/conv13], precision_mode=a8_w8)") in page


def test_text_from_a_build_is_escaped(report):
    page = render(report)
    assert HOSTILE not in page and "<script" not in page and "<b>bold" not in page
    assert escape(HOSTILE) in page


def test_the_page_names_no_network_resource(report):
    page = render(report)
    assert not re.search(r"https?:|//[a-z]", page, re.IGNORECASE), "a URL in the page"
    assert not re.search(r"<(script|link|img|iframe|object|embed)\b|@import|url\(", page)
    hrefs = re.findall(r'href="([^"]*)"', page)
    assert hrefs and all(h.startswith(("#", "../")) for h in hrefs), hrefs


def test_stage_history_comes_from_the_event_logs(report):
    history = {h.stage: h for h in models(report)["tiny-llama"].history}
    export = history["export"]
    assert [r.seconds for r in export.runs] == [3.0, 7.5] and export.reused == 1
    assert [r.key for r in export.runs] == [key(2), key(9)]
    broken = {h.stage: h for h in models(report)["broken"].history}
    assert [r.outcome for r in broken["verify"].runs] == ["failed"]


def test_invocations_and_last_outcomes():
    groups = invocations(events())
    assert len(groups) == 2 and all("summary" in g[-1] for g in groups)
    last = last_outcomes(events())
    assert last["export:tiny-llama"] == "restored" and last["fetch:tiny-llama"] == "uptodate"
    assert last["fetch:broken"] == "built"  # not named since its build


def test_history_is_appended_once_per_result(tmp_path):
    root = write_build(tmp_path)
    write_report(root, CHAINS)
    first = (root / HISTORY).read_text().splitlines()
    write_report(root, CHAINS)
    assert (root / HISTORY).read_text().splitlines() == first  # same results: no new lines
    rows = [json.loads(line) for line in first]
    by_model = {r["model"]: r for r in rows if r["check"] == "verify"}
    assert by_model["tiny-llama"]["key"] == key(5)
    assert by_model["tiny-llama"]["mean_teacher_forced"] == 0.953
    assert by_model["tiny-hailo"]["fake"] is True and by_model["broken"]["passed"] is False


def test_merge_history_keeps_one_row_per_model_check_and_key():
    old = [{"model": "m", "check": "verify", "key": "a", "time": "1"}]
    current = [{"model": "m", "check": "verify", "key": "a", "time": "2"},
               {"model": "m", "check": "verify", "key": "b", "time": "3"}]
    merged, new = merge_history(old, current)
    assert [r["key"] for r in merged] == ["a", "b"] and [r["time"] for r in new] == ["3"]


def test_the_agreement_over_time_is_plotted_from_the_history(tmp_path):
    root = write_build(tmp_path)
    older = {"model": "tiny-llama", "check": "verify", "key": key(99), "mean_agreement": 0.5,
             "mean_teacher_forced": 0.91, "passed": True, "fake": False,
             "time": "2025-01-01T00:00:00Z"}
    (root / HISTORY).parent.mkdir(parents=True)
    (root / HISTORY).write_text(json.dumps(older) + "\n")
    page = write_report(root, CHAINS).read_text()
    points = models(build_report(snapshot(root, CHAINS), CHAINS))["tiny-llama"].agreement
    assert [p.key for p in points] == [key(99), key(5)]  # oldest first
    assert "agreement over time" in section(page, "tiny-llama")
    assert "2025-01-01T00:00:00Z" in page


def test_the_page_is_written_whole(tmp_path):
    root = write_build(tmp_path)
    out = write_report(root, CHAINS)
    assert out == root / "build/report/index.html"
    assert out.read_text().rstrip().endswith("</html>")
    assert [p.name for p in out.parent.iterdir() if p.name.startswith(".")] == []


def test_a_stage_that_runs_now_is_shown_running(tmp_path):
    root = write_build(tmp_path)
    (root / "build/tiny-llama/quantize.running.log").write_text("working\n")
    with open(root / "build/events.jsonl", "a") as f:
        f.write(json.dumps({"task": "quantize:tiny-llama", "key": key(7),
                            "heartbeat": {"rss_mb": 640.0}, "time": "t"}) + "\n")
    report = build_report(snapshot(root, CHAINS), CHAINS)
    quantize = next(s for s in models(report)["tiny-llama"].stages if s.name == "quantize")
    assert quantize.state is StageState.RUNNING and quantize.key == key(7)
    assert quantize.peak_mb == 640.0 and quantize.log == "build/tiny-llama/quantize.running.log"


def test_a_project_never_built_gets_a_page_naming_its_models(tmp_path):
    report = build_report(snapshot(tmp_path, CHAINS), CHAINS)
    assert report.models == () and {u.name for u in report.unbuilt} == set(CHAINS)
    page = render(report)
    assert "no invocation yet" in page and "<h2>Not built</h2>" in page


def test_a_long_history_plots_its_last_builds():
    from hefbuild.report.content import stage_history
    from hefbuild.report.model import PLOTTED

    from .samples import T0, event

    lines = [event("export:m", i, "built", float(i), T0 + i) for i in range(PLOTTED + 40)]
    history = stage_history("export", lines)
    assert history.builds == PLOTTED + 40 and len(history.runs) == PLOTTED
    assert history.runs[-1].seconds == PLOTTED + 39


def test_the_report_page_speaks_in_the_targets_declared_words(tmp_path):
    """Another target's device and test double, and its report's file and title: the page
    takes them all from the declaration, and reads the figures by the report's keys."""
    from dataclasses import replace

    from hefbuild.declare.targets import StageReport, load_targets
    from hefbuild.report.content import chains_of

    from .samples import device_report, manifest, write

    spec = load_targets(None)["hailo10h"]
    stages = tuple(replace(s, report=StageReport("answers.json", "the toy on its NPU"))
                   if s.name == spec.check else replace(s, report=None) for s in spec.stages)
    toy = replace(spec, name="toy", stages=stages, device="a toy NPU",
                  test_double="the toy simulator")
    chains = chains_of({"m": "toy"}, {"toy": toy})
    write(tmp_path / f"build/m/{spec.check}/answers.json", device_report())
    write(tmp_path / f"build/m/{spec.check}/manifest.json", manifest(f"{spec.check}:m", 1))
    (model,) = build_report(snapshot(tmp_path, chains), chains).models
    (check,) = model.checks
    assert check.kind is CheckKind.DEVICE and check.stage == spec.check == model.check
    page = render(build_report(snapshot(tmp_path, chains), chains))
    assert f"{spec.check}: the toy on its NPU</h3>" in page
    assert "The toy simulator answered this check: these figures are NOT from a toy NPU." \
        in page
    assert "<dd>the toy simulator (not a device)</dd>" in page
    assert "Hailo" not in page and "passed on the TEST DOUBLE, not a device" in page


def test_the_declarations_say_why_a_model_is_held_back(tmp_path):
    """This repository's own models: the hub models are manual and not locked; a variant
    would lock through its base; a model file that does not load is named with its error."""
    from hefbuild.declare.project import load_project
    from hefbuild.report.content import project_chains
    from hefbuild.report.markdown import render_markdown

    from .browser import REPO

    chains = project_chains(load_project(REPO, strict=False))
    manual, locked = chains["smollm2"].held_back
    assert manual.startswith("manual: a hub model") and "`doit lock:smollm2`" in locked
    assert chains["tiny-llama"].held_back == ()
    assert chains["tiny-llama"].params["quantize"]["method"] == "weight_only_int8"
    report = build_report(snapshot(tmp_path, chains), chains,
                          broken={"bad": "models/bad.toml: model.target: unknown"})
    why = {u.name: u.why for u in report.unbuilt}
    assert why["smollm2"] == (manual, locked)
    assert why["bad"] == ("its model file does not load: models/bad.toml: model.target: "
                          "unknown",)
    assert f"- `smollm2`: {manual}; {locked}" in render_markdown(report)


def test_a_stage_that_failed_before_its_rule_ran_says_so(tmp_path):
    from .sweep_samples import MISMATCH, sweep_chains, write_sweep

    chains = sweep_chains()
    report = build_report(snapshot(write_sweep(tmp_path), chains), chains)
    why = {u.name: u.why for u in report.unbuilt}
    assert why["blocked"] == (f"fetch failed (the stages after it did not run): {MISMATCH}",)
    assert why["never"] == ("no run has built it yet (`doit verify:never`)",)


def test_a_title_names_what_its_report_ran():
    from hefbuild.report.checks import titled

    assert titled("{method} ONNX Runtime", {"method": "weight_only_int4"}) == \
        "weight_only_int4 ONNX Runtime"
    assert titled("{method} ONNX Runtime", {}) == "ONNX Runtime"  # an older report
    assert titled("{method} ONNX Runtime", {"method": {"nested": 1}}) == "ONNX Runtime"


def test_a_stage_whose_build_created_its_venv_first_says_how_long(tmp_path):
    from .samples import T0, event, manifest, write

    chains = {"m": CHAINS["tiny-llama"]}
    write(tmp_path / "build/m/export/manifest.json", manifest("export:m", 5, seconds=52.0))
    line = event("export:m", 5, "built", 52.0, T0, env="openvino", env_s=209.4)
    (tmp_path / "build/events.jsonl").write_text(json.dumps(line) + "\n")
    report = build_report(snapshot(tmp_path, chains), chains)
    export = next(s for s in models(report)["m"].stages if s.name == "export")
    assert (export.seconds, export.env, export.env_s) == (52.0, "openvino", 209.4)
    row = re.search(r'<tr data-stage="export">.*?</tr>', render(report)).group(0)
    assert "its build first got venv toolchain openvino ready: 209.4 s" in row
