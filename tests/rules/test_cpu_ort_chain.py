"""End-to-end: run the five cpu-ort rules on tiny-llama exactly as the engine does.

Each rule runs as `python rules/<path>.py ACTION_JSON` with cwd = a fresh scratch dir and
PYTHONPATH=<repo>/rules; a successful stage's `out` becomes the read-only input of the next.
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

import pytest
from test_cpu_ort_methods import copy_stages, fetched_and_exported
from tree_digest import sha256_tree

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
CORPUS = "data/corpus/tiny-stories.txt"
CALIBRATION = "data/calibration/tiny-stories.txt"
SOURCE = {
    "synthetic": {
        "architecture": "llama",
        "seed": 1234,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 384,
        "max_position_embeddings": 256,
        "train_steps": 800,
        "corpus": CORPUS,
    }
}
EXPORT_PARAMS = {
    "opset": 17,
    "reference_text": "Once upon a time there was a little robot who",
    "cosine_min": 0.9999,
}
STAGES: dict[str, dict[str, Any]] = {
    "fetch": {"rule": "fetch.py", "inputs": [], "outputs": ["checkpoint/"], "params": {}},
    "export": {
        "rule": "cpu_ort/export.py",
        "inputs": ["fetch"],
        "outputs": ["model.onnx", "export_report.json"],
        "params": EXPORT_PARAMS,
    },
    "quantize": {
        "rule": "cpu_ort/quantize.py",
        "inputs": ["fetch", "export"],
        "outputs": ["model.int8.onnx"],
        "params": {
            "method": "weight_only_int8",
            "block_size": 32,
            "symmetric": True,
            "exclude": [],
            "calibration": CALIBRATION,
            "samples": 32,
            "seq_len": 32,
            "seed": 0,
            "per_channel": False,
            "op_types": ["MatMul", "Gemm"],
            "activation_type": "QUInt8",
            "weight_type": "QInt8",
        },
    },
    "compile": {
        "rule": "cpu_ort/compile.py",
        "inputs": ["quantize"],
        "outputs": ["model.opt.onnx"],
        "params": {"optimization_level": "extended"},
    },
    "verify": {
        "rule": "cpu_ort/verify.py",
        "inputs": ["fetch", "compile"],
        "outputs": ["report.json"],
        "params": {
            "prompts": [
                "Once upon a time there was a tiny mouse",
                "The children played",
                "Sam had a blue kite",
            ],
            "max_new_tokens": 16,
            "min_token_agreement": 0.5,
            "gate": "teacher_forced",
            "min_teacher_forced": 0.9,
            "min_logit_cosine": 0.99,
            "near_tie": 0.5,
        },
    },
}
SHARED = ("fetch", "export")  # made once a session (the engine fixture)
FILE_PARAMS = {"fetch": {"corpus": CORPUS}, "quantize": {"calibration": CALIBRATION}}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    out: Path


class Engine:
    """Just enough of the engine's contract to drive rules from a test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.build = root / "build" / MODEL
        self.runs = 0
        self.first_runs: dict[str, Run] = {}
        self.made_in = [root]  # the folders its outputs were made in

    def run(self, stage: str, params: dict[str, Any] | None = None) -> Run:
        spec = STAGES[stage]
        self.runs += 1
        scratch = self.root / f"scratch-{self.runs:02d}-{stage}"
        scratch.mkdir(parents=True)
        action = {
            "format": 1,
            "model": MODEL,
            "stage": stage,
            "target": "cpu-ort",
            "params": {**spec["params"], **(params or {})},
            "source": SOURCE,
            "inputs": {name: str(self.build / name) for name in spec["inputs"]},
            "files": {k: str(REPO / v) for k, v in FILE_PARAMS.get(stage, {}).items()},
            "out": str(scratch / "out"),
            "outputs": spec["outputs"],
        }
        action_path = scratch / "action.json"
        action_path.write_text(json.dumps(action, sort_keys=True))
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "rules"),
            "PYTHONHASHSEED": "0",
            "OMP_NUM_THREADS": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
        proc = subprocess.run(
            [sys.executable, str(REPO / "rules" / spec["rule"]), str(action_path)],
            cwd=scratch,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr, scratch / "out")

    def promote(self, stage: str, run: Run) -> Path:
        """Accept a stage's out as its build folder, read-only like the engine's."""
        assert run.returncode == 0, f"{stage} failed:\n{run.stdout}\n{run.stderr}"
        dest = self.build / stage
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run.out), dest)
        set_writable(dest, False)
        return dest


