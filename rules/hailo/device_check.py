"""device_check: the verify stage's probe, run ON THE HAILO HOST, one fresh process per attempt.

Self-contained: the build host copies this file and the HEF to the device host and runs it
with the device's python (standard library, numpy and HailoRT's `hailo_platform` only).

    python device_check.py versions
        {"hailort": "<runtime version>", "firmware": "<device firmware>", "devices": [ids],
         "firmware_by_device": {id: raw firmware string}}
    python device_check.py audit HEF
        static HEF audit, no device needed: {"ok", "problems", "network_groups", "inputs",
        "config", "resources"}
    python device_check.py generate HEF REQUEST_JSON
        REQUEST {"prompts": [...], "max_new_tokens": N, "seed": S, "prefill": {"npz": path|null},
                 "expect_versions": {"hailort": "5.3.0", "firmware": "5.3.0"} (optional)}
        -> {"generations": [...], "prefill_logits": [...]|null, "hailort": ..., "firmware": ...}

Every answer is ONE JSON line on stdout (library output is sent to stderr); with the
`hailo_platform` test double it carries "fake": true. Errors print
{"error": {"class": "transient"|"deterministic", "status": "HAILO_..."|null, "message": ...}}
and exit 3 (transient: the interrupted-accept flake surfacing as HAILO_COMMUNICATION_CLOSED,
HAILO_DRIVER_INTERRUPTED or HAILO_INTERRUPTED_BY_SIGNAL; a fresh process succeeds) or 4
(deterministic: bad HEF, version mismatch, failed audit, anything else). Usage errors exit 2.

generate: one VDevice (shared group id) and one `genai.LLM` per process; before each prompt
`clear_context()`, then greedy generation (do_sample=False, the request's seed and
max_generated_tokens). A prompt is a string (raw text, inserted as is: the server adds no BOS,
so put the BOS text in it) or a list of chat messages (the HEF's chat template applies).
The genai API streams TEXT, one piece per token (a piece ending in U+FFFD is held back and
merged with the next), and has no token-id output. So `token_ids` are the LLM's own
`tokenize()` of each streamed piece, concatenated; `token_ids_exact` says whether every piece
gave exactly one id (then the ids are the generated ids, barring a tokenizer whose encode of a
token's text differs from the token); `retokenized_ids` is `tokenize()` of the whole text.

prefill (optional): the six arrays of export's hf_reference.npz are fed, through the low-level
InferModel API, to the `<scope>__prefill` network group and the last-position logits (shards
concatenated in output-name order) are returned for the build host's cosine. Only when the
group's input shapes hold the npz arrays (one run); a group compiled for fewer tokens than the
reference (prefill_input_tokens_count < seq, driven through the KV cache in chunks by the
runtime) is not driven here: `prefill_logits` is then null and `prefill_error` says why.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

EXIT_TRANSIENT, EXIT_DETERMINISTIC, EXIT_USAGE = 3, 4, 2
TRANSIENT_STATUSES = frozenset({
    "HAILO_COMMUNICATION_CLOSED", "HAILO_DRIVER_INTERRUPTED", "HAILO_INTERRUPTED_BY_SIGNAL"})
# Python exception classes of hailo_platform that stand for one status.
STATUS_OF_CLASS = {
    "HailoCommunicationClosedException": "HAILO_COMMUNICATION_CLOSED",
    "HailoRTTimeout": "HAILO_TIMEOUT",
    "HailoRTInvalidHEFException": "HAILO_INVALID_HEF",
    "HailoRTHEFNotCompatibleWithDevice": "HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE",
    "HailoRTNotFoundException": "HAILO_NOT_FOUND",
    "HailoRTInvalidArgumentException": "HAILO_INVALID_ARGUMENT",
    "HailoRTInvalidOperationException": "HAILO_INVALID_OPERATION",
    "HailoRTDriverOperationFailedException": "HAILO_DRIVER_OPERATION_FAILED",
    "HailoRTStreamAborted": "HAILO_STREAM_ABORT",
}
STATUS_NAME = re.compile(r"\bHAILO_[A-Z0-9_]+\b")
# ONNX input of the exported graph -> its role in hailo-config.json input_layers_names_suffixes.
INPUT_ROLES = {
    "inputs_embeds": "embeddings",
    "attention_mask": "attention_mask",
    "cos_k": "pe_k_cos",
    "sin_k": "pe_k_sin",
    "cos_q": "pe_q_cos",
    "sin_q": "pe_q_sin",
}
GROUP_SUFFIXES = ("__prefill", "__tbt")
CONFIG_RESOURCE = "hailo-config.json"
TOKENIZER_RESOURCE = "tokenizer.json"
PREFILL_KEY = "prefill_input_tokens_count"
SHARED_GROUP_ID = "SHARED"
INFER_TIMEOUT_MS = 60000
VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)")


class CheckError(Exception):
    """A failure this script detects itself (not raised by HailoRT)."""

    def __init__(self, message: str, error_class: str = "deterministic",
                 status: str | None = None):
        super().__init__(message)
        self.error_class, self.status = error_class, status


# -- output ----------------------------------------------------------------------------------

_OUT = sys.stdout


def _claim_stdout() -> None:
    """Keep the real stdout for the one JSON line; anything else printed goes to stderr."""
    global _OUT
    try:
        _OUT = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
    except OSError:
        _OUT = sys.stdout
    sys.stdout = sys.stderr


def _is_fake() -> bool:
    module = sys.modules.get("hailo_platform")
    return bool(getattr(module, "IS_FAKE_HAILORT", False))


def emit(answer: dict[str, Any]) -> None:
    if _is_fake():
        answer = {**answer, "fake": True}
    _OUT.write(json.dumps(answer, sort_keys=True) + "\n")
    _OUT.flush()


# -- errors ----------------------------------------------------------------------------------

def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _status_from_code(code: Any) -> str | None:
    try:
        value = int(code)
    except (TypeError, ValueError):
        return None
    try:
        from hailo_platform.pyhailort.pyhailort import get_status_message

        name = get_status_message(value)
    except Exception:  # noqa: BLE001 - best effort: an unknown code only loses its name
        return None
    return name or None


def status_of(exc: BaseException) -> str | None:
    """The HAILO_* status behind an exception: from the exception class, the numeric status of
    the C++ exception it was raised from, or a status name in a message."""
    for link in _chain(exc):
        if isinstance(link, CheckError):
            return link.status
        name = STATUS_OF_CLASS.get(type(link).__name__)
        if name:
            return name
        if type(link).__name__ == "HailoRTStatusException" and link.args:
            name = _status_from_code(link.args[0])
            if name:
                return name
        found = STATUS_NAME.search(str(link))
        if found:
            return found.group(0)
    return None


def classify(exc: BaseException) -> dict[str, Any]:
    status = status_of(exc)
    if isinstance(exc, CheckError):
        error_class = exc.error_class
    else:
        error_class = "transient" if status in TRANSIENT_STATUSES else "deterministic"
    message = f"{type(exc).__name__}: {exc}".strip()
    causes = [f"{type(c).__name__}: {c}" for c in _chain(exc)[1:]]
    if causes:
        message += " (from " + "; ".join(causes) + ")"
    return {"class": error_class, "status": status, "message": message}


def fail(exc: BaseException) -> int:
    error = classify(exc)
    emit({"error": error})
    return EXIT_TRANSIENT if error["class"] == "transient" else EXIT_DETERMINISTIC


# -- versions --------------------------------------------------------------------------------

def release(text: str) -> str | None:
    found = VERSION.search(str(text))
    return ".".join(found.groups()) if found else None


def read_versions() -> dict[str, Any]:
    import hailo_platform
    from hailo_platform import Device

    devices = [str(d) for d in Device.scan()]
    raw: dict[str, str] = {}
    for device_id in devices:
        device = Device(device_id)
        try:
            raw[device_id] = str(device.control.identify().firmware_version)
        finally:
            device.release()
    firmware = sorted({release(v) or v for v in raw.values()})
    return {"hailort": str(hailo_platform.__version__),
            "firmware": firmware[0] if len(firmware) == 1 else (firmware or None),
            "devices": devices, "firmware_by_device": raw}


def check_versions(found: dict[str, Any], expect: dict[str, str] | None) -> None:
    if not found["devices"]:
        raise CheckError("no Hailo device found (Device.scan() is empty)")
    runtime, firmware = release(found["hailort"]), found["firmware"]
    if not isinstance(firmware, str):
        raise CheckError(f"devices run different firmware: {found['firmware_by_device']}")
    if runtime is None or runtime.split(".")[:2] != firmware.split(".")[:2]:
        raise CheckError(f"HailoRT {found['hailort']} and device firmware {firmware} are not "
                         "the same release (runtime, firmware and compiler must match)")
    for key, want in (expect or {}).items():
        have = runtime if key == "hailort" else firmware if key == "firmware" else None
        if have is not None and want and have != release(want):
            raise CheckError(f"{key} is {have} on the device host; the build pins {want}")


# -- audit -----------------------------------------------------------------------------------

def _resource(hef: Any, name: str) -> bytes | None:
    """An external resource attached to the HEF (the DFC's add_external_file), or None.
    HEF._get_external_resources is the binding's own, underscore-named accessor."""
    getter = getattr(hef, "_get_external_resources", None)
    if getter is None:
        raise CheckError("this hailo_platform has no HEF._get_external_resources: cannot read "
                         f"the HEF's {name}")
    try:
        data = getter(name)
    except Exception as exc:  # noqa: BLE001 - absence is reported as a problem by the caller
        if status_of(exc) in TRANSIENT_STATUSES:
            raise
        return None
    return bytes(data) if data is not None else None


def audit(hef_path: str) -> dict[str, Any]:
    from hailo_platform import HEF

    hef = HEF(hef_path)
    problems: list[str] = []
    groups = [str(g) for g in hef.get_network_group_names()]
    scopes = {g[: -len(s)] for g in groups for s in GROUP_SUFFIXES if g.endswith(s)}
    scope = next(iter(scopes)) if len(scopes) == 1 else None
    if scope is None or sorted(groups) != sorted(f"{scope}{s}" for s in GROUP_SUFFIXES):
        problems.append(f"network groups {groups}: expected exactly <scope>__prefill and "
                        "<scope>__tbt")
    inputs = []
    for group in groups:
        for info in hef.get_input_vstream_infos(group):
            inputs.append({"group": group, "name": str(info.name),
                           "shape": [int(d) for d in info.shape]})
    names = getattr(hef, "_get_external_resource_names", None)
    resources = sorted(str(n) for n in names()) if names is not None else None
    raw = _resource(hef, CONFIG_RESOURCE)
    config: dict[str, Any] = {}
    if raw is None:
        problems.append(f"no {CONFIG_RESOURCE} attached to the HEF")
    else:
        try:
            config = json.loads(raw)
        except ValueError as exc:
            problems.append(f"{CONFIG_RESOURCE} is not JSON: {exc}")
    if config:
        problems += config_problems(config, groups, inputs, scope)
    if resources is not None and TOKENIZER_RESOURCE not in resources:
        problems.append(f"no {TOKENIZER_RESOURCE} attached to the HEF")
    return {"ok": not problems, "problems": problems, "network_groups": groups,
            "inputs": inputs, "config": config, "resources": resources}


def config_problems(config: dict[str, Any], groups: list[str], inputs: list[dict],
                    scope: str | None) -> list[str]:
    problems = []
    pre = config.get("pre_process_params")
    if not isinstance(pre, dict):
        return ["hailo-config.json has no pre_process_params"]
    value = pre.get(PREFILL_KEY)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        problems.append(f"pre_process_params.{PREFILL_KEY} is {value!r}: the server reads this "
                        "exact key (a missing key falls back to 96)")
    near = sorted(k for k in pre if k != PREFILL_KEY and k.startswith("prefill_input_tokens"))
    if near:
        problems.append(f"pre_process_params has {near}: the server ignores them; the key is "
                        f"{PREFILL_KEY}")
    kv = pre.get("kv_cache_size")
    if isinstance(value, int) and isinstance(kv, int) and value > kv:
        problems.append(f"{PREFILL_KEY} {value} > kv_cache_size {kv}")
    if scope is not None and config.get("model_name") not in (None, scope):
        problems.append(f"model_name {config.get('model_name')!r} != network scope {scope!r}")
    suffixes = config.get("input_layers_names_suffixes")
    if not isinstance(suffixes, dict) or sorted(suffixes) != sorted(INPUT_ROLES.values()):
        problems.append(f"input_layers_names_suffixes {suffixes!r}: expected the six roles "
                        f"{sorted(INPUT_ROLES.values())}")
        return problems
    for group in groups:
        present = {i["name"] for i in inputs if i["group"] == group}
        missing = sorted(f"{group}/{s}" for s in suffixes.values()
                         if f"{group}/{s}" not in present)
        if missing:
            problems.append(f"{group} lacks the inputs {missing} named in hailo-config.json")
    return problems


# -- generate --------------------------------------------------------------------------------

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


# -- CLI -------------------------------------------------------------------------------------

USAGE = ("usage: device_check.py versions | audit HEF | generate HEF REQUEST_JSON")


def main(argv: list[str]) -> int:
    _claim_stdout()
    commands = {"versions": 0, "audit": 1, "generate": 2}
    if len(argv) < 1 or argv[0] not in commands or len(argv) - 1 != commands[argv[0]]:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    try:
        if argv[0] == "versions":
            emit(read_versions())
        elif argv[0] == "audit":
            emit(audit(argv[1]))
        else:
            emit(generate(argv[1], argv[2]))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one classified JSON line
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
