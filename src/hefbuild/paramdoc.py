"""The stage-parameter reference (docs/parameters.md), generated from the declarations.

Types, defaults, ranges, choices and conditions come from `pipelines.py` itself; each stage's
summary is the first line of its rule's docstring; the one-line meanings live in `MEANING`
below. A test regenerates the file and compares, and checks that every declared parameter
has a meaning and no meaning names a parameter that is gone, so the page cannot drift.

    python -m hefbuild.paramdoc > docs/parameters.md
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from .params import ParamDef, ParamType
from .pipelines import COMMON_STAGE_KEYS, PIPELINES, StageDef

# (stage, parameter) -> what it does; a (target, stage, parameter) key wins where targets
# use one name differently.
MEANING: dict[tuple[str, ...], str] = {
    ("export", "opset"): "ONNX opset of the exported graph",
    ("export", "reference_text"): "text whose logits the export gate compares (ONNX Runtime "
                                  "vs transformers)",
    ("export", "cosine_min"): "the export gate: minimum cosine of those logits",
    ("export", "seq_len"): "tokens of the exported graph's input (prompts are left-padded)",
    ("export", "prefill_size"): "tokens the prefill network group takes at once",
    ("export", "cache_size"): "KV-cache length of the compiled model",
    ("export", "shard_vocab"): "rows per lm_head output shard (a vocabulary above it is split)",
    ("export", "scope"): "network name inside the HAR/HEF (`<scope>__prefill`, `__tbt`)",
    ("export", "chat"): "which template the HEF's tokenizer carries: the checkpoint's chat "
                        "template, or plain text (set by `[model] chat`)",
    ("quantize", "method"): "weight-only int8/int4 (MatMulNBits), dynamic int8, or static QDQ",
    ("quantize", "block_size"): "weight-only: weights per quantization block along K",
    ("quantize", "symmetric"): "weight-only: symmetric blocks (no zero points)",
    ("quantize", "exclude"): "static_qdq: regexes of node names left in float",
    ("quantize", "calibration"): "static_qdq: text file whose lines calibrate activations",
    ("quantize", "samples"): "static_qdq: calibration lines used",
    ("quantize", "seq_len"): "static_qdq: tokens per calibration sample (truncated)",
    ("quantize", "seed"): "static_qdq: shuffle seed of the calibration lines",
    ("quantize", "per_channel"): "static_qdq/dynamic: per-channel weight scales",
    ("quantize", "op_types"): "static_qdq/dynamic: operator types quantized",
    ("quantize", "activation_type"): "static_qdq: activation integer type",
    ("quantize", "weight_type"): "static_qdq/dynamic: weight integer type",
    ("cpu-ort", "compile", "optimization_level"): "ONNX Runtime graph optimization level, "
                                                  "applied offline",
    ("openvino", "export", "precision"): "how the IR stores its float weights (fp16: "
                                         "decompressed to f32 at run time)",
    ("openvino", "compress", "mode"): "NNCF weight compression: int8 per channel, or int4 "
                                      "groups (sym preferred on the NPU)",
    ("openvino", "compress", "group_size"): "int4: input channels per group (-1: channel-wise)",
    ("openvino", "compress", "ratio"): "int4: share of the layers in int4 (the rest int8)",
    ("openvino", "compile", "device"): "OpenVINO device the blob is compiled for (CPU here; "
                                       "NPU on Intel Core Ultra)",
    ("openvino", "verify", "device"): "OpenVINO device GenAI generates on (compile's unless "
                                      "set)",
    ("verify", "prompts"): "prompts the model is checked on",
    ("verify", "max_new_tokens"): "tokens generated per prompt",
    ("verify", "min_token_agreement"): "free-running greedy token agreement needed (the gate "
                                       "with `gate = \"free_running\"`, and on the device)",
    ("verify", "gate"): "what passes or fails: teacher-forced agreement and logit cosine, or "
                        "free-running agreement",
    ("verify", "min_teacher_forced"): "teacher-forced top-1 agreement needed",
    ("verify", "min_logit_cosine"): "mean logit cosine along the float32 continuation needed",
    ("verify", "near_tie"): "float32 top-1/top-2 margin under which a divergence is labelled a "
                            "near tie",
    ("verify", "chat"): "prompts as one user message in the checkpoint's chat template (set by "
                        "`[model] chat`)",
    ("verify", "seed"): "sampling seed sent to the device (greedy decoding ignores it)",
    ("verify", "prefill_check"): "also compare the device's prefill logits with transformers'",
    ("verify", "prefill_cosine_min"): "minimum cosine of those prefill logits",
    ("reference", "prompts"): "prompts of the on-device check",
    ("reference", "max_new_tokens"): "tokens the float32 reference generates per prompt",
    ("reference", "chat"): "prompts in the checkpoint's chat template (set by `[model] chat`)",
    ("optimize", "recipe"): "DFC model-script template (precisions, KV cache, calibration)",
    ("optimize", "calibration"): "text file whose lines make the calibration set",
    ("optimize", "calibration_size"): "calibration rows",
    ("optimize", "calibration_seed"): "order of the calibration lines",
    ("optimize", "optimization_level"): "DFC optimization level (pinned: above 0 re-enables "
                                        "adaround and finetune)",
    ("optimize", "compression_level"): "DFC compression level",
    ("optimize", "accept_reduced_optimization"): "let optimize pass when the DFC reduces the "
                                                 "level (e.g. no GPU)",
    ("fidelity", "calibration"): "calibration text of the CPU emulation (default: optimize's)",
    ("fidelity", "calibration_size"): "its rows (default: optimize's)",
    ("fidelity", "calibration_seed"): "its order (default: optimize's)",
    ("fidelity", "min_teacher_forced"): "gate on compile: teacher-forced agreement of the "
                                        "emulation (0 = report only)",
    ("fidelity", "min_prefill_cosine"): "gate on compile: prefill logit cosine of the "
                                        "emulation (-1 = report only)",
    ("hailo10h", "compile", "compile_script"): "DFC compiler script template",
    ("hailo10h", "compile", "compiler_optimization_level"): "DFC compiler optimization level",
    ("hailo10h", "compile", "auto_spatial_reshapes"): "let the allocator reshape spatially "
                                                      "(drops the allocator line)",
    ("hailo10h", "compile", "replay_placement"): "replay a kept placement (`doit placement:`)",
    ("hailo10h", "compile", "placement"): "the kept `.auto.alls` placement file",
    ("toolchain",): "toolchain the stage runs in (a file in toolchain/)",
    ("timeout",): "kill the stage after this long (not part of the key)",
    ("memory",): "kill the stage above this resident memory (not part of the key)",
    ("gpu",): "whether the stage gets a GPU (part of the key)",
}


def meaning(target: str, stage: str, name: str) -> str | None:
    return MEANING.get((target, stage, name)) or MEANING.get((stage, name))


def stage_summary(rules_dir: Path, rule: str, stage: str) -> str:
    """The first line of the rule's docstring, without its `stage (target):` prefix."""
    try:
        doc = ast.get_docstring(ast.parse((rules_dir / rule).read_text(encoding="utf-8")))
    except (OSError, SyntaxError):
        doc = None
    first = (doc or "").strip().splitlines()[0] if doc else ""
    head, _, rest = first.partition(": ")
    text = rest if rest and head.split(" ")[0] == stage else first
    return text.rstrip(".")


