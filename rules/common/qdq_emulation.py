"""The fidelity stage's CPU emulation of a Hailo recipe's precisions as ONNX graphs for ONNX
Runtime, written here (no `quantize_static`): the export's graph with fake quantization
inserted, its weights left in export's file or handed to the session already rounded.

What is quantized:
- every tensor a MatMul node reads or writes (but the graph inputs): a QuantizeLinear /
  DequantizeLinear pair (com.microsoft, so 16 bits work at any opset) right after the node
  that writes it, per tensor, asymmetric unsigned, `bits` from `tensor_bits`, range = min/max
  of the float32 graph over the calibration rows (MinMax, `with_ranges`);
- constant MatMul weights (input B): symmetric per output channel, 4, 8 or 16 bits, rounded
  and dequantized in numpy (`fake_quantize`: what a DequantizeLinear of the integer weight
  computes, without holding both), handed to the session in place of the file's;
- the graph inputs, by fake-quantizing the feeds the same way (Q then DQ, numpy): they are
  the DFC's input layers, which no MatMul reads directly.
Every other op (norms, softmax, SiLU, adds, the mask) computes in float32; only what it
writes into a MatMul is quantized (at its layer's bits). The Q/DQ nodes are executed as
written (no graph optimization, no integer kernels).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from common.hailo_precision import DEFAULT, Precision

MS_DOMAIN = "com.microsoft"
ZERO_TYPES = {8: "uint8", 16: "uint16"}


@dataclass(frozen=True)
class MatMuls:
    """The graph's MatMul nodes, in graph order, with what each reads and writes."""

    names: list[str]
    reads: dict[str, list[str]]  # node -> its non-constant inputs
    writes: dict[str, list[str]]  # node -> its outputs
    weights: dict[str, list[str]]  # node -> its constant B input (0 or 1 name)
    inputs: list[str]  # graph inputs
    writer: dict[str, str]  # tensor a MatMul reads -> the node that writes it

    @property
    def constant(self) -> list[str]:
        return [n for n in self.names if self.weights[n]]


def matmuls(model: Any) -> MatMuls:
    graph = model.graph
    inits = {i.name for i in graph.initializer}
    writer = {out: node.name for node in graph.node for out in node.output}
    names, reads, writes, weights = [], {}, {}, {}
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        names.append(node.name)
        reads[node.name] = [t for t in node.input if t not in inits]
        writes[node.name] = list(node.output)
        weights[node.name] = [node.input[1]] if node.input[1] in inits else []
    read = {t for ts in reads.values() for t in ts}
    return MatMuls(names, reads, writes, weights,
                   [i.name for i in graph.input if i.name not in inits],
                   {t: writer[t] for t in sorted(read) if t in writer})


