"""The graphs the fidelity stage runs: export's float32 ONNX model and its emulations
(`common.qdq_emulation`), fed the six graph inputs as export feeds the chip (left padding),
calibrated on the rows optimize calibrates on (`common.hailo_calibration`).

Memory: one ONNX Runtime session at a time, each over a small graph file in `fidelity_work/`
whose initializers refer to their bytes in export's model.onnx (`common.onnx_file.load_lazily`),
so the session maps them instead of copying; no prepacking (a repacked copy of every MatMul
weight) and no graph optimization. An emulation hands its rounded weights to the session
(`add_initializer`), which uses them in place of the file's: the float32 weights of those are
not read at all. The embedding table is read from hf_reference.npz as a memory map (only the
rows of the tokens fed are read).
"""

from __future__ import annotations

import gc
import os
import shutil
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common.action import fail
from common.hailo_calibration import pad_id

WORK = Path("fidelity_work")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _libc() -> Any:
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def map_big_blocks() -> None:
    """glibc serves a block under its mmap threshold from the heap and raises the threshold
    each time it frees a mapped block; an emulation's rounded weights, once freed, could then
    stay in the heap (in the resident set) while the next session maps export's file. A
    fixed threshold gives every block from 256 KiB its own mapping, returned when freed."""
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 256 << 10)


def trim() -> None:
    """Hand the heap's free memory back to the system (glibc; elsewhere nothing)."""
    malloc_trim = getattr(_libc(), "malloc_trim", None)
    if malloc_trim is not None:
        malloc_trim(0)


def embedding_table(npz: Path) -> Any:
    """`embedding_table.npy` of export's hf_reference.npz (stored, not compressed) mapped."""
    import numpy as np

    with zipfile.ZipFile(npz) as zf:
        info = zf.getinfo("embedding_table.npy")
    if info.compress_type != zipfile.ZIP_STORED:
        with np.load(npz) as ref:
            return np.asarray(ref["embedding_table"], dtype=np.float32)
    with open(npz, "rb") as f:
        f.seek(info.header_offset + 26)  # the local header's name and extra lengths
        lengths = np.frombuffer(f.read(4), dtype="<u2")
        f.seek(info.header_offset + 30 + int(lengths[0]) + int(lengths[1]))
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            fail(f"fidelity: {npz.name}: embedding_table.npy has .npy format {version}")
        shape, fortran, dtype = read(f)
        offset = f.tell()
    return np.memmap(npz, dtype=dtype, mode="r", offset=offset, shape=shape,
                     order="F" if fortran else "C")


class Feeder:
    """The six graph inputs of a token sequence, as export feeds the chip (left padding),
    and the same with the graph inputs fake-quantized (`quants`, per emulation)."""

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


class Session:
    """One single-threaded session over a graph file (weights mapped from export's file),
    holding the arrays it was handed for as long as it lives."""

    def __init__(self, path: Path, weights: dict[str, Any]) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # Q/DQ executed as written (fake quantization in float32), not fused into integer
        # kernels whose rounding depends on the CPU's instruction set.
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.log_severity_level = 3
        so.add_session_config_entry("session.disable_prepacking", "1")
        # A memory pattern is a second arena block, sized by the first run, on top of it.
        so.enable_mem_pattern = False
        # Nodes run in the order written where the graph allows: a calibration reduction
        # right after its tensor's writer (the default order holds every tensor to the end).
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        self.held = {n: ort.OrtValue.ortvalue_from_numpy(a) for n, a in sorted(weights.items())}
        for name, value in self.held.items():
            so.add_initializer(name, value)
        self.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def run(self, outputs: list[str], feeds: dict[str, Any]) -> list[Any]:
        return self.session.run(outputs, feeds)

    def logits(self, outputs: list[str], feeds: dict[str, Any]) -> Any:
        """Last-position logits, shards concatenated."""
        import numpy as np

        return np.concatenate([np.asarray(o, dtype=np.float32).ravel()
                               for o in self.run(outputs, feeds)])

    def close(self) -> None:
        del self.session, self.held
        gc.collect()  # the mapped file and the handed arrays leave before the next session
        trim()


