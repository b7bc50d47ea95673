"""verify (hailo10h): run the compiled HEF on a Hailo-10H and compare it with the float reference.

Runs in doit's own python on the build host and reaches the device through `common.device`
(`action["device"]`: kind ssh|local, host, user, port, key_file, host_key or known_hosts,
interpreter, remote_dir, pins {hailort, firmware}, retry {attempts, backoff, attempt_timeout}).
A device host that does not present the declared host key gets nothing: the stage fails on the
first connection with one line, never retried. On the device host every step is one fresh
`python device_check.py ...` process (protocol in `hailo/device_check.py`). The steps, with the
`common.hailo_verify_*` module of each:

1. audit   (`_audit`) the HEF alone, before any device time (here when hailo_platform is
           importable here, else on the device host): exactly `<scope>__prefill` and
           `<scope>__tbt`, six inputs, `prefill_input_tokens_count` in the config (a `_size` key
           is silently ignored);
2. copy    (`_files`) the HEF by content digest to `<remote_dir>/<sha256>/model.hef` (skipped
           when that file is there and its remote sha256sum matches), plus device_check.py with
           its `device_check_*.py` modules (`DEVICE_FILES`) and the npz;
3. versions  HailoRT and firmware must equal the toolchain's pins, else one line, no retry;
4. generate  (`_retry`) one attempt = one fresh process under the attempt timeout; only the
           transient class (exit 3, a timeout, a lost ssh connection) is retried, with
           exponential backoff and jitter; deterministic errors (exit 4) are not;
5. compare   (`_compare`) every prompt with reference.json (`common.compare`), plus the prefill
           cosine of the device's last-position logits against hf_reference.npz when
           prefill_check is on.

`report.json` holds every figure, the texts, the attempts and the device versions (never the
host name). On any failure the device's own logs (`hailortcli logs ...`, the client's
hailort.log; `_logs`) are copied into the stage log and the first line containing `CHECK` is
quoted in the one-line error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action, round_sig, write_json
from common.compare import NEAR_TIE
from common.device import HostKeyError, TransportError, open_transport
from common.hailo_verify_audit import audit, audit_problems
from common.hailo_verify_compare import (
    FAKE_WARNING,
    compare_all,
    encoder,
    prefill_figures,
    summarize,
    worst_line,
)
from common.hailo_verify_files import ensure_file, sha256
from common.hailo_verify_logs import fetch_device_logs
from common.hailo_verify_retry import Device, DeviceFailure, Retry, call, require_ok

CHECK_DIR = Path(__file__).resolve().parent
CHECK_SCRIPT = CHECK_DIR / "device_check.py"
# device_check.py and the modules it imports, copied side by side to remote_dir; the stage
# declares the same files as its `code` (targets/hailo10h.toml), so they are in its key.
DEVICE_FILES = ("device_check.py", "device_check_errors.py", "device_check_versions.py",
                "device_check_audit.py", "device_check_generate.py")


def stage_files(dev: Device, hef: Path, npz: Path | None) -> dict[str, str]:
    """device_check's files, the HEF and the npz on the device host, by content digest."""
    hef_sha = sha256(hef)
    paths = {"hef_sha256": hef_sha, "hef": dev.remote(hef_sha, "model.hef")}
    for name in DEVICE_FILES:
        ensure_file(dev, CHECK_DIR / name, dev.remote(name), sha256(CHECK_DIR / name))
    ensure_file(dev, hef, paths["hef"], hef_sha)
    if npz is not None:
        npz_sha = sha256(npz)
        paths["npz"] = dev.remote(npz_sha, "hf_reference.npz")
        ensure_file(dev, npz, paths["npz"], npz_sha)
    return paths


def versions(dev: Device, pins: dict[str, str]) -> dict[str, Any]:
    data = require_ok(call(dev, "versions", ["versions"]), "device versions")
    found = {k: str(data.get(k)) for k in ("hailort", "firmware")}
    wrong = [f"{k} {found[k]} (pinned {pins[k]})" for k in ("hailort", "firmware")
             if found[k] != str(pins[k])]
    if wrong:
        raise DeviceFailure(f"device version mismatch: {', '.join(wrong)}; the HEF was compiled "
                            f"for the pinned release; no generation was run")
    return {**found, "devices": len(data.get("devices") or [])}


def conversation(prompt: str) -> list[dict[str, str]]:
    """One user message: the server applies the HEF's chat template (BOS included), as
    hailo/reference.py formatted the reference run."""
    return [{"role": "user", "content": prompt}]


def generate(dev: Device, files: dict[str, str], params: dict[str, Any],
             reference: dict[str, Any], work: Path, pins: dict[str, str]) -> dict[str, Any]:
    request = {"prompts": [conversation(p["prompt"]) for p in reference["prompts"]],
               "max_new_tokens": int(reference["max_new_tokens"]), "seed": params["seed"],
               "prefill": {"npz": files.get("npz")}, "expect_versions": dict(pins)}
    local = work / "request.json"
    write_json(local, request)
    run_dir = dev.remote(files["hef_sha256"], "runs", sha256(local)[:16])
    remote_request = f"{run_dir}/request.json"
    dev.transport.put(local, remote_request)
    outcome = call(dev, "generate", ["generate", files["hef"], remote_request], cwd=run_dir)
    return require_ok(outcome, "generation")


