"""The fidelity stage's figures per prompt (teacher-forced agreement and logit cosine against
the float32 graph, prefill cosine, free-running greedy output against the reference tokens),
their summary, and the optional gate on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.action import round_sig
from common.compare import (
    NEAR_TIE,
    argmax,
    compare_generations,
    cosine,
    divergence,
    teacher_forced,
)
from common.hailo_fidelity_graphs import Graphs


@dataclass(frozen=True)
class Gate:
    min_teacher_forced: float
    min_prefill_cosine: float

    @property
    def active(self) -> bool:
        return self.min_teacher_forced > 0.0 or self.min_prefill_cosine > -1.0


def read_gate(raw: dict[str, Any]) -> Gate:
    return Gate(float(raw.get("min_teacher_forced", 0.0)),
                float(raw.get("min_prefill_cosine", -1.0)))


def positions(row: dict[str, Any], seq: int) -> int:
    """How many of the reference's tokens fit seq_len after the prompt."""
    prompt, ref = row["prompt_ids"], row["token_ids"]
    return min(len(ref), seq - len(prompt) + 1) if len(prompt) <= seq else 0


def contexts(row: dict[str, Any], seq: int) -> list[list[int]]:
    """The teacher-forced contexts of a reference row: prompt + continuation prefix."""
    prompt, ref = [int(i) for i in row["prompt_ids"]], [int(i) for i in row["token_ids"]]
    return [prompt + ref[:i] for i in range(positions(row, seq))]


def evaluate(graphs: Graphs, row: dict[str, Any], eos: int | None,
             free_running: bool = True) -> dict[str, Any]:
    """A prompt's figures; without `free_running`, the teacher-forced ones only."""
    prompt, ref = [int(i) for i in row["prompt_ids"]], [int(i) for i in row["token_ids"]]
    n = positions(row, graphs.seq)
    head = {"prompt": row["prompt"], "prompt_tokens": len(prompt), "positions": n,
            "beyond_seq_len": len(ref) - n}
    if n == 0:
        return {**head, "skipped": f"the prompt is longer than seq_len {graphs.seq}"}
    floats = [graphs.float_logits(c) for c in contexts(row, graphs.seq)]
    emulated = [graphs.emulated_logits(c) for c in contexts(row, graphs.seq)]
    forced = teacher_forced(ref[:n], floats, emulated)
    forced_row = {
        **head,
        "teacher_forced": {
            "agreement": round_sig(forced["agreement"]),
            "mean_cosine": round_sig(forced["mean_cosine"]),
            "min_cosine": round_sig(forced["min_cosine"]),
            "mismatch_positions": forced["mismatch_positions"],
        },
        "float_graph_agreement": round_sig(
            sum(argmax(f) == t for f, t in zip(floats, ref, strict=False)) / n),
        "prefill_cosine": round_sig(cosine(floats[0], emulated[0])),
        "prefill_same_top1": argmax(floats[0]) == argmax(emulated[0]),
    }
    if not free_running:
        return forced_row
    generated = greedy(graphs, prompt, n, eos)
    free = compare_generations(ref[:n], generated)
    div = divergence(free, floats, NEAR_TIE)
    return {
        **forced_row,
        "free_running": {
            "agreement": round_sig(free["agreement"]),
            "first_divergence": free["first_divergence"],
            "float_margin": None if div["margin"] is None else round_sig(div["margin"]),
            "near_tie": div["near_tie"],
            "degenerate": free["candidate_degenerate"],
            "reference_degenerate": free["reference_degenerate"],
        },
        "emulated_ids": generated,
    }


def greedy(graphs: Graphs, prompt: list[int], n: int, eos: int | None) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        token = argmax(graphs.emulated_logits(prompt + out))
        out.append(token)
        if eos is not None and token == eos:
            break
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["positions"]]
    if not done:
        return {"prompts_evaluated": 0}

    def mean(values: list[float]) -> float:
        return round_sig(sum(values) / len(values))

    return {
        "prompts_evaluated": len(done),
        "mean_teacher_forced": mean([r["teacher_forced"]["agreement"] for r in done]),
        "worst_teacher_forced": min(r["teacher_forced"]["agreement"] for r in done),
        "mean_logit_cosine": mean([r["teacher_forced"]["mean_cosine"] for r in done]),
        "worst_prefill_cosine": min(r["prefill_cosine"] for r in done),
        **({"mean_free_running": mean([r["free_running"]["agreement"] for r in done]),
            "degenerate_prompts": sum(r["free_running"]["degenerate"] for r in done)}
           if all("free_running" in r for r in done) else {"free_running": "not run"}),
    }


def gate_failure(rows: list[dict[str, Any]], gate: Gate) -> str | None:
    """The one line of a gate that is not met (worst prompt first), else None."""
    done = [r for r in rows if r["positions"]]
    if gate.active and not done:
        return "fidelity: no prompt fits seq_len, so the gate has no figure to judge"
    checks = (("teacher-forced agreement", "min_teacher_forced", gate.min_teacher_forced,
               lambda r: r["teacher_forced"]["agreement"]),
              ("prefill cosine", "min_prefill_cosine", gate.min_prefill_cosine,
               lambda r: r["prefill_cosine"]))
    for figure, name, threshold, value in checks:
        worst = min(done, key=value, default=None)
        if worst is not None and value(worst) < threshold:
            return (f"fidelity (CPU emulation, not the chip): {figure} {value(worst):.6g} < "
                    f"{name} {threshold:.6g} on prompt {worst['prompt']!r}; the full report "
                    f"is printed in the log")
    return None
