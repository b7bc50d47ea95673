"""verify (hailo10h): run the compiled HEF on a Hailo-10H and compare it with the float reference.

Runs in doit's own python on the build host and reaches the device through `common.device`
(`action["device"]`: kind ssh|local, host, user, port, key_file, host_key or known_hosts,
interpreter, remote_dir, pins {hailort, firmware}, retry {attempts, backoff, attempt_timeout}).
A device host that does not present the declared host key gets nothing: the stage fails on the
first connection with one line, never retried. On the device host every step is one fresh
`python device_check.py ...` process (protocol in `hailo/device_check.py`):

1. audit   the HEF alone, before any device time (here when hailo_platform is importable here,
           else on the device host): exactly `<scope>__prefill` and `<scope>__tbt`, six inputs,
           `prefill_input_tokens_count` in the config (a `_size` key is silently ignored);
2. copy    the HEF by content digest to `<remote_dir>/<sha256>/model.hef` (skipped when that file
           is there and its remote sha256sum matches), plus device_check.py and the npz;
3. versions  HailoRT and firmware must equal the toolchain's pins, else one line, no retry;
4. generate  one attempt = one fresh process under the attempt timeout; only the transient class
           (exit 3, a timeout, a lost ssh connection) is retried, with exponential backoff and
           jitter; deterministic errors (exit 4) are not;
5. compare   every prompt with reference.json (`common.compare`), plus the prefill cosine of the
           device's last-position logits against hf_reference.npz when prefill_check is on.

`report.json` holds every figure, the texts, the attempts and the device versions (never the
host name). On any failure the device's own logs (`hailortcli logs ...`, the client's
hailort.log) are copied into the stage log and the first line containing `CHECK` is quoted in
the one-line error.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.compare import NEAR_TIE, compare_generations, judge
from common.device import Completed, HostKeyError, Transport, TransportError, open_transport

CHECK_SCRIPT = Path(__file__).resolve().parent / "device_check.py"
TRANSIENT_EXIT, DETERMINISTIC_EXIT = 3, 4
UTILITY_TIMEOUT_S = 120.0
DEVICE_LOGS = ("runtime", "system_control", "nnc")
FAKE_WARNING = ("WARNING: the device answered as the FAKE hailo_platform test double: "
                "these figures are not a real device result")


class DeviceFailure(Exception):
    """A failure on the device side: logs are fetched before the stage fails."""


@dataclass(frozen=True)
class Retry:
    attempts: int
    backoff: float
    attempt_timeout: float

    def delay(self, failed: int, rng: random.Random) -> float:
        """Before attempt failed+1: backoff * 2^(failed-1), plus up to 25 % jitter."""
        base = self.backoff * 2 ** (failed - 1)
        return base + rng.uniform(0, base / 4)


@dataclass
class Outcome:
    """What one device_check call ended with."""

    kind: str  # ok | transient | deterministic
    data: dict[str, Any]
    message: str


@dataclass
class Device:
    transport: Transport
    python: str
    root: str  # absolute remote_dir
    retry: Retry
    sleep: Any = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    fake: bool = False
    attempts_log: list[dict[str, Any]] = field(default_factory=list)
    workdir: str | None = None  # where the last device_check ran (its hailort.log)

    def remote(self, *parts: str) -> str:
        return "/".join((self.root, *parts))


# -- device_check calls ------------------------------------------------------------------


def classify(done: Completed) -> Outcome:
    """Sort one device_check result into ok / transient / deterministic."""
    data = last_json(done.stdout)
    error = data.get("error") if isinstance(data.get("error"), dict) else None
    if done.timed_out:
        return Outcome("transient", data, f"timed out after {done.seconds:.0f} s (killed)")
    if error is not None:
        kind = "transient" if error.get("class") == "transient" else "deterministic"
        if done.code == DETERMINISTIC_EXIT:
            kind = "deterministic"
        return Outcome(kind, data, f"{error.get('status', '?')}: {error.get('message', '')}")
    if done.code == TRANSIENT_EXIT:
        return Outcome("transient", data, f"exit 3: {tail(done)}")
    if done.code != 0 or not data:
        return Outcome("deterministic", data, f"exit {done.code}: {tail(done)}")
    return Outcome("ok", data, "ok")


def last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def tail(done: Completed) -> str:
    lines = [x for x in (done.stderr + "\n" + done.stdout).splitlines() if x.strip()]
    return lines[-1].strip() if lines else "no output"


def call(dev: Device, label: str, args: list[str], cwd: str | None = None) -> Outcome:
    """device_check with retries of the transient class; every attempt logged."""
    argv = [dev.python, dev.remote("device_check.py"), *args]
    cwd = cwd or dev.root  # the client's hailort.log lands in its working directory
    dev.workdir = cwd
    outcome = Outcome("transient", {}, "not run")
    for number in range(1, dev.retry.attempts + 1):
        delay = dev.retry.delay(number - 1, dev.rng) if number > 1 else 0.0
        if delay:
            dev.sleep(delay)
        outcome = attempt(dev, argv, cwd)
        dev.attempts_log.append({"step": label, "attempt": number, "delay_s": round(delay, 2),
                                 "outcome": outcome.kind, "message": outcome.message})
        print(f"[device] {label} attempt {number}/{dev.retry.attempts} after {delay:.2f} s: "
              f"{outcome.kind} ({outcome.message})", flush=True)
        if outcome.data.get("fake"):
            dev.fake = True
        if outcome.kind != "transient":
            break
    return outcome


def attempt(dev: Device, argv: list[str], cwd: str | None) -> Outcome:
    try:
        done = dev.transport.run(argv, dev.retry.attempt_timeout, cwd=cwd)
    except HostKeyError:  # not the declared host: no retry would change that
        raise
    except TransportError as exc:  # the connection itself: worth another fresh attempt
        print(f"[device] {exc}")
        return Outcome("transient", {}, "ssh connection failed (see the stage log)")
    for line in done.stderr.splitlines()[-20:]:
        print(f"[device stderr] {line}")
    return classify(done)


def require_ok(outcome: Outcome, what: str) -> dict[str, Any]:
    if outcome.kind == "ok":
        return outcome.data
    retried = " (transient, retries exhausted)" if outcome.kind == "transient" else ""
    raise DeviceFailure(f"{what} failed{retried}: {outcome.message}")


# -- files on the device host --------------------------------------------------------------


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def ensure_file(dev: Device, local: Path, remote: str, digest: str) -> None:
    """Copy unless the remote file is there with this sha256 (checked with sha256sum)."""
    t = dev.transport
    if t.exists(remote):
        done = t.run(["sha256sum", remote], UTILITY_TIMEOUT_S)
        if done.code == 0 and done.stdout.split()[:1] == [digest]:
            print(f"[device] already there, sha256 verified: {remote} ({local.name})")
            return
        print(f"[device] {remote} does not match sha256 {digest[:12]}: copying again")
    t.put(local, remote)
    done = t.run(["sha256sum", remote], UTILITY_TIMEOUT_S)
    if done.code != 0 or done.stdout.split()[:1] != [digest]:
        raise DeviceFailure(f"copy of {local.name} to the device host is corrupt "
                            f"(sha256sum: {tail(done)})")
    print(f"[device] uploaded {local.name} ({local.stat().st_size} bytes) -> {remote}")


def stage_files(dev: Device, hef: Path, npz: Path | None) -> dict[str, str]:
    hef_sha = sha256(hef)
    paths = {"hef_sha256": hef_sha, "hef": dev.remote(hef_sha, "model.hef")}
    ensure_file(dev, CHECK_SCRIPT, dev.remote("device_check.py"), sha256(CHECK_SCRIPT))
    ensure_file(dev, hef, paths["hef"], hef_sha)
    if npz is not None:
        npz_sha = sha256(npz)
        paths["npz"] = dev.remote(npz_sha, "hf_reference.npz")
        ensure_file(dev, npz, paths["npz"], npz_sha)
    return paths


# -- steps -------------------------------------------------------------------------------------


def audit(dev: Device, hef: Path, remote_hef: str) -> dict[str, Any]:
    """Static HEF audit; here when hailo_platform is importable here, else on the device host."""
    if importlib.util.find_spec("hailo_platform") is not None:
        print("[audit] hailo_platform is importable here: auditing the HEF locally")
        done = local_check(["audit", str(hef)])
        data = require_ok(classify(done), "HEF audit")
    else:
        data = require_ok(call(dev, "audit", ["audit", remote_hef]), "HEF audit")
    dev.fake = dev.fake or bool(data.get("fake"))
    return data


def local_check(args: list[str]) -> Completed:
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(CHECK_SCRIPT), *args], capture_output=True,
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


# -- comparison and report ---------------------------------------------------------------


def basis(ref: dict[str, Any], gen: dict[str, Any], encode: Any) -> tuple[str, list, list]:
    """What to compare. The genai API streams text, not ids: device_check re-tokenizes each
    piece, exact when every piece gave one id. Otherwise both sides are compared as their
    text re-tokenized by the HEF's tokenizer (same generation -> same text -> same ids)."""
    device_ids = list(gen.get("token_ids") or [])
    if gen.get("token_ids_exact", True) or encode is None or "retokenized_ids" not in gen:
        return "token_ids", list(ref["token_ids"]), device_ids
    return "retokenized_text", encode(ref["text"]), list(gen["retokenized_ids"])


