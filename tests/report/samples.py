"""A hand-written build/ folder as the engine and the rules leave it: three models, two
invocations in the event log, one failed verify, one check answered by the test double."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hefbuild.report.content import chains_of

CPU_STAGES = ("fetch", "export", "quantize", "compile", "verify")
CHAINS = chains_of({"tiny-llama": "cpu-ort", "tiny-hailo": "hailo10h", "broken": "cpu-ort",
                    "never": "cpu-ort"})
# Figures that appear nowhere else on the page, so a test can find them.
TF_FIRST, FREE_FIRST, TF_SECOND, FREE_SECOND = 0.9375, 0.8125, 0.96875, 0.6875
DEVICE_AGREEMENT = 0.4375
HOSTILE = '<script>alert("x")</script> & <b>bold</b>'


def key(n: int) -> str:
    return f"{n:02x}" * 32


def write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def manifest(task: str, n: int, outcome: str = "built", seconds: float = 1.5,
             peak: float = 100.0) -> dict[str, Any]:
    return {"task": task, "model": task.split(":")[1], "key": key(n), "outcome": outcome,
            "seconds": seconds, "build_seconds": seconds, "peak_rss_mb": peak,
            "cpu_seconds": seconds, "sandbox": "bwrap", "outputs": {}, "description": {}}


def cpu_prompt(prompt: str, tf: float, free: float, reference: str, candidate: str,
               divergence: int | None) -> dict[str, Any]:
    return {"prompt": prompt, "sent": prompt, "teacher_forced_agreement": tf,
            "logit_cosine_mean": 0.9991, "agreement": free, "first_divergence": divergence,
            "first_divergence_margin": 0.2, "near_tie": False, "reference_text": reference,
            "candidate_text": candidate, "passed": True, "reason": "ok"}


def cpu_report(passed: bool = True) -> dict[str, Any]:
    prompts = [cpu_prompt("Once upon a time", TF_FIRST, FREE_FIRST, " there was a fox.",
                          " there was a dog.", 3),
               cpu_prompt(HOSTILE, TF_SECOND, FREE_SECOND, f" said {HOSTILE}", " said hi", 1)]
    return {"model": "tiny-llama", "target": "cpu-ort", "gate": "teacher_forced",
            "method": "weight_only_int8", "min_teacher_forced": 0.9, "min_logit_cosine": 0.99,
            "min_token_agreement": 0.5, "mean_teacher_forced_agreement": 0.953,
            "mean_logit_cosine": 0.9991, "mean_agreement": 0.75, "passed": passed,
            "prompts": prompts}


def device_report() -> dict[str, Any]:
    row = {"prompt": "The children played", "agreement": DEVICE_AGREEMENT,
           "first_divergence": 2, "reference_text": " in the park", "device_text": " in a box",
           "passed": True, "reason": "ok"}
    return {"model": "tiny-hailo", "target": "hailo10h", "min_token_agreement": 0.4,
            "device": {"fake": True, "hailort_client": "5.1.0"}, "prompts": [row],
            "prefill": {"cosine": 0.97, "passed": True}, "prefill_cosine_min": 0.9,
            "mean_agreement": DEVICE_AGREEMENT, "passed": True}


def fidelity_report() -> dict[str, Any]:
    row = {"prompt": "The children played",
           "teacher_forced": {"agreement": 0.875, "mean_cosine": 0.981},
           "free_running": {"agreement": 0.625, "first_divergence": 4}}
    return {"kind": "cpu-emulation", "note": "not the Hailo-10H's numerics",
            "summary": {"mean_teacher_forced": 0.875, "worst_teacher_forced": 0.875,
                        "mean_logit_cosine": 0.981, "worst_prefill_cosine": 0.99,
                        "mean_free_running": 0.625},
            "sensitivity": {"rows": 4, "groups": [
                {"group": "layer 1", "kind": "weights", "bits": "w4", "logit_cosine": 0.97},
                {"group": "lm_head", "kind": "activations", "bits": "a8",
                 "logit_cosine": 0.995}]},
            "proposal": {"needed": True, "reached": True, "all_a16_reaches": True,
                         "proposed": {"lines": [
                "quantization_param([model/conv12, model/conv13], precision_mode=a8_w8)"]}},
            "prompts": [row]}


def event(task: str, n: int | None, outcome: str, seconds: float, unix: float,
          **extra: Any) -> dict[str, Any]:
    import time

    return {"task": task, "key": key(n) if n is not None else None, "outcome": outcome,
            "seconds": seconds, "peak_rss_mb": 50.0, "unix": unix,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix)), **extra}


def summary(unix: float, tasks: list[str], **counts: int) -> dict[str, Any]:
    import time

    return {"summary": {"built": 0, "restored": 0, "remote": 0, "failed": 0, "uptodate": 0,
                        "remote_bytes": 0, "remote_seconds": 0.0, **counts},
            "uptodate": tasks, "unix": unix,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))}


T0 = 1_780_000_000.0


def events() -> list[dict[str, Any]]:
    """Two invocations: everything built; then export of tiny-llama rebuilt, slower (the
    earlier export's result of key 2 is the one in build/ after a restore), broken's verify
    failed."""
    first = [event(f"{s}:tiny-llama", i + 1, "built", 2.0 + i, T0 + 10 * i)
             for i, s in enumerate(CPU_STAGES)]
    first += [event(f"{s}:broken", 20 + i, "built", 1.0, T0 + 60 + i) for i, s in
              enumerate(CPU_STAGES[:-1])]
    first += [event("verify:tiny-hailo", 40, "built", 3.0, T0 + 70)]
    first.append(summary(T0 + 80, [], built=10))
    second = [event("export:tiny-llama", 9, "built", 7.5, T0 + 200),
              event("export:tiny-llama", 2, "restored", 0.1, T0 + 210),
              event("verify:broken", 30, "failed", 4.0, T0 + 220,
                    error="verify:broken: verify gate failed: teacher-forced 0.1 < 0.9")]
    uptodate = [f"{s}:tiny-llama" for s in CPU_STAGES if s != "export"]
    second.append(summary(T0 + 230, uptodate, built=1, restored=1, failed=1, uptodate=4))
    return first + second


def write_build(root: Path) -> Path:
    """The build/ folder under `root`; returns root."""
    build = root / "build"
    for i, stage in enumerate(CPU_STAGES):
        task = f"{stage}:tiny-llama"
        n = 2 if stage == "export" else i + 1
        outcome = "restored" if stage == "export" else "built"
        write(build / "tiny-llama" / stage / "manifest.json",
              manifest(task, n, outcome, seconds=2.0 + i, peak=111.5 + i))
    write(build / "tiny-llama/verify/report.json", cpu_report())
    for i, stage in enumerate(CPU_STAGES[:-1]):
        write(build / "broken" / stage / "manifest.json", manifest(f"{stage}:broken", 20 + i))
    (build / "broken/verify.failed.log").write_text("the rule's whole log\n")
    failed = cpu_report(passed=False)
    failed["model"] = "broken"
    write(build / "broken/verify.failed/report.json", failed)
    write(build / "tiny-hailo/verify/manifest.json", manifest("verify:tiny-hailo", 40))
    write(build / "tiny-hailo/verify/report.json", device_report())
    write(build / "tiny-hailo/fidelity/manifest.json", manifest("fidelity:tiny-hailo", 41))
    write(build / "tiny-hailo/fidelity/fidelity.json", fidelity_report())
    (build / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events()))
    return root