class Export:
    """export's graph without its weights' bytes (each read from the file when needed), and
    sessions over graphs made from it."""

    def __init__(self, export: Path, config: dict[str, Any]) -> None:
        from common.onnx_file import load_lazily
        from common.qdq_emulation import matmuls

        WORK.mkdir(parents=True, exist_ok=True)
        # The graphs written here refer to `model.onnx` next to them (ONNX Runtime refuses
        # external data outside the model's folder, symbolic links resolved): a hard link
        # where the file system allows one, else a copy (on disk, not in memory).
        link = WORK / "model.onnx"
        if link.is_symlink() or link.exists():
            link.unlink()
        try:
            os.link(export / "model.onnx", link)
        except OSError:
            shutil.copyfile(export / "model.onnx", link)
        self.model = load_lazily(link, WORK)
        self.graph = matmuls(self.model)
        self.inits = {i.name: i for i in self.model.graph.initializer}
        self.writer = {t: node.name for node in self.model.graph.node for t in node.output}
        self.outputs = list(config.get("output_names") or config["outputs"])

    def weight(self, name: str) -> Any:
        from common.onnx_file import read_array

        return read_array(self.inits[name], WORK)

    def session(self, name: str, model: Any, weights: dict[str, Any]) -> Session:
        import onnx

        path = WORK / f"{name}.onnx"
        onnx.save(model, str(path))
        return Session(path, weights)


def float_pass(export: Export, points: list[str], calibration: Iterable[dict[str, Any]],
               keep: int, contexts: Iterable[dict[str, Any]]
               ) -> tuple[dict[str, tuple[float, float]], list[Any], list[Any]]:
    """One float32 session: each point's range over the calibration feeds (0 included), the
    logits of the first `keep` of them, and those of `contexts`."""
    from common.qdq_emulation import with_ranges

    session = export.session("float", with_ranges(export.model, points), {})
    extremes = [f"{t}/{op}" for t in points for op in ("min", "max")]
    lo = dict.fromkeys(points, 0.0)
    hi = dict.fromkeys(points, 0.0)
    kept = []
    for k, feeds in enumerate(calibration):
        values = session.run(export.outputs + extremes, feeds)
        if k < keep:
            kept.append(_concat(values[:len(export.outputs)]))
        for i, t in enumerate(points):
            lo[t] = min(lo[t], float(values[len(export.outputs) + 2 * i]))
            hi[t] = max(hi[t], float(values[len(export.outputs) + 2 * i + 1]))
    floats = [session.logits(export.outputs, feeds) for feeds in contexts]
    session.close()
    return {t: (lo[t], hi[t]) for t in points}, kept, floats


def _concat(outputs: list[Any]) -> Any:
    import numpy as np

    return np.concatenate([np.asarray(o, dtype=np.float32).ravel() for o in outputs])


class Graphs:
    """The float32 logits of the reference's contexts (computed once) and one emulation's
    session: what `common.hailo_fidelity_compare.evaluate` compares."""

    def __init__(self, feeder: Feeder, floats: dict[tuple[int, ...], Any], session: Session,
                 outputs: list[str]) -> None:
        self.feeder, self.seq, self.floats = feeder, feeder.seq, floats
        self.session, self.outputs = session, outputs
        self._emulated: dict[tuple[int, ...], Any] = {}

    def float_logits(self, ids: list[int]) -> Any:
        return self.floats[tuple(ids)]

    def emulated_logits(self, ids: list[int]) -> Any:
        """Cached: free-running repeats the teacher-forced contexts up to its divergence."""
        key = tuple(ids)
        if key not in self._emulated:
            self._emulated[key] = self.session.logits(self.outputs, self.feeder.quantized(ids))
        return self._emulated[key]
