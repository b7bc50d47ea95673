"""Embedding tables in int8 per row (rules/common/onnx_gather_int8.py), on small ONNX graphs
run by ONNX Runtime: the rows looked up match float within half a step of their own scale,
the float table is gone, and a table another node reads stays float."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "rules"))

from common.onnx_file import save_inline  # noqa: E402
from common.onnx_gather_int8 import CHUNK_ROWS, quantize_gathers  # noqa: E402

ROWS, WIDTH = CHUNK_ROWS + 37, 24  # more rows than a chunk: the chunked path is exercised


def table() -> np.ndarray:
    rng = np.random.default_rng(0)
    t = rng.normal(size=(ROWS, WIDTH)).astype(np.float32) * rng.uniform(
        0.01, 3.0, size=(ROWS, 1)).astype(np.float32)  # rows of very different ranges
    t[5] = 0.0  # an all-zero row
    return t


def model(tied: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["h"], name="embed", axis=0)]
    outputs = [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)]
    if tied:  # the lm_head reads the same table (Transpose + MatMul, kept float)
        nodes += [helper.make_node("Transpose", ["emb"], ["emb.T"], name="t"),
                  helper.make_node("MatMul", ["h", "emb.T"], ["logits"], name="head")]
        outputs.append(helper.make_tensor_value_info("logits", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, None])],
        outputs, [numpy_helper.from_array(table(), "emb")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(m: onnx.ModelProto, path: Path, ids: np.ndarray) -> list[np.ndarray]:
    save_inline(m, path, path.parent)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": ids})


IDS = np.array([[0, 5, 17, CHUNK_ROWS - 1, CHUNK_ROWS, ROWS - 1, 17]], dtype=np.int64)


def test_looked_up_rows_match_float_within_half_a_step(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = model(tied=False)
    (want,) = run(m, tmp_path / "float.onnx", IDS)
    assert quantize_gathers(m, Path(), Path("q.bin")) == 1
    names = {t.name: t for t in m.graph.initializer}
    assert "emb" not in names and names["emb.int8"].data_type == TensorProto.INT8
    (got,) = run(m, tmp_path / "q.onnx", IDS)
    step = np.abs(table()[IDS[0]]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(got[0] - want[0]) <= step / 2 + 1e-6)
    assert np.array_equal(got[0][1], np.zeros(WIDTH))  # the zero row stays exactly zero
    assert (tmp_path / "q.onnx").stat().st_size < 0.3 * (tmp_path / "float.onnx").stat().st_size


def test_a_table_another_node_reads_stays_float(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = model(tied=True)
    assert quantize_gathers(m, Path(), Path("q.bin")) == 0
    assert [t.name for t in m.graph.initializer] == ["emb"]
    assert [n.op_type for n in m.graph.node] == ["Gather", "Transpose", "MatMul"]


def test_a_gather_on_another_axis_is_left_alone(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    m = model(tied=False)
    m.graph.node[0].attribute[0].i = 1
    assert quantize_gathers(m, Path(), Path("q.bin")) == 0
