"""What a check's report says, per kind of check: its gated means and its prompts' figures.

A cpu-ort `verify` report, a hailo10h `verify` report (the device, or the HailoRT test double
when `device.fake`) and a `fidelity` report (a CPU emulation) name their figures differently;
here they become the same few views.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class CheckKind(str, Enum):
    CPU_ORT = "cpu-ort"  # int8 ONNX Runtime against float32 transformers
    DEVICE = "device"  # the HEF on a Hailo-10H (or on the HailoRT test double: `fake`)
    FIDELITY = "fidelity"  # a CPU emulation of the recipe's precisions, not the chip


@dataclass(frozen=True)
class PromptFigures:
    prompt: str
    agreement: float | None  # free-running (cpu-ort, fidelity) or device token agreement
    teacher_forced: float | None
    logit_cosine: float | None
    first_divergence: int | None
    reference_text: str
    generated_text: str
    passed: bool | None
    reason: str


def check_kind(stage: str, target: str, report: dict[str, Any]) -> CheckKind:
    """A hailo10h verify is a device check, whatever answered it (`fake` says which)."""
    if stage == "fidelity":
        return CheckKind.FIDELITY
    if target == "hailo10h" or "device" in report:
        return CheckKind.DEVICE
    return CheckKind.CPU_ORT


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


def _cpu_summary(r: dict[str, Any]) -> Summary:
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


def _device_summary(r: dict[str, Any]) -> Summary:
    device = r.get("device") or {}
    prefill = r.get("prefill") or {}
    cosine = prefill.get("cosine")
    prefill_text = (_at_least(cosine, r.get("prefill_cosine_min"), 4) if cosine is not None
                    else str(prefill.get("reason") or "not checked"))
    figures = (
        ("answered by", "the HailoRT TEST DOUBLE (not a device)" if device.get("fake")
         else "a Hailo-10H device"),
        ("mean token agreement", _at_least(r.get("mean_agreement"), r.get("min_token_agreement"))),
        ("prefill logit cosine", prefill_text),
    )
    return figures, number(r.get("min_token_agreement")), (number(r.get("mean_agreement")), None)


def _fidelity_summary(r: dict[str, Any]) -> Summary:
    s = r.get("summary") or {}
    figures = (
        ("estimate", f"{r.get('kind', 'cpu-emulation')}: not the chip"),
        ("mean teacher-forced agreement",
         f"{_fmt(s.get('mean_teacher_forced'))} (worst {_fmt(s.get('worst_teacher_forced'))})"),
        ("mean logit cosine", _fmt(s.get("mean_logit_cosine"), 4)),
        ("worst prefill cosine", _fmt(s.get("worst_prefill_cosine"), 4)),
        ("mean free-running agreement", _fmt(s.get("mean_free_running"))),
    )
    return figures, None, (number(s.get("mean_free_running")), number(s.get("mean_teacher_forced")))


def _cpu_prompt(r: dict[str, Any]) -> PromptFigures:
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


def _fidelity_prompt(r: dict[str, Any]) -> PromptFigures:
    forced, free = r.get("teacher_forced") or {}, r.get("free_running") or {}
    return PromptFigures(
        str(r.get("prompt", "")), number(free.get("agreement")), number(forced.get("agreement")),
        number(forced.get("mean_cosine")), free.get("first_divergence"), "", "", None,
        str(r.get("skipped", "")),
    )


_SUMMARIES = {CheckKind.CPU_ORT: _cpu_summary, CheckKind.DEVICE: _device_summary,
              CheckKind.FIDELITY: _fidelity_summary}
_PROMPTS = {CheckKind.CPU_ORT: _cpu_prompt, CheckKind.DEVICE: _device_prompt,
            CheckKind.FIDELITY: _fidelity_prompt}


def read_check(kind: CheckKind, report: dict[str, Any]
               ) -> tuple[Summary, tuple[PromptFigures, ...]]:
    """The summary (figures, plotted gate, means) and the per-prompt figures of a report."""
    rows = report.get("prompts") or []
    return _SUMMARIES[kind](report), tuple(_PROMPTS[kind](r) for r in rows if isinstance(r, dict))
