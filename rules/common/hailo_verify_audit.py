"""hailo10h verify's static HEF audit, before any device time: device_check's `audit` (here
when hailo_platform is importable here, else on the device host), and our own reading of its
answer: exactly `<scope>__prefill` and `<scope>__tbt`, six inputs each,
`prefill_input_tokens_count` in the config (a `_size` key is silently ignored)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common.device import Completed
from common.hailo_verify_retry import UTILITY_TIMEOUT_S, Device, call, classify, require_ok


def audit(dev: Device, script: Path, hef: Path, remote_hef: str) -> dict[str, Any]:
    """Static HEF audit by `script` (device_check.py); here when hailo_platform is importable
    here, else on the device host."""
    if importlib.util.find_spec("hailo_platform") is not None:
        print("[audit] hailo_platform is importable here: auditing the HEF locally")
        done = local_check(script, ["audit", str(hef)])
        data = require_ok(classify(done), "HEF audit")
    else:
        data = require_ok(call(dev, "audit", ["audit", remote_hef]), "HEF audit")
    dev.fake = dev.fake or bool(data.get("fake"))
    return data


def local_check(script: Path, args: list[str]) -> Completed:
    """device_check run here, as the device host would run it."""
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                              text=True, timeout=UTILITY_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        return Completed(-9, str(exc.stdout or ""), "", UTILITY_TIMEOUT_S, timed_out=True)
    return Completed(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def audit_problems(data: dict[str, Any], run_config: dict[str, Any]) -> list[str]:
    """Our own reading of the audit, on top of the device_check's `problems`."""
    problems = [str(p) for p in data.get("problems") or []]
    scope = run_config.get("scope", "model")
    groups = sorted(str(g) for g in data.get("network_groups") or [])
    wanted = sorted([f"{scope}__prefill", f"{scope}__tbt"])
    if groups != wanted:
        problems.append(f"network groups {groups}, expected exactly {wanted}")
    pre = (data.get("config") or {}).get("pre_process_params") or {}
    count = pre.get("prefill_input_tokens_count")
    if count is None:
        problems.append(f"hailo-config.json pre_process_params lacks prefill_input_tokens_count "
                        f"(keys {sorted(pre)}; the server falls back to 96)")
    elif int(count) != int(run_config.get("prefill_size", -1)):
        problems.append(f"prefill_input_tokens_count {count} != export prefill_size "
                        f"{run_config.get('prefill_size')}")
    for group, names in input_lists(data.get("inputs")).items():
        if len(names) != 6:
            problems.append(f"{group}: {len(names)} inputs, expected 6")
    if data.get("ok") is False and not problems:
        problems.append("device_check reports the HEF as not ok")
    return list(dict.fromkeys(problems))


def input_lists(inputs: Any) -> dict[str, list[Any]]:
    """Inputs per network group: from [{"group", "name", ...}] or {group: [...]}."""
    if isinstance(inputs, dict):
        return {str(k): list(v) for k, v in inputs.items() if isinstance(v, list | dict)}
    groups: dict[str, list[Any]] = {}
    for item in inputs if isinstance(inputs, list) else []:
        group = item.get("group", "HEF") if isinstance(item, dict) else "HEF"
        groups.setdefault(str(group), []).append(item)
    return groups
