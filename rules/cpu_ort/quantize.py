"""quantize (cpu-ort): static int8 QDQ quantization of the exported ONNX model.

Calibration samples are lines of the calibration text, shuffled with a fixed seed, tokenized
like prompts (<s> first) and truncated to seq_len. They are NOT padded: the exported graph has
no attention-mask input, so pad tokens would be attended to and would skew activation ranges
with statistics that never occur at inference. Each sample is a batch of one at its own length
(the graph's seq axis is dynamic and the calibrator reduces every tensor to a scalar min/max).
"""

from __future__ import annotations

import contextlib
import random
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


def count_qdq(path: Path) -> tuple[int, int]:
    import onnx

    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    return ops.count("QuantizeLinear"), ops.count("DequantizeLinear")


def main() -> None:
    action = load_action(sys.argv)
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

    from onnxruntime.quantization import CalibrationMethod, QuantFormat, quantize_static

    lines = read_samples(action.file("calibration"), samples_n, seed)
    samples = tokenize(action.input_dir("fetch") / "checkpoint", lines, seq_len)
    lengths = [len(s) for s in samples]
    print(f"calibration: {len(samples)} samples, tokens/sample {min(lengths)}..{max(lengths)}")

    WORK_DIR.mkdir(parents=True, exist_ok=True)
    source = WORK_DIR / "model.onnx"
    shutil.copyfile(action.input_dir("export") / "model.onnx", source)
    target = WORK_DIR / "model.int8.onnx"
    with single_threaded_calibration():
        quantize_static(
            str(source),
            str(target),
            calibration_data_reader=TokenReader(samples),
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=op_types,
            per_channel=per_channel,
            activation_type=activation_type,
            weight_type=weight_type,
            calibrate_method=CalibrationMethod.MinMax,
        )
    q, dq = count_qdq(target)
    if q == 0:
        fail(f"quantize: no QuantizeLinear nodes inserted for op_types {op_types}")
    print(f"quantized {op_types}: {q} QuantizeLinear, {dq} DequantizeLinear nodes")
    shutil.move(str(target), action.out / "model.int8.onnx")
    check_outputs(action)


if __name__ == "__main__":
    main()
