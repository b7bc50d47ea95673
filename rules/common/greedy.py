"""Greedy decoding from a guess: the tokens of plain greedy, in as few forward passes as the
guess allows.

A model without a KV cache (the ONNX graphs verify runs) pays a whole-sequence forward per
generated token when decoded one token at a time: quadratic, 17 min for 3 x 32 tokens of a
0.5B model. But the reference continuation is known before the candidate runs, and a good
candidate mostly agrees with it. One forward over prompt + guess[:-1] gives, at row i, the
prediction for token i given the prompt and guess[:i]: every prediction up to and including
the first that differs from the guess had the right context, so it is the greedy token.
Repeating from there with the forward's own later predictions as the new guess (Jacobi
decoding, as in speculative decoding with the model as its own draft) accepts at least one
token per forward and reaches exactly plain greedy's tokens, whatever the guess.

With a right guess it costs one forward, and that forward's rows are the teacher-forced rows
verify compares; so they come free with the first forward either way. After a divergence the
guess is mostly wrong, so later forwards carry at most WINDOW guessed tokens: each costs about
what plain greedy's forward at that length costs, not a whole-sequence one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

AllLogits = Callable[[list[int]], Any]  # token ids -> logits [positions, vocab]
WINDOW = 8  # guessed tokens per forward after the first


@dataclass(frozen=True)
class Greedy:
    """A greedy continuation and what it cost."""

    ids: list[int]  # the generated tokens (the prompt not included)
    forwards: int  # forward passes made
    # The first forward's rows, one per generated position: row i is the model's logits for
    # token i given the prompt and guess[:i] (the teacher-forced rows along the guess).
    first_logits: Any


def accept(rest: Sequence[int], preds: Sequence[int]) -> list[int]:
    """The predictions that are greedy tokens: those up to and including the first that
    differs from the guessed tokens `rest` (every one of them had the right context)."""
    taken: list[int] = []
    for guessed, predicted in zip(rest, preds, strict=True):
        taken.append(int(predicted))
        if predicted != guessed:
            break
    return taken


def guessed_greedy(
    all_logits: AllLogits, prompt_ids: Sequence[int], n: int, guess: Sequence[int]
) -> Greedy:
    """Plain greedy's `n` tokens after `prompt_ids` (argmax, first index on ties), found
    from `guess`; a guess shorter than `n` is padded with its last token."""
    import numpy as np

    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("greedy decoding needs at least one prompt token")
    if n < 1:
        raise ValueError(f"greedy decoding of {n} tokens: at least 1 is needed")
    guess = [int(t) for t in guess[:n]]
    guess += [guess[-1] if guess else prompt[-1]] * (n - len(guess))
    ids: list[int] = []
    forwards, first = 0, None
    while len(ids) < n:
        start = len(ids)
        end = n if first is None else min(n, start + WINDOW)
        rest = guess[start:end]
        logits = all_logits(prompt + ids + rest[:-1])
        forwards += 1
        rows = logits[len(prompt) + start - 1 :]
        if first is None:
            first = rows
        preds = [int(p) for p in np.argmax(rows, axis=-1)]
        taken = accept(rest, preds)
        ids += taken
        guess = ids + preds[len(taken) :] + guess[end:]
    return Greedy(ids=ids, forwards=forwards, first_logits=first)
