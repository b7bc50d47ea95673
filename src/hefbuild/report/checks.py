"""What a check's report says, per kind of report: its gated means and its prompts' figures.

A candidate compared with float32 transformers on the build machine, a device's answers (or
its test double's, when `device.fake`) and a CPU emulation of a recipe name their figures
differently; here they become the same few views. The kind is read from the keys the report
holds, and the device's names from its target's declaration: this module knows neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from typing import Any


class CheckKind(str, Enum):
    COMPARISON = "comparison"  # a candidate against float32 transformers, teacher-forced too
    DEVICE = "device"  # the artifact on a device (or on its test double: `device.fake`)
    ESTIMATE = "estimate"  # a CPU emulation of the recipe's precisions, not the chip


# The `kind` an emulation's report declares itself as.
EMULATION = "cpu-emulation"


@dataclass(frozen=True)
class Answerer:
    """How a target's device check names what answered it (`[target] device`, `test_double`):
    noun phrases, article included."""

    device: str = ""
    test_double: str = ""

    @property
    def real(self) -> str:
        return self.device or "a device"

    @property
    def double(self) -> str:
        return self.test_double or "a TEST DOUBLE"


@dataclass(frozen=True)
class PromptFigures:
    prompt: str
    agreement: float | None  # free-running (comparison, estimate) or device token agreement
    teacher_forced: float | None
    logit_cosine: float | None
    first_divergence: int | None
    reference_text: str
    generated_text: str
    passed: bool | None
    reason: str


def check_kind(report: dict[str, Any]) -> CheckKind:
    """By what the report holds: a device check writes its `device` whatever answered it
    (`fake` says which), an emulation says its `kind`."""
    if report.get("kind") == EMULATION:
        return CheckKind.ESTIMATE
    if "device" in report:
        return CheckKind.DEVICE
    return CheckKind.COMPARISON


def number(value: Any) -> float | None:
    """A figure, or None for a missing or non-numeric one (a JSON true is not 1.0)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _fmt(value: Any, digits: int = 3) -> str:
    value = number(value)
    return "–" if value is None else f"{value:.{digits}f}"


def _at_least(value: Any, minimum: Any, digits: int = 3) -> str:
    return f"{_fmt(value, digits)} (minimum {_fmt(minimum, 2)})"


Summary = tuple[tuple[tuple[str, str], ...], float | None, tuple[float | None, float | None]]


def _comparison_summary(r: dict[str, Any], _: Answerer) -> Summary:
    """(label, value) figures, the plotted gate, (mean agreement, mean teacher-forced)."""
    teacher = r.get("gate", "teacher_forced") != "free_running"
    free = _fmt(r.get("mean_agreement")) if teacher else \
        _at_least(r.get("mean_agreement"), r.get("min_token_agreement"))
    figures = (
        ("gate", str(r.get("gate", "teacher_forced"))),
        ("quantization", str(r.get("method") or "–")),
        ("mean teacher-forced agreement",
         _at_least(r.get("mean_teacher_forced_agreement"), r.get("min_teacher_forced"))),
        ("mean logit cosine", _at_least(r.get("mean_logit_cosine"), r.get("min_logit_cosine"), 4)),
        ("mean free-running agreement", free),
    )
    threshold = r.get("min_teacher_forced") if teacher else r.get("min_token_agreement")
    return figures, number(threshold), (number(r.get("mean_agreement")),
                                      number(r.get("mean_teacher_forced_agreement")))


def _device_summary(r: dict[str, Any], answerer: Answerer) -> Summary:
    device = r.get("device") or {}
    prefill = r.get("prefill") or {}
    cosine = prefill.get("cosine")
    prefill_text = (_at_least(cosine, r.get("prefill_cosine_min"), 4) if cosine is not None
                    else str(prefill.get("reason") or "not checked"))
    figures = (
        ("answered by", f"{answerer.double} (not a device)" if device.get("fake")
         else answerer.real),
        ("mean token agreement", _at_least(r.get("mean_agreement"), r.get("min_token_agreement"))),
        ("prefill logit cosine", prefill_text),
    )
    return figures, number(r.get("min_token_agreement")), (number(r.get("mean_agreement")), None)


