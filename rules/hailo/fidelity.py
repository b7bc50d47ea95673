"""fidelity (hailo10h): a CPU estimate of what the recipe's precisions do to the model, after
optimize and before the hours of compile. It is an emulation on ONNX Runtime, NOT the chip.

1. Precisions: the `quantization_param(..., precision_mode=aX_wY)` lines of optimize's
   rendered `model_script.alls`, mapped from DFC layers to ONNX nodes and graph inputs through
   the quantized HAR's graph (`common.hailo_precision`); every layer no line names stays at
   the DFC default a8_w8. A layer's aX is the width of what it writes, wY that of its weights
   (`common.qdq_emulation.tensor_bits`). The report's `precisions` accounts for every line:
   `unmatched` (names no layer of the graph has), `unmapped` (layers with no ONNX node),
   `output_only` (layers of ops that are not emulated: only what they write into a MatMul
   takes their bits), `unsupported` (modes other than a8/a16 with w4/w8/w16).
2. A QDQ copy of export's `model.onnx` (`common.qdq_emulation`): MatMul activations QUInt8 /
   QUInt16 per tensor, constant weights QInt4 / QInt8 / QInt16 per output channel, graph
   inputs fake-quantized at their layer's activation bits; calibrated (MinMax) on the rows
   optimize calibrates on (`common.hailo_calibration`, from this stage's calibration
   parameters, which must equal optimize's: a different `calibset_size` in the script is
   reported, and fails the stage when a gate is set).
3. For every prompt of reference.json (the float32 transformers greedy continuation), both
   graphs are run on prompt + continuation prefix (left-padded to seq_len, as export's host
   inputs; positions whose context exceeds seq_len are skipped and counted):
   teacher-forced top-1 agreement with the reference tokens and logit cosine against the
   float32 graph (`common.compare`), the float graph's own agreement (how well the graph
   stands for transformers), the prefill cosine (row 0: the prompt itself), and the emulated
   graph's free-running greedy output against the reference tokens: agreement, first
   divergence with the float32 top-1/top-2 margin there, degenerate output.

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
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action, round_sig
from common.compare import (
    NEAR_TIE,
    argmax,
    compare_generations,
    cosine,
    divergence,
    teacher_forced,
)
from common.dfc import hn_of_har, load_run_config
from common.hailo_calibration import calibration_rows, pad_id
from common.hailo_precision import DEFAULT, Precision, base_layers, onnx_names, parse, resolve

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
WORK = Path("fidelity_work")  # quantize_static writes helper files next to its input
CALIBSET = re.compile(r"\bcalibset_size\s*=\s*(\d+)")


@dataclass(frozen=True)
class Gate:
    min_teacher_forced: float
    min_prefill_cosine: float

    @property
    def active(self) -> bool:
        return self.min_teacher_forced > 0.0 or self.min_prefill_cosine > -1.0


def read_gate(raw: dict[str, Any]) -> Gate:
    return Gate(float(raw.get("min_teacher_forced", 0.0)),
                float(raw.get("min_prefill_cosine", -1.0)))


# -- precisions ------------------------------------------------------------------------------

@dataclass
class Plan:
    """What the emulation quantizes how, and the report's account of it."""

    nodes: dict[str, Precision]  # ONNX node -> its layer's precision (absent: DEFAULT)
    input_bits: dict[str, int]  # graph input -> its input layer's activation bits
    account: dict[str, Any] = field(default_factory=dict)


def plan_precisions(script: str, hn: dict[str, Any] | None, config: dict[str, Any],
                    graph: Any) -> Plan:
    scope = str(config["scope"])
    lines = parse(script)
    layers = base_layers(hn, scope) if hn is not None else {}
    resolved = resolve(lines, layers, scope)
    mapping, how = onnx_names(layers, graph.constant, graph.inputs)
    plan = Plan({}, dict.fromkeys(graph.inputs, DEFAULT.activation_bits))
    unmapped, output_only = apply(plan, resolved.layers, mapping, graph)
    plan.account = {
        "default": DEFAULT.name,
        "mapping": how,
        "script_lines": len(lines),
        "input_bits": dict(plan.input_bits),
        "matmuls": _count(plan.nodes.get(n, DEFAULT).name for n in graph.names),
        "by_kind": by_kind(plan, graph, config.get("layer_names") or {}),
        "overrides": {n: plan.nodes[n].name for n in sorted(plan.nodes)
                      if n in graph.weights and plan.nodes[n] != DEFAULT},
        "unmatched": sorted(set(resolved.unmatched)),
        "unmapped": unmapped,
        "output_only": output_only,
        "unsupported": resolved.unsupported,
    }
    return plan


