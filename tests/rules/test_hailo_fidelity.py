"""rules/hailo/fidelity.py on the tiny hailo Llama, run as the engine runs rules: fetch,
export and reference for real (the session's doit build of them), parse/resources/optimize
with the DFC test double (its HAR is FAKE, but model_script.alls is rendered by our own
optimize, so fidelity reads a real script), then fidelity. Plus the pure helpers: the
script's precision lines, the HN mapping, the bits of each tensor.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hailo_chain import MODEL, hailo_chain

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "rules"))

from common import hailo_precision as hp  # noqa: E402
from common import qdq_emulation as qe  # noqa: E402
from common.action import Action  # noqa: E402
from common.hailo_calibration import calibration_rows  # noqa: E402
from common.hailo_fidelity_graphs import Feeder  # noqa: E402

from hefbuild.declare.specs import load_model  # noqa: E402
from hefbuild.declare.targets import stage_defs  # noqa: E402

np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")

DEFS = stage_defs(REPO, "hailo10h")
TOOLCHAINS = {p.stem for p in (REPO / "toolchain").glob("*.toml")}
DFC_STAGES = ("parse", "resources", "optimize")
RECIPE = REPO / "rules" / "hailo" / "recipes" / "optimize.alls"
PROJECTIONS = 15  # 7 per layer, 2 layers, one lm_head shard


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    out: Path

    @property
    def last_line(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else ""

    def report(self) -> dict[str, Any]:
        return json.loads((self.out / "fidelity.json").read_text())


class Chain:
    """Each stage's outputs in <root>/<stage>/out, as the engine mounts upstream folders."""

    def __init__(self, root: Path) -> None:
        self.root, self.runs = root, 0
        self.spec = load_model(REPO / "tests" / "hailo_models" / f"{MODEL}.toml", REPO,
                               TOOLCHAINS)
        self.dirs: dict[str, Path] = {}

    def params(self, stage: str, extra: dict[str, Any] | None) -> dict[str, Any]:
        defaults = {k: p.default for k, p in DEFS[stage].params.items()
                    if p.type.name != "FILE"}
        return {**defaults, **self.spec.stages.get(stage, {}), **(extra or {})}

    def files(self, stage: str, extra: dict[str, Path] | None) -> dict[str, str]:
        if stage == "fetch":
            return {"corpus": str(REPO / self.spec.source.synthetic["corpus"])}
        found = {k: str(REPO / p.default) for k, p in DEFS[stage].params.items()
                 if p.type.name == "FILE" and p.when is None}
        return {**found, **{k: str(v) for k, v in (extra or {}).items()}}

    def run(self, stage: str, params: dict[str, Any] | None = None,
            files: dict[str, Path] | None = None, inputs: dict[str, Path] | None = None,
            keep: bool = False) -> Run:
        self.runs += 1
        scratch = self.root / f"{self.runs:02d}-{stage}"
        (scratch / "work").mkdir(parents=True)
        action = {
            "format": 1, "model": MODEL, "stage": stage, "target": "hailo10h",
            "params": self.params(stage, params),
            "source": {"synthetic": dict(self.spec.source.synthetic)} if stage == "fetch"
            else {},
            "inputs": {u: str((inputs or {}).get(u, self.dirs.get(u))) for u in
                       DEFS[stage].inputs},
            "files": self.files(stage, files), "out": str(scratch / "out"),
            "outputs": list(DEFS[stage].outputs),
        }
        (scratch / "action.json").write_text(json.dumps(action))
        paths = [str(REPO / "rules")]
        if stage in DFC_STAGES:
            paths.append(str(REPO / "tests" / "fakes"))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root),
               "PYTHONPATH": os.pathsep.join(paths), "PYTHONHASHSEED": "0",
               "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "HF_HUB_OFFLINE": "1", "NPY_PROMOTION_STATE": "legacy",
               "CUDA_VISIBLE_DEVICES": "0" if stage in DFC_STAGES else "",
               "FAKE_DFC_CALLS": str(scratch / "calls.jsonl")}
        done = subprocess.run([sys.executable, str(REPO / "rules" / DEFS[stage].rule),
                               str(scratch / "action.json")], cwd=scratch / "work", env=env,
                              capture_output=True, text=True, timeout=600)
        run = Run(done.returncode, done.stdout, done.stderr, scratch / "out")
        if keep:
            assert run.code == 0, f"{stage} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            self.dirs[stage] = run.out
        return run

    def optimize(self, recipe: str, name: str) -> Path:
        path = self.root / f"{name}.alls"
        path.write_text(recipe)
        run = self.run("optimize", files={"recipe": path})
        assert run.code == 0, run.stdout[-2000:] + run.stderr[-2000:]
        return run.out

    def fidelity(self, optimize: Path | None = None, **params: Any) -> Run:
        return self.run("fidelity", params, inputs={"optimize": optimize or self.dirs["optimize"]})