def _constraint(p: ParamDef) -> str:
    parts = []
    if p.choices:
        parts.append("one of " + ", ".join(f"`{_toml(c)}`" for c in p.choices))
    if p.minimum is not None and p.maximum is not None:
        parts.append(f"{_num(p.minimum)} to {_num(p.maximum)}")
    elif p.minimum is not None:
        parts.append(f"at least {_num(p.minimum)}")
    elif p.maximum is not None:
        parts.append(f"at most {_num(p.maximum)}")
    if p.when:
        parts.append(f"only with `{p.when} = true`")
    if p.inherit:
        parts.append(f"default: the value of `[stages.{p.inherit}]`")
    return "; ".join(parts)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


_TYPE = {ParamType.INT: "integer", ParamType.FLOAT: "number", ParamType.BOOL: "bool",
         ParamType.STR: "string", ParamType.STR_LIST: "list of strings",
         ParamType.FILE: "file (digest in the key)", ParamType.DURATION: "duration",
         ParamType.SIZE: "size"}


def _row(name: str, p: ParamDef, what: str) -> str:
    default = "—" if p.default is None else f"`{_toml(p.default)}`"
    cell = what.replace("|", "\\|")
    return f"| `{name}` | {_TYPE[p.type]} | {default} | {_constraint(p)} | {cell} |"


def _stage_block(target: str, s: StageDef, rules_dir: Path) -> list[str]:
    lines = [f"### `[stages.{s.name}]` — {target}", "",
             f"{stage_summary(rules_dir, s.rule, s.name)} (`rules/{s.rule}`; reads "
             f"{', '.join(s.inputs) or 'the declared source'}; writes "
             f"{', '.join(f'`{o}`' for o in s.outputs)}; toolchain `{s.toolchain}`"
             f"{'; after ' + ', '.join(s.after) if s.after else ''}).", ""]
    if not s.params:
        return [*lines, "No parameters of its own.", ""]
    lines += ["| parameter | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    lines += [_row(n, p, meaning(target, s.name, n) or "") for n, p in s.params.items()]
    return [*lines, ""]


def reference(rules_dir: Path) -> str:
    lines = ["# Stage parameters", "",
             "Generated by `python -m hefbuild.paramdoc > docs/parameters.md` from "
             "`src/hefbuild/pipelines.py` and the rules' docstrings; do not edit by hand "
             "(a test compares).", "",
             "Every `[stages.<stage>]` table of a model file also takes:", "",
             "| key | type | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | {_TYPE[p.type]} | {MEANING[(k,)]} |"
              for k, p in COMMON_STAGE_KEYS.items()]
    lines.append("")
    for target, stages in PIPELINES.items():
        lines += [f"## Target `{target}`", "",
                  " → ".join(s.name for s in stages), ""]
        for s in stages:
            lines += _stage_block(target, s, rules_dir)
    return "\n".join(lines).rstrip() + "\n"


def undocumented() -> list[str]:
    """Declared parameters without a meaning, and meanings of parameters that are gone."""
    declared = {(t, s.name, n) for t, stages in PIPELINES.items() for s in stages
                for n in s.params}
    missing = [f"{t}.{s}.{n}" for t, s, n in sorted(declared) if meaning(t, s, n) is None]
    used = {(s, n) for _, s, n in declared} | {k for k in declared}
    used |= {(k,) for k in COMMON_STAGE_KEYS}
    stale = [".".join(k) for k in MEANING if k not in used]
    return missing + [f"stale: {s}" for s in stale]


if __name__ == "__main__":
    print(reference(Path(__file__).resolve().parents[2] / "rules"), end="")
