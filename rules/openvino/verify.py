"""verify (openvino): the compiled IR against float32 transformers, the same check as every
target's (`common.check`).

Per prompt, the prompt ids come from transformers' tokenizer (`common.prompting`); GenAI's own
tokenizer (openvino-tokenizers) must give the same ids for the same text, BOS included, else
the prompt fails with that reason: a deployment sends GenAI text, so a tokenizer that differs
is a wrong build. The same ids then go to both sides. The reference is the float32 model's
greedy continuation of max_new_tokens tokens (`common.torch_reference`: KV-cached, confirmed
by one whole-sequence forward; EOS does not stop it). Along it:
- teacher-forced (the gate by default): compile's IR run once by OpenVINO's runtime on the
  declared device over prompt + reference tokens (its KV-cache state reset first), each
  position's top-1 against the reference token and the two logit rows by cosine;
- free-running: `openvino_genai.LLMPipeline` on the same IR, `do_sample = False`,
  `ignore_eos`, as a deployment runs it; agreement, first divergence with the float32
  margin there (near ties labelled), loops. The gate with `gate = "free_running"`.
Runs in the `openvino` venv toolchain.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
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
from common.determinism import pin_torch
from common.prompting import PromptError, encode_prompt
from common.torch_reference import TorchReference, reference_greedy

SEED = 0
MODEL_XML = "openvino_model.xml"


class IRLogits:
    """The IR's logits at every position of a sequence, from OpenVINO's runtime: the
    stateful model (optimum-intel's export keeps the KV cache as state) run from a reset
    state over the whole sequence at once."""

    def __init__(self, ir: Path, device: str) -> None:
        import openvino as ov

        core = ov.Core()
        model = core.read_model(ir / MODEL_XML)
        self.inputs = {port.get_any_name() for port in model.inputs}
        self.request = core.compile_model(model, device).create_infer_request()

    def __call__(self, ids: list[int]) -> Any:
        import numpy as np

        x = np.asarray([ids], dtype=np.int64)
        feeds = {"input_ids": x}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones_like(x)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.arange(len(ids), dtype=np.int64)[None, :]
        if "beam_idx" in self.inputs:
            feeds["beam_idx"] = np.zeros(1, dtype=np.int32)
        self.request.reset_state()
        self.request.infer(feeds)
        logits = np.array(self.request.get_tensor("logits").data[0], dtype=np.float32)
        if logits.shape[0] != len(ids):
            fail(f"verify: {MODEL_XML} returned logits for {logits.shape[0]} positions of "
                 f"{len(ids)}; the teacher-forced check needs every position's")
        return logits


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


def check_prompt(prompt: str, tok: Any, reference: TorchReference, genai: GenAI,
                 ir_logits: IRLogits, params: dict[str, Any]) -> dict[str, Any]:
    try:
        sent = encode_prompt(tok, prompt, params["chat"])
    except PromptError as exc:
        fail(f"verify: {exc}")
    genai_ids = genai.encode(sent.text) if not params["chat"] else sent.ids
    n = params["max_new_tokens"]
    ref = reference_greedy(reference, sent.ids, n)
    cand_ids = genai.greedy(sent.ids, n)
    # Row i: the IR's logits for ref.ids[i] given the prompt and ref.ids[:i].
    cand_rows = ir_logits(list(sent.ids) + ref.ids[:-1])[len(sent.ids) - 1:]
    figures = prompt_figures(ref.ids, cand_ids, ref.first_logits, cand_rows, params)
    if genai_ids != sent.ids:
        figures.update(passed=False, reason=f"GenAI's tokenizer gives ids {genai_ids}, "
                       f"transformers' {sent.ids}")
    return {
        **sent.record(),
        "prompt_tokens": len(sent.ids),
        "genai_prompt_ids": genai_ids,
        "reference_ids": ref.ids,
        "candidate_ids": cand_ids,
        "reference_text": tok.decode(ref.ids, skip_special_tokens=False),
        "candidate_text": tok.decode(cand_ids, skip_special_tokens=False),
        **figures,
    }


def read_params(raw: dict[str, Any]) -> dict[str, Any]:
    params = {
        "prompts": [str(p) for p in raw.get("prompts") or []],
        "max_new_tokens": int(raw.get("max_new_tokens", 16)),
        "device": str(raw.get("device", "CPU")),
        "chat": bool(raw.get("chat", False)),
        **read_gates(raw),
    }
    if not params["prompts"]:
        fail("verify: params.prompts is empty; at least one prompt is needed")
    if params["max_new_tokens"] < 1:
        fail(f"verify: params.max_new_tokens {params['max_new_tokens']} must be >= 1")
    return params


def compression_of(ir: Path) -> dict[str, Any]:
    import json

    try:
        return json.loads((ir / "hefbuild_compression.json").read_text())
    except (OSError, ValueError):
        return {}


def main() -> None:
    action = load_action(sys.argv)
    params = read_params(action.params)
    pin_torch(SEED)
    tok, model = load_checkpoint(action.input_dir("fetch") / "checkpoint")
    reference = TorchReference(model)
    ir = action.input_dir("compile") / "ir"
    genai = GenAI(ir, params["device"])
    ir_logits = IRLogits(ir, params["device"])
    results = []
    for prompt in params["prompts"]:
        results.append(check_prompt(prompt, tok, reference, genai, ir_logits, params))
        say_prompt(results[-1])
    compression = compression_of(ir)
    report = {
        "model": action.model,
        "target": action.target,
        # Not "device": that key marks a Hailo device check's report (hefbuild.report.checks).
        "openvino_device": params["device"],
        "method": compression.get("mode"),
        "compression": compression,
        "chat": params["chat"],
        "max_new_tokens": params["max_new_tokens"],
        **gate_report(results, read_gates(action.params)),
        "prompts": results,
    }
    write_json(action.out / "report.json", report)
    summarize(results, params, f", device {report['openvino_device']}")
    fail_if_failed(results, params)
    check_outputs(action)


if __name__ == "__main__":
    main()
