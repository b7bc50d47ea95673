"""verify (cpu-ort): greedy generations of the compiled ONNX model vs float32 transformers.

Both models run the same greedy loop (whole sequence re-run each step, argmax of the last
position in numpy), so only the model differs. EOS does not stop generation: every prompt
compares exactly max_new_tokens positions for both models.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.compare import compare_generations, judge
from common.determinism import ort_session, pin_torch

NextLogits = Callable[[list[int]], Any]  # token ids -> numpy logits of the last position
SEED = 0


def greedy(next_logits: NextLogits, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    import numpy as np

    ids = list(prompt_ids)
    for _ in range(max_new_tokens):
        ids.append(int(np.argmax(next_logits(ids))))
    return ids[len(prompt_ids) :]


def torch_next_logits(ckpt: Path) -> NextLogits:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype="float32", attn_implementation="eager", local_files_only=True
    ).eval()

    def run(ids: list[int]) -> Any:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits
        return logits[0, -1].numpy()

    return run


def ort_next_logits(onnx_path: Path) -> NextLogits:
    import numpy as np
    import onnxruntime as ort

    # The graph was optimized offline by compile; run exactly that graph.
    session = ort_session(
        str(onnx_path), graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )

    def run(ids: list[int]) -> Any:
        logits = session.run(["logits"], {"input_ids": np.asarray([ids], dtype=np.int64)})[0]
        return logits[0, -1]

    return run


def check_prompt(
    prompt: str, tok: Any, reference: NextLogits, candidate: NextLogits, params: dict[str, Any]
) -> dict[str, Any]:
    prompt_ids = tok(prompt).input_ids
    ref_ids = greedy(reference, prompt_ids, params["max_new_tokens"])
    cand_ids = greedy(candidate, prompt_ids, params["max_new_tokens"])
    cmp = compare_generations(ref_ids, cand_ids)
    passed, reason = judge(cmp, params["min_token_agreement"])
    return {
        "prompt": prompt,
        "prompt_tokens": len(prompt_ids),
        "reference_ids": ref_ids,
        "candidate_ids": cand_ids,
        "reference_text": tok.decode(ref_ids, skip_special_tokens=False),
        "candidate_text": tok.decode(cand_ids, skip_special_tokens=False),
        "agreement": round_sig(cmp["agreement"]),
        "first_divergence": cmp["first_divergence"],
        "reference_degenerate": cmp["reference_degenerate"],
        "candidate_degenerate": cmp["candidate_degenerate"],
        "passed": passed,
        "reason": reason,
    }


def read_params(raw: dict[str, Any]) -> dict[str, Any]:
    prompts = [str(p) for p in raw.get("prompts") or []]
    params = {
        "prompts": prompts,
        "max_new_tokens": int(raw.get("max_new_tokens", 16)),
        "min_token_agreement": float(raw.get("min_token_agreement", 0.5)),
    }
    if not prompts:
        fail("verify: params.prompts is empty; at least one prompt is needed")
    if params["max_new_tokens"] < 1:
        fail(f"verify: params.max_new_tokens {params['max_new_tokens']} must be >= 1")
    if not 0.0 <= params["min_token_agreement"] <= 1.0:
        fail(f"verify: params.min_token_agreement {params['min_token_agreement']} not in [0, 1]")
    return params


def worst(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Failing prompt with the lowest agreement; first such prompt on ties."""
    failing = [r for r in results if not r["passed"]]
    return min(failing, key=lambda r: r["agreement"])


def summarize(results: list[dict[str, Any]], min_agreement: float) -> None:
    for r in results:
        mark = "PASS" if r["passed"] else "FAIL"
        print(
            f"[{mark}] agreement {r['agreement']:.3f} div@{r['first_divergence']} {r['prompt']!r}"
        )
        print(f"    ref : {r['reference_text']!r}")
        print(f"    cand: {r['candidate_text']!r}")
        print(f"    {r['reason']}")
    passed = sum(r["passed"] for r in results)
    print(f"{passed}/{len(results)} prompts passed (min_token_agreement {min_agreement})")


def main() -> None:
    action = load_action(sys.argv)
    params = read_params(action.params)
    pin_torch(SEED)
    from transformers import AutoTokenizer

    ckpt = action.input_dir("fetch") / "checkpoint"
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    reference = torch_next_logits(ckpt)
    candidate = ort_next_logits(action.input_dir("compile") / "model.opt.onnx")
    results = [check_prompt(p, tok, reference, candidate, params) for p in params["prompts"]]

    mean = sum(r["agreement"] for r in results) / len(results)
    overall = all(r["passed"] for r in results)
    report = {
        "model": action.model,
        "target": action.target,
        "max_new_tokens": params["max_new_tokens"],
        "min_token_agreement": params["min_token_agreement"],
        "mean_agreement": round_sig(mean),
        "passed": overall,
        "prompts": results,
    }
    write_json(action.out / "report.json", report)
    summarize(results, params["min_token_agreement"])
    if not overall:
        bad = worst(results)
        fail(f"verify gate failed: prompt {bad['prompt']!r}: {bad['reason']}")
    check_outputs(action)


if __name__ == "__main__":
    main()
