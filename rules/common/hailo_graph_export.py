"""The Hailo-10H graph's export to ONNX and its checks: the interface and op set the DFC
parser accepts, the projection nodes the recipes name, and the logits gate against
transformers (ONNX Runtime and the torch module side by side).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.hailo_graph import HailoDecoder
from common.hailo_graph_spec import GraphSpec, UnsupportedModel
from common.hailo_inputs import INPUT_NAMES

OPSET = 17
# Every op the exported graph may contain; anything else (Expand, Gather, Slice, Concat, Where,
# Shape, ...) fails the export stage.
ALLOWED_OPS = frozenset(
    {
        "MatMul",
        "Add",
        "Mul",
        "Div",
        "Sqrt",
        "ReduceMean",
        "Softmax",
        "Reshape",
        "Transpose",
        "Sigmoid",
        "Constant",
    }
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def export_onnx(module: HailoDecoder, path: Path) -> None:
    """TorchScript exporter, opset 17, no constant folding (the contract's settings)."""
    sample = tuple(torch.zeros(shape) for shape in module.spec.input_shapes.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    # Traced in training mode (the graph has no dropout or batch norm, so nothing else changes):
    # in eval mode the exporter merges initializers with equal VALUES (e.g. norm weights that
    # are all ones) and reads the copies through Identity nodes.
    module.train()
    try:
        with torch.no_grad():
            torch.onnx.export(
                module,
                sample,
                str(path),
                dynamo=False,
                opset_version=OPSET,
                input_names=list(INPUT_NAMES),
                output_names=module.spec.output_names,
                do_constant_folding=False,
                training=torch.onnx.TrainingMode.PRESERVE,
            )
    finally:
        module.eval()


def _dims(value_info: Any) -> list[int | str]:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param
        for d in value_info.type.tensor_type.shape.dim
    ]


def graph_problems(model: Any, spec: GraphSpec) -> list[str]:
    """Everything wrong with an exported graph's interface and op set (empty when it is fine)."""
    problems = []
    inputs = {i.name: _dims(i) for i in model.graph.input}
    if inputs != spec.input_shapes or list(inputs) != list(INPUT_NAMES):
        problems.append(f"inputs {inputs} != {spec.input_shapes}")
    outputs = {o.name: _dims(o) for o in model.graph.output}
    if outputs != spec.output_shapes or list(outputs) != spec.output_names:
        problems.append(f"outputs {outputs} != {spec.output_shapes}")
    ops = sorted({n.op_type for n in model.graph.node})
    bad = [op for op in ops if op not in ALLOWED_OPS]
    if bad:
        problems.append(f"ops outside the allow-list: {bad}")
    return problems


def projection_nodes(model: Any, spec: GraphSpec) -> dict[str, list[str]]:
    """ONNX node names of the big MatMuls, per projection kind in layer order, and lm_head."""
    names = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    found: dict[str, list[str]] = {}
    for proj in PROJECTIONS:
        block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        found[proj] = [f"/layers.{i}/{block}/{proj}/MatMul" for i in range(spec.num_hidden_layers)]
    found["lm_head"] = [f"/lm_head.{i}/MatMul" for i in range(len(spec.shard_sizes))]
    missing = [n for group in found.values() for n in group if n not in names]
    if missing:
        raise UnsupportedModel(f"expected projection nodes missing from the graph: {missing[:3]}")
    return found


def ort_logits(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Run the graph on ONNX Runtime (CPU, one thread); all shards joined: [vocab] float32."""
    from common.determinism import ort_session

    session = ort_session(str(path))
    outs = session.run(None, {name: feeds[name] for name in INPUT_NAMES})
    return np.concatenate([o.reshape(-1) for o in outs]).astype(np.float32)


def torch_logits(module: HailoDecoder, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[name]) for name in INPUT_NAMES))
    return torch.cat([o.reshape(-1) for o in outs]).numpy().astype(np.float32)


def hf_last_logits(hf_model: Any, real_ids: np.ndarray) -> np.ndarray:
    """The reference: transformers' own forward on the real (unpadded) ids, last position."""
    ids = torch.from_numpy(np.asarray(real_ids, dtype=np.int64)).reshape(1, -1)
    with torch.no_grad():
        out = hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0, -1].float().numpy()


@dataclass(frozen=True)
class Gate:
    cosine: float
    max_abs_diff: float
    same_argmax: bool
    cosine_min: float

    @property
    def passed(self) -> bool:
        return self.cosine >= self.cosine_min


def gate(reference: np.ndarray, candidate: np.ndarray, cosine_min: float) -> Gate:
    a, b = reference.astype(np.float64).ravel(), candidate.astype(np.float64).ravel()
    if a.shape != b.shape:
        return Gate(float("-inf"), float("inf"), False, cosine_min)
    denom = max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-30)
    return Gate(
        float(a @ b / denom), float(np.abs(a - b).max()), bool(a.argmax() == b.argmax()), cosine_min
    )