def tensor_bits(graph: MatMuls, precision: dict[str, Precision], input_bits: dict[str, int],
                mapped: set[str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Bits of every tensor a MatMul touches and of every MatMul weight.

    A layer's aX is the width of what it writes: a tensor gets the activation bits of the
    node that writes it (`precision`, by ONNX node; DEFAULT when the recipe leaves that
    layer alone), a graph input those of its input layer. A tensor whose writer no DFC layer
    maps to (not in `mapped`, when given: an op the HN folds into a neighbour) is taken as
    the input of the MatMul layers that read it: their fewest activation bits (DEFAULT when
    no mapped MatMul reads it). A MatMul's own weights get its wY; a weight several MatMuls
    share, the fewest bits any of them asks for.
    """
    readers: dict[str, list[str]] = {}
    writer = dict(graph.writer)
    for node in graph.names:
        for t in graph.reads[node]:
            readers.setdefault(t, []).append(node)
        for t in graph.writes[node]:
            writer[t] = node

    def bits(t: str) -> int:
        if t in input_bits:
            return input_bits[t]
        w = writer.get(t)
        if mapped is None or w in mapped:
            return precision.get(w, DEFAULT).activation_bits if w else DEFAULT.activation_bits
        read = [precision.get(r, DEFAULT).activation_bits for r in readers.get(t, [])
                if r in mapped]
        return min(read) if read else DEFAULT.activation_bits

    acts: dict[str, int] = {}
    weights: dict[str, int] = {}
    for node in graph.names:
        for t in graph.writes[node] + graph.reads[node]:
            if t in input_bits or t in writer:
                acts[t] = bits(t)
        own = precision.get(node, DEFAULT)
        for w in graph.weights[node]:
            weights[w] = min(weights.get(w, own.weight_bits), own.weight_bits)
    return acts, weights


@dataclass(frozen=True)
class Quant:
    """Q then DQ of one tensor: asymmetric unsigned, `bits` wide, over [lo, hi] ∪ {0}."""

    bits: int
    scale: float
    zero_point: int

    @classmethod
    def of(cls, bits: int, lo: float, hi: float) -> Quant:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        qmax = (1 << bits) - 1
        scale = (hi - lo) / qmax if hi > lo else 0.0
        zero = int(round(-lo / scale)) if scale else 0
        return cls(bits, scale, max(0, min(qmax, zero)))

    def apply(self, x: Any) -> Any:
        import numpy as np

        if not self.scale:
            return x
        scale = np.float32(self.scale)
        q = np.clip(np.round(x / scale) + self.zero_point, 0, (1 << self.bits) - 1)
        return ((q - self.zero_point) * scale).astype(np.float32)


def input_ranges(feeds: Iterable[dict[str, Any]], names: Iterable[str]
                 ) -> dict[str, tuple[float, float]]:
    """Per graph input, its range over the calibration feeds (0 included)."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    names = list(names)
    for feed in feeds:
        for name in names:
            lo[name] = min(lo.get(name, 0.0), float(feed[name].min()))
            hi[name] = max(hi.get(name, 0.0), float(feed[name].max()))
    return {name: (lo[name], hi[name]) for name in sorted(lo)}


def quants(ranges: dict[str, tuple[float, float]], bits: dict[str, int]) -> dict[str, Quant]:
    """The quantizer of every tensor `bits` names, over its calibrated range."""
    return {name: Quant.of(b, *ranges[name]) for name, b in sorted(bits.items())}


def activation_points(graph: MatMuls) -> list[str]:
    """Every tensor a MatMul reads or writes but the graph inputs (fed quantized), in graph
    order: where the emulation quantizes activations."""
    seen: dict[str, None] = {}
    for node in graph.names:
        for t in graph.reads[node] + graph.writes[node]:
            if t not in graph.inputs:
                seen.setdefault(t, None)
    return list(seen)


def with_ranges(model: Any, points: list[str]) -> Any:
    """A copy of `model` (weights still referring to their file) that also outputs each
    point's min and max (`<t>/min`, `<t>/max`): calibration in the one float32 session. Each
    reduction follows the node that writes its tensor, so the tensor is not held to the end."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    h, graph = onnx.helper, out.graph
    wanted = set(points)
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        graph.node.append(node)
        for t in node.output:
            if t not in wanted:
                continue
            for op in ("Min", "Max"):
                graph.node.append(h.make_node(f"Reduce{op}", [t], [f"{t}/{op.lower()}"],
                                              name=f"{t}/Reduce{op}", keepdims=0))
    graph.output.extend(h.make_tensor_value_info(f"{t}/{op}", onnx.TensorProto.FLOAT, [])
                        for t in points for op in ("min", "max"))
    return out


def with_fake_quant(model: Any, points: dict[str, Quant]) -> Any:
    """A copy of `model` where every tensor of `points` is quantized and dequantized right
    after the node that writes it: the writer's output is renamed `<t>/float`, and the DQ
    writes `t`, so every reader (and a graph output) sees the rounded tensor."""
    import numpy as np
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    h, graph = onnx.helper, out.graph
    nodes = list(graph.node)
    del graph.node[:]
    for node in nodes:
        wanted = [t for t in node.output if t in points]
        for k, t in enumerate(node.output):
            if t in points:
                node.output[k] = f"{t}/float"
        graph.node.append(node)
        for t in wanted:
            q = points[t]
            zero = np.array(q.zero_point, dtype=ZERO_TYPES[q.bits])
            graph.initializer.extend([
                onnx.numpy_helper.from_array(np.array(q.scale, np.float32), f"{t}/scale"),
                onnx.numpy_helper.from_array(zero, f"{t}/zero")])
            qdq = [f"{t}/scale", f"{t}/zero"]
            graph.node.extend([
                h.make_node("QuantizeLinear", [f"{t}/float", *qdq], [f"{t}/q"],
                            name=f"{t}/Quantize", domain=MS_DOMAIN),
                h.make_node("DequantizeLinear", [f"{t}/q", *qdq], [t],
                            name=f"{t}/Dequantize", domain=MS_DOMAIN)])
    if not any(o.domain == MS_DOMAIN for o in out.opset_import):
        out.opset_import.append(h.make_opsetid(MS_DOMAIN, 1))
    return out


def fake_quantize(weight: Any, bits: int) -> Any:
    """Symmetric per output channel (the last axis of a MatMul's B), rounded to `bits` and
    dequantized, in place (a weight read from the file is the only copy held)."""
    import numpy as np

    top = np.float32(2 ** (bits - 1) - 1)
    amax = np.abs(weight).max(axis=tuple(range(weight.ndim - 1)), keepdims=True)
    scale = np.where(amax > 0, amax / top, np.float32(1.0)).astype(np.float32)
    np.divide(weight, scale, out=weight)
    np.rint(weight, out=weight)
    np.clip(weight, -top, top, out=weight)
    np.multiply(weight, scale, out=weight)
    return weight


def counts(acts: dict[str, int], weights: dict[str, int]) -> dict[str, dict[str, int]]:
    """What the emulation quantizes: weights by integer type, activation tensors by theirs
    (graph inputs not counted: they are quantized in the feeds)."""
    def tally(bits: Iterable[int], prefix: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in bits:
            out[f"{prefix}{b}"] = out.get(f"{prefix}{b}", 0) + 1
        return dict(sorted(out.items()))

    return {"weights": tally(weights.values(), "int"),
            "activations": tally(acts.values(), "uint")}
