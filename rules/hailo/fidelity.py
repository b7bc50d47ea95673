"""fidelity (hailo10h): a CPU estimate of what the recipe's precisions do to the model, after
optimize and before the hours of compile. It is an emulation on ONNX Runtime, NOT the chip.

1. Precisions (`common.hailo_fidelity_plan`): the `quantization_param(..., precision_mode=
   aX_wY)` lines of optimize's rendered `model_script.alls`, mapped from DFC layers to ONNX
   nodes and graph inputs through the quantized HAR's graph (`common.hailo_precision`); every
   layer no line names stays at the DFC default a8_w8. A layer's aX is the width of what it
   writes, wY that of its weights (`common.qdq_emulation.tensor_bits`). The report's
   `precisions` accounts for every line: `unmatched` (names no layer of the graph has),
   `unmapped` (layers with no ONNX node), `output_only` (layers of ops that are not emulated:
   only what they write into a MatMul takes their bits), `unsupported` (modes other than
   a8/a16 with w4/w8/w16).
2. A QDQ copy of export's `model.onnx` (`common.hailo_fidelity_graphs`, `common.qdq_emulation`):
   MatMul activations QUInt8 / QUInt16 per tensor, constant weights QInt4 / QInt8 / QInt16 per
   output channel, graph inputs fake-quantized at their layer's activation bits; calibrated
   (MinMax) on the rows optimize calibrates on (`common.hailo_calibration`, from this stage's
   calibration parameters, which must equal optimize's: a different `calibset_size` in the
   script is reported, and fails the stage when a gate is set).
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
   a table of what each layer group's weight precision alone costs (logit cosine and top-1
   against the float32 graph on the first `sensitivity_rows` calibration rows, costliest
   first), and, when the emulated recipe misses the gate (`min_teacher_forced` when set,
   else `proposal_target`, on the worst prompt; and `min_prefill_cosine`), the smallest
   promotion of the costliest groups that reaches it in `proposal_trials` full emulations:
   `quantization_param` lines to paste into the model's recipe, tried as they would be read.

Not emulated (so the figures are an estimate, optimistic where the chip does more in fixed
point): norms, softmax, SiLU, residual adds and the mask run in float32; the DFC's own
calibration statistics, bias correction and equalization; its accumulator widths and
rounding; the on-device cos/sin; the prefill / token-by-token split and the KV cache's
storage precision. The report says so first (`kind`, `note`).

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
from common.hailo_fidelity_compare import Gate, evaluate, gate_failure, read_gate, summary
from common.hailo_fidelity_graphs import Feeder, Graphs, build_qdq
from common.hailo_fidelity_plan import Plan, plan_precisions, read_hn
from common.hailo_fidelity_proposal import propose
from common.hailo_fidelity_sensitivity import Group, Sensitivity, layer_groups, table

KIND = "cpu-emulation"
NOTE = ("ONNX Runtime QDQ emulation of the recipe's precisions on the CPU; not the Hailo-10H's "
        "numerics. A poor figure says the recipe likely ruins the model; a good one promises "
        "nothing about the chip.")
EMULATED = ("MatMul inputs and outputs: per tensor, asymmetric, MinMax over the calibration "
            "rows; constant MatMul weights: symmetric per output channel; graph inputs: "
            "fake-quantized per tensor")
NOT_EMULATED = (
    "the arithmetic of norms, softmax, SiLU, residual adds and the mask (float32 here; "
    "only what they hand to a MatMul is quantized)",
    "the DFC's calibration statistics, bias correction and equalization",
    "accumulator widths and rounding of the chip",
    "on-device cos/sin",
    "the prefill / token-by-token split and the KV cache's precision",
)
SENSITIVITY = ("per layer group, only its MatMul weights at the recipe's bits (symmetric per "
               "output channel), activations float32: logit cosine and top-1 against the "
               "float32 graph on the first calibration rows")
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


def sensitivity_of(action: Action, feeder: Feeder, plan: Plan, graph: Any, model: Any,
                   outputs: list[str]) -> tuple[list[Group], list[dict[str, Any]]]:
    """The layer groups and their cost table ([] when sensitivity_rows is 0)."""
    from common.hailo_calibration import calibration_rows
    from common.onnx_file import read_array

    rows = int(action.params.get("sensitivity_rows", 4))
    groups = layer_groups(feeder.config.get("layer_names") or {}, set(graph.constant))
    if rows <= 0 or not groups:
        return groups, []
    inits = {i.name: i for i in model.graph.initializer}
    feeds = [feeder.feeds(r) for r in calibration_rows(action, feeder.config)[:rows]]
    export = action.input_dir("export")
    sens = Sensitivity(export / "model.onnx", {n: graph.weights[n][0] for n in graph.constant},
                       lambda name: read_array(inits[name], export), feeds, outputs)
    return groups, table(sens, groups, plan.nodes)


def proposal_of(action: Action, gate: Gate, current: dict[str, Any], groups: list[Group],
                costs: list[dict[str, Any]], plan: Plan, emulate: Any) -> dict[str, Any]:
    target = gate.min_teacher_forced if gate.min_teacher_forced > 0.0 else \
        float(action.params.get("proposal_target", 0.9))

    def reached(s: dict[str, Any]) -> bool:
        return bool(s.get("prompts_evaluated")) and s["worst_teacher_forced"] >= target \
            and s["worst_prefill_cosine"] >= gate.min_prefill_cosine

    head = {"target_worst_teacher_forced": target,
            "target_worst_prefill_cosine": gate.min_prefill_cosine}
    if reached(current):
        return {**head, "needed": False}
    by_name = {g.name: g for g in groups}
    ranked = [by_name[c["group"]] for c in costs]
    trials = int(action.params.get("proposal_trials", 3))
    return {**head, "needed": True, **propose(ranked, plan.nodes, plan.mapping, emulate.script,
                                              emulate, reached, trials)}


class Emulation:
    """The full emulation of a recipe script: its plan, QDQ graph and summary."""

    def __init__(self, action: Action, feeder: Feeder, graph: Any, model: Any, hn: Any,
                 reference: dict[str, Any], script: str) -> None:
        self.action, self.feeder, self.graph, self.model, self.hn = (
            action, feeder, graph, model, hn)
        self.reference, self.script = reference, script

    def __call__(self, script: str) -> dict[str, Any]:
        plan = plan_precisions(script, self.hn, self.feeder.config, self.graph)
        qdq, _ = build_qdq(self.action, self.feeder, plan, self.graph, self.model, "trial")
        graphs = Graphs(self.feeder, self.action.input_dir("export") / "model.onnx", qdq)
        eos = self.reference.get("eos_token_id")
        return summary([evaluate(graphs, r, eos) for r in self.reference["prompts"]])


def show_analysis(costs: list[dict[str, Any]], proposal: dict[str, Any]) -> None:
    if costs:
        print("weight sensitivity (CPU emulation, not the chip), costliest first:")
        for c in costs[:8]:
            print(f"  {c['group']:<10} {c['weights']:<6} logit cosine {c['logit_cosine']:.6f} "
                  f"top-1 {c['top1_agreement']:.3f}")
    if not proposal.get("needed"):
        print("proposal: none needed (the emulated recipe meets the target)")
        return
    best = proposal.get("proposed")
    if best is None:
        print("proposal: no layer group could be promoted")
        return
    verdict = "reaches" if proposal["reached"] else "does NOT reach"
    print(f"proposal ({verdict} the target in emulation: worst teacher-forced "
          f"{best['summary'].get('worst_teacher_forced')}), append to the recipe:")
    for line in best["lines"]:
        print(f"  {line}")


def main() -> None:
    action = load_action(sys.argv)
    gate = read_gate(action.params)
    import numpy as np
    import onnxruntime
    from common.onnx_file import load_lazily
    from common.qdq_emulation import matmuls, qdq_counts

    export, optimize = action.input_dir("export"), action.input_dir("optimize")
    config = load_run_config(export, action.stage)
    script = (optimize / "model_script.alls").read_text(encoding="utf-8")
    reference = json.loads((action.input_dir("reference") / "reference.json").read_text())
    matches = check_calibration(script, action, gate)
    # The graph without its weights' bytes: each is read from the file when it is needed.
    model = load_lazily(export / "model.onnx", export)
    graph = matmuls(model)
    hn = read_hn(optimize / "quantized.har")
    plan = plan_precisions(script, hn, config, graph)
    with np.load(export / "hf_reference.npz") as ref:
        table = np.asarray(ref["embedding_table"], dtype=np.float32)
    feeder = Feeder(config, table)
    qdq, calibration = build_qdq(action, feeder, plan, graph, model)
    graphs = Graphs(feeder, export / "model.onnx", qdq)
    rows = [evaluate(graphs, r, reference.get("eos_token_id")) for r in reference["prompts"]]
    quantized = qdq_counts(qdq)
    groups, costs = sensitivity_of(action, feeder, plan, graph, model, graphs.outputs)
    emulate = Emulation(action, feeder, graph, model, hn, reference, script)
    proposal = proposal_of(action, gate, summary(rows), groups, costs, plan, emulate)
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
        "sensitivity": {"rows": int(action.params.get("sensitivity_rows", 4)),
                        "measures": SENSITIVITY, "groups": costs},
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
