"""Which layers' weight precision costs the model most, in the fidelity stage's emulation: per
layer group (a decoder layer's projections, run_config's `layer_names` by index; the lm_head
on its own), the float32 graph is run with only that group's MatMul weights rounded to the
bits the recipe gives them (symmetric per output channel, numpy), on the first calibration
rows; the logit cosine against the float32 graph and the top-1 agreement say what that group
alone costs. Activations stay float32 here: the table ranks weights, the one thing a
`precision_mode` line changes per layer. One ONNX Runtime session per group, its weights
swapped in with `SessionOptions.add_initializer` (the model file is not rewritten)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.action import round_sig
from common.compare import argmax, cosine
from common.hailo_precision import DEFAULT, Precision


@dataclass(frozen=True)
class Group:
    name: str  # "layer 3", "lm_head"
    nodes: tuple[str, ...]  # its MatMul nodes with a constant weight


def layer_groups(layer_names: dict[str, list[str]], weighted: set[str]) -> list[Group]:
    """Decoder layers by index across the projection kinds, then the lm_head's shards."""
    by_index: dict[int, list[str]] = {}
    head: list[str] = []
    for kind, names in sorted(layer_names.items()):
        for i, node in enumerate(names):
            if node not in weighted:
                continue
            (head if kind == "lm_head" else by_index.setdefault(i, [])).append(node)
    groups = [Group(f"layer {i}", tuple(nodes)) for i, nodes in sorted(by_index.items())]
    return groups + ([Group("lm_head", tuple(head))] if head else [])


def fake_quantized(weight: Any, bits: int) -> Any:
    """Symmetric per output channel (axis 1 of a MatMul's B), rounded and dequantized."""
    import numpy as np

    if bits >= 16:
        return weight
    top = 2 ** (bits - 1) - 1
    amax = np.abs(weight).max(axis=0, keepdims=True)
    scale = np.where(amax > 0, amax / top, 1.0).astype(np.float32)
    return (np.clip(np.rint(weight / scale), -top, top) * scale).astype(np.float32)


@dataclass
class Sensitivity:
    """The float graph, its weights, and the rows' float32 logits to compare against."""

    model_path: Path
    weights: dict[str, Any]  # MatMul node -> its weight initializer name
    arrays: Callable[[str], Any]  # initializer name -> numpy array
    feeds: list[dict[str, Any]]
    outputs: list[str]

    def logits(self, swaps: dict[str, Any]) -> list[Any]:
        import numpy as np
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.log_severity_level = 3
        held = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in swaps.items()}
        for name, value in held.items():  # the session reads them: kept alive until done
            so.add_initializer(name, value)
        session = ort.InferenceSession(str(self.model_path), so,
                                       providers=["CPUExecutionProvider"])
        return [np.concatenate([np.asarray(o, dtype=np.float32).ravel()
                                for o in session.run(self.outputs, f)]) for f in self.feeds]

    def measure(self, group: Group, precision: dict[str, Precision],
                reference: list[Any]) -> dict[str, Any]:
        swaps = {}
        for node in group.nodes:
            bits = precision.get(node, DEFAULT).weight_bits
            name = self.weights[node]
            swaps[name] = fake_quantized(self.arrays(name), bits)
        rows = self.logits(swaps)
        cosines = [cosine(r, q) for r, q in zip(reference, rows, strict=True)]
        top1 = sum(argmax(r) == argmax(q) for r, q in zip(reference, rows, strict=True))
        bits = sorted({precision.get(n, DEFAULT).weight_bits for n in group.nodes})
        mean = sum(cosines) / len(cosines)
        return {"group": group.name, "weights": "/".join(f"w{b}" for b in bits),
                "nodes": len(group.nodes), "logit_cosine": round_sig(mean),
                "cosine_loss": round_sig(1.0 - mean), "top1_agreement": round_sig(
                    top1 / len(rows))}


def table(sens: Sensitivity, groups: list[Group],
          precision: dict[str, Precision]) -> list[dict[str, Any]]:
    """Every group's cost, the costliest first (ties: graph order)."""
    reference = sens.logits({})
    rows = [sens.measure(g, precision, reference) for g in groups]
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]["cosine_loss"], i))
    return [rows[i] for i in order]
