"""The hailo10h chain up to `fidelity` on a real checkpoint, for benchmarks/real_model.py.

export, reference and fidelity run for real; parse, resources and optimize run on the DFC
test double (tests/fakes/hailo_sdk_client: its HARs say FAKE and, above 64 MiB of weights,
hold no weights), which is enough for fidelity: it reads optimize's rendered model script
and the HAR's layer names, and emulates the recipe itself on ONNX Runtime. Parameters are
the target's declared defaults with models/smollm2.toml's export sizes; each stage runs as
the engine runs it (scratch cwd, action JSON). Per stage: seconds, peak RSS and output size
against the float32 checkpoint; then fidelity's figures, its costliest weights and the
recipe change it proposes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
CHAIN = ("export", "reference", "parse", "resources", "optimize", "fidelity")
DFC_STAGES = ("parse", "resources", "optimize")
# models/smollm2.toml's sizes: a real model's export, not the tiny models' defaults.
OVERRIDES = {"export": {"seq_len": 128, "prefill_size": 32, "cache_size": 128,
                        "cosine_min": 0.999},
             "reference": {"prompts": ["Once upon a time", "The little cat", "One day, a boy"],
                           "max_new_tokens": 32}}


def declared() -> dict[str, Any]:
    from hefbuild.declare.targets import stage_defs

    return stage_defs(REPO, "hailo10h")


class HailoRunner:
    def __init__(self, root: Path, model: str, checkpoint: Path) -> None:
        self.root, self.model, self.defs = root / "hailo10h", model, declared()
        self.dirs: dict[str, Path] = {"fetch": self.root / "fetch"}
        self.dirs["fetch"].mkdir(parents=True, exist_ok=True)
        link = self.dirs["fetch"] / "checkpoint"
        if not link.exists():
            link.symlink_to(checkpoint.resolve(), target_is_directory=True)

    def params(self, stage: str) -> dict[str, Any]:
        defaults = {k: p.default for k, p in self.defs[stage].params.items()
                    if p.type.name != "FILE"}
        return {**defaults, **OVERRIDES.get(stage, {})}

    def files(self, stage: str) -> dict[str, str]:
        return {k: str(REPO / p.default) for k, p in self.defs[stage].params.items()
                if p.type.name == "FILE" and p.when is None and p.default}

    def run(self, stage: str) -> dict[str, Any]:
        scratch = self.root / f"scratch-{stage}"
        shutil.rmtree(scratch, ignore_errors=True)
        (scratch / "work").mkdir(parents=True)
        action = {"format": 1, "model": self.model, "stage": stage, "target": "hailo10h",
                  "params": self.params(stage), "source": {},
                  "inputs": {u: str(self.dirs[u]) for u in self.defs[stage].inputs},
                  "files": self.files(stage), "out": str(scratch / "out"),
                  "outputs": list(self.defs[stage].outputs)}
        (scratch / "action.json").write_text(json.dumps(action))
        paths = [str(REPO / "rules")] + ([str(REPO / "tests" / "fakes")]
                                          if stage in DFC_STAGES else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "NPY_PROMOTION_STATE": "legacy",
               "CUDA_VISIBLE_DEVICES": "0" if stage in DFC_STAGES else ""}
        start = time.perf_counter()
        with open(scratch / "log.txt", "wb") as log:
            proc = subprocess.Popen([sys.executable, str(REPO / "rules" / self.defs[stage].rule),
                                     str(scratch / "action.json")], cwd=scratch / "work",
                                    env=env, stdout=log, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
        out = scratch / "out"
        self.dirs[stage] = out
        return {"rc": os.waitstatus_to_exitcode(status), "seconds": time.perf_counter() - start,
                "peak_rss_mib": usage.ru_maxrss / 1024, "out": out,
                "bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
                if out.is_dir() else 0,
                "log": (scratch / "log.txt").read_text(errors="replace")}


def bench_hailo(name: str, root: Path, checkpoint: Path, checkpoint_bytes: int) -> dict | None:
    """The chain; its table; fidelity's report (None when a stage failed)."""
    runner = HailoRunner(root, name, checkpoint)
    print("\n-- hailo10h up to fidelity (parse, resources, optimize: the DFC test double; "
          "export, reference, fidelity: real)")
    print("stage      seconds  peak RSS MiB  x checkpoint  output MiB  x checkpoint")
    for stage in CHAIN:
        run = runner.run(stage)
        print(f"{stage:<10} {run['seconds']:<8.1f} {run['peak_rss_mib']:<13.0f} "
              f"{run['peak_rss_mib'] * MIB / checkpoint_bytes:<13.2f} "
              f"{run['bytes'] / MIB:<11.1f} {run['bytes'] / checkpoint_bytes:.3f}")
        if run["rc"] != 0:
            last = run["log"].strip().splitlines()[-1:] or ["(no output)"]
            print(f"{stage} failed: {last[0][:300]}")
            return None
    report = json.loads((runner.dirs["fidelity"] / "fidelity.json").read_text())
    print_fidelity(report)
    return report


def print_fidelity(report: dict[str, Any]) -> None:
    s = report["summary"]
    print(f"fidelity ({report['kind']}, not the chip): teacher-forced mean "
          f"{s.get('mean_teacher_forced')} worst {s.get('worst_teacher_forced')}, logit cosine "
          f"{s.get('mean_logit_cosine')}, worst prefill cosine {s.get('worst_prefill_cosine')}, "
          f"free-running {s.get('mean_free_running')}")
    groups = report["sensitivity"]["groups"]
    print(f"costliest precisions alone ({len(groups)} rows, {report['sensitivity']['rows']} "
          f"calibration rows): " + ", ".join(
              f"{g['group']} {g['kind']} {g['bits']} cosine {g['logit_cosine']}"
              for g in groups[:6]))
    proposal = report["proposal"]
    if not proposal.get("needed"):
        print("proposal: none needed")
        return
    for trial in proposal["trials"]:
        t, promoted = trial["summary"], trial["promoted"]
        what = promoted if isinstance(promoted, str) else f"{len(promoted)} row(s) promoted"
        print(f"  trial: {what} -> worst teacher-forced {t.get('worst_teacher_forced')}, "
              f"logit cosine {t.get('mean_logit_cosine')}"
              f"{' (reaches the target)' if trial['reached'] else ''}")
    best = proposal.get("proposed") or {}
    target = proposal["target_worst_teacher_forced"]
    if proposal.get("all_a16_reaches") is False:
        print(f"proposal: NONE reaches worst teacher-forced {target} in emulation, not even "
              "every layer at a16_w16")
        return
    reach = "reaches" if proposal["reached"] else "does NOT reach"
    print(f"proposal ({reach} worst teacher-forced {target} in emulation):")
    for line in best.get("lines", []):
        print(f"  {line}")
