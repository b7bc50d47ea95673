"""The hailo10h export rule on the four tiny models of tests/hailo_models/, run exactly as the
engine runs rules (`python rules/<rule> ACTION_JSON`, cwd = a fresh scratch dir,
PYTHONPATH=rules), plus in-process checks that a wrong graph fails the cosine gate.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tree_digest import sha256_tree

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "rules"))

from common.hailo_inputs import INPUT_NAMES, MASK_BLOCKED, head_mask, left_pad  # noqa: E402

from hefbuild.declare.specs import load_model  # noqa: E402
from hefbuild.declare.targets import stage_defs  # noqa: E402

MODELS = ("tiny-hailo-llama", "tiny-hailo-qwen2", "tiny-hailo-mistral", "tiny-hailo-qwen3")
TOOLCHAINS = {p.stem for p in (REPO / "toolchain").glob("*.toml")}
OUTPUTS = stage_defs(REPO, "hailo10h")["export"].outputs
EXPECTED_SHARDS = {"tiny-hailo-qwen2": 2}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    seconds: float


class Rules:
    """Just enough of the engine's contract to drive fetch and export from a test."""

    def __init__(self, root: Path, name: str) -> None:
        spec = load_model(REPO / "tests" / "hailo_models" / f"{name}.toml", REPO, TOOLCHAINS)
        self.root, self.name, self.runs = root, name, 0
        self.source = {"synthetic": dict(spec.source.synthetic)}
        self.export_params = dict(spec.stages["export"])
        self.fetch_dir = root / "fetch"

    def run(self, stage: str, params: dict[str, Any] | None = None) -> Run:
        self.runs += 1
        scratch = self.root / f"scratch-{self.runs:02d}-{stage}"
        scratch.mkdir(parents=True)
        fetch = stage == "fetch"
        action = {
            "format": 1,
            "model": self.name,
            "stage": stage,
            "target": "hailo10h",
            "params": {} if fetch else {**self.export_params, **(params or {})},
            "source": self.source,
            "inputs": {} if fetch else {"fetch": str(self.fetch_dir)},
            "files": {"corpus": str(REPO / self.source["synthetic"]["corpus"])} if fetch else {},
            "out": str(scratch / "out"),
            "outputs": ["checkpoint/"] if fetch else list(OUTPUTS),
        }
        (scratch / "action.json").write_text(json.dumps(action, sort_keys=True))
        rule = REPO / "rules" / ("fetch.py" if fetch else "hailo/export.py")
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "rules"),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
        start = time.monotonic()
        proc = subprocess.run(
            [sys.executable, str(rule), str(scratch / "action.json")],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        seconds = time.monotonic() - start
        return Run(proc.returncode, proc.stdout, proc.stderr, scratch / "out", seconds)


@dataclass
class Built:
    rules: Rules
    export: Run


# About 40 s per model, once per file: fetch trains the tiny checkpoint, export traces it.
@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Built]:
    result = {}
    for name in MODELS:
        rules = Rules(tmp_path_factory.mktemp(name), name)
        fetch = rules.run("fetch")
        assert fetch.returncode == 0, f"{name} fetch failed:\n{fetch.stderr}"
        fetch.out.rename(rules.fetch_dir)
        export = rules.run("export")
        assert export.returncode == 0, f"{name} export failed:\n{export.stdout}\n{export.stderr}"
        result[name] = Built(rules, export)
    return result


def run_config(b: Built) -> dict[str, Any]:
    return json.loads((b.export.out / "run_config.json").read_text())


def hf_config(b: Built) -> dict[str, Any]:
    return json.loads((b.rules.fetch_dir / "checkpoint" / "config.json").read_text())


