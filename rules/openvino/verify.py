"""verify (openvino): OpenVINO GenAI greedy generation against float32 transformers.

Per prompt, the prompt ids come from transformers' tokenizer (`common.prompting`); GenAI's own
tokenizer (openvino-tokenizers) must give the same ids for the same text, BOS included, else
the prompt fails with that reason: a deployment sends GenAI text, so a tokenizer that differs
is a wrong build. The same ids then go to both sides: the float32 model's greedy continuation
of max_new_tokens tokens (the whole sequence re-run each step, argmax of the last position;
EOS does not stop it) is the reference, and `openvino_genai.LLMPipeline` on compile's IR for
the declared device, `do_sample = False`, `ignore_eos`, is the candidate. The gate is
free-running token agreement (`common.compare`), with the first divergence and whether the
candidate's output loops. Runs in the `openvino` venv toolchain.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.checkpoint import load_checkpoint
from common.compare import compare_generations, judge
from common.determinism import pin_torch
from common.prompting import PromptError, encode_prompt

SEED = 0


def reference_greedy(model: Any, prompt_ids: Sequence[int], n: int) -> list[int]:
    import torch

    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], dtype=torch.long)).logits
            ids.append(int(torch.argmax(logits[0, -1])))
    return ids[len(prompt_ids):]


class GenAI:
    """The candidate: an LLMPipeline on an IR folder, fed token ids."""

    def __init__(self, ir: Path, device: str) -> None:
        import openvino_genai as ov_genai

        self._genai = ov_genai
        self.pipe = ov_genai.LLMPipeline(str(ir), device)

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.pipe.get_tokenizer().encode(text).input_ids.data[0]]

    def greedy(self, prompt_ids: Sequence[int], n: int) -> list[int]:
        import numpy as np
        import openvino as ov

        config = self._genai.GenerationConfig()
        config.max_new_tokens = n
        config.do_sample = False
        config.ignore_eos = True
        ids = np.asarray([list(prompt_ids)], dtype=np.int64)
        inputs = self._genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))
        return [int(t) for t in self.pipe.generate(inputs, config).tokens[0]]


def check_prompt(prompt: str, tok: Any, model: Any, genai: GenAI,
                 params: dict[str, Any]) -> dict[str, Any]:
    try:
        sent = encode_prompt(tok, prompt, params["chat"])
    except PromptError as exc:
        fail(f"verify: {exc}")
    genai_ids = genai.encode(sent.text) if not params["chat"] else sent.ids
    n = params["max_new_tokens"]
    ref_ids = reference_greedy(model, sent.ids, n)
    cand_ids = genai.greedy(sent.ids, n)
    cmp = compare_generations(ref_ids, cand_ids)
    passed, reason = judge(cmp, params["min_token_agreement"])
    if genai_ids != sent.ids:
        passed, reason = False, (f"GenAI's tokenizer gives ids {genai_ids}, transformers' "
                                 f"{sent.ids}")
    return {
        **sent.record(),
        "genai_prompt_ids": genai_ids,
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
    params = {
        "prompts": [str(p) for p in raw.get("prompts") or []],
        "max_new_tokens": int(raw.get("max_new_tokens", 16)),
        "min_token_agreement": float(raw.get("min_token_agreement", 0.5)),
        "device": str(raw.get("device", "CPU")),
        "chat": bool(raw.get("chat", False)),
    }
    if not params["prompts"]:
        fail("verify: params.prompts is empty; at least one prompt is needed")
    if params["max_new_tokens"] < 1:
        fail(f"verify: params.max_new_tokens {params['max_new_tokens']} must be >= 1")
    if not 0.0 <= params["min_token_agreement"] <= 1.0:
        fail(f"verify: params.min_token_agreement {params['min_token_agreement']} not in [0, 1]")
    return params


def compression_of(ir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((ir / "hefbuild_compression.json").read_text())
    except (OSError, ValueError):
        return {}


def summarize(results: list[dict[str, Any]], params: dict[str, Any]) -> None:
    for r in results:
        mark = "PASS" if r["passed"] else "FAIL"
        print(f"[{mark}] free-running {r['agreement']:.3f} div@{r['first_divergence']} "
              f"{r['prompt']!r}")
        print(f"    ref : {r['reference_text']!r}")
        print(f"    cand: {r['candidate_text']!r}")
        print(f"    {r['reason']}")
    passed = sum(r["passed"] for r in results)
    print(f"{passed}/{len(results)} prompts passed (gate free_running, min_token_agreement "
          f"{params['min_token_agreement']}, device {params['device']})")


def main() -> None:
    action = load_action(sys.argv)
    params = read_params(action.params)
    pin_torch(SEED)
    tok, model = load_checkpoint(action.input_dir("fetch") / "checkpoint")
    ir = action.input_dir("compile") / "ir"
    genai = GenAI(ir, params["device"])
    results = [check_prompt(p, tok, model, genai, params) for p in params["prompts"]]
    overall = all(r["passed"] for r in results)
    compression = compression_of(ir)
    report = {
        "model": action.model,
        "target": action.target,
        # Not "device": that key marks a Hailo device check's report (hefbuild.report.checks).
        "openvino_device": params["device"],
        "method": compression.get("mode"),
        "compression": compression,
        "gate": "free_running",
        "chat": params["chat"],
        "max_new_tokens": params["max_new_tokens"],
        "min_token_agreement": params["min_token_agreement"],
        "mean_agreement": round_sig(sum(r["agreement"] for r in results) / len(results)),
        "passed": overall,
        "prompts": results,
    }
    write_json(action.out / "report.json", report)
    summarize(results, params)
    if not overall:
        bad = min((r for r in results if not r["passed"]), key=lambda r: r["agreement"])
        fail(f"verify gate failed: prompt {bad['prompt']!r}: {bad['reason']}")
    check_outputs(action)


if __name__ == "__main__":
    main()
