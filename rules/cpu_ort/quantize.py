"""quantize (cpu-ort): quantization of the exported ONNX model, by the model's declared method.

- weight_only_int8 / weight_only_int4 (default: weight_only_int8): ONNX Runtime's MatMulNBits
  contrib op, weights of every MatMul with a constant weight quantized in blocks of block_size
  along K (symmetric or with zero points), activations stay float32. This is what keeps a real
  pretrained checkpoint's top-1 (a 135M Llama: teacher-forced 0.97..1.0, logit cosine 0.9995 at
  int8 block 32).
- dynamic_int8: `quantize_dynamic`, int8 weights per tensor and activations quantized at run time.
- static_qdq: `quantize_static` in QDQ format with MinMax calibration (below), `exclude` regexes
  naming nodes left in float. Static activation ranges wreck a real checkpoint (top-1 ~0.4).

The output is always `model.int8.onnx` ("the quantized model"); the method and its figures
are recorded in the model's metadata_props (`hefbuild.quantize.*`) for verify to report.

Static calibration samples are lines of the calibration text, shuffled with a fixed seed, tokenized
like prompts (<s> first) and truncated to seq_len. They are NOT padded: the exported graph has
no attention-mask input, so pad tokens would be attended to and would skew activation ranges
with statistics that never occur at inference. Each sample is a batch of one at its own length
(the graph's seq axis is dynamic and the calibrator reduces every tensor to a scalar min/max).
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action

# quantize_static writes helper files (e.g. "<name>-inferred.onnx") next to its input, and the
# upstream folder is read-only, so the model is copied here first; nothing here reaches `out`.
WORK_DIR = Path("quantize_work")
QUANT_TYPES = ("QInt8", "QUInt8")
METHODS = ("weight_only_int8", "weight_only_int4", "dynamic_int8", "static_qdq")
META_PREFIX = "hefbuild.quantize."


def read_samples(path: Path, samples: int, seed: int) -> list[str]:
    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        fail(f"quantize: cannot read calibration file {path.name}: {exc}")
    lines = [ln for ln in lines if ln]
    if not lines:
        fail(f"quantize: calibration file {path.name} has no non-empty lines")
    random.Random(seed).shuffle(lines)
    if len(lines) < samples:
        print(f"note: only {len(lines)} calibration lines, fewer than samples={samples}")
    return lines[:samples]


def tokenize(ckpt: Path, lines: list[str], seq_len: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    encoded = [tok(line).input_ids[:seq_len] for line in lines]
    return [ids for ids in encoded if ids]


class TokenReader:
    """CalibrationDataReader over pre-tokenized samples (duck-typed: get_next + rewind)."""

    def __init__(self, samples: list[list[int]]) -> None:
        self.samples = samples
        self.index = 0

    def get_next(self) -> dict[str, Any] | None:
        import numpy as np

        if self.index >= len(self.samples):
            return None
        ids = np.asarray([self.samples[self.index]], dtype=np.int64)
        self.index += 1
        return {"input_ids": ids}

    def rewind(self) -> None:
        self.index = 0

    def __len__(self) -> int:
        return len(self.samples)


@contextlib.contextmanager
def single_threaded_calibration() -> Iterator[None]:
    """The calibrator builds its own session with default (multi-)threading; pin it to one
    thread so activation ranges, hence scales and output bytes, cannot depend on scheduling."""
    import onnxruntime
    from onnxruntime.quantization import calibrate

    original = calibrate.CalibraterBase.create_inference_session

    def create(self: Any) -> None:
        so = onnxruntime.SessionOptions()
        so.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        self.infer_session = onnxruntime.InferenceSession(
            self.augmented_model_path, sess_options=so, providers=self.execution_providers
        )

    calibrate.CalibraterBase.create_inference_session = create
    try:
        yield
    finally:
        calibrate.CalibraterBase.create_inference_session = original


def quant_type(action: Action, name: str, default: str) -> Any:
    from onnxruntime.quantization import QuantType

    value = str(action.params.get(name, default))
    if value not in QUANT_TYPES:
        fail(f"quantize: params.{name} {value!r} is not one of {list(QUANT_TYPES)}")
    return getattr(QuantType, value)


def excluded_nodes(source: Path, patterns: list[str]) -> list[str]:
    """Names of the graph's nodes matched (re.search) by any pattern; a bad regex fails."""
    import onnx

    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            fail(f"quantize: params.exclude pattern {pattern!r} is not a regex: {exc}")
    names = [n.name for n in onnx.load(str(source)).graph.node]
    return sorted({n for n in names if any(c.search(n) for c in compiled)})


