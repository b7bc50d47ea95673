"""export (cpu-ort): float32 HF checkpoint -> ONNX `model.onnx` (input_ids -> logits).

Gate: ONNX Runtime and torch must agree on the reference text's last-position logits
(cosine >= cosine_min), and again at a second batch/length so dynamic axes really are dynamic;
the figures go into export_report.json.

Memory: the TorchScript exporter copies every constant it sees several times over (its shape
inference, its protobuf, that protobuf's serialization), so it is shown none: the traced forward
takes the weights as arguments standing in for the parameters, so they are graph inputs and the
graph is exported alone. The weights then become initializers, streamed from the tensors to disk
and from there into the one output file (common.onnx_file): each Linear's Transpose is folded
into a transposed initializer (written from a transposed view, 16 MiB at a time), and a weight
with more than one use (a tied embedding: the Gather table and the lm_head) is stored once and
keeps its Transpose. The reference logits are taken first and the torch model is freed before
ONNX Runtime runs the file.
"""

from __future__ import annotations

import gc
import shutil
import sys
from pathlib import Path
from typing import Any, NamedTuple

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.checkpoint import load_checkpoint
from common.determinism import mapped_session_options, pin_torch
from common.digest import sha256_file
from common.onnx_file import append_initializers, load_lazily, save_inline

# Fixed relative names: the traced file must not depend on the (fresh) scratch path.
WORK = Path("export_work")
GRAPH_PATH = WORK / "graph.onnx"  # torch's export: the weights are graph inputs
WEIGHTS_NAME = "weights.bin"  # the initializers' data, in initializer order
EXPORT_PATH = WORK / "model.onnx"
SEED = 0


class Reference(NamedTuple):
    """A gate input and torch's logits on it."""

    ids: Any
    logits: Any


def graph_weights(model: Any) -> dict[str, Any]:
    # named_parameters lists a tied parameter once, under its first name: one tensor, one input.
    return {name: p.detach() for name, p in model.named_parameters()}


def parameter_slots(model: Any) -> list[tuple[Any, str, str]]:
    """(module, attribute, graph_weights name) for every parameter slot, tied ones included."""
    canonical = {id(p): name for name, p in model.named_parameters()}
    slots = []
    for name, p in model.named_parameters(remove_duplicate=False):
        owner, _, attribute = name.rpartition(".")
        slots.append((model.get_submodule(owner), attribute, canonical[id(p)]))
    return slots