def without_proposal(run: Run) -> dict[str, Any]:
    """The report but its proposal, whose target a gate sets."""
    return {k: v for k, v in run.report().items() if k != "proposal"}


def recipe_with(projection_mode: str, embeddings_mode: str = "a16_w16") -> str:
    text = RECIPE.read_text()
    text = text.replace("precision_mode=a8_w4", f"precision_mode={projection_mode}")
    return text.replace("[{embeddings_layer}], precision_mode=a16_w16",
                        f"[{{embeddings_layer}}], precision_mode={embeddings_mode}")


# The fetch (a trained checkpoint), export and torch reference are the session's build of
# the model (tests/hailo_chain.py, read only); the (FAKE) DFC stages that the fidelity rule
# reads run here, once per file, as the tests read their calls.
@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    chain = Chain(tmp_path_factory.mktemp("fidelity"))
    built = hailo_chain(tmp_path_factory) / "project" / "build" / MODEL
    chain.dirs.update({stage: built / stage for stage in ("fetch", "export", "reference")})
    for stage in DFC_STAGES:
        chain.run(stage, keep=True)
    return chain


@pytest.fixture(scope="module")
def default(chain: Chain) -> Run:
    run = chain.fidelity()
    assert run.code == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


# -- the rule on the tiny model ------------------------------------------------------------

def test_report_says_first_that_it_is_a_cpu_emulation(default: Run) -> None:
    report = default.report()
    assert list(report)[:2] == ["kind", "note"]
    assert report["kind"] == "cpu-emulation"
    assert "not the Hailo-10H's numerics" in report["note"]
    assert "ONNX Runtime QDQ" in report["note"]


def test_figures_are_in_their_ranges(chain: Chain, default: Run) -> None:
    report = default.report()
    rows = report["prompts"]
    reference = json.loads((chain.dirs["reference"] / "reference.json").read_text())
    assert [r["prompt"] for r in rows] == [p["prompt"] for p in reference["prompts"]]
    for r in rows:
        assert r["positions"] == len(next(p for p in reference["prompts"]
                                          if p["prompt"] == r["prompt"])["token_ids"])
        tf, fr = r["teacher_forced"], r["free_running"]
        assert 0.0 <= tf["agreement"] <= 1.0 and 0.0 <= fr["agreement"] <= 1.0
        assert -1.0 <= tf["min_cosine"] <= tf["mean_cosine"] <= 1.0
        assert -1.0 <= r["prefill_cosine"] <= 1.0
        assert 0.0 <= r["float_graph_agreement"] <= 1.0
        assert isinstance(fr["degenerate"], bool)
        if fr["first_divergence"] is not None:
            assert fr["float_margin"] >= 0.0
        assert len(r["emulated_ids"]) <= r["positions"]
    summary = report["summary"]
    assert summary["prompts_evaluated"] == len(rows)
    assert summary["worst_teacher_forced"] == min(r["teacher_forced"]["agreement"] for r in rows)


def test_the_recipe_precisions_reach_the_qdq_graph(default: Run) -> None:
    report = default.report()
    precisions = report["precisions"]
    assert precisions["mapping"] == "original_names"
    assert precisions["input_bits"]["inputs_embeds"] == 16  # the a16_w16 embeddings line
    assert precisions["input_bits"]["attention_mask"] == 8  # unnamed: the a8_w8 default
    assert precisions["matmuls"]["a8_w4"] == PROJECTIONS
    assert precisions["by_kind"]["q_proj"] == {"a8_w4": 2}
    assert precisions["by_kind"]["lm_head"] == {"a8_w4": 1}
    assert set(precisions["by_kind"]["other"]) == {"a8_w8"}  # RoPE/repeat helpers, scores
    assert precisions["unmatched"] == precisions["unmapped"] == precisions["unsupported"] == []
    assert report["quantized"]["weights"]["int4"] == PROJECTIONS
    assert "uint16" not in report["quantized"]["activations"]


