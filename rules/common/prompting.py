"""How a verify prompt becomes token ids, the same way in every rule that sends one.

A model either takes raw text (`chat = false`, the default: the prompt is tokenized by the
tokenizer's own post-processor, which adds BOS only if the model was trained with it) or is a
chat model (`chat = true`: the prompt is one user message rendered by the chat template the
checkpoint ships, with the generation prompt, tokenized with add_special_tokens=False because
a template that wants BOS writes it itself). Either way BOS never appears twice in a row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PromptError(ValueError):
    """A prompt this model cannot be given (no chat template, zero tokens)."""


@dataclass(frozen=True)
class SentPrompt:
    prompt: str  # as declared
    text: str  # as sent: the rendered template for a chat model, else the prompt itself
    ids: list[int]

    def record(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "sent": self.text, "prompt_ids": list(self.ids)}


def conversation(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def encode_prompt(tok: Any, prompt: str, chat: bool) -> SentPrompt:
    if chat:
        if not getattr(tok, "chat_template", None):
            raise PromptError("the model declares chat = true but its checkpoint ships no "
                              "chat template (chat_template.jinja or tokenizer_config.json)")
        text = tok.apply_chat_template(conversation(prompt), tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False).input_ids
    else:
        text, ids = prompt, tok(prompt).input_ids
    ids = single_bos([int(i) for i in ids], tok.bos_token_id)
    if not ids:
        raise PromptError(f"prompt {prompt!r} encodes to zero tokens")
    return SentPrompt(prompt, text, ids)


def single_bos(ids: list[int], bos: int | None) -> list[int]:
    """A template that writes BOS, tokenized by a post-processor that adds one too, gives
    two: the model never saw that in training."""
    if bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
        return ids[1:]
    return ids


def adds_bos(tok: Any) -> bool:
    """Whether the tokenizer puts BOS before plain text (its post-processor's choice)."""
    bos = tok.bos_token_id
    if bos is None:
        return False
    ids = tok("a").input_ids
    return bool(ids) and ids[0] == bos