def set_writable(folder: Path, writable: bool) -> None:
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        write = stat.S_IWUSR
        path.chmod(mode | write if writable else mode & ~(write | stat.S_IWGRP | stat.S_IWOTH))


# fetch and export are test_cpu_ort_methods.py's, made once a session: the same actions
# (model, source, parameters, files), and fetch trains the checkpoint. This file's own fetch
# and export run again below, each compared with those.
@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    eng = Engine(tmp_path_factory.mktemp("hefbuild"))
    shared = fetched_and_exported(tmp_path_factory, MODEL)
    copy_stages(shared, eng.build, SHARED)
    eng.made_in.append(shared)
    for stage in (s for s in STAGES if s not in SHARED):
        run = eng.run(stage)
        eng.first_runs[stage] = run
        eng.promote(stage, run)
    yield eng
    if eng.build.exists():
        for folder in eng.build.iterdir():
            set_writable(folder, True)


def test_every_declared_output_exists(engine: Engine) -> None:
    for stage, spec in STAGES.items():
        folder = engine.build / stage
        for name in spec["outputs"]:
            path = folder / name.rstrip("/")
            if name.endswith("/"):
                assert path.is_dir() and any(path.iterdir()), f"{stage}: {name} empty"
            else:
                assert path.is_file() and path.stat().st_size > 0, f"{stage}: {name} missing"


def test_checkpoint_loads_with_transformers(engine: Engine) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = engine.build / "fetch" / "checkpoint"
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    assert model.config.model_type == "llama"
    assert len(tok) == 384
    assert tok("The cat").input_ids[0] == tok.bos_token_id


def test_export_report_records_passing_gate(engine: Engine) -> None:
    report = json.loads((engine.build / "export" / "export_report.json").read_text())
    assert report["passed"] is True
    assert report["cosine_last"] >= EXPORT_PARAMS["cosine_min"]
    assert report["max_abs_diff_last"] < 1e-3


def test_verify_passes_with_real_agreement(engine: Engine) -> None:
    report = json.loads((engine.build / "verify" / "report.json").read_text())
    assert report["passed"] is True
    assert len(report["prompts"]) == 3
    for prompt in report["prompts"]:
        assert prompt["passed"], prompt
        assert len(prompt["candidate_ids"]) == 16
        assert not prompt["candidate_degenerate"]
        assert prompt["agreement"] >= report["min_token_agreement"]
        assert prompt["teacher_forced_agreement"] >= report["min_teacher_forced"]
        assert prompt["logit_cosine_mean"] >= report["min_logit_cosine"]
    assert report["method"] == "weight_only_int8"
    assert "prompts passed" in engine.first_runs["verify"].stdout


def test_outputs_contain_no_scratch_paths(engine: Engine) -> None:
    prefixes = [str(root).encode() for root in engine.made_in]
    assert len(prefixes) == 2  # this file's folder, the session's for fetch and export
    for path in engine.build.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(prefix in data for prefix in prefixes), path


def test_export_is_byte_identical_across_runs(engine: Engine) -> None:
    again = engine.run("export")
    assert again.returncode == 0, again.stderr
    assert sha256_tree(again.out) == sha256_tree(engine.build / "export")


def test_fetch_is_byte_identical_across_processes(engine: Engine) -> None:
    again = engine.run("fetch")
    assert again.returncode == 0, again.stderr
    assert sha256_tree(again.out) == sha256_tree(engine.build / "fetch")


def test_broken_export_gate_fails_with_one_line(engine: Engine) -> None:
    run = engine.run("export", {"cosine_min": 1.5})
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("export gate failed: cosine ")
    assert "< cosine_min 1.5" in last
    assert "Traceback" not in run.stderr