def quantize_static_qdq(action: Action, source: Path, target: Path) -> dict[str, str]:
    params = action.params
    samples_n = int(params.get("samples", 32))
    seq_len = int(params.get("seq_len", 32))
    seed = int(params.get("seed", 0))
    per_channel = bool(params.get("per_channel", False))
    op_types = [str(op) for op in params.get("op_types", ["MatMul", "Gemm"])]
    activation_type = quant_type(action, "activation_type", "QUInt8")
    weight_type = quant_type(action, "weight_type", "QInt8")
    if samples_n < 1 or seq_len < 1:
        fail(f"quantize: samples ({samples_n}) and seq_len ({seq_len}) must be >= 1")
    exclude = excluded_nodes(source, [str(p) for p in params.get("exclude", [])])

    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    lines = read_samples(action.file("calibration"), samples_n, seed)
    samples = tokenize(action.input_dir("fetch") / "checkpoint", lines, seq_len)
    lengths = [len(s) for s in samples]
    print(f"calibration: {len(samples)} samples, tokens/sample {min(lengths)}..{max(lengths)}")
    if exclude:
        print(f"excluded from quantization: {len(exclude)} nodes")
    with single_threaded_calibration():
        quantize_static(
            str(source),
            str(target),
            calibration_data_reader=TokenReader(samples),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=op_types,
            nodes_to_exclude=exclude,
            per_channel=per_channel,
            activation_type=activation_type,
            weight_type=weight_type,
            calibrate_method=CalibrationMethod.MinMax,
        )
    q, dq = count_ops(target, "QuantizeLinear"), count_ops(target, "DequantizeLinear")
    if q == 0:
        fail(f"quantize: no QuantizeLinear nodes inserted for op_types {op_types}")
    print(f"quantized {op_types}: {q} QuantizeLinear, {dq} DequantizeLinear nodes")
    return {"quantized_nodes": str(q), "excluded_nodes": str(len(exclude))}


def quantize_dynamic_int8(source: Path, target: Path) -> dict[str, str]:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(
        str(source), str(target), op_types_to_quantize=["MatMul", "Gemm"],
        weight_type=QuantType.QInt8, per_channel=False,
    )
    n = count_ops(target, "MatMulInteger") + count_ops(target, "DynamicQuantizeMatMul")
    if n == 0:
        fail("quantize: dynamic_int8 quantized no MatMul/Gemm node")
    print(f"dynamic int8: {n} MatMul nodes with int8 weights and run-time activation scales")
    return {"quantized_nodes": str(n)}


def quantize_weight_only(
    source: Path, target: Path, bits: int, block_size: int, symmetric: bool
) -> dict[str, str]:
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if block_size < 16 or block_size & (block_size - 1):
        fail(f"quantize: params.block_size {block_size} must be a power of two >= 16")
    # The quantizer logs one INFO line per node on the root logger.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(source)), bits=bits, block_size=block_size, is_symmetric=symmetric,
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(target))
    n = count_ops(target, "MatMulNBits")
    if n == 0:
        fail(f"quantize: weight_only_int{bits} found no MatMul with a constant weight")
    kind = "symmetric" if symmetric else "asymmetric"
    print(f"weight-only int{bits}: {n} MatMulNBits nodes, block {block_size}, {kind}")
    return {"quantized_nodes": str(n), "bits": str(bits), "block_size": str(block_size),
            "symmetric": str(symmetric).lower()}


def count_ops(path: Path, op_type: str) -> int:
    import onnx

    return sum(1 for n in onnx.load(str(path)).graph.node if n.op_type == op_type)


def record(target: Path, method: str, figures: dict[str, str], source: Path) -> None:
    """The method and its figures as metadata_props of the quantized model."""
    import onnx

    model = onnx.load(str(target))
    props = {p.key: p.value for p in model.metadata_props if not p.key.startswith(META_PREFIX)}
    figures = {
        "method": method,
        **figures,
        "float_bytes": str(source.stat().st_size),
        "quantized_bytes": str(target.stat().st_size),
    }
    props.update({META_PREFIX + k: v for k, v in figures.items()})
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.add(key=key, value=props[key])
    onnx.save(model, str(target))


def main() -> None:
    action = load_action(sys.argv)
    params = action.params
    method = str(params.get("method", "weight_only_int8"))
    if method not in METHODS:
        fail(f"quantize: params.method {method!r} is not one of {list(METHODS)}")

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    source = WORK_DIR / "model.onnx"
    shutil.copyfile(action.input_dir("export") / "model.onnx", source)
    target = WORK_DIR / "model.int8.onnx"
    if method == "static_qdq":
        figures = quantize_static_qdq(action, source, target)
    elif method == "dynamic_int8":
        figures = quantize_dynamic_int8(source, target)
    else:
        figures = quantize_weight_only(
            source, target, bits=8 if method == "weight_only_int8" else 4,
            block_size=int(params.get("block_size", 32)),
            symmetric=bool(params.get("symmetric", True)),
        )
    record(target, method, figures, source)
    size = target.stat().st_size
    print(f"method {method}: {source.stat().st_size} -> {size} bytes")
    shutil.move(str(target), action.out / "model.int8.onnx")
    check_outputs(action)


if __name__ == "__main__":
    main()