def divergence_margin(ref: dict[str, Any], first: int | None, how: str,
                      near_tie: float) -> tuple[float | None, bool]:
    """The float32 top-1/top-2 margin where the device first differed (reference.json keeps
    one per generated token); only when positions are the reference's token positions."""
    margins = ref.get("margins") or []
    if how != "token_ids" or first is None or first >= len(margins):
        return None, False
    return margins[first], margins[first] < near_tie


def compare_prompt(ref: dict[str, Any], gen: dict[str, Any], min_agreement: float,
                   encode: Any = None, near_tie: float = NEAR_TIE) -> dict:
    """The cpu-ort report's row shape, with what the device API allows: free-running text
    (no logits along the continuation, so no teacher-forced figures)."""
    how, ref_ids, dev_ids = basis(ref, gen, encode)
    cmp = compare_generations(ref_ids, dev_ids)
    passed, reason = judge(cmp, min_agreement)
    margin, tie = divergence_margin(ref, cmp["first_divergence"], how, near_tie)
    return {
        "prompt": ref["prompt"],
        "sent": ref.get("formatted"),
        "prompt_ids": ref.get("prompt_ids"),
        "compared": how,
        "reference_ids": ref_ids,
        "device_ids": dev_ids,
        "reference_text": ref["text"],
        "device_text": gen.get("text", ""),
        "agreement": round_sig(cmp["agreement"]),
        "first_divergence": cmp["first_divergence"],
        "first_divergence_margin": margin,
        "near_tie": tie,
        "reference_degenerate": cmp["reference_degenerate"],
        "device_degenerate": cmp["candidate_degenerate"],
        "device_ids_exact": gen.get("token_ids_exact"),
        "device_stop": gen.get("stop"),
        "passed": passed,
        "reason": reason,
    }


