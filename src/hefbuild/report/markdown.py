"""The build report as Markdown (`build/report/summary.md`): what a reviewer reads in a CI
job's summary page (GitHub's `$GITHUB_STEP_SUMMARY`, a GitLab artifact) without opening
the HTML report. One table: each model, its check's verdict and figures, and what each
stage came to in the last invocation that named it. Pure: a `BuildReport` in, text out.
"""

from __future__ import annotations

from .model import BuildReport, Check, ModelReport, StageState

_BUILT_OR_NOT = {"built": "built", "restored": "restored", "remote": "remote",
                 "uptodate": "up to date", "failed": "**failed**"}


def render_markdown(report: BuildReport) -> str:
    lines = [f"### hefbuild: {report.project or 'build'}", ""]
    summary = (report.last_summary or {}).get("summary")
    if isinstance(summary, dict):
        lines += [_summary_line(summary), ""]
    if report.models:
        lines += ["| model | target | check | stages (last run) |", "|---|---|---|---|"]
        lines += [_row(m) for m in report.models]
    else:
        lines.append("Nothing in build/ yet.")
    if report.unbuilt:
        lines += ["", "Not built:"] + [f"- `{u.name}`: {'; '.join(u.why)}"
                                        for u in report.unbuilt]
    return "\n".join(lines) + "\n"


def _summary_line(counts: dict) -> str:
    parts = [f"{counts.get(k, 0)} {label}" for k, label in
             (("built", "built"), ("restored", "restored"), ("remote", "from remote"),
              ("uptodate", "up to date"), ("failed", "failed"))]
    return "Last run: " + ", ".join(parts)


def _row(model: ModelReport) -> str:
    check = next((c for c in model.checks if c.stage == model.check), None)
    stages = ", ".join(_stage(s.name, s.last_run, s.state) +
                       (" (in the remote cache)" if s.in_remote else "") for s in model.stages)
    return f"| `{model.name}` | {model.target} | {_verdict(check)} | {stages} |"


def _stage(name: str, last_run: str | None, state: StageState) -> str:
    if last_run in _BUILT_OR_NOT:
        return f"{name} {_BUILT_OR_NOT[last_run]}"
    return f"{name} {state.value}"


def _verdict(check: Check | None) -> str:
    if check is None or check.passed is None:
        return "no report"
    verdict = "passed" if check.passed else "**FAILED**"
    if check.fake_device:
        verdict += " (test double, not a device)"
    figures = "; ".join(f"{label} {value}" for label, value in check.figures)
    return f"{verdict}: {figures}" if figures else verdict