NOT_MEASURED = ("teacher-forced agreement and logit cosine: the device API returns generated "
                "text, not logits along the continuation")


def read_params(raw: dict[str, Any]) -> dict[str, Any]:
    params = {
        "min_token_agreement": float(raw.get("min_token_agreement", 0.5)),
        "seed": int(raw.get("seed", 0)),
        "prefill_check": bool(raw.get("prefill_check", True)),
        "prefill_cosine_min": float(raw.get("prefill_cosine_min", 0.9)),
        "near_tie": float(raw.get("near_tie", NEAR_TIE)),
    }
    if not 0.0 <= params["min_token_agreement"] <= 1.0:
        fail(f"verify: params.min_token_agreement {params['min_token_agreement']} not in [0, 1]")
    return params


def device_of(action_file: str) -> dict[str, Any]:
    raw = json.loads(Path(action_file).read_text(encoding="utf-8"))
    device = raw.get("device")
    if not isinstance(device, dict):
        fail("verify: the action names no device (the stage's toolchain must be a device one)")
    return device


def retry_of(device: dict[str, Any]) -> Retry:
    r = device.get("retry") or {}
    return Retry(int(r.get("attempts", 3)), float(r.get("backoff", 2.0)),
                 float(r.get("attempt_timeout", 600.0)))


def main() -> None:
    action = load_action(sys.argv)
    device = device_of(sys.argv[1])
    params = read_params(action.params)
    export, work = action.input_dir("export"), Path.cwd()
    hef = action.input_dir("compile") / "model.hef"
    reference = json.loads((action.input_dir("reference") / "reference.json").read_text())
    run_config = json.loads((export / "run_config.json").read_text())
    npz = export / "hf_reference.npz" if params["prefill_check"] else None
    try:
        transport = open_transport(device, work)
    except TransportError as exc:
        fail(f"verify: {exc}")
    print(f"[device] {device.get('kind')} transport; pins {device.get('pins')}; "
          f"retry {device.get('retry')}")
    dev = Device(transport, str(device.get("interpreter") or "python3"), "", retry_of(device))
    try:
        failure = run(action, dev, device, params, hef, npz, reference, run_config, work)
    finally:
        for line in transport.log:
            print(f"[transport] {line}")
        transport.close()
    if failure is not None:
        fail(failure)  # the stage log's last line
    check_outputs(action)


def run(action: Action, dev: Device, device: dict[str, Any], params: dict[str, Any], hef: Path,
        npz: Path | None, reference: dict[str, Any], run_config: dict[str, Any],
        work: Path) -> str | None:
    """Every step; the one-line failure, or None when the device check passed."""
    export = action.input_dir("export")
    # The same report shape as every target's check; what a device cannot measure is null.
    report: dict[str, Any] = {"model": action.model, "target": action.target, **params,
                              "gate": "free_running", "mean_teacher_forced_agreement": None,
                              "mean_logit_cosine": None, "not_measured": NOT_MEASURED}
    try:
        remote_dir = str(device.get("remote_dir") or ".cache/hefbuild-device")
        dev.root = remote_dir if remote_dir.startswith("/") else \
            f"{dev.transport.home()}/{remote_dir}"
        files = stage_files(dev, hef, npz)
        report["hef_sha256"] = files["hef_sha256"]
        problems = audit_problems(audit(dev, CHECK_SCRIPT, hef, files["hef"]), run_config)
        if problems:
            raise DeviceFailure(f"HEF audit: {'; '.join(problems)}")
        report["device"] = versions(dev, device.get("pins") or {})
        result = generate(dev, files, params, reference, work, device.get("pins") or {})
    except HostKeyError as exc:  # nothing more is asked of a host that is not the declared one
        return f"verify: {exc}"
    except (DeviceFailure, TransportError) as exc:
        check = fetch_device_logs(dev)
        if dev.fake:
            print(FAKE_WARNING)
        return f"verify: {exc}" + (f"; device log: {check}" if check else "")
    dev.fake = dev.fake or bool(result.get("fake"))
    rows = compare_all(reference, result, params["min_token_agreement"], encoder(export),
                       params["near_tie"])
    prefill = (prefill_figures(npz, result.get("prefill_logits"), params["prefill_cosine_min"],
                               result.get("prefill_error")) if npz is not None else None)
    gen_attempts = [a for a in dev.attempts_log if a["step"] == "generate"]
    report.update({
        "device": {**report["device"], "hailort_client": result.get("hailort"),
                   "fake": dev.fake},
        "attempts": len(gen_attempts),
        "attempt_log": dev.attempts_log,
        "prompts": rows,
        "prefill": prefill,
        "mean_agreement": round_sig(sum(r["agreement"] for r in rows) / len(rows)),
    })
    bad = worst_line(rows, prefill)
    report["passed"] = bad is None
    write_json(action.out / "report.json", report)
    summarize(rows, prefill, dev.fake)
    if bad is not None:
        check = fetch_device_logs(dev)
        return bad + (f"; device log: {check}" if check else "")
    return None


if __name__ == "__main__":
    main()
