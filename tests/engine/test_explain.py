"""`explain_task`: why a task would run, field by field, without running anything."""

from __future__ import annotations

import json

from hefbuild.report.explain import _emulation, explain_task

from .helpers import MODEL, edit, model_toml

VERIFY = f"verify:{MODEL}"
CHANGED = "  changed since the last build: "


def test_up_to_date(built):
    key = built.decide(built.actions[VERIFY]).key.hex
    assert explain_task(built, VERIFY) == [f"{VERIFY}: up to date (key {key[:12]})"]


def test_param_change_is_named_with_old_and_new_value(built, make_engine, root, fake):
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    lines = explain_task(make_engine(), VERIFY)
    assert lines[0].startswith(f"{VERIFY}: would build (inputs, parameters, rule or toolchain")
    assert [ln for ln in lines if ln.startswith(CHANGED)] == [
        CHANGED + "params.max_new_tokens: 16 -> 24"]
    assert lines[-1].endswith("rules/cpu_ort/verify.py would run")
    assert fake.ran == []


def test_result_in_store_is_said_restorable(built, make_engine, root):
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    make_engine().run(VERIFY)
    edit(model_toml(root), "max_new_tokens = 24", "max_new_tokens = 16")
    lines = explain_task(make_engine(), VERIFY)
    assert CHANGED + "params.max_new_tokens: 24 -> 16" in lines
    assert lines[-1].endswith("is in the store: it would be restored, no rule run")
    # the headline says what the detail says (it said "would run" over "would be restored")
    assert lines[0].startswith(f"{VERIFY}: would be restored from the store ("), lines


def test_stale_upstream_is_explained_first(built, make_engine, root):
    edit(model_toml(root), "block_size = 32", "block_size = 16")
    lines = explain_task(make_engine(), VERIFY)
    assert lines[0].startswith(f"{VERIFY}: decided after upstream quantize:{MODEL}, which "
                               f"runs first (")
    assert "early cutoff" in lines[1]


def test_rule_code_change_shows_the_rule_digest(built, make_engine, root):
    (root / "rules" / "cpu_ort" / "verify.py").write_text("# verify, version 2\n")
    changes = [ln for ln in explain_task(make_engine(), VERIFY) if ln.startswith(CHANGED)]
    assert len(changes) == 1
    assert changes[0].startswith(CHANGED + "rule.cpu_ort/verify.py: sha256:")


def test_explaining_writes_nothing(built, make_engine, root):
    events = (root / "build" / "events.jsonl").read_bytes()
    edit(model_toml(root), "max_new_tokens = 16", "max_new_tokens = 24")
    explain_task(make_engine(), VERIFY)
    assert (root / "build" / "events.jsonl").read_bytes() == events


def test_an_emulations_report_says_it_is_one_and_what_it_proposes(built, root):
    """What `doit explain` adds for a stage whose report is a CPU emulation (fidelity's)."""
    report = {"kind": "cpu-emulation", "note": "not the Hailo-10H's numerics",
              "not_emulated": ["accumulator widths"],
              "proposal": {"needed": True, "reached": True, "proposed": {
                  "lines": ["quantization_param([model/conv3], precision_mode=a8_w8)"]}}}
    out = root / "build" / MODEL / "verify" / "report.json"
    assert _emulation(built, VERIFY) == []  # a comparison's report: nothing added
    out.chmod(0o644)
    out.write_text(json.dumps(report))
    assert _emulation(built, VERIFY) == [
        f"  build/{MODEL}/verify/report.json is an estimate, not the chip: not the Hailo-10H's "
        "numerics",
        "  not modelled: accumulator widths",
        "  proposed recipe change (reaches the target in emulation), to append to the "
        "model's recipe:",
        "    quantization_param([model/conv3], precision_mode=a8_w8)"]


def test_an_emulation_no_recipe_change_can_fix_says_so_with_its_best_figure(built, root):
    report = {"kind": "cpu-emulation", "note": "not the Hailo-10H's numerics",
              "proposal": {"needed": True, "reached": False, "all_a16_reaches": False,
                           "proposed": {"lines": ["quantization_param([model/conv3], "
                                                  "precision_mode=a16_w16)"],
                                        "summary": {"worst_teacher_forced": 0.4375}}}}
    out = root / "build" / MODEL / "verify" / "report.json"
    out.chmod(0o644)
    out.write_text(json.dumps(report))
    assert _emulation(built, VERIFY)[-1] == (
        "  no recipe change reaches the target in emulation: even every layer at "
        "a16_w16 gives worst teacher-forced 0.4375")