def compare_all(reference: dict[str, Any], result: dict[str, Any], min_agreement: float,
                encode: Any = None, near_tie: float = NEAR_TIE):
    """Generations come back in request order (a prompt went as a one-message conversation)."""
    generations = list(result.get("generations") or [])
    if len(generations) != len(reference["prompts"]):
        raise DeviceFailure(f"the device returned {len(generations)} generations for "
                            f"{len(reference['prompts'])} prompts")
    return [compare_prompt(ref, gen, min_agreement, encode, near_tie)
            for ref, gen in zip(reference["prompts"], generations, strict=True)]


def encoder(export: Path) -> Any:
    """The HEF's tokenizer (export/tokenizer/tokenizer.json), no special tokens added."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(export / "tokenizer" / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def prefill_figures(npz: Path, logits: Any, cosine_min: float,
                    why_not: str | None = None) -> dict[str, Any]:
    """Cosine of the device's last-position prefill logits vs HF's. When the device check
    could not drive the prefill group (e.g. it is compiled for fewer tokens than the
    reference), the check is reported as skipped with its reason, not failed."""
    import numpy as np

    if logits is None:
        return {"cosine": None, "passed": None, "skipped": True,
                "reason": f"skipped: {why_not or 'the device check returned no prefill logits'}"}
    ref = np.load(npz)["last_logits"].astype(np.float64).ravel()
    dev = np.asarray(logits, dtype=np.float64).ravel()
    if dev.shape != ref.shape:
        return {"cosine": None, "passed": False,
                "reason": f"prefill logits of shape {dev.shape}, reference {ref.shape}"}
    cosine = float(ref @ dev / (np.linalg.norm(ref) * np.linalg.norm(dev) or 1.0))
    passed = cosine >= cosine_min
    return {"cosine": round_sig(cosine), "same_argmax": int(ref.argmax()) == int(dev.argmax()),
            "passed": passed,
            "reason": "ok" if passed else f"cosine {cosine:.4g} < prefill_cosine_min {cosine_min}"}


def summarize(rows: list[dict[str, Any]], prefill: dict[str, Any] | None, fake: bool) -> None:
    for r in rows:
        mark = "PASS" if r["passed"] else "FAIL"
        print(f"[{mark}] agreement {r['agreement']:.3f} div@{r['first_divergence']} "
              f"{r['prompt']!r}")
        print(f"    ref   : {r['reference_text']!r}")
        print(f"    device: {r['device_text']!r}")
        print(f"    {r['reason']}")
    if prefill is not None:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[prefill["passed"]]
        print(f"[{mark}] prefill cosine {prefill['cosine']}: {prefill['reason']}")
    print(f"{sum(r['passed'] for r in rows)}/{len(rows)} prompts passed")
    if fake:
        print(FAKE_WARNING)


def worst_line(rows: list[dict[str, Any]], prefill: dict[str, Any] | None) -> str | None:
    failing = [r for r in rows if not r["passed"]]
    if failing:
        bad = min(failing, key=lambda r: r["agreement"])
        return f"verify failed: worst prompt {bad['prompt']!r}: {bad['reason']}"
    if prefill is not None and prefill["passed"] is False:
        return f"verify failed: prefill check: {prefill['reason']}"
    return None


# -- device logs -------------------------------------------------------------------------------


def fetch_device_logs(dev: Device) -> str | None:
    """Copy the device's own logs into the stage log; return the first line with CHECK."""
    print("---- device logs (fetched because the check failed) ----")
    texts = []
    for which in DEVICE_LOGS:
        texts.append(show(dev, f"hailortcli logs {which}", ["hailortcli", "logs", which]))
    if dev.workdir:
        log = f"{dev.workdir}/hailort.log"
        texts.append(show(dev, log, ["cat", log]))
    print("---- end of device logs ----")
    return next((line.strip() for text in texts for line in text.splitlines()
                 if "CHECK" in line), None)