def apply(plan: Plan, layers: dict[str, Precision], mapping: dict[str, list[str]],
          graph: Any) -> tuple[list[str], list[str]]:
    """Give each layer's ONNX nodes its precision; return the layers with no ONNX node, and
    those with neither a MatMul nor a graph input among them (only what they write into a
    MatMul is emulated)."""
    emulated = set(graph.names) | set(graph.inputs)
    unmapped, output_only = [], []
    for layer, precision in sorted(layers.items()):
        targets = mapping.get(layer) or []
        if not targets:
            unmapped.append(layer)
        elif not emulated & set(targets):
            output_only.append(layer)
        for name in targets:
            _assign(plan, name, precision)
    return unmapped, output_only


def _assign(plan: Plan, name: str, precision: Precision) -> None:
    """Two layers claiming one node (not expected) leave it the fewer bits of each kind."""
    if name in plan.input_bits:
        plan.input_bits[name] = precision.activation_bits
        return
    old = plan.nodes.get(name, precision)
    plan.nodes[name] = Precision(min(old.activation_bits, precision.activation_bits),
                                 min(old.weight_bits, precision.weight_bits))


def by_kind(plan: Plan, graph: Any, layer_names: dict[str, list[str]]) -> dict[str, Any]:
    """Precision counts per projection kind of run_config's layer_names ("other": the rest:
    RoPE and key/value-repeat helpers, attention scores, row selection)."""
    kind_of = {n: kind for kind, names in layer_names.items() for n in names}
    kinds: dict[str, list[str]] = {}
    for node in graph.names:
        kinds.setdefault(kind_of.get(node, "other"), []).append(
            plan.nodes.get(node, DEFAULT).name)
    return {k: _count(v) for k, v in sorted(kinds.items())}