@pytest.mark.parametrize("name", MODELS)
def test_onnx_interface_matches_the_contract(built: dict[str, Built], name: str) -> None:
    import onnx

    b = built[name]
    cfg, hf = run_config(b), hf_config(b)
    graph = onnx.load(str(b.export.out / "model.onnx")).graph
    seq, hd = 32, cfg["head_dim"]
    heads, kv = hf["num_attention_heads"], hf["num_key_value_heads"]
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.input}
    assert list(dims) == list(INPUT_NAMES)
    assert dims == {
        "inputs_embeds": [1, seq, hf["hidden_size"]],
        "attention_mask": [1, 1, seq, heads * seq],
        "cos_k": [1, seq, hd * kv],
        "sin_k": [1, seq, hd * kv],
        "cos_q": [1, seq, hd * heads],
        "sin_q": [1, seq, hd * heads],
    }
    shards = EXPECTED_SHARDS.get(name, 1)
    assert shards == math.ceil(hf["vocab_size"] / 32000)
    outs = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    names = ["logits"] if shards == 1 else [f"logits_{i}" for i in range(shards)]
    assert list(outs) == names
    assert all(s[:2] == [1, 1] for s in outs.values())
    assert sum(s[2] for s in outs.values()) == hf["vocab_size"]
    assert cfg["inputs"] == dims and cfg["outputs"] == outs and cfg["lm_head_shards"] == shards


@pytest.mark.parametrize("name", MODELS)
def test_graph_has_only_parser_friendly_ops(built: dict[str, Built], name: str) -> None:
    import onnx
    from common.hailo_graph_export import ALLOWED_OPS

    graph = onnx.load(str(built[name].export.out / "model.onnx")).graph
    ops = {n.op_type for n in graph.node}
    assert "Expand" not in ops and "Gather" not in ops
    assert ops <= ALLOWED_OPS, ops - ALLOWED_OPS
    assert {"MatMul", "Softmax", "Sigmoid"} <= ops
    assert ("Transpose" in ops) and not (ALLOWED_OPS & {"Expand", "Gather", "Slice", "Concat"})


def test_sharded_lm_head_has_independent_norm_chains(built: dict[str, Built]) -> None:
    import onnx

    graph = onnx.load(str(built["tiny-hailo-qwen2"].export.out / "model.onnx")).graph
    producer = {out: node for node in graph.node for out in node.output}
    residual = producer["logits_0"]
    chains = []
    for i in range(2):
        chain, todo = set(), [f"logits_{i}"]
        while todo:  # walk back from the output until the residual stream of the last layer
            node = producer.get(todo.pop())
            if node is None or node.name.startswith("/layers."):
                residual = node or residual
                continue
            chain.add(node.name)
            todo.extend(node.input)
        assert {n.split("/")[1] for n in chain} == {f"last.{i}", f"norm.{i}", f"lm_head.{i}"}
        assert {f"/last.{i}/MatMul", f"/norm.{i}/Sqrt", f"/lm_head.{i}/MatMul"} <= chain
        chains.append(chain)
    assert not chains[0] & chains[1]
    stream = residual.output[0]
    assert [n.name for n in graph.node if stream in n.input] == ["/last.0/MatMul", "/last.1/MatMul"]


@pytest.mark.parametrize("name", MODELS)
def test_gate_passes_and_is_reported(built: dict[str, Built], name: str) -> None:
    report = json.loads((built[name].export.out / "export_report.json").read_text())
    assert report["passed"] is True
    assert report["cosine"] >= 0.999 and report["cosine_min"] == 0.999
    assert report["max_abs_diff"] < 1e-3
    assert report["same_argmax"] is True
    assert 1 <= report["reference_tokens"] <= 32


@pytest.mark.parametrize("name", MODELS)
def test_reference_npz_holds_exactly_what_the_gate_fed(built: dict[str, Built], name: str) -> None:
    from common.hailo_graph_export import ort_logits

    b = built[name]
    cfg, hf = run_config(b), hf_config(b)
    ref = np.load(b.export.out / "hf_reference.npz")
    ids = ref["input_ids"]
    assert ids.shape == (1, 32) and ids.dtype == np.int64
    n_real, pad = int(ref["n_real"]), int(ref["pad_id"])
    assert int(ref["last_position"]) == 31 and pad == cfg["pad_token_id"] == 0
    assert (ids[0, : 32 - n_real] == pad).all() and ids[0, 32 - n_real] == cfg["bos_token_id"]
    assert ref["embedding_table"].shape == (hf["vocab_size"], hf["hidden_size"])
    np.testing.assert_array_equal(ref["inputs_embeds"][0], ref["embedding_table"][ids[0]])
    assert ref["last_logits"].shape == (hf["vocab_size"],)
    feeds = {n: ref[n] for n in INPUT_NAMES}
    logits = ort_logits(b.export.out / "model.onnx", feeds)
    cos = logits @ ref["last_logits"] / np.linalg.norm(logits) / np.linalg.norm(ref["last_logits"])
    assert cos >= 0.999


