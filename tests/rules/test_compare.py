"""Pure tests of rules/common/compare.py (no torch, no ONNX)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rules"))

from common.compare import compare_generations, is_degenerate, judge, repeating_unit  # noqa: E402

STORY = [12, 40, 7, 99, 3, 51, 8, 77, 23, 5, 64, 18, 2, 1, 30, 41]


def test_identical_generations_agree_fully() -> None:
    result = compare_generations(STORY, list(STORY))
    assert result["agreement"] == 1.0
    assert result["matches"] == result["positions"] == 16
    assert result["first_divergence"] is None


def test_agreement_counts_matching_positions_and_first_divergence() -> None:
    candidate = list(STORY)
    candidate[5] = 1000
    candidate[10] = 1001
    result = compare_generations(STORY, candidate)
    assert result["matches"] == 14
    assert result["agreement"] == pytest.approx(14 / 16)
    assert result["first_divergence"] == 5


def test_positional_agreement_after_early_divergence_is_low() -> None:
    # One flipped early token shifts everything after it: positional agreement stays low.
    candidate = [STORY[0], 555, *STORY[1:-1]]
    result = compare_generations(STORY, candidate)
    assert result["first_divergence"] == 1
    assert result["agreement"] == pytest.approx(1 / 16)


def test_shorter_candidate_counts_missing_positions_as_mismatches() -> None:
    result = compare_generations(STORY, STORY[:8])
    assert result["positions"] == 16
    assert result["agreement"] == pytest.approx(0.5)
    assert result["first_divergence"] == 8


def test_empty_generations_agree_trivially() -> None:
    result = compare_generations([], [])
    assert result["agreement"] == 1.0
    assert result["first_divergence"] is None


def test_single_repeated_token_is_degenerate() -> None:
    assert is_degenerate([7] * 16)
    assert repeating_unit([7] * 16) == (7,)


def test_late_onset_repetition_covering_most_of_sequence_is_degenerate() -> None:
    assert is_degenerate([1, 2, 3, 4] + [9] * 12)


def test_short_cycle_is_degenerate_and_reports_its_unit() -> None:
    cycle = [5, 6, 7] * 5 + [5]
    assert is_degenerate(cycle)
    assert repeating_unit(cycle) == (5, 6, 7)


def test_period_four_cycle_is_degenerate_but_period_five_is_not() -> None:
    assert is_degenerate([1, 2, 3, 4] * 4)
    assert not is_degenerate([1, 2, 3, 4, 5] * 3 + [1])


def test_natural_sequence_with_some_repeats_is_not_degenerate() -> None:
    # "and the ... and the ..." style local repeats must not trip the detector.
    natural = [10, 11, 12, 10, 11, 13, 14, 15, 16, 17, 18, 10, 11, 19, 20, 21]
    assert not is_degenerate(natural)
    assert not is_degenerate(STORY)


def test_very_short_sequences() -> None:
    assert not is_degenerate([])
    assert not is_degenerate([3])
    assert not is_degenerate([1, 2, 1])


def test_judge_rejects_low_agreement_and_names_threshold() -> None:
    candidate = [STORY[0], *[900 + i for i in range(15)]]
    passed, reason = judge(compare_generations(STORY, candidate), 0.5)
    assert not passed
    assert "min_token_agreement" in reason


def test_judge_rejects_degenerate_candidate_even_with_enough_agreement() -> None:
    # 6/16 agree (above the 0.25 threshold), but the candidate then loops on one token.
    candidate = STORY[:6] + [4] * 10
    result = compare_generations(STORY, candidate)
    assert result["candidate_degenerate"] and not result["reference_degenerate"]
    passed, reason = judge(result, 0.25)
    assert not passed
    assert "degenerate" in reason


def test_judge_excuses_candidate_that_loops_like_the_reference() -> None:
    reference = [3, 8, 3, 8, 3, 8, 3, 8, 3, 8, 3, 8, 3, 8, 3, 8]
    result = compare_generations(reference, list(reference))
    assert result["reference_degenerate"] and result["candidate_degenerate"]
    assert result["same_degeneration"]
    passed, reason = judge(result, 0.5)
    assert passed
    assert "reference_degenerate" in reason


def test_judge_passes_good_candidate() -> None:
    assert judge(compare_generations(STORY, STORY), 0.5) == (True, "ok")
