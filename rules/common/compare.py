"""Compare a candidate's generation with the float reference (pure Python).

Shared by every target's device check: token ids (and, where the candidate can be run on the
reference's prefix, logits) go in, so it does not matter whether the candidate ran on ONNX
Runtime or on an accelerator.

Two views of one comparison:
- free-running: each model continues its own output greedily. After the first differing token
  the prefixes differ and everything after cascades, and the first difference is often a near
  tie of the float model's top two logits, so this measures luck as much as the model;
- teacher-forced: the candidate is run on the float32 reference's prefix, and at every position
  its top-1 is compared with the reference's token and its logits with the reference's (cosine).
  Each position is judged on its own, so one flip costs one position: this is the gate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

MAX_PERIOD = 4
# "Most of the sequence": a loop covering at least this share of the tokens is degenerate.
DEGENERATE_FRACTION = 0.6


def repeating_unit(
    ids: Sequence[int], max_period: int = MAX_PERIOD, min_fraction: float = DEGENERATE_FRACTION
) -> tuple[int, ...] | None:
    """The token cycle (period <= max_period) that dominates `ids`, or None.

    For each period p, the longest stretch where ids[i] == ids[i - p] holds is a loop covering
    that stretch plus one period; the loop must repeat at least twice and cover min_fraction of
    the sequence. Shorter periods are tried first, so a single repeated token reports (t,).
    """
    n = len(ids)
    if n < 2:
        return None
    for period in range(1, max_period + 1):
        run, best, best_end = 0, 0, -1
        for i in range(period, n):
            run = run + 1 if ids[i] == ids[i - period] else 0
            if run > best:
                best, best_end = run, i
        covered = best + period
        if best >= period and covered >= min_fraction * n:
            start = best_end - best + 1 - period
            return tuple(ids[start : start + period])
    return None


def is_degenerate(ids: Sequence[int]) -> bool:
    """One token repeated, or a cycle of period <= 4 repeating over most of the sequence."""
    return repeating_unit(ids) is not None


def compare_generations(reference_ids: Sequence[int], candidate_ids: Sequence[int]) -> dict:
    """Positional agreement of two generations of (normally) equal length.

    A generation that stopped early counts its missing positions as mismatches, so agreement is
    over max(len) positions; two empty generations agree trivially.
    """
    ref, cand = list(reference_ids), list(candidate_ids)
    positions = max(len(ref), len(cand))
    matches = sum(1 for r, c in zip(ref, cand, strict=False) if r == c)
    first = next((i for i, (r, c) in enumerate(zip(ref, cand, strict=False)) if r != c), None)
    if first is None and len(ref) != len(cand):
        first = min(len(ref), len(cand))
    ref_unit, cand_unit = repeating_unit(ref), repeating_unit(cand)
    return {
        "positions": positions,
        "matches": matches,
        "agreement": matches / positions if positions else 1.0,
        "first_divergence": first,
        "reference_degenerate": ref_unit is not None,
        "candidate_degenerate": cand_unit is not None,
        # Same tokens cycling (in any rotation): the candidate inherited the reference's loop.
        "same_degeneration": (
            ref_unit is not None and cand_unit is not None and set(ref_unit) == set(cand_unit)
        ),
    }


def judge(comparison: dict, min_agreement: float) -> tuple[bool, str]:
    """Pass/fail plus a short reason; a loop is excused only if the reference loops the same way."""
    agreement = comparison["agreement"]
    if comparison["candidate_degenerate"] and not comparison["same_degeneration"]:
        return False, "candidate output is degenerate (repeating loop)"
    if agreement < min_agreement:
        return False, f"agreement {agreement:.4g} < min_token_agreement {min_agreement:.4g}"
    if comparison["candidate_degenerate"]:
        return True, "ok (reference_degenerate: reference loops the same way)"
    return True, "ok"


# Logits are sequences (one per position) of per-token scores; numpy arrays work too.
Logits = Sequence[Sequence[float]]
NEAR_TIE = 0.5  # float32 top-1/top-2 logit margin under which a divergence is a near tie


def _row(values: Any) -> list[float]:
    return [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]


def argmax(values: Sequence[float]) -> int:
    """Index of the largest value; the first one on ties (like numpy.argmax)."""
    row = _row(values)
    return max(range(len(row)), key=row.__getitem__)


def top2_margin(values: Sequence[float]) -> float:
    """Largest minus second-largest value (inf for a single value)."""
    row = sorted(_row(values), reverse=True)
    return row[0] - row[1] if len(row) > 1 else math.inf


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity; two zero vectors are identical (1.0), one zero vector is 0.0."""
    x, y = _row(a), _row(b)
    if len(x) != len(y):
        raise ValueError(f"cosine of vectors of lengths {len(x)} and {len(y)}")
    dot = math.fsum(p * q for p, q in zip(x, y, strict=True))
    nx, ny = math.sqrt(math.fsum(p * p for p in x)), math.sqrt(math.fsum(q * q for q in y))
    if nx == 0.0 or ny == 0.0:
        return 1.0 if nx == ny else 0.0
    return max(-1.0, min(1.0, dot / (nx * ny)))


def teacher_forced(
    reference_ids: Sequence[int], reference_logits: Logits, candidate_logits: Logits
) -> dict:
    """Candidate vs reference along the reference's own continuation.

    `reference_logits[i]` and `candidate_logits[i]` are both models' next-token logits given the
    prompt plus reference_ids[:i]; the reference's greedy token there is reference_ids[i].
    """
    ref = list(reference_ids)
    if not len(ref) == len(reference_logits) == len(candidate_logits):
        raise ValueError(
            f"teacher_forced: {len(ref)} ids, {len(reference_logits)} reference and "
            f"{len(candidate_logits)} candidate logit rows"
        )
    top1 = [argmax(row) for row in candidate_logits]
    cosines = [cosine(r, c) for r, c in zip(reference_logits, candidate_logits, strict=True)]
    mismatches = [i for i, (r, c) in enumerate(zip(ref, top1, strict=True)) if r != c]
    n = len(ref)
    return {
        "positions": n,
        "matches": n - len(mismatches),
        "agreement": (n - len(mismatches)) / n if n else 1.0,
        "mismatch_positions": mismatches,
        "candidate_top1": top1,
        "mean_cosine": math.fsum(cosines) / n if n else 1.0,
        "min_cosine": min(cosines) if n else 1.0,
    }


def divergence(comparison: dict, reference_logits: Logits, near_tie: float = NEAR_TIE) -> dict:
    """The free-running first divergence with the float32 top-1/top-2 margin there.

    Up to the first divergence both free-running prefixes equal the reference's, so the float32
    logits at that position are the reference's teacher-forced row. None when nothing diverged
    (or the divergence is past the rows, e.g. a generation that stopped early).
    """
    first = comparison["first_divergence"]
    if first is None or first >= len(reference_logits):
        return {"position": first, "margin": None, "near_tie": False}
    margin = top2_margin(reference_logits[first])
    return {"position": first, "margin": margin, "near_tie": margin < near_tie}


def judge_teacher_forced(
    metrics: dict, min_agreement: float, min_cosine: float
) -> tuple[bool, str]:
    """Pass/fail of the teacher-forced gate plus a short reason."""
    agreement, cos = metrics["agreement"], metrics["mean_cosine"]
    if agreement < min_agreement:
        return False, (
            f"teacher-forced agreement {agreement:.4g} < min_teacher_forced {min_agreement:.4g}"
        )
    if cos < min_cosine:
        return False, f"mean logit cosine {cos:.6g} < min_logit_cosine {min_cosine:.6g}"
    return True, "ok"
