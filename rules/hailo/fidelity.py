"""fidelity (hailo10h): a CPU estimate of what the recipe's precisions do to the model, after
optimize and before the hours of compile. It is an emulation on ONNX Runtime, NOT the chip.

1. Precisions (`common.hailo_fidelity_plan`): the `quantization_param(..., precision_mode=
   aX_wY)` lines of optimize's rendered `model_script.alls`, mapped from DFC layers to ONNX
   nodes and graph inputs through the quantized HAR's graph (`common.hailo_precision`); every
   layer no line names stays at the DFC default a8_w8. A layer's aX is the width of what it
   writes (an op no layer maps to: that of the MatMul layers reading it), wY that of its
   weights (`common.qdq_emulation.tensor_bits`). The report's
   `precisions` accounts for every line: `unmatched` (names no layer of the graph has),
   `unmapped` (layers with no ONNX node), `output_only` (layers of ops that are not emulated:
   only what they write into a MatMul takes their bits), `unsupported` (modes other than
   a8/a16 with w4/w8/w16).
2. An emulation of export's `model.onnx` (`common.qdq_emulation`, `common.hailo_fidelity_graphs`,
   `common.hailo_fidelity_emulation`): a QuantizeLinear/DequantizeLinear pair on every tensor
   a MatMul reads or writes, uint8 / uint16 per tensor at the bits of the layer that writes it,
   constant weights rounded symmetric per output channel to 4 / 8 / 16 bits, graph inputs
   fake-quantized at their layer's activation bits; calibrated (MinMax, the float32 graph) on
   the rows optimize calibrates on (`common.hailo_calibration`, from this stage's calibration
   parameters, which must equal optimize's: a different `calibset_size` in the script is
   reported, and fails the stage when a gate is set). One session at a time over export's
   mapped file: the float32 logits of every context are computed once, in the pass that
   calibrates, before any emulation holds its rounded weights.
3. For every prompt of reference.json (the float32 transformers greedy continuation), both
   graphs are run on prompt + continuation prefix (left-padded to seq_len, as export's host
   inputs; positions whose context exceeds seq_len are skipped and counted):
   teacher-forced top-1 agreement with the reference tokens and logit cosine against the
   float32 graph (`common.compare`), the float graph's own agreement (how well the graph
   stands for transformers), the prefill cosine (row 0: the prompt itself), and the emulated
   graph's free-running greedy output against the reference tokens: agreement, first
   divergence with the float32 top-1/top-2 margin there, degenerate output
   (`common.hailo_fidelity_compare`, with the gate below).

4. What to change (`common.hailo_fidelity_sensitivity`, `common.hailo_fidelity_proposal`):
   a table of what each layer group's precisions cost, its weights alone at the recipe's wY
   and its activations alone at the recipe's aX (logit cosine and top-1 against the float32
   graph on the first `sensitivity_rows` calibration rows, costliest first), and, when the
   emulated recipe misses the gate (`min_teacher_forced` when set, else `proposal_target`, on
   the worst prompt; and `min_prefill_cosine`), within `proposal_trials` full emulations:
   whether every layer the HN maps at a16_w16 reaches it at all (if not, the report says so
   with that figure), then the fewest of the costliest rows promoted (activations to
   a16_w16, weights w4 -> a8_w8 or w8 -> a16_w16) found to reach it: `quantization_param`
   lines to paste into the model's recipe, tried as they would be read.

Not emulated (so the figures are an estimate, optimistic where the chip does more in fixed
point): norms, softmax, SiLU, residual adds and the mask run in float32; the DFC's own
calibration statistics, bias correction and equalization; its accumulator widths and
rounding; the on-device cos/sin; the prefill / token-by-token split and the KV cache's
storage precision; which layer holds an op the HN maps to no layer (what it writes into a
MatMul is taken as that MatMul layer's input; what only such ops read stays at a8 whatever a
line says: the report counts those tensors). The report says so first (`kind`, `note`).

`fidelity.json`: keys in a fixed order, figures rounded to 6 significant digits, no paths,
thresholds or timestamps, so equal inputs give equal bytes. Gate (optional):
`min_teacher_forced` (worst prompt's teacher-forced agreement) and `min_prefill_cosine`
(worst prompt's prefill cosine); when one is not met the report is written and printed to the
log, then the stage fails with one line naming the figure, the prompt and the threshold.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action
from common.dfc import load_run_config
from common.hailo_fidelity_compare import Gate, gate_failure, read_gate, summary
from common.hailo_fidelity_emulation import Emulator, calibrate
from common.hailo_fidelity_graphs import Export, Feeder, embedding_table, map_big_blocks
from common.hailo_fidelity_plan import Plan, read_hn
from common.hailo_fidelity_proposal import A16_W16, propose
from common.hailo_fidelity_sensitivity import Reach, Sensitivity, layer_groups, reach_of, table

KIND = "cpu-emulation"
NOTE = ("ONNX Runtime QDQ emulation of the recipe's precisions on the CPU; not the Hailo-10H's "
        "numerics. A poor figure says the recipe likely ruins the model; a good one promises "
        "nothing about the chip.")
EMULATED = ("tensors MatMuls read or write: per tensor, asymmetric, MinMax over the "
            "calibration rows of the float32 graph, at the bits of the layer that writes them; "
            "constant MatMul weights: symmetric per output channel; graph inputs: "
            "fake-quantized per tensor")
NOT_EMULATED = (
    "the arithmetic of norms, softmax, SiLU, residual adds and the mask (float32 here; "
    "only what they hand to a MatMul is quantized)",
    "the DFC's calibration statistics, bias correction and equalization",
    "accumulator widths and rounding of the chip",
    "on-device cos/sin",
    "the prefill / token-by-token split and the KV cache's precision",
    "which DFC layer holds an op the HN maps to no layer: what it writes into a MatMul is "
    "taken as that MatMul layer's input (its aX); what only such ops read stays at a8 "
    "whatever the recipe says (counted in sensitivity.activations_no_line_reaches)",
)
SENSITIVITY = ("per layer group, everything else float32: its MatMul weights alone at the "
               "recipe's wY (symmetric per output channel), and its activations alone at the "
               "recipe's aX (the tensors an a16 line for its layers would widen, per tensor, "
               "MinMax); logit cosine and top-1 against the float32 graph on the first "
               "calibration rows")
CALIBSET = re.compile(r"\bcalibset_size\s*=\s*(\d+)")


def check_calibration(script: str, action: Action, gate: Gate) -> bool:
    """Whether the script's calibset_size is this stage's calibration_size (the rows are
    then the ones optimize used, for the same file and seed)."""
    found = CALIBSET.search(script)
    size = int(action.params["calibration_size"])
    if found is None or int(found.group(1)) == size:
        return True
    message = (f"fidelity: calibration_size {size} != the model script's calibset_size "
               f"{found.group(1)}: set [stages.fidelity] calibration like [stages.optimize]")
    if gate.active:
        fail(message)
    print(f"WARNING: {message}")
    return False


def write_report(path: Path, report: dict[str, Any]) -> str:
    """Keys in the order built (kind and note first), so not sorted; deterministic still."""
    text = json.dumps(report, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    path.write_text(text, encoding="utf-8")
    return text


def show(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if not r["positions"]:
            print(f"[skip] {r['prompt']!r}: {r['skipped']}")
            continue
        tf, fr = r["teacher_forced"], r["free_running"]
        print(f"{r['prompt']!r}: teacher-forced {tf['agreement']:.3f}, logit cosine "
              f"{tf['mean_cosine']:.6f}, prefill cosine {r['prefill_cosine']:.6f}, "
              f"free-running {fr['agreement']:.3f} (diverges at {fr['first_divergence']}"
              f"{', degenerate' if fr['degenerate'] else ''})")


def sensitivity_of(action: Action, emulator: Emulator, plan: Plan
                   ) -> tuple[dict[str, Reach], list[dict[str, Any]]]:
    """Each layer group's reach (what a line for it names) and the cost table ([] when
    sensitivity_rows is 0)."""
    export, cal = emulator.export, emulator.calibration
    rows = min(int(action.params.get("sensitivity_rows", 4)), len(cal.rows))
    groups = layer_groups(emulator.feeder.config.get("layer_names") or {},
                          export.graph.constant)
    reaches = {g.name: reach_of(g, plan, export.graph, export.writer) for g in groups}
    if rows <= 0 or not groups:
        return reaches, []
    acts, weights = plan.bits(export.graph)
    sens = Sensitivity(export, [emulator.feeder.feeds(r) for r in cal.rows[:rows]],
                       cal.kept[:rows], acts, weights, cal.acts)
    return reaches, table(sens, groups, reaches)


def proposal_of(action: Action, gate: Gate, current: dict[str, Any], reaches: dict[str, Reach],
                costs: list[dict[str, Any]], plan: Plan, script: str,
                emulator: Emulator) -> dict[str, Any]:
    target = gate.min_teacher_forced if gate.min_teacher_forced > 0.0 else \
        float(action.params.get("proposal_target", 0.9))

    def reached(s: dict[str, Any]) -> bool:
        return bool(s.get("prompts_evaluated")) and s["worst_teacher_forced"] >= target \
            and s["worst_prefill_cosine"] >= gate.min_prefill_cosine

    head = {"target_worst_teacher_forced": target,
            "target_worst_prefill_cosine": gate.min_prefill_cosine}
    if reached(current):
        return {**head, "needed": False}
    trials = int(action.params.get("proposal_trials", 5))
    return {**head, "needed": True, **propose(
        costs, reaches, plan.nodes, plan.mapping, script,
        lambda trial: emulator.trial(trial, reached), reached, trials,
        mapped_layers(plan, emulator.export))}


def mapped_layers(plan: Plan, export: Export) -> list[str]:
    """DFC layers with an ONNX node or graph input (not only a graph output's name)."""
    known = set(export.writer.values()) | set(export.graph.inputs)
    return sorted(layer for layer, names in plan.mapping.items() if known & set(names))


def unreachable(plan: Plan, export: Export) -> int:
    """Activation tensors no recipe line changes: at a8 with every mapped node at a16."""
    top = {n: A16_W16 for n in plan.mapped}
    return sum(b < 16 for b in plan.bits(export.graph, top)[0].values())


def show_analysis(costs: list[dict[str, Any]], proposal: dict[str, Any]) -> None:
    if costs:
        print("sensitivity (CPU emulation, not the chip), costliest first:")
        for c in costs[:8]:
            print(f"  {c['group']:<10} {c['kind']:<11} {c['bits']:<6} logit cosine "
                  f"{c['logit_cosine']:.6f} top-1 {c['top1_agreement']:.3f}")
    if not proposal.get("needed"):
        print("proposal: none needed (the emulated recipe meets the target)")
        return
    best = proposal.get("proposed")
    if best is None:
        print("proposal: none (no trial was run)")
        return
    figure = best["summary"].get("worst_teacher_forced")
    target = proposal["target_worst_teacher_forced"]
    if proposal["all_a16_reaches"] is False:
        print(f"proposal: NONE reaches the target in emulation: even every layer at "
              f"a16_w16 gives worst teacher-forced {figure} (target {target}); the lines of "
              "that best case:")
    else:
        print(f"proposal (reaches the target {target} in emulation: worst teacher-forced "
              f"{figure}), append to the recipe:")
    for line in best["lines"]:
        print(f"  {line}")


def main() -> None:
    action = load_action(sys.argv)
    gate = read_gate(action.params)
    map_big_blocks()
    import onnxruntime
    from common.hailo_calibration import calibration_rows

    export_dir, optimize = action.input_dir("export"), action.input_dir("optimize")
    config = load_run_config(export_dir, action.stage)
    script = (optimize / "model_script.alls").read_text(encoding="utf-8")
    reference = json.loads((action.input_dir("reference") / "reference.json").read_text())
    matches = check_calibration(script, action, gate)
    export = Export(export_dir, config)
    feeder = Feeder(config, embedding_table(export_dir / "hf_reference.npz"))
    rows_tokens = calibration_rows(action, config)
    keep = max(0, int(action.params.get("sensitivity_rows", 4)))
    cal = calibrate(export, feeder, rows_tokens, keep, reference)
    emulator = Emulator(export, feeder, read_hn(optimize / "quantized.har"), cal, reference)
    plan = emulator.plan(script)
    rows, quantized = emulator.rows(plan)
    reaches, costs = sensitivity_of(action, emulator, plan)
    proposal = proposal_of(action, gate, summary(rows), reaches, costs, plan, script, emulator)
    lengths = [len(r) for r in rows_tokens]
    calibration = {"rows": len(rows_tokens), "seed": int(action.params["calibration_seed"]),
                   "tokens_per_row": [min(lengths), max(lengths)]}
    report = {
        "kind": KIND,
        "note": NOTE,
        "emulated": EMULATED,
        "not_emulated": list(NOT_EMULATED),
        "onnxruntime": onnxruntime.__version__,
        "precisions": plan.account,
        "quantized": quantized,
        "calibration": {**calibration, "matches_model_script": matches},
        "summary": summary(rows),
        "sensitivity": {"rows": min(keep, len(rows_tokens)), "measures": SENSITIVITY,
                        "activations_no_line_reaches": unreachable(plan, export),
                        "groups": costs},
        "proposal": proposal,
        "prompts": rows,
    }
    text = write_report(action.out / "fidelity.json", report)
    show(rows)
    show_analysis(costs, proposal)
    failure = gate_failure(rows, gate)
    if failure is not None:
        print("---- fidelity.json (the report of this failed run) ----\n" + text, end="")
        fail(failure)
    check_outputs(action)


if __name__ == "__main__":
    main()