def test_a16_w16_gives_a_closer_model_than_a8_w4(chain: Chain, default: Run) -> None:
    gentle = chain.fidelity(chain.optimize(recipe_with("a16_w16"), "gentle"))
    harsh = chain.fidelity(chain.optimize(recipe_with("a8_w4", "a8_w8"), "harsh"))
    assert gentle.code == 0 and harsh.code == 0, gentle.stderr + harsh.stderr
    soft, hard = gentle.report(), harsh.report()
    assert soft["quantized"]["weights"]["int16"] == PROJECTIONS
    assert soft["quantized"]["activations"]["uint16"] >= PROJECTIONS
    assert hard["precisions"]["input_bits"]["inputs_embeds"] == 8
    for figure in ("mean_logit_cosine", "worst_prefill_cosine"):
        assert soft["summary"][figure] > hard["summary"][figure], figure
    assert soft["summary"]["mean_logit_cosine"] > 0.999  # 16 bits: nearly the float model
    print(f"a16_w16: {soft['summary']}\na8_w4: {hard['summary']}")


def test_a_gate_that_is_not_met_fails_in_one_line_after_writing_the_report(
        chain: Chain, default: Run) -> None:
    run = chain.fidelity(min_teacher_forced=1.01)
    assert run.code == 1
    worst = min(default.report()["prompts"], key=lambda r: r["teacher_forced"]["agreement"])
    assert re.fullmatch(
        r"fidelity \(CPU emulation, not the chip\): teacher-forced agreement [0-9.]+ < "
        rf"min_teacher_forced 1\.01 on prompt {re.escape(repr(worst['prompt']))}; the full "
        r"report is printed in the log", run.last_line), run.last_line
    assert without_proposal(run) == without_proposal(default)  # the gate moves its target only
    assert '"kind": "cpu-emulation"' in run.stdout  # the log holds the report too
    achieved = default.report()["summary"]["worst_prefill_cosine"]
    cosine = chain.fidelity(min_prefill_cosine=min(1.0, achieved + 1e-4))
    assert cosine.code == 1 and "prefill cosine" in cosine.last_line
    assert "min_prefill_cosine" in cosine.last_line


def test_a_gate_that_is_met_passes_and_leaves_the_same_bytes(chain: Chain, default: Run) -> None:
    summary = default.report()["summary"]
    run = chain.fidelity(min_teacher_forced=summary["worst_teacher_forced"],
                         min_prefill_cosine=summary["worst_prefill_cosine"])
    assert run.code == 0, run.stderr
    assert without_proposal(run) == without_proposal(default)
    assert run.report()["proposal"]["target_worst_teacher_forced"] == \
        summary["worst_teacher_forced"]


def test_two_runs_write_the_same_bytes(chain: Chain, default: Run) -> None:
    again = chain.fidelity()
    assert again.code == 0
    first = hashlib.sha256((default.out / "fidelity.json").read_bytes()).hexdigest()
    assert hashlib.sha256((again.out / "fidelity.json").read_bytes()).hexdigest() == first
    assert str(chain.root) not in (again.out / "fidelity.json").read_text()


def test_calibration_rows_are_optimizes(chain: Chain) -> None:
    """The embeddings fidelity calibrates on are, byte for byte, those optimize gave the DFC."""
    calls = [json.loads(ln) for ln in (chain.dirs["optimize"].parent / "calls.jsonl")
             .read_text().splitlines()]
    given = next(c for c in calls if c["call"] == "optimize")["args"][0]["model/input_layer1"]
    config = json.loads((chain.dirs["export"] / "run_config.json").read_text())
    action = Action(MODEL, "fidelity", "hailo10h", chain.params("fidelity", None), {},
                    {"export": chain.dirs["export"]},
                    {"calibration": REPO / DEFS["fidelity"].params["calibration"].default},
                    chain.root / "unused")
    with np.load(chain.dirs["export"] / "hf_reference.npz") as ref:
        feeder = Feeder(config, ref["embedding_table"])
    embeds = np.stack([feeder.feeds(r)["inputs_embeds"] for r in calibration_rows(action, config)])
    embeds = np.ascontiguousarray(embeds, dtype=np.float32).reshape(given["ndarray"]["shape"])
    assert hashlib.sha256(embeds.tobytes()).hexdigest() == given["ndarray"]["sha256"]


def test_a_calibration_size_unlike_the_scripts_is_reported_or_fails_a_gate(chain: Chain) -> None:
    report_only = chain.fidelity(calibration_size=8)
    assert report_only.code == 0
    assert report_only.report()["calibration"]["matches_model_script"] is False
    assert "WARNING: fidelity: calibration_size 8 != the model script's calibset_size 32" \
        in report_only.stdout
    gated = chain.fidelity(calibration_size=8, min_teacher_forced=0.1)
    assert gated.code == 1 and "calibset_size 32" in gated.last_line