def test_mask_is_left_padded_causal_and_windowed(built: dict[str, Built]) -> None:
    ref = np.load(built["tiny-hailo-mistral"].export.out / "hf_reference.npz")
    n_real = int(ref["n_real"])
    assert n_real > 6, "the reference prompt must be longer than the sliding window"
    mask = ref["attention_mask"][0, 0]
    assert mask.shape == (32, 4 * 32)
    np.testing.assert_array_equal(mask, np.tile(mask[:, :32], (1, 4)))
    last = mask[31, :32]
    assert (last[26:] == 0).all() and (last[:26] == MASK_BLOCKED).all()  # window of 6
    assert run_config(built["tiny-hailo-mistral"])["sliding_window"] == 6
    assert run_config(built["tiny-hailo-llama"])["sliding_window"] is None
    full = head_mask(5, 8)
    assert (full[3:, :3] == MASK_BLOCKED).all() and (np.diag(full) == 0).all()
    padded, n = left_pad(list(range(40)), 32, 0)
    assert n == 32 and padded[0] == 0 and padded[-1] == 31


@pytest.mark.parametrize(
    ("name", "n_real", "window"),
    [
        ("tiny-hailo-mistral", None, None),  # the window ignored
        ("tiny-hailo-llama", 32, None),  # left pads not blocked
    ],
)
def test_a_wrong_host_mask_fails_the_gate(
    built: dict[str, Built], name: str, n_real: int | None, window: int | None
) -> None:
    from common.hailo_graph_export import gate, ort_logits
    from common.hailo_inputs import attention_mask

    out = built[name].export.out
    ref = np.load(out / "hf_reference.npz")
    feeds = {n: ref[n] for n in INPUT_NAMES}
    feeds["attention_mask"] = attention_mask(n_real or int(ref["n_real"]), 32, 4, window)
    assert not gate(ref["last_logits"], ort_logits(out / "model.onnx", feeds), 0.999).passed


def test_run_config_keys_and_layer_names(built: dict[str, Built]) -> None:
    import onnx

    required = {
        "architecture",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "num_hidden_layers",
        "rope_theta",
        "rms_norm_eps",
        "vocab_size",
        "lm_head_shards",
        "shard_vocab",
        "seq_len",
        "prefill_size",
        "cache_size",
        "scope",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "inputs",
        "outputs",
        "onnx_opset",
        "layer_names",
    }
    for name in MODELS:
        b = built[name]
        cfg = run_config(b)
        assert required <= set(cfg), required - set(cfg)
        assert (cfg["seq_len"], cfg["prefill_size"], cfg["cache_size"]) == (32, 8, 32)
        assert cfg["onnx_opset"] == 17 and cfg["scope"] == "model"
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (1, 2)
        model = onnx.load(str(b.export.out / "model.onnx"))
        assert model.opset_import[0].version == 17
        nodes = {n.name for n in model.graph.node}
        for group in cfg["layer_names"].values():
            assert set(group) <= nodes
        assert len(cfg["layer_names"]["q_proj"]) == cfg["num_hidden_layers"] == 2
    qwen3 = run_config(built["tiny-hailo-qwen3"])
    assert qwen3["head_dim"] == 24 and qwen3["qk_norm"] is True
    assert qwen3["inputs"]["cos_q"] == [1, 32, 96] and qwen3["inputs"]["cos_k"] == [1, 32, 48]


