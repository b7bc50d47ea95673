"""device_check's generation: greedy genai generation of the request's prompts, and the
prefill group's last-position logits for the build host's cosine. Runs on the device host with
device_check.py."""

from __future__ import annotations

import json
import re
from typing import Any

from device_check_audit import INPUT_ROLES, PREFILL_KEY, audit
from device_check_errors import CheckError
from device_check_versions import check_versions, read_versions

SHARED_GROUP_ID = "SHARED"
INFER_TIMEOUT_MS = 60000


def load_request(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            request = json.load(fh)
    except (OSError, ValueError) as exc:
        raise CheckError(f"cannot read request {path}: {exc}") from exc
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(
            isinstance(p, (str, list)) for p in prompts):
        raise CheckError("request.prompts must be a non-empty list of strings or message lists")
    n = request.get("max_new_tokens")
    if not isinstance(n, int) or isinstance(n, bool) or n <= 0:
        raise CheckError(f"request.max_new_tokens must be a positive integer, got {n!r}")
    seed = request.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise CheckError(f"request.seed must be a non-negative integer, got {seed!r}")
    return request


def generate_one(llm: Any, prompt: str | list, max_new: int, seed: int) -> dict[str, Any]:
    llm.clear_context()
    prompt_ids = [int(t) for t in llm.tokenize(prompt)] if isinstance(prompt, str) else None
    capacity = llm.max_context_capacity() if hasattr(llm, "max_context_capacity") else None
    if prompt_ids is not None and capacity and len(prompt_ids) + max_new > int(capacity):
        raise CheckError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens {max_new} exceed "
                         f"the model's context capacity {capacity}")
    pieces: list[str] = []
    with llm.generate(prompt=prompt, do_sample=False, max_generated_tokens=max_new,
                      seed=seed) as completion:
        for piece in completion:
            pieces.append(str(piece))
        status = completion.generation_status
    per_piece = [[int(t) for t in llm.tokenize(p)] for p in pieces]
    text = "".join(pieces)
    return {
        "prompt": prompt,
        "prompt_token_ids": prompt_ids,
        "text": text,
        "pieces": pieces,
        "token_ids": [t for ids in per_piece for t in ids],
        "token_ids_source": "llm.tokenize(each streamed piece)",
        "token_ids_exact": all(len(ids) == 1 for ids in per_piece),
        "retokenized_ids": [int(t) for t in llm.tokenize(text)] if text else [],
        "stop": getattr(status, "name", str(status)),
    }


def _natural(name: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def prefill_logits(vdevice: Any, hef_path: str, npz_path: str,
                   report: dict[str, Any]) -> tuple[list[float] | None, str | None]:
    import numpy as np
    from hailo_platform import HEF, FormatType

    group = next(g for g in report["network_groups"] if g.endswith("__prefill"))
    suffixes = report["config"]["input_layers_names_suffixes"]
    try:
        with np.load(npz_path) as ref:
            arrays = {name: np.asarray(ref[name], dtype=np.float32) for name in INPUT_ROLES}
    except (OSError, KeyError, ValueError) as exc:
        raise CheckError(f"cannot read the six inputs from {npz_path}: {exc}") from exc
    model = vdevice.create_infer_model(hef_path, name=group)
    feeds = {}
    for onnx_name, role in INPUT_ROLES.items():
        vstream = f"{group}/{suffixes[role]}"
        if vstream not in model.input_names:
            raise CheckError(f"{group} has no input {vstream} ({onnx_name}); inputs: "
                             f"{model.input_names}")
        shape = tuple(int(d) for d in model.input(vstream).shape)
        if int(np.prod(shape)) != arrays[onnx_name].size:
            return None, (f"{vstream} takes {list(shape)} per run but the reference "
                          f"{onnx_name} is {list(arrays[onnx_name].shape)}: the prefill group "
                          f"runs {PREFILL_KEY} tokens at a time through the KV cache; chunked "
                          "prefill is not driven by this check")
        model.input(vstream).set_format_type(FormatType.FLOAT32)
        feeds[vstream] = np.ascontiguousarray(arrays[onnx_name].reshape(shape))
    hef = HEF(hef_path)
    order = sorted(model.output_names, key=lambda n: _natural(
        (hef.get_original_names_from_vstream_name(n, group) or [n])[0]))
    outputs = {}
    for name in order:
        model.output(name).set_format_type(FormatType.FLOAT32)
        outputs[name] = np.empty(tuple(int(d) for d in model.output(name).shape), np.float32)
    with model.configure() as configured:
        bindings = configured.create_bindings(input_buffers=feeds, output_buffers=outputs)
        configured.run([bindings], INFER_TIMEOUT_MS)
        shards = [np.asarray(bindings.output(n).get_buffer(), dtype=np.float32) for n in order]
    last = np.concatenate([s.reshape(-1, s.shape[-1])[-1] for s in shards])
    return [float(x) for x in last], None


def generate(hef_path: str, request_path: str) -> dict[str, Any]:
    request = load_request(request_path)
    versions = read_versions()
    check_versions(versions, request.get("expect_versions"))
    report = audit(hef_path)
    if not report["ok"]:
        raise CheckError("HEF audit failed: " + "; ".join(report["problems"]))
    from hailo_platform import VDevice
    from hailo_platform.genai import LLM

    max_new, seed = int(request["max_new_tokens"]), int(request.get("seed", 0))
    params = VDevice.create_params()
    params.group_id = SHARED_GROUP_ID
    vdevice = VDevice(params)
    try:
        llm = LLM(vdevice, hef_path)
        try:
            generations = [generate_one(llm, p, max_new, seed) for p in request["prompts"]]
        finally:
            llm.release()
        npz = (request.get("prefill") or {}).get("npz")
        logits, prefill_error = (None, None)
        if npz:
            logits, prefill_error = prefill_logits(vdevice, hef_path, npz, report)
    finally:
        vdevice.release()
    return {"generations": generations, "prefill_logits": logits,
            "prefill_error": prefill_error, "hailort": versions["hailort"],
            "firmware": versions["firmware"], "devices": versions["devices"],
            "sampling": {"do_sample": False, "seed": seed, "max_generated_tokens": max_new}}
