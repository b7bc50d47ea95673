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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.compare import (
    compare_generations,
    divergence,
    judge,
    judge_teacher_forced,
    teacher_forced,
)
from common.determinism import ort_session, pin_torch
from common.greedy import Greedy, guessed_greedy
from common.prompting import PromptError, encode_prompt

AllLogits = Callable[[list[int]], Any]  # token ids -> numpy logits [positions, vocab]
SEED = 0
GATES = ("teacher_forced", "free_running")
META_PREFIX = "hefbuild.quantize."


class TorchReference:
    """The float32 checkpoint in transformers: whole-sequence logits, and greedy decoding
    with its KV cache."""

    def __init__(self, ckpt: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            ckpt, dtype="float32", attn_implementation="eager", local_files_only=True
        ).eval()

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
    """The full forward's greedy tokens, found from the KV-cached ones (one extra forward
    when they agree, as they do but on a float tie)."""
    found = guessed_greedy(reference, prompt_ids, n, reference.cached_greedy(prompt_ids, n))
    if found.forwards == 1:
        return found
    again = guessed_greedy(reference, prompt_ids, n, found.ids)  # rows along the final tokens
    return Greedy(again.ids, found.forwards + again.forwards, again.first_logits)


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
    prompt_ids = sent.ids
    ref = reference_greedy(reference, prompt_ids, n)
    cand = guessed_greedy(candidate, prompt_ids, n, ref.ids)
    ref_ids, cand_ids = ref.ids, cand.ids
    # Both first forwards ran over the prompt + ref_ids: row i predicts ref_ids[i].
    ref_rows, cand_rows = ref.first_logits, cand.first_logits
    cmp = compare_generations(ref_ids, cand_ids)
    tf = teacher_forced(ref_ids, ref_rows, cand_rows)
    div = divergence(cmp, ref_rows, params["near_tie"])
    if params["gate"] == "free_running":
        passed, reason = judge(cmp, params["min_token_agreement"])
    else:
        passed, reason = judge_teacher_forced(
            tf, params["min_teacher_forced"], params["min_logit_cosine"]
        )
        if passed and cmp["candidate_degenerate"] and not cmp["same_degeneration"]:
            reason = "ok (free-running candidate output loops; not gated)"
    margin = div["margin"]
    return {
        **sent.record(),
        "prompt_tokens": len(prompt_ids),
        "reference_ids": ref_ids,
        "candidate_ids": cand_ids,
        "reference_text": tok.decode(ref_ids, skip_special_tokens=False),
        "candidate_text": tok.decode(cand_ids, skip_special_tokens=False),
        "agreement": round_sig(cmp["agreement"]),
        "first_divergence": cmp["first_divergence"],
        "first_divergence_margin": None if margin is None else round_sig(margin),
        "near_tie": div["near_tie"],
        "reference_degenerate": cmp["reference_degenerate"],
        "candidate_degenerate": cmp["candidate_degenerate"],
        "candidate_forwards": cand.forwards,
        "teacher_forced_agreement": round_sig(tf["agreement"]),
        "teacher_forced_mismatches": tf["mismatch_positions"],
        "logit_cosine_mean": round_sig(tf["mean_cosine"]),
        "logit_cosine_min": round_sig(tf["min_cosine"]),
        "passed": passed,
        "reason": reason,
    }


