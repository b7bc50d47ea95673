"""A tied-embedding model (tie_word_embeddings, like SmolLM2) through the real cpu-ort rules.

export stores the embedding matrix once (the Gather table; the lm_head reads it through a
Transpose) and its gate still passes; each quantization method keeps that table once (in
float, or in int8 per row for the weight-only methods) and gives the lm_head one quantized
copy (no float transposed duplicate); the chain verifies.
"""

from __future__ import annotations

import json
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from test_cpu_ort_methods import METHODS, MODELS, REPO, Chain

sys.path.insert(0, str(REPO / "rules"))

from common.onnx_file import inline_size, load_lazily, save_inline  # noqa: E402

SPEC = MODELS["tiny-llama"]
TIED = {"synthetic": {**SPEC, "tie_word_embeddings": True}}
TABLE = (SPEC["vocab_size"], SPEC["hidden_size"])  # the embedding matrix, [vocab, hidden]
FLOAT = onnx.TensorProto.FLOAT


@pytest.fixture(scope="module")
def tied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chain]:
    chain = Chain(tmp_path_factory.mktemp("tied"), "tiny-llama-tied", TIED)
    for stage in ("fetch", "export"):
        chain.promote(stage, chain.run(stage))
    yield chain
    for path in (chain.root / "build").rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


@pytest.fixture(scope="module")
def quantized(tied: Chain) -> dict[str, Path]:
    return {method: chain_stage(tied, "quantize", {"method": method}, method) / "model.int8.onnx"
            for method in METHODS}


def chain_stage(chain: Chain, stage: str, params: dict[str, Any], tag: str,
                inputs: dict[str, Path] | None = None) -> Path:
    return chain.promote(stage, chain.run(stage, params, inputs), f"{stage}-{tag}")


def float_arrays(path: Path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if t.data_type == FLOAT}


def tables(arrays: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Float initializers shaped like the embedding matrix or its transpose."""
    return {n: a.shape for n, a in arrays.items() if a.shape in (TABLE, TABLE[::-1])}


def int8_tables(path: Path) -> dict[str, tuple[int, ...]]:
    """int8 initializers shaped like the embedding matrix (common.onnx_gather_int8)."""
    model = onnx.load(str(path))
    return {t.name: tuple(t.dims) for t in model.graph.initializer
            if t.data_type == onnx.TensorProto.INT8 and tuple(t.dims) == TABLE}


def parameter_count(chain: Chain) -> int:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(chain.root / "build" / "fetch" / "checkpoint")
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return sum(p.numel() for p in model.parameters())  # a tied parameter counts once


def test_export_gate_passes(tied: Chain) -> None:
    report = json.loads((tied.root / "build" / "export" / "export_report.json").read_text())
    assert report["passed"] is True
    assert report["cosine_last"] >= 0.9999 and report["cosine_other_shape"] >= 0.9999


def test_export_stores_the_embedding_matrix_once(tied: Chain) -> None:
    arrays = float_arrays(tied.root / "build" / "export" / "model.onnx")
    assert list(tables(arrays).values()) == [TABLE]
    matrices = [a for a in arrays.values() if a.ndim == 2]
    for i, a in enumerate(matrices):
        for b in matrices[i + 1 :]:
            assert not (a.shape == b.shape and np.array_equal(a, b))
            assert not (a.shape == b.shape[::-1] and np.array_equal(a, b.T))


def test_export_initializers_are_the_parameters_once(tied: Chain) -> None:
    model = onnx.load(str(tied.root / "build" / "export" / "model.onnx"))
    stored = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    params = parameter_count(tied) * 4
    # Beyond the parameters: a few shape constants the exporter folded.
    assert params <= stored <= params * 1.01


def test_the_lm_head_reads_the_table_through_a_transpose(tied: Chain) -> None:
    model = onnx.load(str(tied.root / "build" / "export" / "model.onnx"))
    (table,) = tables(float_arrays(tied.root / "build" / "export" / "model.onnx"))
    users = [n for n in model.graph.node if table in n.input]
    assert sorted(n.op_type for n in users) == ["Gather", "Transpose"]
    (transpose,) = [n for n in users if n.op_type == "Transpose"]
    (matmul,) = [n for n in model.graph.node if transpose.output[0] in n.input]
    assert matmul.op_type == "MatMul" and "lm_head" in matmul.name


@pytest.mark.parametrize("method", METHODS)
def test_each_method_keeps_one_table_and_quantizes_the_lm_head(
    quantized: dict[str, Path], method: str
) -> None:
    path = quantized[method]
    if method.startswith("weight_only"):  # the embedding's rows in int8, no float copy
        assert list(tables(float_arrays(path)).values()) == []
        assert list(int8_tables(path).values()) == [TABLE]
    else:
        assert list(tables(float_arrays(path)).values()) == [TABLE]
    model = onnx.load(str(path))
    ops = [n.op_type for n in model.graph.node]
    assert "Transpose" not in [n.op_type for n in model.graph.node
                               if any(i.endswith("embed_tokens.weight") for i in n.input)]
    if method.startswith("weight_only"):
        assert ops.count("MatMulNBits") == 15  # 7 projections x 2 layers + the lm_head
    elif method == "dynamic_int8":
        assert ops.count("MatMulInteger") + ops.count("DynamicQuantizeMatMul") == 15
    else:
        (lm_head,) = [n for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
        producers = {o: n.op_type for n in model.graph.node for o in n.output}
        assert producers[lm_head.input[1]] == "DequantizeLinear"


def test_a_float_lm_head_keeps_reading_the_shared_table(tied: Chain) -> None:
    path = chain_stage(tied, "quantize", {"method": "static_qdq", "exclude": ["lm_head"]},
                       "static-float-head") / "model.int8.onnx"
    assert list(tables(float_arrays(path)).values()) == [TABLE]
    model = onnx.load(str(path))
    (lm_head,) = [n for n in model.graph.node if n.op_type == "MatMul" and "lm_head" in n.name]
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert producers[lm_head.input[1]] == "Transpose"


def test_weight_only_int8_compiles_and_verifies(tied: Chain,
                                               quantized: dict[str, Path]) -> None:
    compiled = chain_stage(tied, "compile", {}, "weight_only_int8",
                           {"quantize": quantized["weight_only_int8"].parent})
    assert list(tables(float_arrays(compiled / "model.opt.onnx")).values()) == []
    assert list(int8_tables(compiled / "model.opt.onnx").values()) == [TABLE]
    run = tied.run("verify", inputs={"compile": compiled})
    assert run.returncode == 0, run.stderr
    report = json.loads((run.out / "report.json").read_text())
    assert report["passed"] is True and report["mean_teacher_forced_agreement"] >= 0.9


def test_a_lazily_read_model_is_written_back_equal(tied: Chain, tmp_path: Path) -> None:
    source = tied.root / "build" / "export" / "model.onnx"
    lazy = load_lazily(source, source.parent)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL and not t.raw_data
               for t in lazy.graph.initializer)
    target = tmp_path / "copy.onnx"
    written = save_inline(lazy, target, source.parent)
    assert written == target.stat().st_size == inline_size(lazy, source.parent)
    assert onnx.load(str(target)) == onnx.load(str(source))
