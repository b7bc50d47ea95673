"""One way of checking a candidate against float32 transformers, for every CPU target's
verify: the gate parameters (declared once, in targets/groups/check.toml), the figures of a
prompt (teacher-forced agreement, logit cosine, free-running agreement with its first
divergence and the float32 margin there), its verdict, the printed lines and the report's
gate fields. A target's verify only says how its candidate produces logits and tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.action import fail, round_sig
from common.compare import (
    compare_generations,
    divergence,
    judge,
    judge_teacher_forced,
    teacher_forced,
)

GATES = ("teacher_forced", "free_running")


def read_gates(raw: dict[str, Any]) -> dict[str, Any]:
    """The gate parameters, checked (their defaults are the declaration's)."""
    gates = {
        "gate": str(raw.get("gate", "teacher_forced")),
        "min_token_agreement": float(raw.get("min_token_agreement", 0.5)),
        "min_teacher_forced": float(raw.get("min_teacher_forced", 0.9)),
        "min_logit_cosine": float(raw.get("min_logit_cosine", 0.99)),
        "near_tie": float(raw.get("near_tie", 0.5)),
    }
    for name in ("min_token_agreement", "min_teacher_forced"):
        if not 0.0 <= gates[name] <= 1.0:
            fail(f"verify: params.{name} {gates[name]} not in [0, 1]")
    if not -1.0 <= gates["min_logit_cosine"] <= 1.0:
        fail(f"verify: params.min_logit_cosine {gates['min_logit_cosine']} not in [-1, 1]")
    if gates["gate"] not in GATES:
        fail(f"verify: params.gate {gates['gate']!r} is not one of {list(GATES)}")
    return gates


def prompt_figures(ref_ids: Sequence[int], cand_ids: Sequence[int], ref_rows: Any,
                   cand_rows: Any, gates: dict[str, Any]) -> dict[str, Any]:
    """A prompt's figures and verdict. Row i of `ref_rows`/`cand_rows` is each model's
    logits for ref_ids[i] given the prompt and ref_ids[:i] (teacher-forced)."""
    cmp = compare_generations(ref_ids, cand_ids)
    tf = teacher_forced(ref_ids, ref_rows, cand_rows)
    div = divergence(cmp, ref_rows, gates["near_tie"])
    if gates["gate"] == "free_running":
        passed, reason = judge(cmp, gates["min_token_agreement"])
    else:
        passed, reason = judge_teacher_forced(
            tf, gates["min_teacher_forced"], gates["min_logit_cosine"])
        if passed and cmp["candidate_degenerate"] and not cmp["same_degeneration"]:
            reason = "ok (free-running candidate output loops; not gated)"
    margin = div["margin"]
    return {
        "agreement": round_sig(cmp["agreement"]),
        "first_divergence": cmp["first_divergence"],
        "first_divergence_margin": None if margin is None else round_sig(margin),
        "near_tie": div["near_tie"],
        "reference_degenerate": cmp["reference_degenerate"],
        "candidate_degenerate": cmp["candidate_degenerate"],
        "teacher_forced_agreement": round_sig(tf["agreement"]),
        "teacher_forced_mismatches": tf["mismatch_positions"],
        "logit_cosine_mean": round_sig(tf["mean_cosine"]),
        "logit_cosine_min": round_sig(tf["min_cosine"]),
        "passed": passed,
        "reason": reason,
    }


def say_prompt(r: dict[str, Any]) -> None:
    """A prompt's lines, printed as it finishes (a stage's stdout is a file: flushed)."""
    mark = "PASS" if r["passed"] else "FAIL"
    tie = " (near tie)" if r["near_tie"] else ""
    lines = [
        f"[{mark}] teacher-forced {r['teacher_forced_agreement']:.3f} cosine "
        f"{r['logit_cosine_mean']:.5f} | free-running {r['agreement']:.3f} "
        f"div@{r['first_divergence']}{tie} {r['prompt']!r}",
        f"    ref : {r['reference_text']!r}",
        f"    cand: {r['candidate_text']!r}",
        f"    {r['reason']}",
    ]
    print("\n".join(lines), flush=True)


def gate_text(gates: dict[str, Any]) -> str:
    if gates["gate"] == "free_running":
        return f"gate free_running, min_token_agreement {gates['min_token_agreement']}"
    return (f"gate teacher_forced, min_teacher_forced {gates['min_teacher_forced']}, "
            f"min_logit_cosine {gates['min_logit_cosine']}")


def summarize(results: list[dict[str, Any]], gates: dict[str, Any], extra: str = "") -> None:
    passed = sum(r["passed"] for r in results)
    print(f"{passed}/{len(results)} prompts passed ({gate_text(gates)}{extra})", flush=True)


def gated_figure(gates: dict[str, Any]) -> str:
    return "agreement" if gates["gate"] == "free_running" else "teacher_forced_agreement"


def worst(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Failing prompt with the lowest gated agreement; first such prompt on ties."""
    return min((r for r in results if not r["passed"]), key=lambda r: r[key])


def mean(results: list[dict[str, Any]], key: str) -> float:
    return round_sig(sum(r[key] for r in results) / len(results))


def gate_report(results: list[dict[str, Any]], gates: dict[str, Any]) -> dict[str, Any]:
    """The report's gate fields, the same on every target."""
    return {
        **gates,
        "mean_agreement": mean(results, "agreement"),
        "mean_teacher_forced_agreement": mean(results, "teacher_forced_agreement"),
        "mean_logit_cosine": mean(results, "logit_cosine_mean"),
        "passed": all(r["passed"] for r in results),
    }


def fail_if_failed(results: list[dict[str, Any]], gates: dict[str, Any]) -> None:
    if not all(r["passed"] for r in results):
        bad = worst(results, gated_figure(gates))
        fail(f"verify gate failed: prompt {bad['prompt']!r}: {bad['reason']}")
