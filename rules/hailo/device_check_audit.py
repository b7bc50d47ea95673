"""device_check's static HEF audit, no device needed: the network groups, their inputs and the
attached hailo-config.json the genai server reads. Runs on the device host with
device_check.py (or on the build host, when hailo_platform is importable there)."""

from __future__ import annotations

import json
from typing import Any

from device_check_errors import TRANSIENT_STATUSES, CheckError, status_of

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