def read_params(raw: dict[str, Any]) -> dict[str, Any]:
    prompts = [str(p) for p in raw.get("prompts") or []]
    params = {
        "prompts": prompts,
        "max_new_tokens": int(raw.get("max_new_tokens", 16)),
        "min_token_agreement": float(raw.get("min_token_agreement", 0.5)),
        "gate": str(raw.get("gate", "teacher_forced")),
        "min_teacher_forced": float(raw.get("min_teacher_forced", 0.9)),
        "min_logit_cosine": float(raw.get("min_logit_cosine", 0.99)),
        "near_tie": float(raw.get("near_tie", 0.5)),
        "chat": bool(raw.get("chat", False)),
    }
    if not prompts:
        fail("verify: params.prompts is empty; at least one prompt is needed")
    if params["max_new_tokens"] < 1:
        fail(f"verify: params.max_new_tokens {params['max_new_tokens']} must be >= 1")
    for name in ("min_token_agreement", "min_teacher_forced"):
        if not 0.0 <= params[name] <= 1.0:
            fail(f"verify: params.{name} {params[name]} not in [0, 1]")
    if not -1.0 <= params["min_logit_cosine"] <= 1.0:
        fail(f"verify: params.min_logit_cosine {params['min_logit_cosine']} not in [-1, 1]")
    if params["gate"] not in GATES:
        fail(f"verify: params.gate {params['gate']!r} is not one of {list(GATES)}")
    return params


def gated_figure(params: dict[str, Any]) -> str:
    return "agreement" if params["gate"] == "free_running" else "teacher_forced_agreement"


def worst(results: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Failing prompt with the lowest gated agreement; first such prompt on ties."""
    failing = [r for r in results if not r["passed"]]
    return min(failing, key=lambda r: r[key])


def say_prompt(r: dict[str, Any]) -> None:
    mark = "PASS" if r["passed"] else "FAIL"
    tie = " (near tie)" if r["near_tie"] else ""
    lines = [
        f"[{mark}] teacher-forced {r['teacher_forced_agreement']:.3f} cosine "
        f"{r['logit_cosine_mean']:.5f} | free-running {r['agreement']:.3f} "
        f"div@{r['first_divergence']}{tie} {r['prompt']!r}",
        f"    ref : {r['reference_text']!r}",
        f"    cand: {r['candidate_text']!r}",
        f"    {r['reason']}",
    ]
    print("\n".join(lines), flush=True)  # a stage's stdout is a file: flush as each ends


def summarize(results: list[dict[str, Any]], params: dict[str, Any]) -> None:
    passed = sum(r["passed"] for r in results)
    if params["gate"] == "free_running":
        limits = f"gate free_running, min_token_agreement {params['min_token_agreement']}"
    else:
        limits = (
            f"gate teacher_forced, min_teacher_forced {params['min_teacher_forced']}, "
            f"min_logit_cosine {params['min_logit_cosine']}"
        )
    print(f"{passed}/{len(results)} prompts passed ({limits})")


def mean(results: list[dict[str, Any]], key: str) -> float:
    return round_sig(sum(r[key] for r in results) / len(results))


def main() -> None:
    action = load_action(sys.argv)
    params = read_params(action.params)
    pin_torch(SEED)
    from transformers import AutoTokenizer

    ckpt = action.input_dir("fetch") / "checkpoint"
    model_path = action.input_dir("compile") / "model.opt.onnx"
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    reference = TorchReference(ckpt)
    candidate = ort_logits(model_path)
    results = []
    for prompt in params["prompts"]:
        results.append(check_prompt(prompt, tok, reference, candidate, params))
        say_prompt(results[-1])
    quantization = quantization_info(model_path)

    overall = all(r["passed"] for r in results)
    report = {
        "model": action.model,
        "target": action.target,
        "method": quantization.get("method"),
        "quantization": quantization,
        "gate": params["gate"],
        "chat": params["chat"],
        "max_new_tokens": params["max_new_tokens"],
        "min_token_agreement": params["min_token_agreement"],
        "min_teacher_forced": params["min_teacher_forced"],
        "min_logit_cosine": params["min_logit_cosine"],
        "near_tie": params["near_tie"],
        "mean_agreement": mean(results, "agreement"),
        "mean_teacher_forced_agreement": mean(results, "teacher_forced_agreement"),
        "mean_logit_cosine": mean(results, "logit_cosine_mean"),
        "passed": overall,
        "prompts": results,
    }
    write_json(action.out / "report.json", report)
    summarize(results, params)
    if not overall:
        bad = worst(results, gated_figure(params))
        fail(f"verify gate failed: prompt {bad['prompt']!r}: {bad['reason']}")
    check_outputs(action)


if __name__ == "__main__":
    main()