def show(dev: Device, title: str, argv: list[str]) -> str:
    try:
        done = dev.transport.run(argv, UTILITY_TIMEOUT_S)
    except TransportError as exc:
        print(f"== {title}: unavailable ({exc})")
        return ""
    if done.code == 127:
        print(f"== {title}: command not found on the device host")
        return ""
    print(f"== {title} (exit {done.code})")
    text = done.stdout + done.stderr
    print(text.rstrip() or "(empty)")
    return text


# -- main ----------------------------------------------------------------------------------------


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


def run(action, dev: Device, device: dict[str, Any], params: dict[str, Any], hef: Path,
        npz: Path | None, reference: dict[str, Any], run_config: dict[str, Any],
        work: Path) -> str | None:
    """Every step; the one-line failure, or None when the device check passed."""
    export = action.input_dir("export")
    report: dict[str, Any] = {"model": action.model, "target": action.target, **params}
    try:
        remote_dir = str(device.get("remote_dir") or ".cache/hefbuild-device")
        dev.root = remote_dir if remote_dir.startswith("/") else \
            f"{dev.transport.home()}/{remote_dir}"
        files = stage_files(dev, hef, npz)
        report["hef_sha256"] = files["hef_sha256"]
        problems = audit_problems(audit(dev, hef, files["hef"]), run_config)
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