# -- the pure helpers ----------------------------------------------------------------------

SCRIPT = """\
model_optimization_flavor(optimization_level=0, compression_level=4)
quantization_param([m/input_layer1], precision_mode=a16_w16)
quantization_param([m/conv1, m/conv2], precision_mode=a8_w4)
quantization_param({conv*}, precision_mode=a16_w16, bias_mode=double)
quantization_param(m/conv2, precision_mode=a8_w4)
quantization_param([m/conv9], precision_mode=a8_w4)
quantization_param([m/conv1], precision_mode=a4_w4)
quantization_param([m/conv1], output_encoding=x)
"""
HN = {"layers": {
    "m/input_layer1": {"type": "input_layer", "original_names": ["x"]},
    "m/conv1": {"type": "conv", "original_names": ["/q/MatMul"]},
    "m/conv2": {"type": "conv", "original_names": ["/k/MatMul", "/k/Add"]},
    "m/norm1": {"type": "normalization", "original_names": ["/norm/Mul"]},
    "m__prefill/conv1": {"type": "conv", "original_names": ["/q/MatMul"]},
}}


def test_precision_lines_are_read_in_order_later_lines_winning() -> None:
    lines = hp.parse(SCRIPT)
    assert [ln.targets for ln in lines] == [("m/input_layer1",), ("m/conv1", "m/conv2"),
                                           ("conv*",), ("m/conv2",), ("m/conv9",), ("m/conv1",)]
    assert lines[2].glob and not lines[1].glob
    assert lines[5].precision is None  # a4 is no activation width of the DFC
    resolved = hp.resolve(lines, hp.base_layers(HN, "m"), "m")
    assert {k: p.name for k, p in resolved.layers.items()} == {
        "m/input_layer1": "a16_w16", "m/conv1": "a16_w16", "m/conv2": "a8_w4"}
    assert resolved.unmatched == ["m/conv9"]
    assert resolved.unsupported == ["quantization_param([m/conv1], precision_mode=a4_w4)"]


def test_layers_map_by_original_names_else_by_order() -> None:
    layers = hp.base_layers(HN, "m")
    assert "m__prefill/conv1" not in layers
    mapping, how = hp.onnx_names(layers, ["/q/MatMul", "/k/MatMul"], ["x"])
    assert how == "original_names" and mapping["m/conv2"] == ["/k/MatMul", "/k/Add"]
    bare = {n: {"type": v["type"]} for n, v in layers.items()}
    mapping, how = hp.onnx_names(bare, ["/q/MatMul", "/k/MatMul"], ["x"])
    assert how == "order"
    assert mapping == {"m/conv1": ["/q/MatMul"], "m/conv2": ["/k/MatMul"],
                       "m/input_layer1": ["x"]}
    assert hp.onnx_names(bare, ["/q/MatMul"], ["x"]) == ({}, "none")
    only_prefill = {"layers": {"m__prefill/conv1": HN["layers"]["m__prefill/conv1"]}}
    assert list(hp.base_layers(only_prefill, "m")) == ["m/conv1"]


def tiny_graph() -> Any:
    """x -> Mul (a norm) -> MatMul q (W) -> MatMul r (R, shared) ; q also -> MatMul k (R)."""
    h = onnx.helper
    f32 = onnx.TensorProto.FLOAT
    w = onnx.numpy_helper.from_array(np.ones((4, 4), np.float32), "W")
    r = onnx.numpy_helper.from_array(np.eye(4, dtype=np.float32), "R")
    nodes = [h.make_node("Mul", ["x", "x"], ["n"], name="/norm/Mul"),
             h.make_node("MatMul", ["n", "W"], ["q"], name="/q/MatMul"),
             h.make_node("MatMul", ["q", "R"], ["r"], name="/r/MatMul"),
             h.make_node("MatMul", ["q", "R"], ["k"], name="/k/MatMul")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", f32, [1, 4])],
                         [h.make_tensor_value_info("r", f32, [1, 4]),
                          h.make_tensor_value_info("k", f32, [1, 4])], [w, r])
    return h.make_model(graph)


