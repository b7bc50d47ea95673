"""quantize (cpu-ort): quantization of the exported ONNX model, by the model's declared method.

- weight_only_int8 / weight_only_int4 (default: weight_only_int8): ONNX Runtime's MatMulNBits
  contrib op, weights of every MatMul with a constant weight quantized in blocks of block_size
  along K (symmetric or with zero points), activations stay float32; the token embedding's
  Gather table in int8 with a scale per row (common.onnx_gather_int8), in both. This is what
  keeps a real pretrained checkpoint's top-1 (a 135M Llama: teacher-forced 0.97..1.0, logit
  cosine 0.9995 at int8 block 32).
- dynamic_int8: `quantize_dynamic`, int8 weights per tensor and activations quantized at run time.
- static_qdq: `quantize_static` in QDQ format with MinMax calibration (below), `exclude` regexes
  naming nodes left in float. Static activation ranges wreck a real checkpoint (top-1 ~0.4).

The output is always `model.int8.onnx` ("the quantized model"); the method and its figures
are recorded in the model's metadata_props (`hefbuild.quantize.*`) for verify to report.

Memory: the float model is never parsed whole. It is read lazily (common.onnx_file: its
initializers stay in the copied file and are read on demand), the result is written inline from
those references, and ONNX Runtime's path-based quantizers (dynamic, static) get the graph with
its initializers as external data in that same file, write their result with external data, and
calibrate through a cached range file so the model is not held while the calibration session
runs. A tied embedding (stored once by export: the Gather table, and Transpose(table) for the
lm_head) gets a transposed copy for the lm_head's MatMul only where that MatMul is quantized, so
the quantized file holds the float table once and the lm_head once, quantized.

Static calibration samples are lines of the calibration text, shuffled with a fixed seed, tokenized
like prompts (<s> first) and truncated to seq_len. They are NOT padded: the exported graph has
no attention-mask input, so pad tokens would be attended to and would skew activation ranges
with statistics that never occur at inference. Each sample is a batch of one at its own length
(the graph's seq axis is dynamic and the calibrator reduces every tensor to a scalar min/max).
"""

from __future__ import annotations

import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action
from common.onnx_file import inline_size, load_lazily, save_inline
from common.onnx_gather_int8 import quantize_gathers
from common.onnx_untie import untie_transposed_weights
from common.ort_calibration import calibrate, read_samples, tokenize

# quantize_static writes helper files (e.g. "<name>-inferred.onnx") next to its input, and the
# upstream folder is read-only, so the model is copied here first; nothing here reaches `out`.
WORK_DIR = Path("quantize_work")
SOURCE = WORK_DIR / "model.onnx"  # the float model, copied
ORT_INPUT = WORK_DIR / "float.onnx"  # its graph, initializers referring into SOURCE
ORT_OUTPUT = WORK_DIR / "ort.int8.onnx"  # ONNX Runtime's result, data in ORT_OUTPUT.data
CALIBRATION_CACHE = WORK_DIR / "calibration.json"
UNTIED = WORK_DIR / "untied.bin"  # transposed copies of tied weights (common.onnx_untie)
GATHER_INT8 = WORK_DIR / "gather_int8.bin"  # int8 embedding rows (common.onnx_gather_int8)
TARGET = WORK_DIR / "model.int8.onnx"
QUANT_TYPES = ("QInt8", "QUInt8")
METHODS = ("weight_only_int8", "weight_only_int4", "dynamic_int8", "static_qdq")
META_PREFIX = "hefbuild.quantize."


def quant_type(action: Action, name: str, default: str) -> Any:
    from onnxruntime.quantization import QuantType

    value = str(action.params.get(name, default))
    if value not in QUANT_TYPES:
        fail(f"quantize: params.{name} {value!r} is not one of {list(QUANT_TYPES)}")
    return getattr(QuantType, value)


def excluded_nodes(model: Any, patterns: list[str]) -> list[str]:
    """Names of the graph's nodes matched (re.search) by any pattern; a bad regex fails."""
    compiled = []
    for pattern in patterns:
        try:
            compiled.append(re.compile(pattern))
        except re.error as exc:
            fail(f"quantize: params.exclude pattern {pattern!r} is not a regex: {exc}")
    names = [n.name for n in model.graph.node]
    return sorted({n for n in names if any(c.search(n) for c in compiled)})


@dataclass(frozen=True)
class Quantized:
    """A quantized model; its initializers may refer to data in files under base_dir."""

    model: Any
    base_dir: Path
    figures: dict[str, str]


def float_model(base_dir: Path, keep_float: frozenset[str] = frozenset()) -> Any:
    """SOURCE, read lazily (references relative to base_dir), a tied lm_head untied unless
    its MatMul is in keep_float."""
    model = load_lazily(SOURCE, base_dir)
    untied = untie_transposed_weights(model, base_dir, keep_float, UNTIED)
    if untied:
        print(f"tied weights: {untied} MatMul weight(s) transposed from a shared initializer")
    return model


def ort_input(model: Any) -> Path:
    """The model as ORT_INPUT for ONNX Runtime's path-based quantizers: a small file whose
    initializers refer into SOURCE (model read relative to WORK_DIR)."""
    import onnx

    onnx.save(model, str(ORT_INPUT))
    return ORT_INPUT


def ort_output() -> Any:
    import onnx

    return onnx.load(str(ORT_OUTPUT), load_external_data=False)


