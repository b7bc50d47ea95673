"""Process-wide settings that make torch / ONNX Runtime results repeatable bit for bit."""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime


def pin_torch(seed: int) -> None:
    """One thread and a fixed seed: multi-threaded reductions change float summation order."""
    import torch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # Progress bars only add carriage-return noise to the captured stage log.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    torch.set_num_threads(1)
    # Only settable once per process, before any parallel work; already pinned is fine.
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    with contextlib.suppress(ImportError):
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def ort_session(model_path: str, **options: object) -> onnxruntime.InferenceSession:
    """Single-threaded CPU session, so logits do not depend on core count or scheduling."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    for name, value in options.items():
        setattr(so, name, value)
    return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])


def mapped_session_options() -> onnxruntime.SessionOptions:
    """Options of a single-threaded session over weights mapped from a file (external data):
    without prepacking, which keeps a repacked copy of every MatMul weight, it runs on the
    mapped pages alone. (Constant folding, a second copy of a transposed weight, is turned
    off by the caller with `disabled_optimizers`.)"""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.add_session_config_entry("session.disable_prepacking", "1")
    return so