def test_a_tensor_has_the_bits_of_the_layer_that_writes_it() -> None:
    graph = qe.matmuls(tiny_graph())
    assert graph.constant == ["/q/MatMul", "/r/MatMul", "/k/MatMul"]
    precision = {"/q/MatMul": hp.Precision(16, 16), "/k/MatMul": hp.Precision(8, 4)}
    acts, weights = qe.tensor_bits(graph, precision, {"x": 16})
    assert acts == {"n": 8, "q": 16, "r": 8, "k": 8}  # the norm writes at the default a8
    assert weights == {"W": 16, "R": 4}  # R is shared: the fewest bits any reader asks for
    norm16 = qe.tensor_bits(graph, {**precision, "/norm/Mul": hp.Precision(16, 16)}, {})[0]
    assert norm16["n"] == 16
    # the norm mapped to no layer: its output is the input of the layers reading it (q: a16)
    mapped = {"/q/MatMul", "/r/MatMul", "/k/MatMul"}
    assert qe.tensor_bits(graph, precision, {"x": 16}, mapped)[0]["n"] == 16
    assert qe.tensor_bits(graph, precision, {"x": 16}, mapped - {"/q/MatMul"})[0] == {
        "n": 8, "q": 8, "r": 8, "k": 8}  # a writer no layer maps to, read by none mapped


def test_input_quantization_is_q_then_dq_over_the_calibrated_range() -> None:
    quant = qe.Quant.of(8, -1.0, 1.0)
    x = np.linspace(-1, 1, 11, dtype=np.float32)
    y = quant.apply(x)
    assert y.dtype == np.float32 and np.max(np.abs(y - x)) <= quant.scale / 2 + 1e-7
    assert quant.apply(np.zeros(3, np.float32)).tolist() == [0.0, 0.0, 0.0]  # zero is exact
    mask = qe.Quant.of(8, -1.0e4, 0.0)
    assert mask.apply(np.array([-1.0e4, 0.0], np.float32)).tolist() == [-1.0e4, 0.0]
    assert np.max(np.abs(qe.Quant.of(16, -1.0, 1.0).apply(x) - x)) < 2e-5


def test_fidelity_is_declared_between_optimize_and_compile() -> None:
    fidelity, compile_ = DEFS["fidelity"], DEFS["compile"]
    assert fidelity.inputs == ("export", "optimize", "reference")
    assert fidelity.toolchain == "host" and fidelity.outputs == ("fidelity.json",)
    assert compile_.after == ("fidelity",) and "fidelity" not in compile_.inputs
    assert fidelity.params["min_teacher_forced"].default == 0.0
    assert fidelity.params["min_prefill_cosine"].default == -1.0
    for name in ("calibration", "calibration_size", "calibration_seed"):
        assert fidelity.params[name].default == DEFS["optimize"].params[name].default
        assert fidelity.params[name].inherit == "optimize"  # optimize's rows unless told


# -- what to change: the sensitivity table and the proposed recipe lines --------------------

SENSITIVE_LAYER = 1
# At w4 (7 steps) a row 30x larger than the rest rounds the rest of its column to zero; at w8
# (127 steps) they keep about two bits, so the proposal's first promotion can help.
OUTLIER = 30.0
ROWS = (3, 17, 40)


def editable_copy(folder: Path, dest: Path) -> None:
    """`folder` (a stage's build folder: read-only files, store objects) as files of our own
    at `dest`, to edit (copying modes too, a normal user could not write to them)."""
    shutil.copytree(folder, dest, copy_function=shutil.copyfile)


def sensitive_export(chain: Chain) -> Path:
    """export's folder with layer 1 made sensitive to weight rounding, the float function
    unchanged: a few input rows k of down_proj times OUTLIER and up_proj's output columns k
    divided by it (down_proj reads act(gate) * up). Per output channel those rows then set
    the scale of every column, so the other rows lose their bits."""
    dest = chain.root / "export-sensitive"
    if dest.exists():
        return dest
    editable_copy(chain.dirs["export"], dest)
    config = json.loads((dest / "run_config.json").read_text())
    model = onnx.load(str(dest / "model.onnx"))
    nodes = {n.name: n for n in model.graph.node}
    inits = {i.name: i for i in model.graph.initializer}
    for reader, writer in (("down_proj", "up_proj"),):
        read = inits[nodes[config["layer_names"][reader][SENSITIVE_LAYER]].input[1]]
        write = inits[nodes[config["layer_names"][writer][SENSITIVE_LAYER]].input[1]]
        r = onnx.numpy_helper.to_array(read).copy()
        w = onnx.numpy_helper.to_array(write).copy()
        rows = [k for k in ROWS if k < min(r.shape[0], w.shape[1])]
        r[rows, :] *= OUTLIER
        w[:, rows] /= OUTLIER
        read.CopyFrom(onnx.numpy_helper.from_array(r, read.name))
        write.CopyFrom(onnx.numpy_helper.from_array(w, write.name))
    onnx.save(model, str(dest / "model.onnx"))
    return dest


