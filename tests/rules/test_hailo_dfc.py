"""The hailo10h DFC rules (parse, resources, optimize, compile) run as the engine runs them.

Each rule runs as `python rules/hailo/<stage>.py ACTION_JSON` with cwd = a fresh scratch dir
and PYTHONPATH=rules:tests/fakes, so `hailo_sdk_client` is the FAKE test double
(tests/fakes/hailo_sdk_client), which records every call in $FAKE_DFC_CALLS. The export
folder is synthesized here: a tiny real ONNX decoder-like graph, run_config.json,
hf_reference.npz and a real `tokenizers` tokenizer. Nothing produced here is a real result.

The tests marked `dfc` run the same rules against a real `hailo_sdk_client` (no fake on the
path) and are skipped where it is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
tokenizers = pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "rules"
FAKES = REPO / "tests" / "fakes"
RECIPES = RULES / "hailo" / "recipes"
TOOLCHAIN_ENV = {"NPY_PROMOTION_STATE": "legacy", "CUDA_VISIBLE_DEVICES": "0",
                 "TRANSFORMERS_NO_TF": "1", "PYTHONHASHSEED": "0"}
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, SEQ, VOCAB = 32, 4, 2, 8, 16, 64
SCOPE = "tiny"
WORDS = ["once", "upon", "a", "time", "there", "was", "little", "fox", "who", "liked", "to",
         "dig", "holes", "in", "the", "garden", "found", "shiny", "spoon", "lost", "sock", "and",
         "an", "old", "bone", "quiet", "girl", "named", "june", "collected", "stones"]
CALIBRATION_TEXT = "\n".join([
    "once upon a time there was a little fox",
    "the fox found a shiny spoon",
    "a lost sock and an old bone",
    "",
    "a quiet girl named june collected stones",
    "the girl liked to dig holes in the garden",
    "there was a little girl who found a bone",
]) + "\n"
STAGES = {
    "parse": {"inputs": ["export"], "outputs": ["parsed.har"]},
    "resources": {"inputs": ["export", "parse"],
                  "outputs": ["resources.har", "hailo-config.json"]},
    "optimize": {"inputs": ["export", "resources"],
                 "outputs": ["quantized.har", "model_script.alls"]},
    "compile": {"inputs": ["export", "optimize"],
                "outputs": ["model.hef", "compiled.har", "model.auto.alls",
                            "compile_script.alls"]},
}
OPTIMIZE_PARAMS = {"calibration_size": 3, "calibration_seed": 0, "optimization_level": 0,
                   "compression_level": 4, "accept_reduced_optimization": False}
COMPILE_PARAMS = {"compiler_optimization_level": 0, "auto_spatial_reshapes": False,
                  "replay_placement": False}


# -- synthetic export folder ---------------------------------------------------------------

def _matmul(nodes: list, inits: list, rng: Any, x: str, name: str, n_in: int, n_out: int,
            weight: Any = None) -> str:
    w = weight if weight is not None else rng.standard_normal((n_in, n_out)).astype(np.float32)
    inits.append(onnx.numpy_helper.from_array(w.astype(np.float32), f"{name}.weight"))
    nodes.append(onnx.helper.make_node("MatMul", [x, f"{name}.weight"], [f"{name}_out"],
                                       name=f"/{name}/MatMul"))
    return f"{name}_out"


def build_onnx(path: Path, layers: int) -> list[str]:
    """A tiny decoder-shaped graph: per layer q/k/v/o and gate/up/down MatMuls, plus a sparse
    rotate-half matrix and a head-wide helper (both must stay out of the a8_w4 list)."""
    h, rng = onnx.helper, np.random.default_rng(7)
    f32 = onnx.TensorProto.FLOAT
    shapes = input_shapes()
    graph_inputs = [h.make_tensor_value_info(n, f32, s) for n, s in shapes.items()]
    nodes: list = []
    inits: list = []
    x = "inputs_embeds"
    for i in range(layers):
        p = f"model/layers.{i}"
        q = _matmul(nodes, inits, rng, x, f"{p}/self_attn/q_proj", HIDDEN, HEADS * HEAD_DIM)
        _matmul(nodes, inits, rng, x, f"{p}/self_attn/k_proj", HIDDEN, KV_HEADS * HEAD_DIM)
        _matmul(nodes, inits, rng, x, f"{p}/self_attn/v_proj", HIDDEN, KV_HEADS * HEAD_DIM)
        rot = np.roll(np.eye(HIDDEN, dtype=np.float32), HIDDEN // 2, axis=1)
        q = _matmul(nodes, inits, rng, q, f"{p}/self_attn/rotate_half", HIDDEN, HIDDEN, rot)
        o = _matmul(nodes, inits, rng, q, f"{p}/self_attn/o_proj", HEADS * HEAD_DIM, HIDDEN)
        nodes.append(h.make_node("Add", [x, o], [f"{p}/res1"]))
        x = f"{p}/res1"
        g = _matmul(nodes, inits, rng, x, f"{p}/mlp/gate_proj", HIDDEN, 2 * HIDDEN)
        u = _matmul(nodes, inits, rng, x, f"{p}/mlp/up_proj", HIDDEN, 2 * HIDDEN)
        nodes.append(h.make_node("Mul", [g, u], [f"{p}/swiglu"]))
        d = _matmul(nodes, inits, rng, f"{p}/swiglu", f"{p}/mlp/down_proj", 2 * HIDDEN, HIDDEN)
        nodes.append(h.make_node("Add", [x, d], [f"{p}/res2"]))
        x = f"{p}/res2"
    inits += [onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), n) for n, v in
              (("head_start", [0]), ("head_end", [HEAD_DIM]), ("last_start", [SEQ - 1]),
               ("last_end", [SEQ]), ("axis_c", [2]), ("axis_s", [1]))]
    nodes.append(h.make_node("Slice", ["cos_k", "head_start", "head_end", "axis_c"], ["cos_h"]))
    _matmul(nodes, inits, rng, "cos_h", "model/rope_helper", HEAD_DIM, HEAD_DIM)
    logits = _matmul(nodes, inits, rng, x, "lm_head", HIDDEN, VOCAB)
    nodes.append(h.make_node("Slice", [logits, "last_start", "last_end", "axis_s"], ["logits"]))
    out = h.make_tensor_value_info("logits", f32, [1, 1, VOCAB])
    model = h.make_model(h.make_graph(nodes, "tiny", graph_inputs, [out], inits),
                         opset_imports=[h.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return [n.name for n in nodes if n.op_type == "MatMul"]


def input_shapes() -> dict[str, list[int]]:
    return {"inputs_embeds": [1, SEQ, HIDDEN], "attention_mask": [1, 1, SEQ, HEADS * SEQ],
            "cos_k": [1, SEQ, HEAD_DIM * KV_HEADS], "sin_k": [1, SEQ, HEAD_DIM * KV_HEADS],
            "cos_q": [1, SEQ, HEAD_DIM * HEADS], "sin_q": [1, SEQ, HEAD_DIM * HEADS]}


def build_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    assert len(vocab) <= VOCAB
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    data = json.loads((folder / "tokenizer.json").read_text())
    data["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "_"}, "content": " "},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    data["added_tokens"] = [{"id": i, "content": t, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": True}
                            for t, i in list(vocab.items())[:4]]
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>",
        "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"}))


def make_export(root: Path, layers: int) -> Path:
    export = root / "export"
    export.mkdir(parents=True)
    build_onnx(export / "model.onnx", layers)
    config = {
        "architecture": "llama", "hidden_size": HIDDEN, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_hidden_layers": layers,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "lm_head_shards": 1,
        "shard_vocab": 32000, "seq_len": SEQ, "prefill_size": 8, "cache_size": SEQ,
        "scope": SCOPE, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "mask_value": -1.0e4, "padding": "left", "sliding_window": None,
        "inputs": input_shapes(), "outputs": {"logits": [1, 1, VOCAB]}, "onnx_opset": 17,
    }
    (export / "run_config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(3)
    np.savez(export / "hf_reference.npz",
             embedding_table=rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
             attention_mask=np.zeros((1, 1, SEQ, HEADS * SEQ), np.float32) - 1.0e4,
             last_logits=rng.standard_normal(VOCAB).astype(np.float32),
             input_ids=np.zeros((1, SEQ), np.int64), pad_id=np.array(0),
             last_position=np.array(SEQ - 1))
    build_tokenizer(export / "tokenizer")
    (root / "calibration.txt").write_text(CALIBRATION_TEXT)
    return export


# -- running rules ---------------------------------------------------------------------------

@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    out: Path
    calls: list[dict[str, Any]]

    def named(self, call: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["call"] == call]

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""


def run_rule(root: Path, stage: str, inputs: dict[str, Path], params: dict[str, Any] | None = None,
             files: dict[str, Path] | None = None, tag: str = "", fake: bool = True,
             env: dict[str, str] | None = None, base_env: dict[str, str] | None = None) -> Run:
    scratch = root / f"{stage}{tag}"
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "work").mkdir(parents=True)
    action = {"format": 1, "model": "tiny", "stage": stage, "target": "hailo10h",
              "params": params or {}, "source": {},
              "inputs": {k: str(v) for k, v in inputs.items()},
              "files": {k: str(v) for k, v in (files or {}).items()},
              "out": str(scratch / "out"), "outputs": STAGES[stage]["outputs"]}
    (scratch / "action.json").write_text(json.dumps(action))
    calls = scratch / "calls.jsonl"
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONDONTWRITEBYTECODE": "1",
            **(TOOLCHAIN_ENV if base_env is None else base_env),
            "PYTHONPATH": os.pathsep.join([str(RULES), str(FAKES)] if fake else [str(RULES)]),
            "FAKE_DFC_CALLS": str(calls), **(env or {})}
    done = subprocess.run([sys.executable, str(RULES / "hailo" / f"{stage}.py"),
                           str(scratch / "action.json")], cwd=scratch / "work", env=full,
                          capture_output=True, text=True, timeout=300)
    recorded = [json.loads(ln) for ln in calls.read_text().splitlines()] if calls.exists() else []
    return Run(done.returncode, done.stdout, done.stderr, scratch / "out", recorded)


def ok(run: Run) -> Run:
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def har_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


@dataclass
class Chain:
    root: Path
    export: Path
    runs: dict[str, Run]

    def out(self, stage: str) -> Path:
        return self.runs[stage].out

    def inputs(self, stage: str) -> dict[str, Path]:
        return {up: (self.export if up == "export" else self.out(up))
                for up in STAGES[stage]["inputs"]}

    def optimize(self, tag: str, fake: bool = True, env: dict[str, str] | None = None,
                 **params: Any) -> Run:
        return run_rule(self.root, "optimize", self.inputs("optimize"),
                        {**OPTIMIZE_PARAMS, **params},
                        {"recipe": RECIPES / "optimize.alls",
                         "calibration": self.root / "calibration.txt"},
                        tag=tag, fake=fake, env=env)

    def compile(self, tag: str, files: dict[str, Path] | None = None, fake: bool = True,
                **params: Any) -> Run:
        return run_rule(self.root, "compile", self.inputs("compile"),
                        {**COMPILE_PARAMS, **params},
                        {"compile_script": RECIPES / "compile.alls", **(files or {})},
                        tag=tag, fake=fake)


def build_chain(root: Path, layers: int, fake: bool = True) -> Chain:
    chain = Chain(root, make_export(root, layers), {})
    chain.runs["parse"] = ok(run_rule(root, "parse", chain.inputs("parse"), fake=fake))
    chain.runs["resources"] = ok(run_rule(root, "resources", chain.inputs("resources"),
                                          fake=fake))
    chain.runs["optimize"] = ok(chain.optimize("", fake=fake))
    chain.runs["compile"] = ok(chain.compile("", fake=fake))
    return chain


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    return build_chain(tmp_path_factory.mktemp("hailo4"), layers=4)


# -- guards ----------------------------------------------------------------------------------

def test_guards_set_before_numpy_and_sdk_import(chain: Chain) -> None:
    for stage in STAGES:
        imports = chain.runs[stage].named("import")
        assert imports == [{"call": "import", "args": [], "kwargs": {
            "numpy_imported": False, "NPY_PROMOTION_STATE": "legacy",
            "CUDA_VISIBLE_DEVICES": "0", "TRANSFORMERS_NO_TF": "1"}}], stage


def test_guards_fill_a_bare_environment(chain: Chain) -> None:
    bare = {"PYTHONHASHSEED": "0"}  # no NPY_PROMOTION_STATE, CUDA_VISIBLE_DEVICES, TF switch
    run = ok(run_rule(chain.root, "parse", chain.inputs("parse"), tag="-bare", base_env=bare))
    assert run.named("import")[0]["kwargs"] == {
        "numpy_imported": False, "NPY_PROMOTION_STATE": "legacy",
        "CUDA_VISIBLE_DEVICES": "0", "TRANSFORMERS_NO_TF": "1"}


def test_guard_rejects_other_promotion_state(chain: Chain) -> None:
    run = run_rule(chain.root, "parse", chain.inputs("parse"), tag="-weak",
                   env={"NPY_PROMOTION_STATE": "weak"})
    assert run.code == 1
    assert run.last_line == "parse: NPY_PROMOTION_STATE='weak'; the DFC needs 'legacy'"
    assert run.named("import") == []  # failed before the SDK was imported


def test_guard_rejects_numpy_imported_first() -> None:
    code = ("import numpy, sys\nsys.argv = ['x']\nfrom common.dfc import prepare_environment\n"
            "prepare_environment('optimize')\n")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(RULES),
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "optimize: numpy was imported before NPY_PROMOTION_STATE=legacy was set (it is None); "
        "the DFC's quantization needs the legacy promotion")


def test_acceleras_layers_registered_before_loading_quantized_har(chain: Chain) -> None:
    # The fake raises "Unknown layer" on a quantized HAR unless the classes were registered;
    # compile loaded one, so registration happened (3 layer classes, the broken backend and
    # the non-layer class skipped).
    assert "registered 3 acceleras layer classes" in chain.runs["compile"].stdout
    assert chain.runs["compile"].named("compile")


def test_fake_sdk_not_importable_from_the_test_process() -> None:
    import importlib.util

    spec = importlib.util.find_spec("hailo_sdk_client")
    assert spec is None or not str(spec.origin).startswith(str(FAKES))


# -- parse -----------------------------------------------------------------------------------

def test_parse_calls(chain: Chain) -> None:
    run = chain.runs["parse"]
    assert run.named("ClientRunner") == [{"call": "ClientRunner", "args": [],
                                          "kwargs": {"hw_arch": "hailo10h", "har": None}}]
    (translate,) = run.named("translate_onnx_model")
    assert translate["args"] == [str(chain.export / "model.onnx"), SCOPE]
    assert translate["kwargs"]["net_input_shapes"] == input_shapes()
    assert list(translate["kwargs"]["net_input_shapes"]) == list(input_shapes())
    assert translate["kwargs"]["net_input_format"]["inputs_embeds"] == [
        "Dims.BATCH", "Dims.WIDTH", "Dims.CHANNELS"]
    assert translate["kwargs"]["net_input_format"]["attention_mask"] == [
        "Dims.BATCH", "Dims.HEIGHT", "Dims.WIDTH", "Dims.CHANNELS"]
    assert translate["kwargs"]["disable_onnx_simplifier"] is True
    members = har_members(run.out / "parsed.har")
    assert f"{SCOPE}.hn" in members and "FAKE_DFC_README.txt" in members


def test_hars_written_deterministically(chain: Chain) -> None:
    for stage, name in (("parse", "parsed.har"), ("resources", "resources.har"),
                        ("optimize", "quantized.har"), ("compile", "compiled.har")):
        with tarfile.open(chain.out(stage) / name) as tar:
            members = tar.getmembers()
        assert [m.name for m in members] == sorted(m.name for m in members), stage
        assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {
            (946684800, 0, 0, "", "", 0o644)}, stage
    again = ok(run_rule(chain.root, "parse", chain.inputs("parse"), tag="-again"))
    first = (chain.out("parse") / "parsed.har").read_bytes()
    assert (again.out / "parsed.har").read_bytes() == first


# -- resources -------------------------------------------------------------------------------

def test_hailo_config(chain: Chain) -> None:
    cfg = json.loads((chain.out("resources") / "hailo-config.json").read_text())
    assert cfg["pre_process_params"] == {"num_attention_heads": HEADS,
                                         "num_key_value_heads": KV_HEADS,
                                         "kv_cache_size": SEQ,
                                         "prefill_input_tokens_count": 8}
    assert "prefill_input_tokens_size" not in json.dumps(cfg)
    assert cfg["input_layers_names_suffixes"] == {
        "embeddings": "input_layer1", "attention_mask": "input_layer2",
        "pe_k_cos": "input_layer3", "pe_k_sin": "input_layer4",
        "pe_q_cos": "input_layer5", "pe_q_sin": "input_layer6"}
    assert (cfg["eos_token_id"], cfg["stop_token_id"], cfg["bos_token_id"]) == (2, [2], 1)
    assert cfg["chat_template"] == "<s>{% for m in messages %}{{ m['content'] }}{% endfor %}"


def test_resources_attached(chain: Chain) -> None:
    run = chain.runs["resources"]
    assert run.named("ClientRunner")[0]["kwargs"] == {
        "hw_arch": "hailo10h", "har": str(chain.out("parse") / "parsed.har")}
    (res,) = run.named("add_external_resources")
    res = res["args"][0]
    assert res["input_layers_mapping"] == {
        f"{SCOPE}/input_layer1": "embedding", f"{SCOPE}/input_layer3": "cos",
        f"{SCOPE}/input_layer4": "sin", f"{SCOPE}/input_layer5": "cos",
        f"{SCOPE}/input_layer6": "sin"}
    embed = res["weights"][f"{SCOPE}/input_layer1"]["embed"]["ndarray"]
    with np.load(chain.export / "hf_reference.npz") as ref:
        table = ref["embedding_table"]
    assert embed["shape"] == [VOCAB, HIDDEN] and embed["dtype"] == "float32"
    import hashlib

    assert embed["sha256"] == hashlib.sha256(table.tobytes()).hexdigest()
    k_cos = res["weights"][f"{SCOPE}/input_layer3"]
    assert k_cos["theta"]["ndarray"]["shape"] == [HEAD_DIM]
    files = {c["args"][0]: c for c in run.named("add_external_file")}
    assert sorted(files) == ["hailo-config.json", "tokenizer.json"]
    members = har_members(run.out / "resources.har")
    manifest = json.loads(members["hefbuild/resources.json"])
    expected = 1.0 / 10000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    assert np.allclose(manifest["rope_theta_table"], np.concatenate([expected, expected]))
    assert manifest["rope_tiles"] == {"cos_k": [1, 1, KV_HEADS], "sin_k": [1, 1, KV_HEADS],
                                      "cos_q": [1, 1, HEADS], "sin_q": [1, 1, HEADS]}
    assert members["hefbuild/hailo-config.json"] == (
        chain.out("resources") / "hailo-config.json").read_bytes()
    tok = json.loads(members["hefbuild/tokenizer.json"])
    assert [d["type"] for d in tok["decoder"]["decoders"]] == ["Replace"]
    assert set(har_members(chain.out("parse") / "parsed.har")) <= set(members)


# -- optimize --------------------------------------------------------------------------------

def rendered(path: Path) -> list[str]:
    return path.read_text().splitlines()


def test_model_script(chain: Chain) -> None:
    lines = rendered(chain.out("optimize") / "model_script.alls")
    convs = sorted((c for c in json.loads(
        har_members(chain.out("parse") / "parsed.har")[f"{SCOPE}.hn"])["layers"]
        if "/conv" in c), key=lambda c: int(c.rsplit("conv", 1)[1]))  # conv1, conv2, ... conv10
    # 4 layers x (q, k, v, rotate, o, gate, up, down) + rope helper + lm_head
    assert len(convs) == 4 * 8 + 2
    hn = json.loads(har_members(chain.out("parse") / "parsed.har")[f"{SCOPE}.hn"])["layers"]
    excluded = {c for c in convs if any(
        s in hn[c]["original_names"][0] for s in ("rotate_half", "rope_helper"))}
    assert len(excluded) == 5
    projections = [f"quantization_param([{c}], precision_mode=a8_w4)"
                   for c in convs if c not in excluded]
    assert lines == [
        "pre_quantization_optimization(ew_add_fusing, policy=disabled)",
        "model_optimization_config(globals, multiproc_policy=disabled)",
        "set_kv_cache_global_params(8, 16)",
        "model_optimization_config(calibration, batch_size=1, calibset_size=3, "
        "use_saitama=True, device=cuda)",
        "model_optimization_flavor(optimization_level=0, compression_level=4)",
        "post_quantization_optimization(bias_correction, policy=enabled, use_saitama=True, "
        "device=cuda)",
        "post_quantization_optimization(adaround, policy=disabled)",
        "post_quantization_optimization(finetune, policy=disabled)",
        f"quantization_param([{SCOPE}/input_layer1], precision_mode=a16_w16)",
        *projections,
    ]
    (loaded,) = chain.runs["optimize"].named("load_model_script")
    assert loaded["args"] == ["\n".join(lines) + "\n"]


def test_optimize_calibration(chain: Chain) -> None:
    run = chain.runs["optimize"]
    assert run.named("ClientRunner")[0]["kwargs"]["hw_arch"] == "hailo10h"
    order = [c["call"] for c in run.calls]
    assert order.index("load_model_script") < order.index("optimize")
    (opt,) = run.named("optimize")
    calib = {k: v["ndarray"] for k, v in opt["args"][0].items()}
    assert {k: (v["shape"], v["dtype"]) for k, v in calib.items()} == {
        f"{SCOPE}/input_layer1": ([3, 1, SEQ, HIDDEN], "float32"),
        f"{SCOPE}/input_layer2": ([3, 1, SEQ, HEADS * SEQ], "float32"),
        **{f"{SCOPE}/input_layer{k}": ([3, SEQ], "float32") for k in (3, 4, 5, 6)}}
    # same seed: identical arrays; another seed: other text rows (the mask may not change)
    again = ok(chain.optimize("-again"))
    assert again.named("optimize") == run.named("optimize")
    assert (again.out / "quantized.har").read_bytes() == (
        run.out / "quantized.har").read_bytes()
    other = ok(chain.optimize("-seed", calibration_seed=1))
    other_calib = other.named("optimize")[0]["args"][0]
    assert other_calib[f"{SCOPE}/input_layer1"] != opt["args"][0][f"{SCOPE}/input_layer1"]


def test_calibration_values(tmp_path: Path, chain: Chain) -> None:
    """Recompute the calibration the documented way and compare digests with the fake."""
    import hashlib

    from tokenizers import Tokenizer

    lines = [ln.strip() for ln in CALIBRATION_TEXT.splitlines() if ln.strip()]
    order = np.random.default_rng(0).permutation(len(lines))
    ordered = [lines[i] for i in order]
    tok = Tokenizer.from_file(str(chain.export / "tokenizer" / "tokenizer.json"))
    enc = [tok.encode(ln, add_special_tokens=False).ids for ln in ordered]
    with np.load(chain.export / "hf_reference.npz") as ref:
        table = ref["embedding_table"]
    rows = []
    for r in range(3):
        ids = [1]
        for k in range(len(enc)):
            if len(ids) >= SEQ:
                break
            ids += enc[(r + k) % len(enc)]
        rows.append(ids[:SEQ])
    assert all(len(r) == SEQ for r in rows)  # packed: no padding with this text
    embeds = table[np.array(rows)][:, None].astype(np.float32)
    causal = np.where(np.tri(SEQ, dtype=bool), 0.0, -1.0e4).astype(np.float32)
    mask = np.broadcast_to(np.tile(causal, (1, HEADS)), (3, 1, SEQ, HEADS * SEQ))
    pos = np.broadcast_to(np.arange(SEQ, dtype=np.float32), (3, SEQ))
    got = chain.runs["optimize"].named("optimize")[0]["args"][0]

    def digest(a: Any) -> str:
        return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float32).tobytes()).hexdigest()

    assert got[f"{SCOPE}/input_layer1"]["ndarray"]["sha256"] == digest(embeds)
    assert got[f"{SCOPE}/input_layer2"]["ndarray"]["sha256"] == digest(mask)
    for k in (3, 4, 5, 6):
        assert got[f"{SCOPE}/input_layer{k}"]["ndarray"]["sha256"] == digest(pos)


@pytest.mark.parametrize("env", [{"FAKE_DFC_REDUCE_OPT": "1"}, {"FAKE_DFC_NO_GPU": "1"}],
                         ids=["reduced", "no-gpu"])
def test_optimize_fails_on_reduced_optimization(chain: Chain, env: dict[str, str]) -> None:
    run = chain.optimize(f"-{next(iter(env))}", env=env)
    assert run.code == 1
    assert run.last_line.startswith("optimize: the DFC reduced the optimization: '")
    assert run.last_line.endswith(
        "(make a GPU visible, or set accept_reduced_optimization = true)")
    word = "Reducing optimization level" if "REDUCE" in next(iter(env)) else "no available GPU"
    assert word in run.last_line
    assert not (run.out / "quantized.har").exists()


def test_optimize_accepts_reduced_optimization(chain: Chain) -> None:
    run = ok(chain.optimize("-accept", env={"FAKE_DFC_REDUCE_OPT": "1", "FAKE_DFC_NO_GPU": "1"},
                            accept_reduced_optimization=True))
    warnings = [ln for ln in run.stdout.splitlines() if "WARNING: accepted reduced" in ln]
    assert len(warnings) == 2
    assert (run.out / "quantized.har").is_file()


def test_unresolved_placeholder_names_it_and_the_recipe(chain: Chain, tmp_path: Path) -> None:
    recipe = tmp_path / "bad.alls"
    recipe.write_text((RECIPES / "optimize.alls").read_text() + "foo({nonsense_value})\n")
    run = run_rule(chain.root, "optimize", chain.inputs("optimize"), OPTIMIZE_PARAMS,
                   {"recipe": recipe, "calibration": chain.root / "calibration.txt"},
                   tag="-bad")
    assert run.code == 1
    assert run.last_line.startswith(
        f"optimize: recipe unresolved placeholder {{nonsense_value}} at {recipe}:")
    assert run.named("optimize") == []


def test_optimization_level_must_be_pinned(chain: Chain, tmp_path: Path) -> None:
    recipe = tmp_path / "unpinned.alls"
    recipe.write_text((RECIPES / "optimize.alls").read_text().replace(
        "optimization_level={optimization_level}, ", ""))
    run = run_rule(chain.root, "optimize", chain.inputs("optimize"), OPTIMIZE_PARAMS,
                   {"recipe": recipe, "calibration": chain.root / "calibration.txt"},
                   tag="-unpinned")
    assert run.code == 1
    assert "does not pin model_optimization_flavor(optimization_level=...)" in run.last_line


# -- compile ---------------------------------------------------------------------------------

def conversion_lines(lines: list[str]) -> list[str]:
    return [ln for ln in lines if "format_conversion(" in ln]


def test_compile_script(chain: Chain) -> None:
    lines = rendered(chain.out("compile") / "compile_script.alls")
    assert lines[:4] == [
        "performance_param(compiler_optimization_level=0)",
        "allocator_param(enable_auto_spatial_reshapes=False)",
        f"{SCOPE}__prefill = network_group([{SCOPE}__prefill])",
        f"{SCOPE}__tbt = network_group([{SCOPE}__tbt])",
    ]
    conv = conversion_lines(lines)
    assert len(conv) == 32 == len(lines) - 4
    assert sum("tf_rgb_to_hailo_rgb)" in ln for ln in conv) == 16
    assert sum("hailo_rgb_to_tf_rgb)" in ln for ln in conv) == 16
    for group in (f"{SCOPE}__prefill", f"{SCOPE}__tbt"):
        assert sum(ln.startswith(f"{group}/") for ln in conv) == 16
    assert (f"{SCOPE}__tbt/tf_rgb_to_hailo_rgb_from_cache_input_k0 = format_conversion("
            f"{SCOPE}__tbt/cache_input_k0, {SCOPE}__tbt/conv2, tf_rgb_to_hailo_rgb)") in conv
    assert "automatic_reshapes" not in "".join(lines)


def test_compile_outputs(chain: Chain) -> None:
    run = chain.runs["compile"]
    assert len(run.named("compile")) == 1
    (loaded,) = run.named("load_model_script")
    assert loaded["args"] == [(run.out / "compile_script.alls").read_text()]
    hef = (run.out / "model.hef").read_bytes()
    assert hef.startswith(b"FAKE-HEF")
    assert json.loads(hef.split(b"\n", 1)[1])["network_groups"] == [
        f"{SCOPE}__prefill", f"{SCOPE}__tbt"]
    auto = (run.out / "model.auto.alls").read_text()
    assert auto == har_members(run.out / "compiled.har")[f"{SCOPE}.auto.alls"].decode()
    assert auto.startswith("# FAKE DFC auto model script")
    assert "WARNING: hailo_sdk_client is the FAKE test double" in run.stdout
    assert "SDK paths patched: release mode" in run.stdout


def test_auto_spatial_reshapes_restores_compiler_default(chain: Chain) -> None:
    run = ok(chain.compile("-reshapes", auto_spatial_reshapes=True))
    lines = rendered(run.out / "compile_script.alls")
    assert not any("allocator_param" in ln for ln in lines)
    assert not any("automatic_reshapes" in ln for ln in lines)
    assert len(conversion_lines(lines)) == 32


def test_replay_placement_loads_the_placement(chain: Chain, tmp_path: Path) -> None:
    placement = tmp_path / "tiny.auto.alls"
    shutil.copy(chain.out("compile") / "model.auto.alls", placement)
    run = ok(chain.compile("-replay", files={"placement": placement}, replay_placement=True))
    (loaded,) = run.named("load_model_script")
    assert loaded["args"] == [placement.read_text()]
    assert (run.out / "compile_script.alls").read_text() == placement.read_text()
    assert len(run.named("compile")) == 1


def test_compile_rejects_extra_network_group(chain: Chain, tmp_path: Path) -> None:
    script = tmp_path / "three.alls"
    script.write_text((RECIPES / "compile.alls").read_text() +
                      "{scope} = network_group([{scope}])\n")
    run = run_rule(chain.root, "compile", chain.inputs("compile"), COMPILE_PARAMS,
                   {"compile_script": script}, tag="-three")
    assert run.code == 1
    assert "declares network groups" in run.last_line and run.named("compile") == []


def test_two_layer_chain_scripts(tmp_path: Path) -> None:
    two = build_chain(tmp_path, layers=2)
    lines = rendered(two.out("compile") / "compile_script.alls")
    assert len(conversion_lines(lines)) == 16
    model = rendered(two.out("optimize") / "model_script.alls")
    # q k v o gate up down per layer, and lm_head
    assert sum("precision_mode=a8_w4" in ln for ln in model) == 2 * 7 + 1


# -- the real DFC --------------------------------------------------------------------------

def _real_sdk_available() -> bool:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1", **TOOLCHAIN_ENV}
    done = subprocess.run([sys.executable, "-c", "import hailo_sdk_client"], env=env,
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.dfc
def test_real_dfc_chain(tmp_path: Path) -> None:
    if not _real_sdk_available():
        pytest.skip("hailo_sdk_client (Hailo Dataflow Compiler) is not importable "
                    f"from {sys.executable} without the fake")
    chain = build_chain(tmp_path, layers=2, fake=False)
    for stage, spec in STAGES.items():
        for name in spec["outputs"]:
            assert (chain.out(stage) / name).is_file(), (stage, name)
    assert "FAKE" not in (chain.out("compile") / "model.auto.alls").read_text()[:200]
    assert not (chain.out("compile") / "model.hef").read_bytes().startswith(b"FAKE-HEF")
    lines = rendered(chain.out("compile") / "compile_script.alls")
    assert len(conversion_lines(lines)) > 0


# -- the double writes only small files -----------------------------------------------------

def test_a_model_over_the_doubles_limit_leaves_only_small_files(tmp_path: Path,
                                                                chain: Chain) -> None:
    """Above FAKE_DFC_MAX_WEIGHT_BYTES (64 MiB by default; 1 here) the DFC double keeps
    neither kernels nor graph: every HAR and the HEF stay small, say FAKE and say why, and
    the hailo_platform double refuses to run such a HEF rather than answer for it."""
    env = {"FAKE_DFC_MAX_WEIGHT_BYTES": "1"}
    small = Chain(tmp_path, make_export(tmp_path, layers=4), {})
    for stage in ("parse", "resources"):
        small.runs[stage] = ok(run_rule(tmp_path, stage, small.inputs(stage), env=env))
    small.runs["optimize"] = ok(run_rule(
        tmp_path, "optimize", small.inputs("optimize"), OPTIMIZE_PARAMS,
        {"recipe": RECIPES / "optimize.alls", "calibration": tmp_path / "calibration.txt"},
        env=env))
    small.runs["compile"] = ok(run_rule(
        tmp_path, "compile", small.inputs("compile"), COMPILE_PARAMS,
        {"compile_script": RECIPES / "compile.alls"}, env=env))
    outputs = {"parse": "parsed.har", "resources": "resources.har",
               "optimize": "quantized.har", "compile": "model.hef"}
    for stage, name in outputs.items():
        full, kept = chain.out(stage) / name, small.out(stage) / name
        assert kept.stat().st_size < full.stat().st_size / 4, (stage, kept.stat().st_size)
    members = har_members(small.out("parse") / "parsed.har")
    assert f"{SCOPE}.fake_model.onnx" not in members and "FAKE_DFC_README.txt" in members
    assert "weights of this model are not kept" in json.loads(members["fake_dfc.json"])[
        "weights_not_kept"]
    assert "get_params() failed (FAKE DFC: the weights of this model are not kept" in \
        small.runs["optimize"].stdout
    hef = (small.out("compile") / "model.hef").read_bytes()
    assert hef.startswith(b"FAKE-HEF\n")
    body = json.loads(hef.split(b"\n", 1)[1])
    assert "model.onnx" not in body["files"] and body["weights_not_kept"]
    # In a child: the doubles must not be importable from the test process itself.
    device = subprocess.run(
        [sys.executable, "-c", "import json, sys\nfrom hailo_platform._fake import Model\n"
         "Model(json.load(sys.stdin))"], input=json.dumps(body), capture_output=True,
        text=True, env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(FAKES)})
    assert device.returncode != 0
    assert "ValueError: FAKE-HEF holds no model to run: FAKE DFC: the weights" in device.stderr
