"""Each cpu-ort quantization method through the real rules, on tiny-llama and tiny-qwen2.

Like test_cpu_ort_chain.py: each rule runs as `python rules/<path>.py ACTION_JSON` in a fresh
scratch cwd with PYTHONPATH=<repo>/rules; fetch and export run once per model, then quantize ->
compile -> verify once per method (a verify whose gate fails still leaves its report).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
from session_once import once_per_session
from tree_digest import sha256_tree

REPO = Path(__file__).resolve().parents[2]
CALIBRATION = "data/calibration/tiny-stories.txt"
CORPUS = "data/corpus/tiny-stories.txt"
METHODS = ("weight_only_int8", "weight_only_int4", "dynamic_int8", "static_qdq")
# The models' own declarations: models/tiny-llama.toml and models/tiny-qwen2.toml.
SYNTHETIC = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 384,
    "max_position_embeddings": 256, "train_steps": 800, "corpus": CORPUS,
}
MODELS = {
    "tiny-llama": {"architecture": "llama", "seed": 1234, **SYNTHETIC},
    "tiny-qwen2": {"architecture": "qwen2", "seed": 4321, **SYNTHETIC},
}
PROMPTS = ["Once upon a time there was a tiny mouse", "The children played",
           "Sam had a blue kite"]
STAGES: dict[str, dict[str, Any]] = {
    "fetch": {"rule": "fetch.py", "inputs": [], "outputs": ["checkpoint/"], "params": {}},
    "export": {"rule": "cpu_ort/export.py", "inputs": ["fetch"],
               "outputs": ["model.onnx", "export_report.json"],
               "params": {"opset": 17, "reference_text": "Once upon a time there was a little "
                          "robot who", "cosine_min": 0.9999}},
    # Only the method: every other parameter takes the rule's default, as for a model that
    # declares nothing else.
    "quantize": {"rule": "cpu_ort/quantize.py", "inputs": ["fetch", "export"],
                 "outputs": ["model.int8.onnx"], "params": {}},
    "compile": {"rule": "cpu_ort/compile.py", "inputs": ["quantize"],
                "outputs": ["model.opt.onnx"], "params": {"optimization_level": "extended"}},
    "verify": {"rule": "cpu_ort/verify.py", "inputs": ["fetch", "compile"],
               "outputs": ["report.json"],
               "params": {"prompts": PROMPTS, "max_new_tokens": 16, "min_token_agreement": 0.5}},
}
FILES = {"fetch": {"corpus": CORPUS}, "quantize": {"calibration": CALIBRATION}}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path

    def last_error(self) -> str:
        return self.stderr.strip().splitlines()[-1]


class Chain:
    def __init__(self, root: Path, model: str, source: dict[str, Any] | None = None) -> None:
        self.root, self.model = root, model
        self.source = source or {"synthetic": MODELS[model]}
        self.runs = 0

    def run(self, stage: str, params: dict[str, Any] | None = None,
            inputs: dict[str, Path] | None = None) -> Run:
        spec = STAGES[stage]
        self.runs += 1
        scratch = self.root / f"scratch-{self.runs:02d}-{stage}"
        scratch.mkdir(parents=True)
        action = {
            "format": 1, "model": self.model, "stage": stage, "target": "cpu-ort",
            "params": {**spec["params"], **(params or {})},
            "source": self.source,
            "inputs": {name: str((inputs or {}).get(name, self.root / "build" / name))
                       for name in spec["inputs"]},
            "files": {k: str(REPO / v) for k, v in FILES.get(stage, {}).items()},
            "out": str(scratch / "out"), "outputs": spec["outputs"],
        }
        (scratch / "action.json").write_text(json.dumps(action, sort_keys=True))
        env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        proc = subprocess.run(
            [sys.executable, str(REPO / "rules" / spec["rule"]), str(scratch / "action.json")],
            cwd=scratch, env=env, capture_output=True, text=True, timeout=300,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr, scratch / "out")

    def promote(self, stage: str, run: Run, name: str | None = None) -> Path:
        assert run.returncode == 0, f"{stage} failed:\n{run.stdout}\n{run.stderr}"
        dest = self.root / "build" / (name or stage)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run.out), dest)
        for path in [dest, *dest.rglob("*")]:
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        return dest


@dataclass
class MethodRun:
    quantized: Path
    compiled: Path
    verify: Run
    report: dict[str, Any]


def fetched_and_exported(factory: pytest.TempPathFactory, model: str) -> Path:
    """A folder whose `build/fetch` and `build/export` are the model's, made once a session
    (tests/session_once.py): fetch trains the checkpoint (some 15 s of CPU), and
    test_cpu_ort_chain.py runs the same two actions on tiny-llama. Read only."""
    def build(folder: Path) -> None:
        chain = Chain(folder, model)
        for stage in ("fetch", "export"):
            chain.promote(stage, chain.run(stage))
    return once_per_session(factory, f"cpu-ort-{model}", build)


def copy_stages(shared: Path, build: Path, stages: tuple[str, ...]) -> None:
    """`shared`'s build folders of `stages` into `build`, read only as the engine's are."""
    for stage in stages:
        shutil.copytree(shared / "build" / stage, build / stage)


# About 30 s per model, once per file: every method's quantize, compile and verify, which
# the tests of the file only read (on fetch and export made once a session).
@pytest.fixture(scope="module", params=sorted(MODELS))
def built(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Chain, dict[str, MethodRun]]]:
    model = request.param
    chain = Chain(tmp_path_factory.mktemp(model), model)
    copy_stages(fetched_and_exported(tmp_path_factory, model), chain.root / "build",
                ("fetch", "export"))
    results = {}
    for method in METHODS:
        quantized = chain.promote("quantize", chain.run("quantize", {"method": method}),
                                  f"quantize-{method}")
        compiled = chain.promote("compile", chain.run("compile", inputs={"quantize": quantized}),
                                 f"compile-{method}")
        verify = chain.run("verify", inputs={"compile": compiled})
        report = json.loads((verify.out / "report.json").read_text())
        results[method] = MethodRun(quantized / "model.int8.onnx", compiled / "model.opt.onnx",
                                    verify, report)
    yield chain, results
    for path in (chain.root / "build").rglob("*"):
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def op_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in onnx.load(str(path)).graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def metadata(path: Path) -> dict[str, str]:
    return {p.key: p.value for p in onnx.load(str(path)).metadata_props}


@pytest.mark.parametrize("method", METHODS)
def test_each_method_builds_and_reports_its_figures(built, method: str) -> None:
    chain, results = built
    result = results[method]
    report = result.report
    assert report["method"] == method
    assert report["quantization"]["method"] == method
    assert report["gate"] == "teacher_forced"
    assert report["passed"] is (result.verify.returncode == 0)
    assert len(report["prompts"]) == len(PROMPTS)
    for key in ("mean_agreement", "mean_teacher_forced_agreement", "mean_logit_cosine"):
        assert 0.0 <= report[key] <= 1.0, key
    for p in report["prompts"]:
        assert len(p["candidate_ids"]) == len(p["reference_ids"]) == 16
        assert 0.0 <= p["teacher_forced_agreement"] <= 1.0
        assert p["logit_cosine_min"] <= p["logit_cosine_mean"] <= 1.0
        assert isinstance(p["near_tie"], bool)
        if p["first_divergence"] is None:
            assert p["first_divergence_margin"] is None and p["agreement"] == 1.0
        else:
            assert p["first_divergence_margin"] >= 0.0
            assert p["near_tie"] is (p["first_divergence_margin"] < 0.5)
        assert p["teacher_forced_agreement"] == pytest.approx(
            1 - len(p["teacher_forced_mismatches"]) / 16)
    # The stage log shows both views per prompt.
    assert "teacher-forced" in result.verify.stdout and "free-running" in result.verify.stdout


@pytest.mark.parametrize("method", METHODS)
def test_each_method_leaves_its_own_operators(built, method: str) -> None:
    _, results = built
    ops = op_counts(results[method].quantized)
    float_matmuls = op_counts(built[0].root / "build" / "export" / "model.onnx")["MatMul"]
    if method.startswith("weight_only"):
        bits = 8 if method == "weight_only_int8" else 4
        nodes = [n for n in onnx.load(str(results[method].quantized)).graph.node
                 if n.op_type == "MatMulNBits"]
        assert len(nodes) == 15  # 7 projections x 2 layers + lm_head (constant weights)
        for node in nodes:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["bits"] == bits and attrs["block_size"] == 32
        assert "QuantizeLinear" not in ops
        assert ops["MatMul"] == float_matmuls - 15  # attention's activation x activation
    elif method == "dynamic_int8":
        assert ops.get("MatMulInteger", 0) + ops.get("DynamicQuantizeMatMul", 0) == 15
    else:
        assert ops["QuantizeLinear"] > 0 and ops["DequantizeLinear"] > 0
    meta = metadata(results[method].compiled)  # survives compile
    assert meta["hefbuild.quantize.method"] == method
    sizes = {k: int(meta[f"hefbuild.quantize.{k}_bytes"]) for k in ("quantized", "float")}
    assert sizes["quantized"] < sizes["float"]


def test_weight_only_int8_passes_the_gate_with_margin(built) -> None:
    _, results = built
    result = results["weight_only_int8"]
    assert result.verify.returncode == 0, result.verify.stderr
    report = result.report
    assert report["passed"] is True
    assert report["min_teacher_forced"] == 0.9 and report["min_logit_cosine"] == 0.99
    for p in report["prompts"]:
        assert p["passed"] and p["reason"] == "ok"
        assert p["teacher_forced_agreement"] == 1.0
        assert p["logit_cosine_mean"] > 0.999  # the default gate is 0.99
    assert report["quantization"]["bits"] == "8"
    assert report["quantization"]["block_size"] == "32"
    assert report["quantization"]["symmetric"] == "true"


def test_weight_only_int8_halves_the_model(built) -> None:
    _, results = built
    meta = results["weight_only_int8"].report["quantization"]
    assert int(meta["quantized_bytes"]) < 0.6 * int(meta["float_bytes"])


def test_the_quantized_size_is_that_of_the_file_written(built) -> None:
    """The figure is stored in the file it measures, so it must count itself."""
    _, results = built
    for method, result in results.items():
        meta = result.report["quantization"]
        assert int(meta["quantized_bytes"]) == result.quantized.stat().st_size, method


def test_weight_only_int8_is_byte_identical_across_runs(built) -> None:
    chain, results = built
    again = chain.run("quantize", {"method": "weight_only_int8"})
    assert again.returncode == 0, again.stderr
    assert sha256_tree(again.out) == sha256_tree(results["weight_only_int8"].quantized.parent)


def test_block_size_and_asymmetry_are_applied(built) -> None:
    chain, _ = built
    run = chain.run("quantize", {"method": "weight_only_int4", "block_size": 64,
                                 "symmetric": False})
    assert run.returncode == 0, run.stderr
    nodes = [n for n in onnx.load(str(run.out / "model.int8.onnx")).graph.node
             if n.op_type == "MatMulNBits"]
    assert nodes
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["bits"] == 4 and attrs["block_size"] == 64
        assert len(node.input) >= 4 and node.input[3]  # zero points
    assert "block 64, asymmetric" in run.stdout


def test_static_qdq_exclude_keeps_matching_nodes_float(built) -> None:
    chain, results = built
    run = chain.run("quantize", {"method": "static_qdq", "exclude": ["lm_head"]})
    assert run.returncode == 0, run.stderr
    model = onnx.load(str(run.out / "model.int8.onnx"))
    meta = {p.key: p.value for p in model.metadata_props}
    assert int(meta["hefbuild.quantize.excluded_nodes"]) >= 1
    plain = int(results["static_qdq"].report["quantization"]["quantized_nodes"])
    assert int(meta["hefbuild.quantize.quantized_nodes"]) < plain


def test_bad_exclude_regex_is_one_line(built) -> None:
    chain, _ = built
    run = chain.run("quantize", {"method": "static_qdq", "exclude": ["lm_head("]})
    assert run.returncode == 1
    assert run.last_error().startswith("quantize: params.exclude pattern 'lm_head(' is not a regex")
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize(("params", "expected"), [
    ({"method": "int3"}, "quantize: params.method 'int3' is not one of"),
    ({"method": "weight_only_int8", "block_size": 24},
     "quantize: params.block_size 24 must be a power of two >= 16"),
])
def test_bad_method_params_fail_in_the_rule_with_one_line(built, params, expected) -> None:
    chain, _ = built
    run = chain.run("quantize", params)
    assert run.returncode == 1
    assert run.last_error().startswith(expected)
    assert "Traceback" not in run.stderr


def test_a_failed_gate_is_one_line_naming_the_figure(built) -> None:
    chain, results = built
    # weight-only int8: every top-1 right (agreement 1.0), cosine ~0.99995 < 1.0.
    compiled = results["weight_only_int8"].compiled.parent
    run = chain.run("verify", {"min_logit_cosine": 1.0}, inputs={"compile": compiled})
    assert run.returncode == 1
    last = run.last_error()
    assert last.startswith("verify gate failed: prompt ")
    assert "< min_logit_cosine 1" in last
    report = json.loads((run.out / "report.json").read_text())
    assert report["passed"] is False


def test_free_running_gate_uses_min_token_agreement(built) -> None:
    chain, results = built
    compiled = results["weight_only_int8"].compiled.parent
    run = chain.run("verify", {"gate": "free_running"}, inputs={"compile": compiled})
    assert run.returncode == 0, run.stderr
    report = json.loads((run.out / "report.json").read_text())
    assert report["gate"] == "free_running"
    assert "gate free_running, min_token_agreement 0.5" in run.stdout
    assert report["passed"] is True
