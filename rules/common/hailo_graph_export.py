"""The Hailo-10H graph's export to ONNX and its checks: the interface and op set the DFC
parser accepts, the projection nodes the recipes name, and the logits gate against
transformers (ONNX Runtime and the torch module side by side). The export and the ONNX Runtime
run hold no copy of the weights: `traced_graph`, `write_inline` and `ort_logits` say how.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common.determinism import mapped_session_options
from common.hailo_graph import HailoDecoder, graph_tensors
from common.hailo_graph_spec import GraphSpec, UnsupportedModel
from common.hailo_inputs import INPUT_NAMES
from common.onnx_file import append_initializers, load_lazily, save_inline

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
WEIGHTS_NAME = "weights.bin"  # traced_graph's initializer data, beside the model it is for
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def traced_graph(module: HailoDecoder, path: Path) -> Any:
    """The graph for `path`, from the TorchScript exporter at opset 17 without constant folding
    (the contract's settings), shown no weight: every tensor of `graph_tensors` is passed as an
    argument, so the trace reads it as a graph input and the exporter writes the graph alone.
    Those inputs then become the initializers of the same names, in the same order (what the
    exporter would have written), their data streamed to WEIGHTS_NAME beside `path` (an
    [in, out] projection, a transposed view, made contiguous a block at a time)."""
    import onnx

    work = path.parent
    work.mkdir(parents=True, exist_ok=True)
    traced = work / "graph.onnx"
    tensors = graph_tensors(module)
    sample = tuple(torch.zeros(shape) for shape in module.spec.input_shapes.values())
    # In eval mode the exporter merges initializers of equal VALUES (e.g. norm weights that are
    # all ones) into one read through Identity nodes; shown no initializer, it merges none.
    with torch.no_grad():
        torch.onnx.export(
            module,
            (*sample, *tensors.values()),
            str(traced),
            dynamo=False,
            opset_version=OPSET,
            input_names=[*INPUT_NAMES, *tensors],
            output_names=module.spec.output_names,
            do_constant_folding=False,
        )
    graph = onnx.load(str(traced))
    traced.unlink()
    kept = [i for i in graph.graph.input if i.name not in tensors]
    graph.graph.ClearField("input")
    graph.graph.input.extend(kept)
    append_initializers(graph, ((n, t.numpy()) for n, t in tensors.items()), work, WEIGHTS_NAME)
    return graph


def write_inline(graph: Any, path: Path) -> None:
    """`traced_graph`'s graph as the one self-contained file `path`, its weights copied in from
    their file in chunks (which then goes): the torch weights need not be in memory."""
    save_inline(graph, path, path.parent)
    (path.parent / WEIGHTS_NAME).unlink()


def export_onnx(module: HailoDecoder, path: Path) -> None:
    """The module's graph and weights as the self-contained ONNX file `path`."""
    write_inline(traced_graph(module, path), path)


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
    """Run the graph on ONNX Runtime (CPU, one thread); all shards joined: [vocab] float32.

    The session is given the graph with its initializers as references into `path` (external
    data), so it maps their pages instead of holding the parsed file and a copy of each tensor;
    with prepacking (a repacked copy of every MatMul weight) and constant folding off, it runs
    on those mapped pages alone. Nothing is written next to `path`."""
    import onnxruntime as ort

    view = load_lazily(path, path.parent)
    so = mapped_session_options()
    # A model given as bytes resolves its external data against this folder.
    so.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                str(path.parent))
    session = ort.InferenceSession(view.SerializeToString(), so,
                                   providers=["CPUExecutionProvider"],
                                   disabled_optimizers=["ConstantFolding"])
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