def test_every_layer_group_has_its_cost_costliest_first(default: Run) -> None:
    sens = default.report()["sensitivity"]
    rows = sens["groups"]
    assert sens["rows"] == 4 and "activations alone" in sens["measures"]
    assert sorted((g["group"], g["kind"]) for g in rows) == [
        (g, k) for g in ("layer 0", "layer 1", "lm_head") for k in ("activations", "weights")]
    assert [g["cosine_loss"] for g in rows] == sorted((g["cosine_loss"] for g in rows),
                                                      reverse=True)
    for g in rows:
        # the default recipe: a8_w4 projections, each writing its output at a8
        assert g["bits"] == ("w4" if g["kind"] == "weights" else "a8")
        assert -1.0 <= g["logit_cosine"] <= 1.0 and 0.0 <= g["top1_agreement"] <= 1.0
        if g["kind"] == "weights":
            assert g["tensors"] == (1 if g["group"] == "lm_head" else 7)
    acts = {g["group"]: g["tensors"] for g in rows if g["kind"] == "activations"}
    # the fake HN maps only the MatMuls with a weight: what a layer's seven projections write;
    # the norms' outputs, the MLP's product and the attention's output they read (no layer
    # holds those ops: they are taken as the reading MatMul's input); what the four RoPE and
    # key/value-repeat MatMuls of its scope write, and the rotated key one of them reads
    assert acts["layer 0"] == acts["layer 1"] == 7 + 4 + 4 + 1
    # the attention's own MatMuls (no weight: no layer) read and write at a8 whatever a line
    assert sens["activations_no_line_reaches"] > 0


def test_a_layer_made_sensitive_is_found_and_the_proposal_fixes_it(chain: Chain,
                                                                     default: Run) -> None:
    name = f"layer {SENSITIVE_LAYER}"
    plain = [g for g in default.report()["sensitivity"]["groups"] if g["kind"] == "weights"]
    assert plain[0]["group"] != name  # not the costliest as trained
    export = sensitive_export(chain)
    base = chain.run("fidelity", {"proposal_target": 0.0}, inputs={"export": export})
    assert base.code == 0, base.stderr[-3000:]
    costs = [g for g in base.report()["sensitivity"]["groups"] if g["kind"] == "weights"]
    print(f"\nweight sensitivity as built: {plain}\nwith {name} made sensitive: {costs}")
    assert costs[0]["group"] == name, costs
    loss = {c["group"]: c["cosine_loss"] for c in plain}
    assert costs[0]["cosine_loss"] > 3 * loss[name]
    assert {c["group"]: c["cosine_loss"] for c in costs[1:]} == {  # the others: unchanged
        g: v for g, v in loss.items() if g != name}
    assert base.report()["proposal"]["needed"] is False  # a target of 0 is met

    before = base.report()["summary"]
    run = weight_proposal(chain, export, before)
    proposal = run.report()["proposal"]
    print(f"before: {before}\nproposal: {json.dumps(proposal, indent=1)[:3000]}")
    assert proposal["needed"] and proposal["all_a16_reaches"] and proposal["reached"]
    first = proposal["trials"][1]  # after the all-a16 trial: the costliest row alone
    assert first["promoted"] == [f"{name} weights"]
    assert len(first["lines"]) == 1 and first["lines"][0].endswith("precision_mode=a8_w8)")
    assert first["lines"][0].count("model/conv") == 7  # the layer's seven projections
    assert first["summary"]["mean_logit_cosine"] > before["mean_logit_cosine"]  # it helps
    assert "append to the recipe:" in run.stdout
    assert all(line in run.stdout for line in proposal["proposed"]["lines"])


def weight_proposal(chain: Chain, export: Path, before: dict[str, Any]) -> Run:
    """fidelity asked for a little more than the recipe gives on the weight-sensitive export
    (the tiny model's teacher-forced figures move in steps of 1/16)."""
    run = chain.run("fidelity", {"proposal_target": before["worst_teacher_forced"] + 1e-6},
                    inputs={"export": export})
    assert run.code == 0, run.stderr[-3000:]
    return run


