"""A QDQ copy of an ONNX graph with per-node precisions, made by ONNX Runtime's
`quantize_static` (the fidelity stage's CPU emulation of a Hailo recipe).

What is quantized:
- every MatMul node (in ONNX Runtime's QDQ format: a QuantizeLinear/DequantizeLinear pair on
  each input and on the output): activations per tensor, asymmetric, range = min/max over the
  calibration feeds (MinMax), QUInt8 or QUInt16 by the bits of the layer that writes the
  tensor (`tensor_bits`); constant weights (input B) symmetric per output channel, QInt4,
  QInt8 or QInt16;
- the graph inputs, by fake-quantizing the feeds the same way (Q then DQ, numpy): they are
  the DFC's input layers, which no MatMul reads directly.
Every other op (norms, softmax, SiLU, adds, the mask) computes in float32; only what it
writes into a MatMul is quantized (at its layer's bits). The Q/DQ nodes are executed as
written (no integer kernels).

The calibrator's session is pinned to one thread (`single_threaded_calibration`): activation
ranges, hence scales and every figure, must not depend on scheduling.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.hailo_precision import DEFAULT, Precision

ACTIVATION_TYPES = {8: "QUInt8", 16: "QUInt16"}
WEIGHT_TYPES = {4: "QInt4", 8: "QInt8", 16: "QInt16"}


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


def tensor_bits(graph: MatMuls, precision: dict[str, Precision], input_bits: dict[str, int]
                ) -> tuple[dict[str, int], dict[str, int]]:
    """Bits of every tensor a MatMul touches and of every MatMul weight.

    A layer's aX is the width of what it writes: a tensor gets the activation bits of the
    node that writes it (`precision`, by ONNX node; DEFAULT when the recipe leaves that
    layer alone), a graph input those of its input layer. A MatMul's own weights get its wY;
    a weight several MatMuls share, the fewest bits any of them asks for.
    """
    acts: dict[str, int] = {}
    weights: dict[str, int] = {}
    for node in graph.names:
        own = precision.get(node, DEFAULT)
        for t in graph.writes[node]:
            acts[t] = own.activation_bits
        for t in graph.reads[node]:
            if t in input_bits:
                acts[t] = input_bits[t]
            elif t in graph.writer:
                acts[t] = precision.get(graph.writer[t], DEFAULT).activation_bits
        for w in graph.weights[node]:
            weights[w] = min(weights.get(w, own.weight_bits), own.weight_bits)
    return acts, weights


def overrides(acts: dict[str, int], weights: dict[str, int], ranks: dict[str, int]
              ) -> dict[str, list[dict[str, Any]]]:
    """`TensorQuantOverrides` for the tensors that differ from the defaults (QUInt8
    activations, QInt8 per-channel weights). `ranks`: rank of each weight (channel axis last)."""
    from onnxruntime.quantization import QuantType

    out: dict[str, list[dict[str, Any]]] = {}
    for name, bits in sorted(acts.items()):
        if bits != DEFAULT.activation_bits:
            out[name] = [{"quant_type": getattr(QuantType, ACTIVATION_TYPES[bits])}]
    for name, bits in sorted(weights.items()):
        if bits != DEFAULT.weight_bits:
            out[name] = [{"quant_type": getattr(QuantType, WEIGHT_TYPES[bits]),
                          "axis": ranks[name] - 1}]
    return out


class FeedReader:
    """CalibrationDataReader (get_next + rewind) that builds each row's feeds on demand."""

    def __init__(self, rows: list[Any], feeds: Callable[[Any], dict[str, Any]]) -> None:
        self.rows, self.feeds, self.index = rows, feeds, 0

    def get_next(self) -> dict[str, Any] | None:
        if self.index >= len(self.rows):
            return None
        self.index += 1
        return self.feeds(self.rows[self.index - 1])

    def rewind(self) -> None:
        self.index = 0

    def __len__(self) -> int:
        return len(self.rows)


@contextlib.contextmanager
def single_threaded_calibration() -> Iterator[None]:
    """The calibrator makes its own session with ONNX Runtime's default thread pool; swap in
    one that runs on a single thread for as long as the context lasts."""
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import CalibraterBase

    saved = CalibraterBase.create_inference_session

    def one_thread(self: Any) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.infer_session = ort.InferenceSession(self.augmented_model_path, options,
                                                  providers=self.execution_providers)

    CalibraterBase.create_inference_session = one_thread
    try:
        yield
    finally:
        CalibraterBase.create_inference_session = saved


def quantize(source: Path, target: Path, reader: FeedReader,
             tensor_overrides: dict[str, list[dict[str, Any]]]) -> None:
    """quantize_static in QDQ format, MatMul only, MinMax; contrib Q/DQ ops so that 4- and
    16-bit types work whatever the model's opset (16-bit also lifts it to 21). The MinMax
    calibrator keeps only reduced min/max values per row, so every row is held at once
    (its CalibMaxIntermediateOutputs option drops rows instead of merging them)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with single_threaded_calibration():
        quantize_static(
            str(source), str(target), calibration_data_reader=reader,
            quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"], per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            extra_options={"TensorQuantOverrides": tensor_overrides, "UseQDQContribOps": True,
                           "WeightSymmetric": True, "ActivationSymmetric": False},
        )


@dataclass(frozen=True)
class InputQuant:
    """Q then DQ of one graph input: asymmetric unsigned, `bits` wide, over [lo, hi] ∪ {0}."""

    bits: int
    scale: float
    zero_point: int

    @classmethod
    def of(cls, bits: int, lo: float, hi: float) -> InputQuant:
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


def input_quants(feeds: Iterator[dict[str, Any]], bits: dict[str, int]) -> dict[str, InputQuant]:
    """Per graph input, its range over the calibration feeds and the quantizer of it."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for feed in feeds:
        for name in bits:
            lo[name] = min(lo.get(name, 0.0), float(feed[name].min()))
            hi[name] = max(hi.get(name, 0.0), float(feed[name].max()))
    return {name: InputQuant.of(b, lo[name], hi[name]) for name, b in sorted(bits.items())}


def qdq_counts(path: Path) -> dict[str, dict[str, int]]:
    """What the QDQ graph holds: DequantizeLinear nodes by kind (weight or activation) and
    integer type, read back from the file (the check that the overrides took)."""
    import onnx

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    counts: dict[str, dict[str, int]] = {"weights": {}, "activations": {}}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        weight = node.input[0] in inits
        # a weight's own type; an activation's is its zero point's
        typed = inits[node.input[0]] if weight else (
            inits.get(node.input[2]) if len(node.input) > 2 else None)
        dtype = onnx.TensorProto.DataType.Name(typed.data_type).lower() if typed else "?"
        kind = counts["weights" if weight else "activations"]
        kind[dtype] = kind.get(dtype, 0) + 1
    return {k: dict(sorted(v.items())) for k, v in counts.items()}
