"""A check's verdict, read from the report its stage wrote: the one line the terminal shows
and the figures an event keeps. The rebuilder records them; the views show them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..declare.checks import Checks, builtin_checks
from ..store.events import read_json


def check_verdict(root: Path, task: str, failed: bool = False,
                  checks: Checks | None = None) -> str:
    """A check task's one-line result with the figures it was gated on, from its report
    (`failed`: the report a failed run left in build/<model>/<stage>.failed/); '' when
    none. `checks`: the project's (else those of hefbuild's own targets)."""
    checks = checks or builtin_checks()
    stage = checks.stage_of(task)
    if stage is None:
        return ""
    model = task.split(":", 1)[1]
    rel = f"build/{model}/{stage}{'.failed' if failed else ''}/{checks.report_of(stage)}"
    report = read_json(root / rel)
    if report is None:
        return ""
    verdict = "passed" if report.get("passed") else "FAILED"
    if (report.get("device") or {}).get("fake"):
        verdict += f" on {checks.double(stage)} (not a device)"
    return f"{task}: {verdict}, {_gated_figures(report)}; {rel}"


def check_figures(root: Path, task: str, checks: Checks | None = None) -> dict[str, Any]:
    """A check result's headline figures, for its event (the report's history)."""
    checks = checks or builtin_checks()
    stage = checks.stage_of(task)
    if stage is None:
        return {}
    report = read_json(root / "build" / task.split(":", 1)[1] / stage / checks.report_of(stage))
    if report is None:
        return {}
    keys = ("passed", "mean_agreement", "mean_teacher_forced_agreement", "mean_logit_cosine")
    figures = {k: report[k] for k in keys if k in report}
    if (report.get("device") or {}).get("fake"):
        figures["fake"] = True
    return figures


def _gated_figures(report: dict[str, Any]) -> str:
    """The figure that decided the verdict first: the gate holds per prompt, so a failure
    quotes the failing prompt's own reason and a pass the lowest prompt's figure."""
    count = len(report.get("prompts", []))
    prompts = [p for p in report.get("prompts", []) if isinstance(p, dict)]
    teacher = report.get("gate") == "teacher_forced"
    failing = [p for p in prompts if p.get("passed") is False and p.get("reason")]
    if failing:
        worst = min(failing, key=lambda p: _num(p.get(
            "teacher_forced_agreement" if teacher else "agreement")))
        text = (f"{len(failing)} of {count} prompts under the gate, "
                f"{worst.get('prompt', '')!r}: {worst['reason']}; ")
    else:
        text = _lowest(prompts, report, teacher)
    quoted = bool(text)
    text += _means(report, teacher, count)
    if not quoted:  # no prompt's own figures: the means, and the per-prompt minimum
        minimum = report.get("min_teacher_forced" if teacher else "min_token_agreement")
        text += f" (minimum {minimum} per prompt)"
    cosine = (report.get("prefill") or {}).get("cosine")
    if cosine is not None:
        text += f", prefill cosine {cosine:.4f} (minimum {report.get('prefill_cosine_min')})"
    return text


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) else float("inf")


def _lowest(prompts: list[dict[str, Any]], report: dict[str, Any], teacher: bool) -> str:
    """A pass: the lowest prompt's gated figures against their per-prompt minimums."""
    if teacher:
        tf = [_num(p.get("teacher_forced_agreement")) for p in prompts]
        cos = [_num(p.get("logit_cosine_mean")) for p in prompts]
        if tf and max(tf + cos) < float("inf"):
            return (f"lowest teacher-forced agreement {min(tf):.3f} and logit cosine "
                    f"{min(cos):.4f} of {len(prompts)} prompts (minimum "
                    f"{report.get('min_teacher_forced')} and {report.get('min_logit_cosine')} "
                    f"per prompt); ")
        return ""
    agreement = [_num(p.get("agreement")) for p in prompts]
    if agreement and max(agreement) < float("inf"):
        return (f"lowest token agreement {min(agreement):.2f} of {len(prompts)} prompts "
                f"(minimum {report.get('min_token_agreement')} per prompt); ")
    return ""


def _means(report: dict[str, Any], teacher: bool, prompts: int) -> str:
    if teacher:
        return (f"mean teacher-forced agreement "
                f"{report.get('mean_teacher_forced_agreement', 0):.3f}, logit cosine "
                f"{report.get('mean_logit_cosine', 0):.4f}, free-running agreement "
                f"{report.get('mean_agreement', 0):.2f} over {prompts} prompts")
    return f"mean token agreement {report.get('mean_agreement', 0):.2f} over {prompts} prompts"
