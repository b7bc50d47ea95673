"""Teacher-forced metrics of rules/common/compare.py on small literal logit arrays."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rules"))

from common.compare import (  # noqa: E402
    argmax,
    compare_generations,
    cosine,
    divergence,
    judge,
    judge_teacher_forced,
    teacher_forced,
    top2_margin,
)


def one_hot(token: int, vocab: int = 6, high: float = 4.0, low: float = 0.0) -> list[float]:
    return [high if i == token else low for i in range(vocab)]


# The float32 reference's greedy continuation and its logit rows along it.
REFERENCE = [1, 2, 3, 4, 5, 0, 1, 2]
REF_ROWS = [one_hot(t) for t in REFERENCE]


def test_argmax_margin_and_cosine_on_literals() -> None:
    assert argmax([0.5, 3.0, 3.0, -1.0]) == 1  # first of a tie, like numpy
    assert top2_margin([0.5, 3.0, 2.75, -1.0]) == pytest.approx(0.25)
    assert top2_margin([7.0]) == math.inf
    assert cosine([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 1.0]) == pytest.approx(0.0)
    assert cosine([1.0, 0.0], [-1.0, 0.0]) == pytest.approx(-1.0)
    assert cosine([0.0, 0.0], [0.0, 0.0]) == 1.0
    assert cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    with pytest.raises(ValueError):
        cosine([1.0], [1.0, 2.0])


def test_identical_logits_agree_fully_with_cosine_one() -> None:
    tf = teacher_forced(REFERENCE, REF_ROWS, [list(r) for r in REF_ROWS])
    assert tf["agreement"] == 1.0 and tf["matches"] == tf["positions"] == 8
    assert tf["mismatch_positions"] == []
    assert tf["mean_cosine"] == pytest.approx(1.0)
    assert tf["min_cosine"] == pytest.approx(1.0)


def test_one_flip_cascades_free_running_but_costs_teacher_forced_one_position() -> None:
    # The candidate's logits equal the reference's everywhere but position 2, where it prefers
    # token 4 over the reference's 3 by a hair. Free-running, its own prefix then differs and
    # (as a cascading model does) every later token differs too.
    cand_rows = [list(r) for r in REF_ROWS]
    cand_rows[2] = [0.0, 0.0, 0.0, 3.9, 4.0, 0.0]
    free_running = [1, 2, 4, 0, 1, 4, 3, 5]
    cmp = compare_generations(REFERENCE, free_running)
    tf = teacher_forced(REFERENCE, REF_ROWS, cand_rows)
    assert cmp["agreement"] == pytest.approx(2 / 8)
    assert cmp["first_divergence"] == 2
    assert tf["agreement"] == pytest.approx(7 / 8)
    assert tf["mismatch_positions"] == [2]
    assert tf["candidate_top1"][2] == 4
    assert tf["mean_cosine"] > 0.9
    assert judge_teacher_forced(tf, 0.85, 0.9) == (True, "ok")
    passed, reason = judge(cmp, 0.5)
    assert not passed and "min_token_agreement" in reason


def test_divergence_at_a_near_tie_is_labelled() -> None:
    rows = [list(r) for r in REF_ROWS]
    rows[3] = [0.0, 0.0, 0.0, 0.0, 2.1, 1.8]  # float32 itself: 4 over 5 by 0.3
    cmp = compare_generations(REFERENCE, [1, 2, 3, 5, 0, 1, 2, 3])
    tie = divergence(cmp, rows, near_tie=0.5)
    assert tie["position"] == 3
    assert tie["margin"] == pytest.approx(0.3)
    assert tie["near_tie"] is True
    clear = divergence(cmp, REF_ROWS, near_tie=0.5)
    assert clear["margin"] == pytest.approx(4.0) and clear["near_tie"] is False


def test_no_divergence_has_no_margin() -> None:
    cmp = compare_generations(REFERENCE, list(REFERENCE))
    assert divergence(cmp, REF_ROWS) == {"position": None, "margin": None, "near_tie": False}


def test_low_cosine_fails_the_gate_even_with_every_top1_right() -> None:
    # Same argmax everywhere, but the rest of each row is noise: top-1 is not the whole story.
    cand_rows = [[4.0 if i == t else (3.5 if i % 2 else -3.5) for i in range(6)]
                 for t in REFERENCE]
    tf = teacher_forced(REFERENCE, REF_ROWS, cand_rows)
    assert tf["agreement"] == 1.0
    assert tf["mean_cosine"] < 0.9
    passed, reason = judge_teacher_forced(tf, 0.9, 0.99)
    assert not passed
    assert reason.startswith("mean logit cosine ") and "< min_logit_cosine 0.99" in reason


def test_low_agreement_fails_the_gate_with_its_figure() -> None:
    cand_rows = [one_hot((t + 1) % 6) for t in REFERENCE]
    tf = teacher_forced(REFERENCE, REF_ROWS, cand_rows)
    assert tf["agreement"] == 0.0
    passed, reason = judge_teacher_forced(tf, 0.9, 0.0)
    assert not passed
    assert reason == "teacher-forced agreement 0 < min_teacher_forced 0.9"


def test_numpy_rows_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    ref = np.asarray(REF_ROWS, dtype=np.float32)
    tf = teacher_forced(REFERENCE, ref, ref * 0.5)
    assert tf["agreement"] == 1.0 and tf["mean_cosine"] == pytest.approx(1.0)


def test_mismatched_lengths_are_an_error() -> None:
    with pytest.raises(ValueError, match="teacher_forced"):
        teacher_forced(REFERENCE, REF_ROWS[:-1], REF_ROWS)
