"""reference (hailo10h): the float32 transformers greedy generation of every verify prompt.

Runs once on the build host, so the device check compares against it without recomputing it
per device run.

Prompt formatting is the genai server's: the server never applies the tokenizer's
post-processor; it renders the chat template of the tokenizer attached to the HEF around the
messages, and export prepares that template (`common.hailo_tokenizer`): the checkpoint's own
template when the model declares `chat = true`, else plain text (with BOS first only if the
tokenizer puts BOS before plain text). The device check sends each prompt as one user message.
Here the same tokenizer is prepared from the checkpoint with the same `chat`, the same
one-message conversation is rendered with `add_generation_prompt=True` and tokenized with
`add_special_tokens=False`; a doubled BOS is cut to one (`common.prompting`).

Greedy decoding, float32, eager attention, the whole sequence re-run each step (no KV cache):
at most `max_new_tokens` tokens; an EOS token ends the generation and is kept as its last id.
At every generated position the float32 top-1/top-2 logit margin is kept: a device output that
first differs where the margin is small diverged at a near tie, not through damage.

`reference.json` (sorted keys, deterministic):
    {"model", "max_new_tokens", "eos_token_id", "chat", "chat_template",
     "prompts": [{"prompt", "formatted", "prompt_ids", "token_ids", "margins", "text"}]}
`formatted` is the text as sent; `text` the decoded generation without special tokens removed
(`skip_special_tokens=False`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.determinism import pin_torch

SEED = 0


def conversation(prompt: str) -> list[dict[str, str]]:
    """What the device check hands the genai server for one prompt."""
    return [{"role": "user", "content": prompt}]


def format_prompt(tok: Any, prompt: str) -> tuple[str, list[int]]:
    """Always through the template: the server renders the HEF's template for every prompt
    (for a raw-text model that template is the plain one)."""
    from common.prompting import single_bos

    text = tok.apply_chat_template(conversation(prompt), tokenize=False,
                                   add_generation_prompt=True)
    ids = single_bos([int(i) for i in tok(text, add_special_tokens=False).input_ids],
                     tok.bos_token_id)
    if not ids:
        fail(f"reference: prompt {prompt!r} formats to zero tokens")
    return text, ids


def greedy(model: Any, prompt_ids: list[int], max_new_tokens: int,
           eos: int | None) -> tuple[list[int], list[float]]:
    """The new tokens, and the top-1/top-2 logit margin where each was chosen."""
    import torch

    ids = list(prompt_ids)
    new: list[int] = []
    margins: list[float] = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits
        top = torch.topk(logits[0, -1], 2)
        token = int(top.indices[0].item())
        margins.append(round_sig(float(top.values[0] - top.values[1])))
        ids.append(token)
        new.append(token)
        if eos is not None and token == eos:
            break
    return new, margins


def read_params(raw: dict[str, Any]) -> tuple[list[str], int, bool]:
    prompts = [str(p) for p in raw.get("prompts") or []]
    max_new = int(raw.get("max_new_tokens", 16))
    if not prompts:
        fail("reference: params.prompts is empty; at least one prompt is needed")
    if max_new < 1:
        fail(f"reference: params.max_new_tokens {max_new} must be >= 1")
    return prompts, max_new, bool(raw.get("chat", False))


def load(ckpt: Path, work: Path, chat: bool) -> tuple[Any, Any]:
    from common.hailo_tokenizer import prepare_tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        changes = prepare_tokenizer(ckpt, work / "tokenizer", chat=chat)
    except (OSError, ValueError) as exc:
        fail(f"reference: cannot prepare the tokenizer as export does: {exc}")
    tok = AutoTokenizer.from_pretrained(work / "tokenizer", local_files_only=True)
    tok.chat_template = changes["chat_template"]
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype="float32", attn_implementation="eager", local_files_only=True
    ).eval()
    return tok, model


def main() -> None:
    action = load_action(sys.argv)
    prompts, max_new, chat = read_params(action.params)
    pin_torch(SEED)
    ckpt = action.input_dir("fetch") / "checkpoint"
    tok, model = load(ckpt, Path.cwd(), chat)
    eos = tok.eos_token_id if tok.eos_token_id is not None else model.config.eos_token_id
    eos = eos[0] if isinstance(eos, list) else eos
    rows = []
    for prompt in prompts:
        formatted, prompt_ids = format_prompt(tok, prompt)
        token_ids, margins = greedy(model, prompt_ids, max_new, eos)
        text = tok.decode(token_ids, skip_special_tokens=False)
        rows.append({"prompt": prompt, "formatted": formatted, "prompt_ids": prompt_ids,
                     "token_ids": token_ids, "margins": margins, "text": text})
        print(f"{prompt!r}: {len(prompt_ids)} prompt tokens -> {len(token_ids)} new: {text!r}")
    write_json(action.out / "reference.json", {
        "model": action.model,
        "max_new_tokens": max_new,
        "eos_token_id": eos,
        "chat": chat,
        "chat_template": tok.chat_template,
        "prompts": rows,
    })
    check_outputs(action)


if __name__ == "__main__":
    main()
