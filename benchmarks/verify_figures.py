"""How benchmarks/real_model.py shows every target's verify the same way: a prompt's check
figures (the shape rules/common/check.py gives every target's report), and verify's time
against float32 transformers `generate` on the checkpoint with the verify stage's prompts
and token count, run in a child process of its own (its loading included, like a stage's).

    python benchmarks/verify_figures.py CHECKPOINT '{"prompts": [...], "max_new_tokens": N}'

is that child: it prints its figures as one JSON line (load and generate seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VERIFY_RATIO = 3.0  # the goal: verify within 3x of float32 transformers generate


def generate_baseline(ckpt: Path, prompts: list[str], n: int) -> dict[str, float]:
    """What a user would run instead: load the float32 checkpoint and `generate` greedily,
    with its KV cache, the verify stage's prompts and token count (EOS not stopping it)."""
    start = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                 local_files_only=True).eval()
    loaded = time.perf_counter()
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tok(prompt)["input_ids"]], dtype=torch.long)
            model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                           max_new_tokens=n, min_new_tokens=n, use_cache=True,
                           pad_token_id=tok.eos_token_id)
    end = time.perf_counter()
    return {"load_s": loaded - start, "generate_s": end - loaded}


def run_baseline(ckpt: Path, prompts: list[str], n: int) -> dict[str, Any]:
    """generate_baseline in a child with the rules' environment (threads included): its
    wall time as `seconds`, or `error` with its last line."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    spec = json.dumps({"prompts": prompts, "max_new_tokens": n})
    proc = subprocess.run([sys.executable, __file__, str(ckpt), spec],
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or ["(no output)"]
        return {"seconds": seconds, "error": lines[-1]}
    return {"seconds": seconds, **json.loads(proc.stdout.strip().splitlines()[-1])}


def print_prompt(p: dict[str, Any]) -> None:
    tie = ""
    if p["first_divergence"] is not None:
        tie = f", diverges @{p['first_divergence']} margin " \
              f"{p['first_divergence_margin']:.3f}{' (near tie)' if p['near_tie'] else ''}"
    print(f"  teacher-forced {p['teacher_forced_agreement']:.3f}  cosine "
          f"{p['logit_cosine_mean']:.5f} (min {p['logit_cosine_min']:.5f})  free-running "
          f"{p['agreement']:.3f}{tie}  {p['prompt']!r}")


def print_verify_time(prompts: list[str], n: int,
                      rows: list[tuple[str, dict[str, Any], dict[str, dict[str, Any]]]]) -> None:
    """One line per (method, verify report, runs with "verify" and "generate")."""
    print(f"\nverify stage vs float32 transformers generate (KV cache), {len(prompts)} prompts x "
          f"{n} tokens, each process's wall time with loading, run one after the other; the "
          f"goal is verify <= {VERIFY_RATIO:g}x")
    print("method            verify s  generate s (load + generate)  ratio  goal  forwards")
    for method, report, runs in rows:
        ver, gen = runs["verify"], runs["generate"]
        if "error" in gen:
            print(f"{method:<17} {ver['seconds']:<9.1f} baseline failed: {gen['error']}")
            continue
        ratio = ver["seconds"] / gen["seconds"]
        # cpu-ort's verify counts its candidate's forwards; a target that does not: "-".
        forwards = [p.get("candidate_forwards") for p in report["prompts"]]
        shown = "-" if all(f is None for f in forwards) else forwards
        print(f"{method:<17} {ver['seconds']:<9.1f} {gen['seconds']:.1f} ({gen['load_s']:.1f} + "
              f"{gen['generate_s']:.1f}){'':<13} {ratio:<6.2f} "
              f"{'met' if ratio <= VERIFY_RATIO else 'MISSED':<5} {shown}")


if __name__ == "__main__":
    given = json.loads(sys.argv[2])
    print(json.dumps(generate_baseline(Path(sys.argv[1]), given["prompts"],
                                       given["max_new_tokens"])))
