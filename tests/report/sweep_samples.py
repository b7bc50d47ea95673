"""A hand-written build/ of a recipe sweep: tiny-llama and two variants, @int4 (its verify
FAILED) and @qdq (passed), with the parameters each declares; and three models with nothing
in build/, each for another reason (never asked for, held back by its declarations, a
stage that failed before it left a log)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hefbuild.report.content import chains_of

from .samples import CPU_STAGES, T0, cpu_report, event, manifest, summary, write

BASE, INT4, QDQ = "tiny-llama", "tiny-llama@int4", "tiny-llama@qdq"
SWEEP = (BASE, INT4, QDQ)
METHODS = {BASE: "weight_only_int8", INT4: "weight_only_int4", QDQ: "static_qdq"}
SAMPLES = {BASE: 32, INT4: 32, QDQ: 16}
HELD = ("manual: a hub model, needs `doit lock:hub` where the hub is reachable",
        "not locked: its source is not pinned to a commit and file digests (`doit lock:hub`)")
MISMATCH = ("toolchain/host.toml: packages.torch: version 2.5.1 required, 2.4.0 installed in "
            "python3 (install it, or run the stage in another toolchain)")


def params(model: str) -> dict[str, dict[str, Any]]:
    return {"quantize": {"method": METHODS[model], "block_size": 32, "samples": SAMPLES[model],
                         "op_types": ["MatMul", "Gemm"]},
            "verify": {"prompts": ["Once upon a time"], "max_new_tokens": 16}}


def sweep_chains() -> dict:
    chains = chains_of({m: "cpu-ort" for m in (*SWEEP, "never", "hub", "blocked")})
    chains = {m: replace(c, params=params(m)) if m in SWEEP else c for m, c in chains.items()}
    chains["hub"] = replace(chains["hub"], held_back=HELD)
    return chains


def _keys(model: str) -> dict[str, int]:
    """Keys by stage: fetch and export shared by every column, the rest per variant."""
    offset = SWEEP.index(model) * 10
    return {s: i + 1 if s in ("fetch", "export") else 100 + offset + i
            for i, s in enumerate(CPU_STAGES)}


def write_sweep(root: Path) -> Path:
    build = root / "build"
    lines = []
    for model in SWEEP:
        keys = _keys(model)
        for i, stage in enumerate(CPU_STAGES):
            failed = model == INT4 and stage == "verify"
            outcome = "restored" if model != BASE and stage in ("fetch", "export") else "built"
            lines.append(event(f"{stage}:{model}", keys[stage], "failed" if failed else outcome,
                               1.0 + i, T0 + 10 * len(lines)))
            if not failed:
                write(build / model / stage / "manifest.json",
                      manifest(f"{stage}:{model}", keys[stage], outcome, 1.0 + i))
        report = {**cpu_report(passed=model != INT4), "model": model, "method": METHODS[model]}
        if model == INT4:
            (build / model / "verify.failed.log").write_text("gate failed\n")
            write(build / model / "verify.failed" / "report.json", report)
        else:
            write(build / model / "verify" / "report.json", report)
    lines.append(event("fetch:blocked", 50, "failed", 3.0, T0 + 500, error=MISMATCH))
    lines.append(summary(T0 + 510, [], built=11, restored=4, failed=2))
    (build / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    return root
