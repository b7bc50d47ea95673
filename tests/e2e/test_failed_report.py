"""A failed verify through doit, real rules: its report is kept, the stale one leaves build/."""

from __future__ import annotations

import json

import pytest

from .conftest import Project

pytestmark = pytest.mark.e2e

VERIFY = "build/tiny-llama/verify"


def test_failed_verify_keeps_its_report_and_drops_the_stale_one(project: Project):
    passing = json.loads((project.root / VERIFY / "report.json").read_text())
    assert passing["passed"] is True
    # No weight-only int8 model matches float32 logits exactly: this gate cannot be met.
    project.edit("models/tiny-llama.toml", "min_token_agreement = 0.5",
                 "min_token_agreement = 0.5\nmin_logit_cosine = 1.0")
    run = project.doit("verify:tiny-llama")
    assert run.returncode != 0
    errors = [ln for ln in run.stdout.splitlines() if ln.startswith("ERROR")]
    assert len(errors) == 1 and "verify gate failed" in errors[0], run.stdout
    assert "mean logit cosine 0.9" in errors[0] and "< min_logit_cosine 1;" in errors[0]
    assert not (project.root / VERIFY).exists()  # made for other parameters
    failed = json.loads((project.root / f"{VERIFY}.failed" / "report.json").read_text())
    assert failed["passed"] is False and failed["min_logit_cosine"] == 1.0
    verdicts = [ln.strip() for ln in run.stdout.splitlines() if "verify:tiny-llama: FAILED" in ln]
    assert verdicts and "teacher-forced agreement" in verdicts[0]
    assert verdicts[0].endswith(f"{VERIFY}.failed/report.json")
    explain = project.doit("explain", "verify:tiny-llama")
    assert f"its last run failed: {VERIFY}.failed.log; what it wrote: " \
           f"{VERIFY}.failed/report.json" in explain.stdout

    project.edit("models/tiny-llama.toml", "\nmin_logit_cosine = 1.0", "")
    back = project.doit("verify:tiny-llama")
    assert back.returncode == 0 and back.outcomes()["verify:tiny-llama"] == "restored"
    assert json.loads((project.root / VERIFY / "report.json").read_text()) == passing
    assert not (project.root / f"{VERIFY}.failed").exists()
    assert not (project.root / f"{VERIFY}.failed.log").exists()
