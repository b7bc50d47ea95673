"""A check's verdict line quotes the figure that decided it: the gate holds per prompt, so a
failure names the failing prompt and its reason, and a pass the lowest prompt's figures."""

from __future__ import annotations

import json
from pathlib import Path

from hefbuild.engine.verdicts import check_verdict


def row(prompt: str, tf: float, cos: float, free: float, passed: bool, reason: str) -> dict:
    return {"prompt": prompt, "teacher_forced_agreement": tf, "logit_cosine_mean": cos,
            "agreement": free, "passed": passed, "reason": reason}


def verdict(tmp_path: Path, report: dict) -> str:
    (tmp_path / "build/m/verify").mkdir(parents=True)
    (tmp_path / "build/m/verify/report.json").write_text(json.dumps(report))
    return check_verdict(tmp_path, "verify:m")


TF = {"gate": "teacher_forced", "min_teacher_forced": 0.9, "min_logit_cosine": 0.99,
      "min_token_agreement": 0.5}


def test_a_failure_quotes_the_failing_prompt_not_the_mean(tmp_path: Path):
    reason = "teacher-forced agreement 0.4375 < min_teacher_forced 0.9"
    line = verdict(tmp_path, {**TF, "passed": False, "mean_teacher_forced_agreement": 0.8,
                              "mean_logit_cosine": 0.995, "mean_agreement": 0.8, "prompts": [
                                  row("a", 1.0, 0.999, 1.0, True, "ok"),
                                  row("b", 0.4375, 0.98, 0.41, False, reason),
                                  row("c", 0.96, 0.999, 0.9, True, "ok")]})
    assert line.startswith(f"verify:m: FAILED, 1 of 3 prompts under the gate, 'b': {reason}; "
                           "mean teacher-forced agreement 0.800"), line
    assert line.endswith("; build/m/verify/report.json")


def test_a_pass_quotes_the_lowest_prompt(tmp_path: Path):
    line = verdict(tmp_path, {**TF, "passed": True, "mean_teacher_forced_agreement": 0.97,
                              "mean_logit_cosine": 0.998, "mean_agreement": 0.9, "prompts": [
                                  row("a", 1.0, 0.9995, 1.0, True, "ok"),
                                  row("b", 0.9375, 0.9962, 0.8, True, "ok")]})
    assert ("passed, lowest teacher-forced agreement 0.938 and logit cosine 0.9962 of 2 "
            "prompts (minimum 0.9 and 0.99 per prompt); mean teacher-forced") in line, line


def test_free_running_quotes_the_lowest_agreement(tmp_path: Path):
    line = verdict(tmp_path, {"gate": "free_running", "min_token_agreement": 0.5,
                              "passed": False, "mean_agreement": 0.8, "prompts": [
                                  row("a", 1.0, 1.0, 1.0, True, "ok"),
                                  row("b", 1.0, 1.0, 0.41, False, "agreement 0.41 < 0.5")]})
    assert "FAILED, 1 of 2 prompts under the gate, 'b': agreement 0.41 < 0.5; mean token " \
           "agreement 0.80 over 2 prompts" in line, line
