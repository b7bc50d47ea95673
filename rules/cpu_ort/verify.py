"""verify (cpu-ort): the compiled ONNX model measured against float32 transformers.

Prompts are encoded by `common.prompting`: raw text through the tokenizer (default), or with
`chat = true` as one user message in the checkpoint's own chat template; each prompt's report
row records the text and the ids as sent.

Per prompt, the float32 model's greedy continuation of max_new_tokens tokens is the reference
(argmax, EOS does not stop generation). It is decoded with transformers' KV cache, then
confirmed by one whole-sequence forward: the reference is what that forward's argmax says, so
a cached step that chose differently on a near tie is decoded again from the full forward.
Along it:
- teacher-forced (the gate by default): the rows of both models' forward over prompt +
  reference tokens; at every position the candidate's top-1 is compared with the reference
  token, and the two logit rows by cosine. One flipped token costs one position, not the rest
  of the sequence;
- free-running: the candidate's own greedy continuation, decoded from the reference as a
  guess (`common.greedy`: exactly plain greedy's tokens, in one forward when the candidate
  agrees, so the ONNX graph without a KV cache is not run once per token). Reported with its
  first divergence and the float32 top-1/top-2 margin there (a margin under `near_tie` means
  the float model itself nearly chose the other token), and whether the output loops. It is
  the gate only with `gate = "free_running"` (then min_token_agreement applies).

Each prompt's figures are printed as it finishes, so a long check's log moves.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, write_json
from common.check import (
    fail_if_failed,
    gate_report,
    prompt_figures,
    read_gates,
    say_prompt,
    summarize,
)
from common.checkpoint import load_checkpoint
from common.determinism import ort_session, pin_torch
from common.greedy import guessed_greedy
from common.prompting import PromptError, encode_prompt
from common.torch_reference import TorchReference, reference_greedy

AllLogits = Callable[[list[int]], Any]  # token ids -> numpy logits [positions, vocab]
SEED = 0
META_PREFIX = "hefbuild.quantize."


def ort_logits(onnx_path: Path) -> AllLogits:
    import numpy as np
    import onnxruntime as ort

    # The graph was optimized offline by compile; run exactly that graph.
    session = ort_session(
        str(onnx_path), graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )

    def run(ids: list[int]) -> Any:
        return session.run(["logits"], {"input_ids": np.asarray([ids], dtype=np.int64)})[0][0]

    return run


def quantization_info(onnx_path: Path) -> dict[str, str]:
    """What quantize recorded in the model's metadata_props ({} when nothing was)."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    return {
        p.key[len(META_PREFIX) :]: p.value
        for p in model.metadata_props
        if p.key.startswith(META_PREFIX)
    }


def check_prompt(
    prompt: str, tok: Any, reference: TorchReference, candidate: AllLogits,
    params: dict[str, Any],
) -> dict[str, Any]:
    n = params["max_new_tokens"]
    try:
        sent = encode_prompt(tok, prompt, params["chat"])
    except PromptError as exc:
        fail(f"verify: {exc}")
    ref = reference_greedy(reference, sent.ids, n)
    cand = guessed_greedy(candidate, sent.ids, n, ref.ids)
    # Both first forwards ran over the prompt + ref.ids: row i predicts ref.ids[i].
    figures = prompt_figures(ref.ids, cand.ids, ref.first_logits, cand.first_logits, params)
    return {
        **sent.record(),
        "prompt_tokens": len(sent.ids),
        "reference_ids": ref.ids,
        "candidate_ids": cand.ids,
        "reference_text": tok.decode(ref.ids, skip_special_tokens=False),
        "candidate_text": tok.decode(cand.ids, skip_special_tokens=False),
        "candidate_forwards": cand.forwards,
        **figures,
    }


def read_params(raw: dict[str, Any]) -> dict[str, Any]:
    params = {
        "prompts": [str(p) for p in raw.get("prompts") or []],
        "max_new_tokens": int(raw.get("max_new_tokens", 16)),
        "chat": bool(raw.get("chat", False)),
        **read_gates(raw),
    }
    if not params["prompts"]:
        fail("verify: params.prompts is empty; at least one prompt is needed")
    if params["max_new_tokens"] < 1:
        fail(f"verify: params.max_new_tokens {params['max_new_tokens']} must be >= 1")
    return params


def main() -> None:
    action = load_action(sys.argv)
    params = read_params(action.params)
    pin_torch(SEED)
    model_path = action.input_dir("compile") / "model.opt.onnx"
    tok, model = load_checkpoint(action.input_dir("fetch") / "checkpoint")
    reference = TorchReference(model)
    candidate = ort_logits(model_path)
    results = []
    for prompt in params["prompts"]:
        results.append(check_prompt(prompt, tok, reference, candidate, params))
        say_prompt(results[-1])
    quantization = quantization_info(model_path)
    report = {
        "model": action.model,
        "target": action.target,
        "method": quantization.get("method"),
        "quantization": quantization,
        "chat": params["chat"],
        "max_new_tokens": params["max_new_tokens"],
        **gate_report(results, params),
        "prompts": results,
    }
    write_json(action.out / "report.json", report)
    summarize(results, params)
    fail_if_failed(results, params)
    check_outputs(action)


if __name__ == "__main__":
    main()