def _estimate_summary(r: dict[str, Any], _: Answerer) -> Summary:
    s = r.get("summary") or {}
    figures = (
        ("estimate", f"{r.get('kind', EMULATION)}: not the chip"),
        ("mean teacher-forced agreement",
         f"{_fmt(s.get('mean_teacher_forced'))} (worst {_fmt(s.get('worst_teacher_forced'))})"),
        ("mean logit cosine", _fmt(s.get("mean_logit_cosine"), 4)),
        ("worst prefill cosine", _fmt(s.get("worst_prefill_cosine"), 4)),
        ("mean free-running agreement", _fmt(s.get("mean_free_running"))),
        ("costliest precisions (alone)", _costliest(r)),
        ("proposed recipe change", _proposal(r)),
    )
    return figures, None, (number(s.get("mean_free_running")), number(s.get("mean_teacher_forced")))


def _costliest(r: dict[str, Any]) -> str:
    groups = (r.get("sensitivity") or {}).get("groups") or []
    return ", ".join(f"{g.get('group')} {g.get('kind', 'weights')} "
                     f"{g.get('bits', g.get('weights'))} (logit cosine "
                     f"{_fmt(g.get('logit_cosine'), 4)})" for g in groups[:3]) or "–"


def _proposal(r: dict[str, Any]) -> str:
    """The lines to paste, and whether they reach the target in emulation."""
    proposal = r.get("proposal") or {}
    if not proposal:
        return "–"
    if not proposal.get("needed"):
        return "none needed (the emulated recipe meets the target)"
    best = proposal.get("proposed") or {}
    if not best.get("lines"):
        return "none found"
    if proposal.get("all_a16_reaches") is False:
        figure = _fmt((best.get("summary") or {}).get("worst_teacher_forced"))
        return ("none reaches the target in emulation: even every layer at a16_w16 "
                f"gives worst teacher-forced {figure}")
    reach = "reaches" if proposal.get("reached") else "does NOT reach"
    return f"{reach} the target in emulation: " + "; ".join(best["lines"])


def _comparison_prompt(r: dict[str, Any]) -> PromptFigures:
    return PromptFigures(
        str(r.get("prompt", "")), number(r.get("agreement")),
        number(r.get("teacher_forced_agreement")),
        number(r.get("logit_cosine_mean")), r.get("first_divergence"),
        str(r.get("reference_text", "")), str(r.get("candidate_text", "")), r.get("passed"),
        str(r.get("reason", "")),
    )


def _device_prompt(r: dict[str, Any]) -> PromptFigures:
    return PromptFigures(
        str(r.get("prompt", "")), number(r.get("agreement")), None, None,
        r.get("first_divergence"), str(r.get("reference_text", "")),
        str(r.get("device_text", "")), r.get("passed"), str(r.get("reason", "")),
    )


def _estimate_prompt(r: dict[str, Any]) -> PromptFigures:
    forced, free = r.get("teacher_forced") or {}, r.get("free_running") or {}
    return PromptFigures(
        str(r.get("prompt", "")), number(free.get("agreement")), number(forced.get("agreement")),
        number(forced.get("mean_cosine")), free.get("first_divergence"), "", "", None,
        str(r.get("skipped", "")),
    )


_SUMMARIES = {CheckKind.COMPARISON: _comparison_summary, CheckKind.DEVICE: _device_summary,
              CheckKind.ESTIMATE: _estimate_summary}
_PROMPTS = {CheckKind.COMPARISON: _comparison_prompt, CheckKind.DEVICE: _device_prompt,
            CheckKind.ESTIMATE: _estimate_prompt}


def read_check(kind: CheckKind, report: dict[str, Any], answerer: Answerer
               ) -> tuple[Summary, tuple[PromptFigures, ...]]:
    """The summary (figures, plotted gate, means) and the per-prompt figures of a report;
    `answerer`: how its target names the device and the test double."""
    rows = report.get("prompts") or []
    return _SUMMARIES[kind](report, answerer), \
        tuple(_PROMPTS[kind](r) for r in rows if isinstance(r, dict))


def titled(template: str, report: dict[str, Any]) -> str:
    """A declared report title with each `{field}` filled from the report itself, so each
    variant of a sweep is titled by what it ran (its `method`); a field the report does not
    hold as a plain value is left out."""
    from ..declare.targets import TITLE_FIELD

    def value(match: re.Match[str]) -> str:
        found = report.get(match.group(1))
        return str(found) if isinstance(found, (str, int, float)) \
            and not isinstance(found, bool) else ""

    return " ".join(TITLE_FIELD.sub(value, template).split())
