"""Greedy decoding from a guess (rules/common/greedy.py) on a causal toy model: any guess gives
plain greedy's tokens; a right guess costs one forward; the first forward's rows are the
teacher-forced rows along the guess."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rules"))

from common.greedy import WINDOW, accept, guessed_greedy  # noqa: E402

VOCAB = 7


class ToyModel:
    """Causal: row j depends only on ids[:j + 1] (its last three tokens and its position).
    Logits are rounded to one decimal so ties occur and argmax's tie rule matters."""

    def __init__(self) -> None:
        self.forwards = 0
        self.lengths: list[int] = []

    def row(self, prefix: list[int]) -> np.ndarray:
        seed = hash((tuple(prefix[-3:]), len(prefix))) & 0xFFFFFFFF
        return np.round(np.random.default_rng(seed).normal(size=VOCAB), 1)

    def __call__(self, ids: list[int]) -> np.ndarray:
        self.forwards += 1
        self.lengths.append(len(ids))
        return np.stack([self.row(ids[: j + 1]) for j in range(len(ids))])


def plain_greedy(model: ToyModel, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(np.argmax(model(ids)[-1])))
    return ids[len(prompt):]


def guesses(right: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    wrong = [(t + 1) % VOCAB for t in right]
    return [
        right, wrong, [], right[:3], right + [0, 1, 2],
        [rng.randrange(VOCAB) for _ in right],
        right[:5] + wrong[5:],  # right up to a divergence, as a quantized candidate
        [right[0]] * len(right),
    ]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("case", range(8))
def test_any_guess_gives_plain_greedy(seed: int, case: int):
    model = ToyModel()
    prompt = [seed % VOCAB, 3, (seed * 5) % VOCAB]
    right = plain_greedy(model, prompt, 12)
    guess = guesses(right, seed)[case]
    found = guessed_greedy(ToyModel(), prompt, 12, guess)
    assert found.ids == right, (guess, found.ids, right)
    assert 1 <= found.forwards <= 12


def test_a_right_guess_costs_one_forward():
    prompt = [1, 2, 3, 4]
    right = plain_greedy(ToyModel(), prompt, 20)
    model = ToyModel()
    found = guessed_greedy(model, prompt, 20, right)
    assert (found.ids, found.forwards, model.forwards) == (right, 1, 1)


def test_a_guess_right_up_to_a_divergence_costs_few_forwards():
    prompt = [5, 0, 6]
    right = plain_greedy(ToyModel(), prompt, 16)
    guess = right[:10] + [(t + 3) % VOCAB for t in right[10:]]
    found = guessed_greedy(ToyModel(), prompt, 16, guess)
    assert found.ids == right and found.forwards <= 7  # at least 11 accepted by the first


def test_after_a_divergence_a_forward_is_not_a_whole_sequence_one():
    prompt, n = [1, 6, 0], 24
    right = plain_greedy(ToyModel(), prompt, n)
    model = ToyModel()
    found = guessed_greedy(model, prompt, n, [(t + 2) % VOCAB for t in right])
    assert found.ids == right
    assert model.lengths[0] == len(prompt) + n - 1  # the teacher-forced forward
    later = model.lengths[1:]
    assert later and len(later) <= n - 1 and max(later) <= model.lengths[0]
    # Each later forward is plain greedy's forward at that point plus at most WINDOW - 1
    # guessed tokens, and accepts at least one: the total stays within plain greedy's.
    plain = sum(len(prompt) + i for i in range(1, n))
    assert sum(later) <= plain + (WINDOW - 1) * len(later)
    assert min(later) < model.lengths[0] - WINDOW  # not whole-sequence forwards


def test_the_first_rows_are_the_teacher_forced_rows_along_the_guess():
    model, prompt = ToyModel(), [2, 2, 6]
    guess = [4, 0, 1, 5, 3]
    rows = guessed_greedy(model, prompt, 5, guess).first_logits
    assert rows.shape == (5, VOCAB)
    for i in range(5):
        np.testing.assert_array_equal(rows[i], model(prompt + guess[:i])[-1])


def test_one_token():
    prompt = [3, 1]
    found = guessed_greedy(ToyModel(), prompt, 1, [])
    assert found.ids == plain_greedy(ToyModel(), prompt, 1) and found.forwards == 1


def test_accept_takes_the_matches_and_the_first_correction():
    assert accept([1, 2, 3, 4], [1, 2, 9, 4]) == [1, 2, 9]
    assert accept([1, 2, 3], [1, 2, 3]) == [1, 2, 3]
    assert accept([1, 2, 3], [7, 2, 3]) == [7]


def test_an_empty_prompt_or_no_tokens_is_refused():
    with pytest.raises(ValueError, match="at least one prompt token"):
        guessed_greedy(ToyModel(), [], 4, [1, 2, 3, 4])
    with pytest.raises(ValueError, match="0 tokens"):
        guessed_greedy(ToyModel(), [1], 0, [])