def quantize_static_qdq(action: Action) -> Quantized:
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
    exclude = excluded_nodes(load_lazily(SOURCE, WORK_DIR),
                             [str(p) for p in params.get("exclude", [])])
    # An lm_head left in float keeps reading the shared table through its Transpose.
    model = (float_model(WORK_DIR, frozenset(exclude)) if "MatMul" in op_types
             else load_lazily(SOURCE, WORK_DIR))

    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    lines = read_samples(action.file("calibration"), samples_n, seed)
    samples = tokenize(action.input_dir("fetch") / "checkpoint", lines, seq_len)
    lengths = [len(s) for s in samples]
    print(f"calibration: {len(samples)} samples, tokens/sample {min(lengths)}..{max(lengths)}")
    if exclude:
        print(f"excluded from quantization: {len(exclude)} nodes")
    source = ort_input(model)
    del model
    cache = calibrate(source, samples, op_types, WORK_DIR, CALIBRATION_CACHE)
    quantize_static(
        str(source),
        str(ORT_OUTPUT),
        calibration_data_reader=None,
        calibration_cache_path=str(cache),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=op_types,
        nodes_to_exclude=exclude,
        per_channel=per_channel,
        activation_type=activation_type,
        weight_type=weight_type,
        calibrate_method=CalibrationMethod.MinMax,
        use_external_data_format=True,
    )
    result = ort_output()
    q, dq = count_ops(result, "QuantizeLinear"), count_ops(result, "DequantizeLinear")
    if q == 0:
        fail(f"quantize: no QuantizeLinear nodes inserted for op_types {op_types}")
    print(f"quantized {op_types}: {q} QuantizeLinear, {dq} DequantizeLinear nodes")
    return Quantized(result, WORK_DIR, {"quantized_nodes": str(q),
                                        "excluded_nodes": str(len(exclude))})


def quantize_dynamic_int8() -> Quantized:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = ort_input(float_model(WORK_DIR))
    quantize_dynamic(
        str(source), str(ORT_OUTPUT), op_types_to_quantize=["MatMul", "Gemm"],
        weight_type=QuantType.QInt8, per_channel=False, use_external_data_format=True,
    )
    result = ort_output()
    n = count_ops(result, "MatMulInteger") + count_ops(result, "DynamicQuantizeMatMul")
    if n == 0:
        fail("quantize: dynamic_int8 quantized no MatMul/Gemm node")
    print(f"dynamic int8: {n} MatMul nodes with int8 weights and run-time activation scales")
    return Quantized(result, WORK_DIR, {"quantized_nodes": str(n)})


def quantize_weight_only(bits: int, block_size: int, symmetric: bool) -> Quantized:
    import logging

    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    if block_size < 16 or block_size & (block_size - 1):
        fail(f"quantize: params.block_size {block_size} must be a power of two >= 16")
    # The quantizer logs one INFO line per node on the root logger.
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    # The quantizer reads each weight with no base folder: references relative to the cwd.
    base_dir = Path()
    quantizer = MatMulNBitsQuantizer(
        float_model(base_dir), bits=bits, block_size=block_size, is_symmetric=symmetric,
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    result = quantizer.model.model
    n = count_ops(result, "MatMulNBits")
    if n == 0:
        fail(f"quantize: weight_only_int{bits} found no MatMul with a constant weight")
    tables = quantize_gathers(result, base_dir, GATHER_INT8)
    kind = "symmetric" if symmetric else "asymmetric"
    print(f"weight-only int{bits}: {n} MatMulNBits nodes, block {block_size}, {kind}; "
          f"{tables} embedding table(s) int8 per row")
    return Quantized(result, base_dir, {
        "quantized_nodes": str(n), "bits": str(bits), "block_size": str(block_size),
        "symmetric": str(symmetric).lower(), "embedding_int8_tables": str(tables)})


def count_ops(model: Any, op_type: str) -> int:
    return sum(1 for n in model.graph.node if n.op_type == op_type)


def record(result: Quantized, method: str) -> None:
    """The method and its figures as metadata_props of the quantized model. quantized_bytes
    is the size of the file written, these props included: the props hold their own size,
    so it is set until it no longer changes (the size grows with its own digit count only,
    so that takes three passes, four where the count carries over)."""
    model = result.model
    others = {p.key: p.value for p in model.metadata_props if not p.key.startswith(META_PREFIX)}
    figures = {"method": method, **result.figures, "float_bytes": str(SOURCE.stat().st_size),
               "quantized_bytes": "0"}
    while True:
        _set_props(model, others | {META_PREFIX + k: v for k, v in figures.items()})
        size = str(inline_size(model, result.base_dir))
        if size == figures["quantized_bytes"]:
            return
        figures["quantized_bytes"] = size


def _set_props(model: Any, props: dict[str, str]) -> None:
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.add(key=key, value=props[key])


def quantize(action: Action, method: str) -> Quantized:
    params = action.params
    if method == "static_qdq":
        return quantize_static_qdq(action)
    if method == "dynamic_int8":
        return quantize_dynamic_int8()
    return quantize_weight_only(
        bits=8 if method == "weight_only_int8" else 4,
        block_size=int(params.get("block_size", 32)),
        symmetric=bool(params.get("symmetric", True)),
    )


def main() -> None:
    action = load_action(sys.argv)
    method = str(action.params.get("method", "weight_only_int8"))
    if method not in METHODS:
        fail(f"quantize: params.method {method!r} is not one of {list(METHODS)}")

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(action.input_dir("export") / "model.onnx", SOURCE)
    result = quantize(action, method)
    record(result, method)
    size = save_inline(result.model, TARGET, result.base_dir)
    print(f"method {method}: {SOURCE.stat().st_size} -> {size} bytes")
    shutil.move(str(TARGET), action.out / "model.int8.onnx")
    check_outputs(action)


if __name__ == "__main__":
    main()