def _count(names: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def read_hn(har: Path) -> dict[str, Any] | None:
    try:
        return hn_of_har(har)
    except (OSError, KeyError, ValueError) as exc:
        print(f"fidelity: WARNING: cannot read the graph of {har.name} ({exc}); no recipe "
              "line can be mapped, every layer is emulated at the default a8_w8")
        return None


# -- the two graphs --------------------------------------------------------------------------

class Feeder:
    """The six graph inputs of a token sequence, as export feeds the chip (left padding),
    and the same with the graph inputs fake-quantized (`quants`, once calibrated)."""

    def __init__(self, config: dict[str, Any], table: Any) -> None:
        self.config, self.table = config, table
        self.seq, self.pad = int(config["seq_len"]), pad_id(config)
        self.quants: dict[str, Any] = {}

    def feeds(self, ids: list[int]) -> dict[str, Any]:
        from common import hailo_inputs as hi

        padded, n_real = hi.left_pad(ids, self.seq, self.pad)
        if int(padded.max()) >= self.table.shape[0]:
            fail(f"fidelity: token id {int(padded.max())} is outside the embedding table "
                 f"({self.table.shape[0]} rows)")
        c = self.config
        return hi.graph_inputs(padded, n_real, self.table, n_heads=int(c["num_attention_heads"]),
                               n_kv_heads=int(c["num_key_value_heads"]),
                               head_dim=int(c["head_dim"]), rope_theta=float(c["rope_theta"]),
                               sliding_window=c.get("sliding_window"))

    def quantized(self, ids: list[int]) -> dict[str, Any]:
        feeds = self.feeds(ids)
        return {k: self.quants[k].apply(v) if k in self.quants else v for k, v in feeds.items()}


class Graphs:
    """The float32 export and its QDQ copy; last-position logits, shards concatenated."""

    def __init__(self, feeder: Feeder, float_path: Path, qdq_path: Path) -> None:
        from common.determinism import ort_session

        self.feeder, self.seq = feeder, feeder.seq
        self.float = ort_session(str(float_path))
        self.qdq = ort_session(str(qdq_path), graph_optimization_level=_no_fusion())
        config = feeder.config
        self.outputs = list(config.get("output_names") or config["outputs"])
        self._emulated: dict[tuple[int, ...], Any] = {}

    def float_logits(self, ids: list[int]) -> Any:
        return self._logits(self.float, self.feeder.feeds(ids))

    def emulated_logits(self, ids: list[int]) -> Any:
        """Cached: free-running repeats the teacher-forced contexts up to its divergence."""
        key = tuple(ids)
        if key not in self._emulated:
            self._emulated[key] = self._logits(self.qdq, self.feeder.quantized(ids))
        return self._emulated[key]

    def _logits(self, session: Any, feeds: dict[str, Any]) -> Any:
        import numpy as np

        outs = session.run(self.outputs, feeds)
        return np.concatenate([np.asarray(o, dtype=np.float32).ravel() for o in outs])


def _no_fusion() -> Any:
    """Q/DQ executed as written (fake quantization in float32), not fused into integer
    kernels whose rounding depends on the CPU's instruction set."""
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def build_qdq(action: Action, feeder: Feeder, plan: Plan, graph: Any, model: Any,
              ) -> tuple[Path, dict[str, Any]]:
    """The QDQ file (the feeder's input quantizers set), and the calibration's account."""
    from common import qdq_emulation as qe

    rows = calibration_rows(action, feeder.config)
    feeder.quants = qe.input_quants((feeder.feeds(r) for r in rows), plan.input_bits)
    acts, weights = qe.tensor_bits(graph, plan.nodes, plan.input_bits)
    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    WORK.mkdir(parents=True, exist_ok=True)
    source, target = WORK / "model.onnx", WORK / "model.qdq.onnx"
    shutil.copyfile(action.input_dir("export") / "model.onnx", source)
    qe.quantize(source, target, qe.FeedReader(rows, feeder.quantized),
                qe.overrides(acts, weights, ranks))
    lengths = [len(r) for r in rows]
    return target, {"rows": len(rows), "seed": int(action.params["calibration_seed"]),
                    "tokens_per_row": [min(lengths), max(lengths)]}


# -- the comparison --------------------------------------------------------------------------

def evaluate(graphs: Graphs, row: dict[str, Any], eos: int | None) -> dict[str, Any]:
    prompt, ref = [int(i) for i in row["prompt_ids"]], [int(i) for i in row["token_ids"]]
    n = min(len(ref), graphs.seq - len(prompt) + 1) if len(prompt) <= graphs.seq else 0
    head = {"prompt": row["prompt"], "prompt_tokens": len(prompt), "positions": n,
            "beyond_seq_len": len(ref) - n}
    if n == 0:
        return {**head, "skipped": f"the prompt is longer than seq_len {graphs.seq}"}
    contexts = [prompt + ref[:i] for i in range(n)]
    floats = [graphs.float_logits(c) for c in contexts]
    emulated = [graphs.emulated_logits(c) for c in contexts]
    forced = teacher_forced(ref[:n], floats, emulated)
    generated = greedy(graphs, prompt, n, eos)
    free = compare_generations(ref[:n], generated)
    div = divergence(free, floats, NEAR_TIE)
    return {
        **head,
        "teacher_forced": {
            "agreement": round_sig(forced["agreement"]),
            "mean_cosine": round_sig(forced["mean_cosine"]),
            "min_cosine": round_sig(forced["min_cosine"]),
            "mismatch_positions": forced["mismatch_positions"],
        },
        "float_graph_agreement": round_sig(
            sum(argmax(f) == t for f, t in zip(floats, ref, strict=False)) / n),
        "prefill_cosine": round_sig(cosine(floats[0], emulated[0])),
        "prefill_same_top1": argmax(floats[0]) == argmax(emulated[0]),
        "free_running": {
            "agreement": round_sig(free["agreement"]),
            "first_divergence": free["first_divergence"],
            "float_margin": None if div["margin"] is None else round_sig(div["margin"]),
            "near_tie": div["near_tie"],
            "degenerate": free["candidate_degenerate"],
            "reference_degenerate": free["reference_degenerate"],
        },
        "emulated_ids": generated,
    }


def greedy(graphs: Graphs, prompt: list[int], n: int, eos: int | None) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        token = argmax(graphs.emulated_logits(prompt + out))
        out.append(token)
        if eos is not None and token == eos:
            break
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in rows if r["positions"]]
    if not done:
        return {"prompts_evaluated": 0}

    def mean(values: list[float]) -> float:
        return round_sig(sum(values) / len(values))

    return {
        "prompts_evaluated": len(done),
        "mean_teacher_forced": mean([r["teacher_forced"]["agreement"] for r in done]),
        "worst_teacher_forced": min(r["teacher_forced"]["agreement"] for r in done),
        "mean_logit_cosine": mean([r["teacher_forced"]["mean_cosine"] for r in done]),
        "worst_prefill_cosine": min(r["prefill_cosine"] for r in done),
        "mean_free_running": mean([r["free_running"]["agreement"] for r in done]),
        "degenerate_prompts": sum(r["free_running"]["degenerate"] for r in done),
    }


