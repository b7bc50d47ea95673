"""Compare a candidate's greedy generation with the float reference (pure Python).

Shared by every target's device check: only token ids go in, so it does not matter whether the
candidate ran on ONNX Runtime or on an accelerator.
"""

from __future__ import annotations

from collections.abc import Sequence

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