def logits_module(model: Any, names: list[str]) -> Any:
    import torch

    slots = parameter_slots(model)

    class LogitsOnly(torch.nn.Module):
        """(input_ids, *weights) -> logits, nothing else in the graph's interface."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
            # The given tensors stand in for the parameters, so the trace reads them as inputs.
            # (torch.func.functional_call does this but refuses to run under the tracer;
            # `_parameters` is written directly because setattr only takes Parameters.)
            given = dict(zip(names, weights, strict=True))
            saved = [(module, attr, module._parameters[attr]) for module, attr, _ in slots]
            for module, attr, name in slots:
                module._parameters[attr] = given[name]
            try:
                # An explicit all-ones mask keeps transformers off its packed-sequence
                # detection, which uses aten::diff (no ONNX symbolic); unpadded, it changes
                # nothing.
                mask = torch.ones_like(input_ids)
                return self.inner(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
            finally:
                for module, attr, parameter in saved:
                    module._parameters[attr] = parameter

    return LogitsOnly(model).eval()


def export_graph(module: Any, sample: Any, weights: dict[str, Any], opset: int) -> None:
    import torch

    WORK.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module,
            (sample, *weights.values()),
            str(GRAPH_PATH),
            dynamo=False,
            opset_version=opset,
            input_names=["input_ids", *weights],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
            do_constant_folding=True,
        )


def foldable_transposes(model: Any, weights: dict[str, Any]) -> dict[str, Any]:
    """Weight name -> the Transpose that is its only use (a Linear's weight), where it is 2-D
    and transposed plainly; a tied weight (two uses) is not in the result."""
    uses: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for value in node.input:
            uses.setdefault(value, []).append(node)
    found = {}
    for name, weight in weights.items():
        users = uses.get(name, [])
        if weight.dim() != 2 or len(users) != 1 or users[0].op_type != "Transpose":
            continue
        perm = [list(a.ints) for a in users[0].attribute if a.name == "perm"]
        if perm in ([], [[1, 0]]):
            found[name] = users[0]
    return found


def drop_transposes(model: Any, transposes: dict[str, Any]) -> None:
    """Remove the folded Transposes; their users read the transposed initializer instead."""
    renames = {node.output[0]: f"{name}.T" for name, node in transposes.items()}
    kept = [n for n in model.graph.node
            if not (n.op_type == "Transpose" and n.output[0] in renames)]
    for node in kept:
        for i, value in enumerate(node.input):
            if value in renames:
                node.input[i] = renames[value]
    model.graph.ClearField("node")
    model.graph.node.extend(kept)


def attach_weights(model: Any, weights: dict[str, Any]) -> None:
    """The weight inputs become initializers, their data written to WORK/WEIGHTS_NAME."""
    transposes = foldable_transposes(model, weights)
    arrays = ((f"{name}.T", weight.t().numpy()) if name in transposes else (name, weight.numpy())
              for name, weight in weights.items())
    append_initializers(model, arrays, WORK, WEIGHTS_NAME)
    drop_transposes(model, transposes)
    kept = [i for i in model.graph.input if i.name not in weights]
    model.graph.ClearField("input")
    model.graph.input.extend(kept)


def torch_logits(module: Any, weights: dict[str, Any], ids: Any) -> Any:
    import numpy as np
    import torch

    with torch.no_grad():
        return module(ids, *weights.values()).numpy().astype(np.float64)


def onnx_logits(session: Any, ids: Any, reference: Any) -> Any:
    import numpy as np

    logits = session.run(["logits"], {"input_ids": ids.numpy()})[0].astype(np.float64)
    if logits.shape != reference.shape:
        fail(f"export gate failed: ONNX logits {logits.shape} != torch {reference.shape}")
    return logits


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def gate_session() -> Any:
    """Single-threaded session over EXPORT_PATH's own bytes. ONNX Runtime parsing a file with
    inline tensors holds them ~1.5 times over; given a view of the file whose initializers
    refer to their bytes in it (external data), it maps them instead. Without prepacking (a
    repacked copy of every MatMul weight) and constant folding (a transposed copy of a tied
    embedding) it runs on those mapped pages alone."""
    import onnx
    import onnxruntime as ort

    view_path = WORK / "view.onnx"
    onnx.save(load_lazily(EXPORT_PATH, WORK), str(view_path))
    onnx.checker.check_model(str(view_path))
    return ort.InferenceSession(str(view_path), mapped_session_options(),
                                providers=["CPUExecutionProvider"],
                                disabled_optimizers=["ConstantFolding"])


def compare(main: Reference, other: Reference) -> dict[str, float]:
    import numpy as np

    session = gate_session()
    onnx_main = onnx_logits(session, main.ids, main.logits)
    onnx_other = onnx_logits(session, other.ids, other.logits)
    a, b = onnx_main[0, -1], main.logits[0, -1]
    return {
        "cosine_last": cosine(a, b),
        "cosine_other_shape": cosine(onnx_other[1, -1], other.logits[1, -1]),
        "max_abs_diff_last": float(np.abs(a - b).max()),
        "max_abs_diff_all": float(np.abs(onnx_main - main.logits).max()),
        "same_argmax_last": bool(a.argmax() == b.argmax()),
    }


def export(ckpt: Path, text: str, opset: int, model_name: str) -> tuple[Reference, Reference]:
    """Write EXPORT_PATH; torch's logits on the gate's two inputs."""
    import onnx
    import torch

    tok, model = load_checkpoint(ckpt)
    ids = tok(text, return_tensors="pt").input_ids.to(torch.long)
    if ids.shape[1] == 0:
        fail("export: reference_text tokenizes to zero tokens")
    weights = graph_weights(model)
    module = logits_module(model, list(weights))
    # The trace saw one shape; a batch of 2 at another length catches sizes frozen into the graph.
    other = ids[:, : max(1, ids.shape[1] // 2)].repeat(2, 1)
    main, second = (Reference(x, torch_logits(module, weights, x)) for x in (ids, other))
    print(f"exporting {model_name} at opset {opset}, reference {ids.shape[1]} tokens", flush=True)
    export_graph(module, ids, weights, opset)
    graph = onnx.load(str(GRAPH_PATH))
    attach_weights(graph, weights)
    del tok, model, module, weights
    gc.collect()  # the float weights leave memory before ONNX Runtime maps them again
    save_inline(graph, EXPORT_PATH, WORK)
    return main, second


def main() -> None:
    action = load_action(sys.argv)
    opset = int(action.params.get("opset", 17))
    text = str(action.params.get("reference_text", ""))
    cosine_min = float(action.params.get("cosine_min", 0.9999))
    pin_torch(SEED)

    main_ref, other_ref = export(action.input_dir("fetch") / "checkpoint", text, opset,
                                 action.model)
    stats = compare(main_ref, other_ref)
    worst_cosine = min(stats["cosine_last"], stats["cosine_other_shape"])
    passed = worst_cosine >= cosine_min
    report = {
        "model": action.model,
        "opset": opset,
        "reference_text": text,
        "reference_tokens": int(main_ref.ids.shape[1]),
        "cosine_last": round_sig(stats["cosine_last"], 8),
        "cosine_min": cosine_min,
        "cosine_other_shape": round_sig(stats["cosine_other_shape"], 8),
        "max_abs_diff_last": round_sig(stats["max_abs_diff_last"]),
        "max_abs_diff_all": round_sig(stats["max_abs_diff_all"]),
        "same_argmax_last": stats["same_argmax_last"],
        "onnx_sha256": sha256_file(EXPORT_PATH),
        "onnx_bytes": EXPORT_PATH.stat().st_size,
        "passed": passed,
    }
    print(
        f"cosine {report['cosine_last']} (min {cosine_min}), max abs diff "
        f"{report['max_abs_diff_last']} (last), {report['max_abs_diff_all']} (all positions)",
        flush=True,
    )
    if not passed:
        fail(f"export gate failed: cosine {round_sig(worst_cosine, 8)} < cosine_min {cosine_min}")
    shutil.move(str(EXPORT_PATH), action.out / "model.onnx")
    write_json(action.out / "export_report.json", report)
    check_outputs(action)


if __name__ == "__main__":
    main()
