"""The float32 reference every CPU check compares against: the checkpoint in transformers,
its whole-sequence logits, and its greedy continuation decoded with the KV cache and
confirmed by one whole-sequence forward (`common.greedy`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from common.greedy import Greedy, guessed_greedy


class TorchReference:
    """A loaded transformers model (common.checkpoint.load_checkpoint) as a reference."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, ids: list[int]) -> Any:
        import torch

        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
        return out.logits[0].numpy()

    def cached_greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        import torch

        ids: list[int] = []
        step, past = torch.tensor([list(prompt_ids)], dtype=torch.long), None
        with torch.no_grad():
            for _ in range(n):
                out = self.model(input_ids=step, past_key_values=past, use_cache=True)
                past = out.past_key_values
                ids.append(int(torch.argmax(out.logits[0, -1])))
                step = torch.tensor([[ids[-1]]], dtype=torch.long)
        return ids


def reference_greedy(reference: TorchReference, prompt_ids: Sequence[int], n: int) -> Greedy:
    """The whole-sequence forward's greedy tokens, found from the KV-cached ones: one extra
    forward when they agree, as they do but on a float tie (then the full forward decides,
    so the reference does not hang on the cache's rounding)."""
    found = guessed_greedy(reference, prompt_ids, n, reference.cached_greedy(prompt_ids, n))
    if found.forwards == 1:
        return found
    again = guessed_greedy(reference, prompt_ids, n, found.ids)  # rows along the final tokens
    return Greedy(again.ids, found.forwards + again.forwards, again.first_logits)
