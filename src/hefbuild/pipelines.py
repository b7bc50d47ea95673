"""The stage chains of each target platform, as data.

A stage names its rule program (under `rules/`), the upstream stages whose outputs it
reads, the outputs it must leave (a trailing `/` is a non-empty folder), the parameters
it accepts with their defaults, and the toolchain it runs in unless the model says
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .params import ParamDef
from .params import ParamType as T


@dataclass(frozen=True)
class StageDef:
    name: str
    rule: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: dict[str, ParamDef] = field(default_factory=dict)
    toolchain: str = "host"
    gpu: bool = False  # wants a GPU (optimize); a model may say otherwise
    # Stages that must succeed before this one runs, whose outputs it does not read: an
    # order (and a gate), not an input, so they are neither in its key nor mounted.
    after: tuple[str, ...] = ()


# Keys every [stages.<stage>] table accepts besides the stage's own parameters: where it
# runs and under which limits. `timeout` and `memory` never enter a key (they decide
# whether a stage finishes, not what it makes); `gpu` does (a CPU-only optimize differs).
COMMON_STAGE_KEYS = {
    "toolchain": ParamDef(T.STR),
    "timeout": ParamDef(T.DURATION),
    "memory": ParamDef(T.SIZE),
    "gpu": ParamDef(T.BOOL),
}

_FETCH = StageDef("fetch", "fetch.py", (), ("checkpoint/",))

# A chat model gets its prompts in its own chat template; set for every stage that formats a
# prompt by `[model] chat = true` (rules/common/prompting.py).
_CHAT = ParamDef(T.BOOL, False)

_VERIFY_PARAMS = {
    "prompts": ParamDef(T.STR_LIST, ["Once upon a time", "The children played"], minimum=1),
    "max_new_tokens": ParamDef(T.INT, 16, minimum=1),
    "min_token_agreement": ParamDef(T.FLOAT, 0.5, minimum=0.0, maximum=1.0),
}

CPU_ORT = (
    _FETCH,
    StageDef(
        "export", "cpu_ort/export.py", ("fetch",), ("model.onnx", "export_report.json"),
        {
            "opset": ParamDef(T.INT, 17, minimum=7),
            "reference_text": ParamDef(T.STR, "Once upon a time there was a little robot who"),
            "cosine_min": ParamDef(T.FLOAT, 0.9999, minimum=-1.0),
        },
    ),
    StageDef(
        "quantize", "cpu_ort/quantize.py", ("fetch", "export"), ("model.int8.onnx",),
        {
            # weight_only_*: MatMulNBits (block_size, symmetric); static_qdq: the rest.
            "method": ParamDef(T.STR, "weight_only_int8", choices=(
                "weight_only_int8", "weight_only_int4", "dynamic_int8", "static_qdq")),
            "block_size": ParamDef(T.INT, 32, choices=(16, 32, 64, 128, 256, 512, 1024)),
            "symmetric": ParamDef(T.BOOL, True),
            "exclude": ParamDef(T.STR_LIST, []),
            "calibration": ParamDef(T.FILE, "data/calibration/tiny-stories.txt"),
            "samples": ParamDef(T.INT, 32, minimum=1),
            "seq_len": ParamDef(T.INT, 32, minimum=1),
            "seed": ParamDef(T.INT, 0),
            "per_channel": ParamDef(T.BOOL, False),
            "op_types": ParamDef(T.STR_LIST, ["MatMul", "Gemm"]),
            "activation_type": ParamDef(T.STR, "QUInt8", choices=("QUInt8", "QInt8")),
            "weight_type": ParamDef(T.STR, "QInt8", choices=("QInt8", "QUInt8")),
        },
    ),
    StageDef(
        "compile", "cpu_ort/compile.py", ("quantize",), ("model.opt.onnx",),
        {"optimization_level": ParamDef(T.STR, "extended", choices=("basic", "extended", "all"))},
    ),
    StageDef("verify", "cpu_ort/verify.py", ("fetch", "compile"), ("report.json",), {
        **_VERIFY_PARAMS,
        # The gate: teacher-forced top-1 agreement and mean logit cosine along the float32
        # greedy continuation; "free_running" gates on min_token_agreement instead.
        "gate": ParamDef(T.STR, "teacher_forced", choices=("teacher_forced", "free_running")),
        "min_teacher_forced": ParamDef(T.FLOAT, 0.9, minimum=0.0, maximum=1.0),
        "min_logit_cosine": ParamDef(T.FLOAT, 0.99, minimum=-1.0, maximum=1.0),
        "near_tie": ParamDef(T.FLOAT, 0.5, minimum=0.0),
        "chat": _CHAT,
    }),
)

# Sizes that are known to work on the Hailo-10H (HAILO-PIPELINE.md).
_DFC = "hailo-dfc-5.3.0"
_RECIPES = "rules/hailo/recipes"
# optimize's calibration set; fidelity takes optimize's values unless its own table sets
# them, so the CPU emulation is calibrated on the same rows.
_CALIBRATION = {
    "calibration": ParamDef(T.FILE, "data/calibration/tiny-stories.txt"),
    "calibration_size": ParamDef(T.INT, 32, minimum=1),
    "calibration_seed": ParamDef(T.INT, 0),
}
_SAME_CALIBRATION = {k: replace(v, inherit="optimize") for k, v in _CALIBRATION.items()}

HAILO10H = (
    _FETCH,
    StageDef(
        "export", "hailo/export.py", ("fetch",),
        ("model.onnx", "hf_reference.npz", "tokenizer/", "run_config.json",
         "export_report.json"),
        {
            "seq_len": ParamDef(T.INT, 128, minimum=8),
            "prefill_size": ParamDef(T.INT, 32, minimum=1),
            "cache_size": ParamDef(T.INT, 128, minimum=8),
            "shard_vocab": ParamDef(T.INT, 32000, minimum=256),
            "scope": ParamDef(T.STR, "model"),
            "reference_text": ParamDef(T.STR, "Once upon a time there was a little robot who"),
            "cosine_min": ParamDef(T.FLOAT, 0.999, minimum=-1.0, maximum=1.0),
            "chat": _CHAT,  # which template the HEF's tokenizer carries
        },
    ),
    StageDef("parse", "hailo/parse.py", ("export",), ("parsed.har",), toolchain=_DFC),
    StageDef("resources", "hailo/resources.py", ("export", "parse"),
             ("resources.har", "hailo-config.json"), toolchain=_DFC),
    StageDef(
        "optimize", "hailo/optimize.py", ("export", "resources"),
        ("quantized.har", "model_script.alls"),
        {
            "recipe": ParamDef(T.FILE, f"{_RECIPES}/optimize.alls"),
            **_CALIBRATION,
            "optimization_level": ParamDef(T.INT, 0, minimum=0, maximum=4),
            "compression_level": ParamDef(T.INT, 4, minimum=0, maximum=5),
            "accept_reduced_optimization": ParamDef(T.BOOL, False),
        },
        toolchain=_DFC, gpu=True,
    ),
    StageDef(
        "compile", "hailo/compile.py", ("export", "optimize"),
        ("model.hef", "compiled.har", "model.auto.alls", "compile_script.alls"),
        {
            "compile_script": ParamDef(T.FILE, f"{_RECIPES}/compile.alls"),
            "compiler_optimization_level": ParamDef(T.INT, 0, minimum=0, maximum=2),
            "auto_spatial_reshapes": ParamDef(T.BOOL, False),
            "replay_placement": ParamDef(T.BOOL, False),
            "placement": ParamDef(T.FILE, "placements/{model}.auto.alls",
                                  when="replay_placement"),
        },
        # The fidelity gate runs first: a recipe that ruins the model fails in minutes,
        # before hours of placement; its figures never enter compile's key.
        toolchain=_DFC, after=("fidelity",),
    ),
    # The float32 transformers greedy run of the prompts, on the build host, once: the
    # device check compares against it without recomputing it per device run.
    StageDef(
        "reference", "hailo/reference.py", ("fetch",), ("reference.json",),
        {**{k: _VERIFY_PARAMS[k] for k in ("prompts", "max_new_tokens")}, "chat": _CHAT},
    ),
    # A CPU emulation of the recipe's precisions (ONNX Runtime QDQ), compared with float32
    # like verify compares the device; not the chip. Thresholds of 0 / -1 only report.
    StageDef(
        "fidelity", "hailo/fidelity.py", ("export", "optimize", "reference"), ("fidelity.json",),
        {
            **_SAME_CALIBRATION,
            "min_teacher_forced": ParamDef(T.FLOAT, 0.0, minimum=0.0, maximum=1.0),
            "min_prefill_cosine": ParamDef(T.FLOAT, -1.0, minimum=-1.0, maximum=1.0),
        },
    ),
    StageDef(
        "verify", "hailo/verify.py", ("export", "compile", "reference"), ("report.json",),
        {
            "min_token_agreement": _VERIFY_PARAMS["min_token_agreement"],
            "seed": ParamDef(T.INT, 0),
            "prefill_check": ParamDef(T.BOOL, True),
            "prefill_cosine_min": ParamDef(T.FLOAT, 0.9, minimum=-1.0, maximum=1.0),
            "near_tie": ParamDef(T.FLOAT, 0.5, minimum=0.0),
        },
        toolchain="hailo10h-device",
    ),
)

# Intel NPUs through OpenVINO (OPENVINO.md): every stage but fetch runs in the `openvino`
# toolchain, a venv made from its lock file (its packages conflict with the host's). The
# compiled blob is the artifact; compile also keeps the IR, which GenAI's verify loads.
_OV = "openvino"
_OV_DEVICE = ParamDef(T.STR, "CPU", choices=("CPU", "NPU", "GPU"))
OPENVINO = (
    _FETCH,
    StageDef("export", "openvino/export.py", ("fetch",), ("ir/",),
             {"precision": ParamDef(T.STR, "fp32", choices=("fp32", "fp16"))}, toolchain=_OV),
    StageDef("compress", "openvino/compress.py", ("export",), ("ir/",), {
        "mode": ParamDef(T.STR, "int8_asym",
                         choices=("int8_asym", "int8_sym", "int4_sym", "int4_asym")),
        # int4 only (int8 is per channel): -1 is channel-wise; ratio is the share kept at int4.
        "group_size": ParamDef(T.INT, 128, choices=(-1, 16, 32, 64, 128, 256)),
        "ratio": ParamDef(T.FLOAT, 1.0, minimum=0.0, maximum=1.0),
    }, toolchain=_OV),
    StageDef("compile", "openvino/compile.py", ("compress",), ("model.blob", "ir/"),
             {"device": _OV_DEVICE}, toolchain=_OV),
    StageDef("verify", "openvino/verify.py", ("fetch", "compile"), ("report.json",), {
        **_VERIFY_PARAMS, "device": replace(_OV_DEVICE, inherit="compile"), "chat": _CHAT,
    }, toolchain=_OV),
)

PIPELINES: dict[str, tuple[StageDef, ...]] = {"cpu-ort": CPU_ORT, "hailo10h": HAILO10H,
                                              "openvino": OPENVINO}

# The stage whose output is a target's deployable artifact (`hef:<model>` for hailo10h).
ARTIFACT_STAGE = {"cpu-ort": "compile", "hailo10h": "compile", "openvino": "compile"}


def stage_defs(target: str) -> dict[str, StageDef]:
    return {s.name: s for s in PIPELINES[target]}