# The lm_head's output (the logits) made sensitive to 8-bit activations: one token's logit far
# below the rest stretches the per-tensor range, so the other logits share a few steps.
LOGIT_STRETCH = 40.0


def float_logits(chain: Chain, export: Path, contexts: list[list[int]]) -> Any:
    import onnxruntime as ort

    config = json.loads((export / "run_config.json").read_text())
    with np.load(export / "hf_reference.npz") as ref:
        feeder = Feeder(config, ref["embedding_table"])
    session = ort.InferenceSession(str(export / "model.onnx"), providers=["CPUExecutionProvider"])
    outputs = list(config["output_names"])
    return np.stack([np.concatenate([o.ravel() for o in session.run(outputs, feeder.feeds(c))])
                     for c in contexts])


def activation_sensitive_export(chain: Chain) -> tuple[Path, int]:
    """export's folder with the lm_head's weight column of one token t replaced by a multiple
    of (t's column - s's column), for the pair whose logits l_s > l_t on every calibration row
    and reference context by the widest margin: t's logit ends far below every other on
    those, so no top-1 changes. Its column has its own weight scale (per output channel):
    the weights are as easy as before."""
    dest = chain.root / "export-activation-sensitive"
    config = json.loads((chain.dirs["export"] / "run_config.json").read_text())
    action = Action(MODEL, "fidelity", "hailo10h", chain.params("fidelity", None), {},
                    {"export": chain.dirs["export"]},
                    {"calibration": REPO / DEFS["fidelity"].params["calibration"].default},
                    chain.root / "unused")
    reference = json.loads((chain.dirs["reference"] / "reference.json").read_text())
    contexts = calibration_rows(action, config) + [
        p["prompt_ids"] + p["token_ids"][:i] for p in reference["prompts"]
        for i in range(len(p["token_ids"]))]
    logits = float_logits(chain, chain.dirs["export"], contexts)
    # token t and another, s, whose logit is above t's by the widest margin on every context
    margins = (logits[:, :, None] - logits[:, None, :]).min(axis=0)  # [s, t]
    np.fill_diagonal(margins, -np.inf)
    above, token = (int(i) for i in np.unravel_index(np.argmax(margins), margins.shape))
    margin, spread = float(margins[above, token]), float(np.ptp(logits, axis=1).max())
    assert margin > 0.0
    if not dest.exists():
        editable_copy(chain.dirs["export"], dest)
        model = onnx.load(str(dest / "model.onnx"))
        nodes = {n.name: n for n in model.graph.node}
        head = nodes[config["layer_names"]["lm_head"][0]]
        init = next(i for i in model.graph.initializer if i.name == head.input[1])
        w = onnx.numpy_helper.to_array(init).copy()
        # t's logit becomes (l_t - l_s) times a factor: below -LOGIT_STRETCH x the spread
        w[:, token] = (w[:, token] - w[:, above]) * (LOGIT_STRETCH * spread / margin)
        init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
        onnx.save(model, str(dest / "model.onnx"))
    return dest, token


def test_activations_made_sensitive_are_found_and_a16_is_proposed_for_them(
        chain: Chain, default: Run) -> None:
    export, _ = activation_sensitive_export(chain)
    plain = {(g["group"], g["kind"]): g for g in default.report()["sensitivity"]["groups"]}
    base = chain.run("fidelity", {"proposal_target": 0.0}, inputs={"export": export})
    assert base.code == 0, base.stderr[-3000:]
    costs = base.report()["sensitivity"]["groups"]
    print(f"\nsensitivity as built: {list(plain.values())}\nlogits stretched: {costs}")
    assert (costs[0]["group"], costs[0]["kind"]) == ("lm_head", "activations"), costs
    assert costs[0]["cosine_loss"] > 3 * plain[("lm_head", "activations")]["cosine_loss"]
    weights = next(c for c in costs if (c["group"], c["kind"]) == ("lm_head", "weights"))
    assert weights["cosine_loss"] < costs[0]["cosine_loss"] / 3  # the weights are not it

    target = default.report()["summary"]["worst_teacher_forced"]
    assert base.report()["summary"]["worst_teacher_forced"] < target
    run = chain.run("fidelity", {"proposal_target": target}, inputs={"export": export})
    assert run.code == 0, run.stderr[-3000:]
    proposal = run.report()["proposal"]
    print(f"proposal: {json.dumps(proposal, indent=1)[:3000]}")
    assert proposal["reached"] and proposal["proposed"]["promoted"] == ["lm_head activations"]
    head_layer = re.fullmatch(r"quantization_param\(\[(model/conv\d+)\], "
                              r"precision_mode=a16_w16\)", proposal["proposed"]["lines"][0])
    assert head_layer and len(proposal["proposed"]["lines"]) == 1, proposal["proposed"]
    pasted = pasted_run(chain, export, proposal["proposed"]["lines"], "pasted-a16")
    assert pasted.report()["summary"] == proposal["proposed"]["summary"]
    assert pasted.report()["precisions"]["by_kind"]["lm_head"] == {"a16_w16": 1}


