"""The two graphs the fidelity stage compares: export's float32 ONNX model and its QDQ copy
(`common.qdq_emulation`), fed the six graph inputs as export feeds the chip (left padding),
calibrated on the rows optimize calibrates on (`common.hailo_calibration`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from common.action import Action, fail
from common.hailo_calibration import calibration_rows, pad_id
from common.hailo_fidelity_plan import Plan

WORK = Path("fidelity_work")  # quantize_static writes helper files next to its input


class Feeder:
    """The six graph inputs of a token sequence, as export feeds the chip (left padding),
    and the same with the graph inputs fake-quantized (`quants`, once calibrated)."""

    def __init__(self, config: dict[str, Any], table: Any) -> None:
        self.config, self.table = config, table
        self.seq, self.pad = int(config["seq_len"]), pad_id(config)
        self.quants: dict[str, Any] = {}

    def feeds(self, ids: list[int]) -> dict[str, Any]:
        from common import hailo_inputs as hi

        padded, n_real = hi.left_pad(ids, self.seq, self.pad)
        if int(padded.max()) >= self.table.shape[0]:
            fail(f"fidelity: token id {int(padded.max())} is outside the embedding table "
                 f"({self.table.shape[0]} rows)")
        c = self.config
        return hi.graph_inputs(padded, n_real, self.table, n_heads=int(c["num_attention_heads"]),
                               n_kv_heads=int(c["num_key_value_heads"]),
                               head_dim=int(c["head_dim"]), rope_theta=float(c["rope_theta"]),
                               sliding_window=c.get("sliding_window"))

    def quantized(self, ids: list[int]) -> dict[str, Any]:
        feeds = self.feeds(ids)
        return {k: self.quants[k].apply(v) if k in self.quants else v for k, v in feeds.items()}


class Graphs:
    """The float32 export and its QDQ copy; last-position logits, shards concatenated."""

    def __init__(self, feeder: Feeder, float_path: Path, qdq_path: Path) -> None:
        from common.determinism import ort_session

        self.feeder, self.seq = feeder, feeder.seq
        self.float = ort_session(str(float_path))
        self.qdq = ort_session(str(qdq_path), graph_optimization_level=_no_fusion())
        config = feeder.config
        self.outputs = list(config.get("output_names") or config["outputs"])
        self._emulated: dict[tuple[int, ...], Any] = {}

    def float_logits(self, ids: list[int]) -> Any:
        return self._logits(self.float, self.feeder.feeds(ids))

    def emulated_logits(self, ids: list[int]) -> Any:
        """Cached: free-running repeats the teacher-forced contexts up to its divergence."""
        key = tuple(ids)
        if key not in self._emulated:
            self._emulated[key] = self._logits(self.qdq, self.feeder.quantized(ids))
        return self._emulated[key]

    def _logits(self, session: Any, feeds: dict[str, Any]) -> Any:
        import numpy as np

        outs = session.run(self.outputs, feeds)
        return np.concatenate([np.asarray(o, dtype=np.float32).ravel() for o in outs])


def _no_fusion() -> Any:
    """Q/DQ executed as written (fake quantization in float32), not fused into integer
    kernels whose rounding depends on the CPU's instruction set."""
    import onnxruntime as ort

    return ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def build_qdq(action: Action, feeder: Feeder, plan: Plan, graph: Any, model: Any,
              name: str = "model") -> tuple[Path, dict[str, Any]]:
    """The QDQ file `<name>.qdq.onnx` (the feeder's input quantizers set), and the
    calibration's account."""
    from common import qdq_emulation as qe

    rows = calibration_rows(action, feeder.config)
    feeder.quants = qe.input_quants((feeder.feeds(r) for r in rows), plan.input_bits)
    acts, weights = qe.tensor_bits(graph, plan.nodes, plan.input_bits)
    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    WORK.mkdir(parents=True, exist_ok=True)
    source, target = WORK / "model.onnx", WORK / f"{name}.qdq.onnx"
    shutil.copyfile(action.input_dir("export") / "model.onnx", source)
    qe.quantize(source, target, qe.FeedReader(rows, feeder.quantized),
                qe.overrides(acts, weights, ranks))
    lengths = [len(r) for r in rows]
    return target, {"rows": len(rows), "seed": int(action.params["calibration_seed"]),
                    "tokens_per_row": [min(lengths), max(lengths)]}