@pytest.mark.parametrize("name", ["tiny-hailo-llama", "tiny-hailo-qwen2"])
def test_tokenizer_is_ready_for_the_genai_server(built: dict[str, Built], name: str) -> None:
    from transformers import AutoTokenizer

    folder = built[name].export.out / "tokenizer"
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["chat_template"].startswith("{{ bos_token }}")
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    text = "Once upon a time"
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False)
    assert chat == "<s>" + text
    body = tok(text, add_special_tokens=False).input_ids
    assert tok(chat, add_special_tokens=False).input_ids == [1, *body]
    pieces = "".join(tok.decode([i]) for i in body)
    assert pieces == text  # token-by-token detokenization keeps every space
    decoder = json.loads((folder / "tokenizer.json").read_text())["decoder"]
    assert "Strip" not in json.dumps(decoder)


def test_reference_npz_is_streamed_and_reads_back(tmp_path: Path) -> None:
    from common.hailo_inputs import save_npz

    rng = np.random.default_rng(0)
    arrays = {
        "table": rng.standard_normal((3000, 700)).astype(np.float32),  # > one 16 MiB chunk
        "fortran": np.asfortranarray(rng.standard_normal((5, 7))),
        "scalar": np.array(3, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }
    save_npz(str(tmp_path / "a.npz"), arrays)
    save_npz(str(tmp_path / "b.npz"), arrays)
    assert (tmp_path / "a.npz").read_bytes() == (tmp_path / "b.npz").read_bytes()
    with np.load(tmp_path / "a.npz") as back:
        assert sorted(back.files) == sorted(arrays)
        for name, array in arrays.items():
            np.testing.assert_array_equal(back[name], array)


def test_strip_steps_are_dropped_from_a_sentencepiece_decoder() -> None:
    from common.hailo_tokenizer import strip_free_decoder

    llama2 = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    assert [d["type"] for d in strip_free_decoder(llama2)["decoders"]] == [
        "Replace",
        "ByteFallback",
        "Fuse",
    ]


@pytest.mark.parametrize("name", MODELS)
def test_reexport_is_byte_identical(built: dict[str, Built], name: str) -> None:
    b = built[name]
    again = b.rules.run("export")
    assert again.returncode == 0, again.stderr
    first = sha256_tree(b.export.out)
    assert {k.split("/")[0] for k in first} == {o.rstrip("/") for o in OUTPUTS}
    assert sha256_tree(again.out) == first


@pytest.mark.parametrize("name", MODELS)
def test_each_weight_is_one_initializer_stored_in_out(built: dict[str, Built], name: str) -> None:
    """The file holds each checkpoint weight once, as the initializer its MatMul reads directly,
    [in, out]: no copy under another name, no [out, in] copy behind a Transpose, none hidden
    in a Constant node."""
    import hashlib

    import onnx
    from onnx import numpy_helper
    from safetensors.numpy import load_file

    b = built[name]
    graph = onnx.load(str(b.export.out / "model.onnx")).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    assert len(inits) == len(graph.initializer)
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for value in node.input:
            readers.setdefault(value, []).append(node)
    assert set(inits) <= set(readers), set(inits) - set(readers)
    assert not [n.name for t in inits for n in readers[t] if n.op_type == "Transpose"]

    hf = load_file(b.rules.fetch_dir / "checkpoint" / "model.safetensors")
    heads = hf.get("lm_head.weight", hf["model.embed_tokens.weight"])
    expected = {}  # MatMul node -> the checkpoint's weight it must read, [in, out]
    for kind, nodes in run_config(b)["layer_names"].items():
        for i, node in enumerate(nodes):
            if kind == "lm_head":
                continue
            block = "mlp" if kind in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            expected[node] = hf[f"model.layers.{i}.{block}.{kind}.weight"].T
    lm_head = [inits[matmul_weight(graph, n)] for n in run_config(b)["layer_names"]["lm_head"]]
    np.testing.assert_array_equal(np.concatenate(lm_head, axis=1), heads.T)
    for node, weight in expected.items():
        np.testing.assert_array_equal(inits[matmul_weight(graph, node)], weight)

    def digest(a: np.ndarray) -> str:
        return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest()

    stored = [digest(a) for a in inits.values() if a.ndim == 2]
    for weight in [*expected.values(), *lm_head]:
        assert stored.count(digest(weight)) == 1  # [in, out], once
        assert digest(weight.T) not in stored  # and never [out, in]
    smallest = min(w.nbytes for w in expected.values())
    constants = [numpy_helper.to_array(a.t) for n in graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value"]
    assert constants and max(c.nbytes for c in constants) < smallest


def matmul_weight(graph: Any, node_name: str) -> str:
    """The weight (second input) of the MatMul `node_name`."""
    (node,) = [n for n in graph.node if n.name == node_name]
    assert node.op_type == "MatMul"
    return node.input[1]


def test_the_torch_graph_shares_the_checkpoint_weights(built: dict[str, Built]) -> None:
    """HailoDecoder copies no weight (each is a view of the HF model's storage), and tensors
    given to its forward stand in for its own only while it runs."""
    import torch
    from common.hailo_graph import HailoDecoder, graph_tensors
    from common.hailo_graph_export import torch_logits
    from common.hailo_graph_spec import spec_from_config
    from transformers import AutoModelForCausalLM

    b = built["tiny-hailo-qwen2"]
    model = AutoModelForCausalLM.from_pretrained(
        b.rules.fetch_dir / "checkpoint", dtype="float32", attn_implementation="eager"
    ).eval()
    module = HailoDecoder(spec_from_config(model.config, 32, 32000), model).eval()
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    own = {n for n, p in module.named_parameters()
           if p.untyped_storage().data_ptr() not in storages}
    assert own == set(), own  # qwen2 has no QK-norm, the one weight the graph repeats per head
    assert module.layers[0].self_attn.q_proj.weight.shape == (64, 64)  # [in, out]

    ref = np.load(b.export.out / "hf_reference.npz")
    feeds = {n: ref[n] for n in INPUT_NAMES}
    before = torch_logits(module, feeds)
    given = [-t if n.endswith("v_proj.weight") else t for n, t in graph_tensors(module).items()]
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[n]) for n in INPUT_NAMES), *given)
    assert not np.allclose(torch.cat([o.reshape(-1) for o in outs]).numpy(), before)
    np.testing.assert_array_equal(torch_logits(module, feeds), before)  # its own are back


