"""Static-QDQ calibration of cpu-ort quantize: the samples, and ONNX Runtime's own MinMax
calibrator run deterministically and ahead of `quantize_static`.

Samples are lines of the calibration text, shuffled with a fixed seed, tokenized like prompts
(<s> first) and truncated to seq_len, never padded (the exported graph has no attention-mask
input, so pad tokens would skew the activation ranges); each is a batch of one at its own length.
"""

from __future__ import annotations

import contextlib
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.action import fail


def read_samples(path: Path, samples: int, seed: int) -> list[str]:
    """The file's non-empty lines in the seeded order, at most `samples` of them."""
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
    """Each line's ids by the checkpoint's tokenizer, cut to seq_len; empty ones dropped."""
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
    thread so activation ranges, hence scales and output bytes, cannot depend on scheduling.

    Memory: by then the calibrator has saved the augmented model with external data, which
    cleared the tensors of its in-memory copy but not the memory they held (a protobuf message
    frees it only when it is freed): the copy is replaced by an equal one read without the
    data. (Prepacking stays on: without it the float results differ in the last bits, and so
    would the ranges.)"""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import calibrate

    original = calibrate.CalibraterBase.create_inference_session

    def create(self: Any) -> None:
        self.model = onnx.load(self.augmented_model_path, load_external_data=False)
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


def calibrate(source: Path, samples: list[list[int]], op_types: list[str], work_dir: Path,
              cache: Path) -> Path:
    """quantize_static's own MinMax calibration, run beforehand and handed over as its range
    cache: quantize_static would otherwise hold the whole model while the calibrator loads it
    again and runs it. The augmented model goes to a temporary folder under work_dir."""
    from onnxruntime.quantization import CalibrationMethod, create_calibrator, save_tensors_data

    with single_threaded_calibration(), tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        calibrator = create_calibrator(
            source, op_types, augmented_model_path=str(Path(tmp) / "augmented_model.onnx"),
            calibrate_method=CalibrationMethod.MinMax, use_external_data_format=True,
        )
        calibrator.collect_data(TokenReader(samples))
        ranges = calibrator.compute_data()
        del calibrator
    save_tensors_data(ranges, cache)
    return cache