def pasted_run(chain: Chain, export: Path, lines: list[str], name: str) -> Run:
    """optimize with `lines` appended to the recipe, then fidelity on its script."""
    recipe = RECIPE.read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n"
    optimized = chain.optimize(recipe, name)
    assert lines[0] in (optimized / "model_script.alls").read_text()
    again = chain.run("fidelity", {"proposal_target": 0.0},
                      inputs={"export": export, "optimize": optimized})
    assert again.code == 0, again.stderr[-3000:]
    return again


def test_the_proposed_lines_pasted_into_the_recipe_give_the_proposals_figures(
        chain: Chain) -> None:
    """What the proposal says of its lines is what optimize + fidelity say of the recipe
    with them pasted in: the lines parse back to the same precisions."""
    export = sensitive_export(chain)
    base = chain.run("fidelity", {"proposal_target": 0.0}, inputs={"export": export})
    proposed = weight_proposal(chain, export, base.report()["summary"]).report()["proposal"][
        "proposed"]
    again = pasted_run(chain, export, proposed["lines"], "pasted")
    assert again.report()["summary"] == proposed["summary"]


def test_promotions_lines_and_the_search() -> None:
    from common.hailo_fidelity_proposal import lines_for, promoted, search, targets
    from common.hailo_fidelity_sensitivity import Reach

    assert promoted(hp.Precision(8, 4)) == hp.Precision(8, 8)  # 8 instead of 4
    assert promoted(hp.Precision(8, 8)) == hp.Precision(16, 16)  # keep at 16 bit
    assert promoted(hp.Precision(16, 16)) is None
    mapping = {"model/conv12": ["a"], "model/conv3": ["b"], "model/conv9": ["c"],
               "model/norm1": ["n"]}
    precision = {"a": hp.Precision(8, 4), "b": hp.Precision(8, 4)}  # c: the a8_w8 default
    reaches = {"layer 0": Reach(("model/conv3", "model/conv9", "model/conv12"),
                                ("model/conv3", "model/conv9", "model/conv12", "model/norm1"),
                                ("t",))}
    weights = targets([{"group": "layer 0", "kind": "weights"}], reaches, precision, mapping)
    lines = lines_for(weights)
    assert lines == ["quantization_param([model/conv9], precision_mode=a16_w16)",
                     "quantization_param([model/conv3, model/conv12], precision_mode=a8_w8)"]
    parsed = hp.parse("\n".join(lines))  # the lines read back as the script reader reads them
    assert [(ln.targets, ln.precision) for ln in parsed] == [
        (("model/conv9",), hp.Precision(16, 16)),
        (("model/conv3", "model/conv12"), hp.Precision(8, 8))]
    both = targets([{"group": "layer 0", "kind": "weights"},
                    {"group": "layer 0", "kind": "activations"}], reaches, precision, mapping)
    assert lines_for(both) == ["quantization_param([model/conv3, model/conv9, model/conv12, "
                               "model/norm1], precision_mode=a16_w16)"]

    def tried(n: int, trials: int, smallest: int | None) -> list[int]:
        """The search's prefix sizes when `smallest` rows reach (None: even all-a16 misses)."""
        return search(n, trials, lambda k: smallest is not None and (k == 0 or k >= smallest))

    assert tried(10, 4, None) == [0]  # all-a16 misses: nothing smaller can reach
    assert tried(10, 4, 1) == [0, 1]
    assert tried(10, 6, 3) == [0, 1, 2, 4, 3]  # doubling to a hit, then halving the gap
    assert tried(10, 3, 7) == [0, 1, 2]  # out of trials: the all-a16 lines stand
    assert tried(10, 9, 10) == [0, 1, 2, 4, 8, 10, 9]
    assert tried(10, 9, 11) == [0, 1, 2, 4, 8, 10]  # only all-a16 reaches
    assert tried(0, 3, 1) == [] and tried(5, 0, 1) == []