def test_impossible_cosine_min_fails_the_stage_with_one_line(built: dict[str, Built]) -> None:
    run = built["tiny-hailo-llama"].rules.run("export", {"cosine_min": 1.5})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("export gate failed: cosine ") and "< cosine_min 1.5" in last
    assert "Traceback" not in run.stderr
    assert not (run.out / "run_config.json").exists()


@pytest.mark.parametrize("corrupt", ["weight", "rotate_half", "mask_layout"])
def test_a_wrong_graph_fails_the_gate(
    built: dict[str, Built], tmp_path: Path, corrupt: str
) -> None:
    import torch
    from common import hailo_graph as hg
    from common import hailo_graph_export as hx
    from common import hailo_graph_spec as hs
    from transformers import AutoModelForCausalLM

    b = built["tiny-hailo-qwen3"]
    model = AutoModelForCausalLM.from_pretrained(
        b.rules.fetch_dir / "checkpoint", dtype="float32", attn_implementation="eager"
    ).eval()
    spec = hs.spec_from_config(model.config, 32, 32000)
    module = hg.HailoDecoder(spec, model).eval()
    ref = np.load(b.export.out / "hf_reference.npz")
    feeds = {n: ref[n] for n in INPUT_NAMES}
    assert hx.gate(ref["last_logits"], hx.torch_logits(module, feeds), 0.999).passed
    with torch.no_grad():
        if corrupt == "weight":
            module.layers[1].self_attn.v_proj.weight.mul_(-1.0)
        elif corrupt == "rotate_half":
            module.rot_q.mul_(-1.0)  # sign error: rotates queries the wrong way
            module.rot_k.mul_(-1.0)
    if corrupt == "mask_layout":  # head-major tiling read as key-major: causality broken
        m = feeds["attention_mask"].reshape(32, 4, 32)
        feeds["attention_mask"] = np.ascontiguousarray(m.transpose(0, 2, 1)).reshape(1, 1, 32, 128)
    path = tmp_path / "model.onnx"
    hx.export_onnx(module, path)
    result = hx.gate(ref["last_logits"], hx.ort_logits(path, feeds), 0.999)
    assert not result.passed, result
    assert result.cosine < 0.99
