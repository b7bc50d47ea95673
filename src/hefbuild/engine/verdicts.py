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
    prompts = len(report.get("prompts", []))
    if report.get("gate") == "teacher_forced":
        return (f"teacher-forced agreement {report.get('mean_teacher_forced_agreement', 0):.3f}"
                f" (minimum {report.get('min_teacher_forced')}), logit cosine "
                f"{report.get('mean_logit_cosine', 0):.4f} (minimum "
                f"{report.get('min_logit_cosine')}) over {prompts} prompts; free-running "
                f"agreement {report.get('mean_agreement', 0):.2f}")
    text = (f"mean token agreement {report.get('mean_agreement', 0):.2f} over {prompts} "
            f"prompts (minimum {report.get('min_token_agreement')})")
    cosine = (report.get("prefill") or {}).get("cosine")
    if cosine is not None:
        text += f", prefill cosine {cosine:.4f} (minimum {report.get('prefill_cosine_min')})"
    return text
