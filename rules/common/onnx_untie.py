"""Tied weights made quantizable: export stores a tied embedding once (the Gather table, and
Transpose(table) for the lm_head), which no quantizer sees as a constant MatMul weight. The
lm_head's MatMul gets a transposed copy instead, written to a side file and referred to as
external data (`common.onnx_file`), so the float table is never held twice in memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from common.onnx_file import external_ref, read_array


def plain_transpose(node: Any) -> bool:
    """A Transpose of a matrix's two axes (no perm, or perm [1, 0])."""
    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return node.op_type == "Transpose" and perm in ([], [[1, 0]])


def transposed_copy(tensor: Any, base_dir: Path, data: BinaryIO, data_path: Path) -> Any:
    """An initializer `<name>.T` holding tensor's transpose, its data appended to `data` (the
    file `data_path`) and referred to from there."""
    import numpy as np
    import onnx

    array = np.ascontiguousarray(read_array(tensor, base_dir).T)
    copy = onnx.TensorProto(name=f"{tensor.name}.T", data_type=tensor.data_type)
    copy.dims.extend(array.shape)
    offset = data.tell()
    data.write(array.data)
    external_ref(copy, os.path.relpath(data_path, base_dir), offset, array.nbytes)
    return copy


def untie_transposed_weights(model: Any, base_dir: Path, keep_float: frozenset[str],
                             data_path: Path) -> int:
    """A MatMul whose weight is Transpose(initializer) (export's tied lm_head) reads a transposed
    copy instead, an initializer the quantizers see as a constant weight and replace by its
    quantized form; MatMuls named in keep_float keep the Transpose (no float copy). A Transpose
    left with no user is removed. The copies' data goes to `data_path`. Returns how many copies
    were made."""
    tensors = {t.name: t for t in model.graph.initializer}
    uses: dict[str, list[Any]] = {}
    for node in model.graph.node:
        for value in node.input:
            uses.setdefault(value, []).append(node)
    outputs = {o.name for o in model.graph.output}
    dropped, copies = set(), 0
    with open(data_path, "wb") as data:
        for node in model.graph.node:
            if not plain_transpose(node) or node.input[0] not in tensors:
                continue
            out, users = node.output[0], uses.get(node.output[0], [])
            matmuls = [u for u in users if u.op_type == "MatMul" and u.input[1] == out
                       and u.input[0] != out and u.name not in keep_float]
            if not matmuls:
                continue
            copy = transposed_copy(tensors[node.input[0]], base_dir, data, data_path)
            model.graph.initializer.append(copy)
            copies += 1
            for user in matmuls:
                user.input[1] = copy.name
            if len(matmuls) == len(users) and out not in outputs:
                dropped.add(out)
    kept = [n for n in model.graph.node
            if not (n.op_type == "Transpose" and n.output[0] in dropped)]
    model.graph.ClearField("node")
    model.graph.node.extend(kept)
    return copies
