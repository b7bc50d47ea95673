"""Embedding tables in int8: a float Gather table (a token embedding, rows looked up by id)
becomes int8 rows with one float scale per row (symmetric, scale = max |row| / 127), and the
Gather becomes Gather(int8 table) -> Cast -> Mul(Gather(scales)). Only the looked-up rows are
ever dequantized, so a forward costs a few multiplies per token, not the whole table.

Weight-only methods quantize MatMul weights alone (MatMulNBits); the embedding of a real
checkpoint (28M of SmolLM2-135M's 135M parameters, 136M of a 0.5B Qwen2's) would otherwise stay
float32. A table is quantized only when every node that reads it is such a Gather on axis 0:
a tied table still read by the lm_head's Transpose keeps its float copy.

The quantized rows are written in chunks to a side file and referred to as external data
(`common.onnx_file`), so the float table is never held whole in memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from common.onnx_file import data_span, external_ref

CHUNK_ROWS = 4096


def _axis(node: Any) -> int:
    return next((a.i for a in node.attribute if a.name == "axis"), 0)


def table_rows(tensor: Any, base_dir: Path) -> Any:
    """The float table, memory-mapped when it is external data (read row chunk by chunk)."""
    import numpy as np
    import onnx

    span = data_span(tensor, base_dir)
    if span is None:
        return onnx.numpy_helper.to_array(tensor)
    return np.memmap(span.path, dtype=np.float32, mode="r", offset=span.offset,
                     shape=tuple(tensor.dims))


def _external(name: str, data_type: int, shape: tuple[int, ...], rel: str, offset: int,
              nbytes: int) -> Any:
    import onnx

    tensor = onnx.TensorProto(name=name, data_type=data_type)
    tensor.dims.extend(shape)
    external_ref(tensor, rel, offset, nbytes)
    return tensor


def quantize_table(tensor: Any, base_dir: Path, data: BinaryIO, data_path: Path
                   ) -> tuple[Any, Any]:
    """(int8 rows `<name>.int8`, float scales `<name>.scale` [rows, 1]), data in `data`."""
    import numpy as np
    import onnx

    rows = table_rows(tensor, base_dir)
    rel = os.path.relpath(data_path, base_dir)
    n, width = rows.shape
    start = data.tell()
    scales = np.empty((n, 1), dtype=np.float32)
    for lo in range(0, n, CHUNK_ROWS):
        chunk = np.asarray(rows[lo:lo + CHUNK_ROWS], dtype=np.float32)
        amax = np.abs(chunk).max(axis=1, keepdims=True)
        scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
        data.write(np.clip(np.rint(chunk / scale), -127, 127).astype(np.int8).tobytes())
        scales[lo:lo + len(chunk)] = scale
    q = _external(f"{tensor.name}.int8", onnx.TensorProto.INT8, (n, width), rel, start,
                  n * width)
    at = data.tell()
    data.write(scales.tobytes())
    s = _external(f"{tensor.name}.scale", onnx.TensorProto.FLOAT, (n, 1), rel, at,
                  scales.nbytes)
    return q, s


def dequantizing_gather(node: Any, q: Any, s: Any) -> list[Any]:
    """The nodes that replace `node`: the same output, from the int8 rows and their scales."""
    import onnx

    out, ids = node.output[0], node.input[1]
    make = onnx.helper.make_node
    return [
        make("Gather", [q.name, ids], [f"{out}.int8"], name=f"{node.name}.int8", axis=0),
        make("Gather", [s.name, ids], [f"{out}.scale"], name=f"{node.name}.scale", axis=0),
        make("Cast", [f"{out}.int8"], [f"{out}.rows"], name=f"{node.name}.cast",
             to=onnx.TensorProto.FLOAT),
        make("Mul", [f"{out}.rows", f"{out}.scale"], [out], name=f"{node.name}.dequantize"),
    ]


def quantizable_tables(model: Any) -> set[str]:
    """Rank-2 float32 initializers read only by Gathers on axis 0 (as their data input)."""
    import onnx

    readers: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for i, value in enumerate(node.input):
            readers.setdefault(value, []).append((node, i))
    outputs = {o.name for o in model.graph.output}
    return {t.name for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
            and t.name not in outputs and readers.get(t.name)
            and all(n.op_type == "Gather" and i == 0 and _axis(n) == 0
                    for n, i in readers[t.name])}


def quantize_gathers(model: Any, base_dir: Path, data_path: Path) -> int:
    """Every quantizable Gather table in int8 per row (data to `data_path`); the number of
    tables quantized. The float tables are dropped from the model."""
    tables = quantizable_tables(model)
    if not tables:
        return 0
    tensors = {t.name: t for t in model.graph.initializer}
    done: dict[str, tuple[Any, Any]] = {}
    nodes: list[Any] = []
    with open(data_path, "wb") as data:
        for node in model.graph.node:
            table = node.input[0] if node.op_type == "Gather" else None
            if table not in tables:
                nodes.append(node)
                continue
            if table not in done:
                done[table] = quantize_table(tensors[table], base_dir, data, data_path)
            nodes.extend(dequantizing_gather(node, *done[table]))
    kept = [t for t in model.graph.initializer if t.name not in tables]
    model.graph.ClearField("initializer")
    model.graph.initializer.extend(kept + [t for pair in done.values() for t in pair])
    model.graph.ClearField("node")
    model.graph.node.extend(nodes)
    return len(done)