def gate_failure(rows: list[dict[str, Any]], gate: Gate) -> str | None:
    """The one line of a gate that is not met (worst prompt first), else None."""
    done = [r for r in rows if r["positions"]]
    if gate.active and not done:
        return "fidelity: no prompt fits seq_len, so the gate has no figure to judge"
    checks = (("teacher-forced agreement", "min_teacher_forced", gate.min_teacher_forced,
               lambda r: r["teacher_forced"]["agreement"]),
              ("prefill cosine", "min_prefill_cosine", gate.min_prefill_cosine,
               lambda r: r["prefill_cosine"]))
    for figure, name, threshold, value in checks:
        worst = min(done, key=value, default=None)
        if worst is not None and value(worst) < threshold:
            return (f"fidelity (CPU emulation, not the chip): {figure} {value(worst):.6g} < "
                    f"{name} {threshold:.6g} on prompt {worst['prompt']!r}; the full report "
                    f"is printed in the log")
    return None


# -- main ------------------------------------------------------------------------------------

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


def main() -> None:
    action = load_action(sys.argv)
    gate = read_gate(action.params)
    import numpy as np
    import onnx
    import onnxruntime
    from common.qdq_emulation import matmuls, qdq_counts

    export, optimize = action.input_dir("export"), action.input_dir("optimize")
    config = load_run_config(export, action.stage)
    script = (optimize / "model_script.alls").read_text(encoding="utf-8")
    reference = json.loads((action.input_dir("reference") / "reference.json").read_text())
    matches = check_calibration(script, action, gate)
    model = onnx.load(str(export / "model.onnx"))
    graph = matmuls(model)
    plan = plan_precisions(script, read_hn(optimize / "quantized.har"), config, graph)
    with np.load(export / "hf_reference.npz") as ref:
        table = np.asarray(ref["embedding_table"], dtype=np.float32)
    feeder = Feeder(config, table)
    qdq, calibration = build_qdq(action, feeder, plan, graph, model)
    graphs = Graphs(feeder, export / "model.onnx", qdq)
    rows = [evaluate(graphs, r, reference.get("eos_token_id")) for r in reference["prompts"]]
    report = {
        "kind": KIND,
        "note": NOTE,
        "emulated": EMULATED,
        "not_emulated": list(NOT_EMULATED),
        "onnxruntime": onnxruntime.__version__,
        "precisions": plan.account,
        "quantized": qdq_counts(qdq),
        "calibration": {**calibration, "matches_model_script": matches},
        "summary": summary(rows),
        "prompts": rows,
    }
    text = write_report(action.out / "fidelity.json", report)
    show(rows)
    failure = gate_failure(rows, gate)
    if failure is not None:
        print("---- fidelity.json (the report of this failed run) ----\n" + text, end="")
        fail(failure)
    check_outputs(action)


if __name__ == "__main__":
    main()
