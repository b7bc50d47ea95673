"""optimize (hailo10h): resources.har -> quantized.har with the DFC's `load_model_script` +
`optimize`; the model script actually loaded is written as model_script.alls.

The model script is rendered from the `recipe` template (syntax: rules/common/dfc_script.py)
with these placeholders:

    {scope} {prefill_size} {cache_size} {seq_len}      from export/run_config.json
    {calibration_size} {optimization_level} {compression_level}   stage parameters
    {embeddings_layer} {attention_mask_layer}           HN input layers (resources manifest)
    [each projection] ... {projection} ...              one line per large projection: every
                                                        conv of the base scope whose narrowest
                                                        input is wider than head_dim (not a
                                                        RoPE helper) and whose kernel is at
                                                        most 90 % zeros (lm_head included)

The rendered script must pin `model_optimization_flavor(optimization_level=...)` (a level > 0
silently re-enables adaround/finetune) and carry `set_kv_cache_global_params(...)` (what
duplicates the graph into `<scope>__prefill` / `<scope>__tbt`).

Calibration (deterministic for a seed; `common.hailo_calibration`, shared with the fidelity
stage): the non-empty lines of the `calibration` file ordered by
`numpy.random.default_rng(calibration_seed).permutation`; row r starts with BOS and packs
ordered lines r, r+1, ... (cyclic, each line at most once per row), tokenized without special
tokens by export/tokenizer/tokenizer.json, cut to seq_len and, when shorter, left-padded with
pad_token_id: the host-input convention of the export (`common.hailo_inputs`). Inputs, float32
in the HN layout of each input layer ([N, 1, seq, ...]): the embeddings (embedding_table rows),
the additive mask tiled per head (`hailo_inputs.attention_mask`: causal, pad keys blocked,
sliding window applied), and for the four RoPE inputs the integer positions as [N, seq] (pads
0, real tokens 0..n-1): resources bound those inputs to on-device cos/sin from the theta table,
so the DFC computes cos/sin itself during calibration.

The SDK's log is watched during optimize: a "Reducing optimization level" or a no-GPU line
fails the stage unless `accept_reduced_optimization = true` (then a WARNING line is printed).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action
from common.dfc import (
    HW_ARCH,
    SdkLogWatch,
    client_runner,
    import_sdk,
    load_run_config,
    natural_key,
    normalize_har,
    prepare_environment,
    read_har_member,
    register_acceleras_layers,
    warn_if_fake_sdk,
    write_har,
)
from common.dfc_script import ScriptError, commands, render
from common.hailo_calibration import calibration_rows, pad_id

HEFBUILD_PREFIX = "hefbuild/"
SPARSE_LIMIT = 0.9
ROPE_INPUTS = ("cos_k", "sin_k", "cos_q", "sin_q")


def read_manifest(resources_har: Path, stage: str) -> dict[str, Any]:
    try:
        return json.loads(read_har_member(resources_har, f"{HEFBUILD_PREFIX}resources.json"))
    except (OSError, KeyError, ValueError) as exc:
        fail(f"{stage}: resources.har has no readable {HEFBUILD_PREFIX}resources.json ({exc}); "
             "it was not written by rules/hailo/resources.py")


def kernel_of(params: Any, layer: str) -> Any:
    if params is None:
        return None
    try:
        inner = params.get(layer)
        if isinstance(inner, dict) and "kernel:0" in inner:
            return inner["kernel:0"]
        return params.get(f"{layer}/kernel:0")
    except AttributeError:
        return None


def projections(hn: dict[str, Any], params: Any, config: dict[str, Any]) -> list[str]:
    import numpy as np

    scope, head_dim = config["scope"], int(config["head_dim"])
    chosen: list[str] = []
    for name, layer in sorted(hn.get("layers", {}).items(), key=lambda kv: natural_key(kv[0])):
        if layer.get("type") != "conv" or not name.startswith(f"{scope}/"):
            continue
        widths = [int(s[-1]) for s in layer.get("input_shapes") or [] if s]
        if not widths or min(widths) <= head_dim:
            continue
        kernel = kernel_of(params, name)
        if kernel is not None and float(np.mean(np.asarray(kernel) == 0)) > SPARSE_LIMIT:
            continue
        chosen.append(name)
    return chosen


def render_recipe(action: Action, context: dict[str, Any]) -> str:
    recipe = action.file("recipe")
    try:
        template = recipe.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{action.stage}: cannot read recipe {recipe}: {exc}")
    try:
        script = render(template, context, str(recipe))
    except ScriptError as exc:
        fail(f"{action.stage}: recipe {exc}")
    lines = commands(script)
    flavor = [ln for ln in lines if ln.startswith("model_optimization_flavor(")]
    if not any(re.search(r"\boptimization_level\s*=", ln) for ln in flavor):
        fail(f"{action.stage}: recipe {recipe} does not pin "
             "model_optimization_flavor(optimization_level=...) explicitly")
    kv = [ln for ln in lines if ln.startswith("set_kv_cache_global_params(")]
    expected = f"set_kv_cache_global_params({context['prefill_size']}, {context['cache_size']})"
    if [re.sub(r"\s+", " ", ln) for ln in kv] != [expected]:
        fail(f"{action.stage}: recipe {recipe} must carry exactly one '{expected}' line; "
             f"found {kv}")
    return script


def hn_shape(hn: dict[str, Any], layer: str, n: int, stage: str) -> list[int]:
    shapes = hn["layers"][layer].get("output_shapes") or hn["layers"][layer].get("input_shapes")
    if not shapes:
        fail(f"{stage}: input layer {layer} has no shape in the graph")
    return [n if int(d) < 0 else int(d) for d in shapes[0]]


def calibration_set(action: Action, config: dict[str, Any], hn: dict[str, Any],
                    layers: dict[str, str]) -> dict[str, Any]:
    """{input layer: float32 array [N, ...]} following export's host-input convention
    (common.hailo_inputs: left padding, pad keys blocked, pads at RoPE position 0)."""
    import numpy as np
    from common import hailo_inputs as hi

    stage, export = action.stage, action.input_dir("export")
    size = int(action.params["calibration_size"])
    rows = calibration_rows(action, config)
    with np.load(export / "hf_reference.npz") as ref:
        table = np.asarray(ref["embedding_table"], dtype=np.float32)
    seq, heads = int(config["seq_len"]), int(config["num_attention_heads"])
    pad = pad_id(config)
    window = config.get("sliding_window")
    embeds, masks, positions = [], [], []
    for ids in rows:
        padded, n_real = hi.left_pad(ids, seq, pad)
        if int(padded.max()) >= table.shape[0]:
            fail(f"{stage}: token id {int(padded.max())} is outside the embedding table "
                 f"({table.shape[0]} rows)")
        embeds.append(table[padded])
        masks.append(hi.attention_mask(n_real, seq, heads, window)[0, 0])
        positions.append(hi.positions(n_real, seq).astype(np.float32))
    arrays = {"inputs_embeds": np.stack(embeds), "attention_mask": np.stack(masks)}
    calib: dict[str, Any] = {}
    for name, array in arrays.items():
        layer = layers[name]
        shape = hn_shape(hn, layer, size, stage)
        if int(np.prod(shape)) != array.size:
            fail(f"{stage}: calibration data for {name} has {list(array.shape)}, which does not "
                 f"fit the graph's input layer {layer} {shape}")
        calib[layer] = np.ascontiguousarray(array, dtype=np.float32).reshape(shape)
    stacked = np.ascontiguousarray(np.stack(positions), dtype=np.float32)
    for name in ROPE_INPUTS:
        calib[layers[name]] = stacked
    return dict(sorted(calib.items()))


def run(action: Action) -> None:
    stage = action.stage
    export = action.input_dir("export")
    config = load_run_config(export, stage)
    resources_har = action.input_dir("resources") / "resources.har"
    if not resources_har.is_file():
        fail(f"{stage}: resources/resources.har is missing")
    manifest = read_manifest(resources_har, stage)
    if manifest.get("scope") != config["scope"]:
        fail(f"{stage}: resources.har was made for scope {manifest.get('scope')!r}, run_config "
             f"says {config['scope']!r}")
    if not manifest.get("rope_inputs_take_positions"):
        fail(f"{stage}: resources.har does not bind the RoPE inputs to on-device cos/sin")
    layers: dict[str, str] = manifest["input_layers"]
    work = Path.cwd()
    sdk_har = work / "resources.sdk.har"
    write_har(sdk_har, [resources_har], drop_prefix=HEFBUILD_PREFIX)

    import_sdk(stage)
    warn_if_fake_sdk(stage)
    print(f"{stage}: registered {register_acceleras_layers()} acceleras layer classes")
    runner = client_runner(stage, har=str(sdk_har), hw_arch=HW_ARCH)
    hn = runner.get_hn_dict()
    try:
        params = runner.get_params()
    except Exception as exc:  # sparsity is a refinement; the width rule still applies
        print(f"{stage}: note: get_params() failed ({exc}); kernel sparsity not checked")
        params = None
    chosen = projections(hn, params, config)
    context = {
        "scope": config["scope"],
        "prefill_size": int(config["prefill_size"]),
        "cache_size": int(config["cache_size"]),
        "seq_len": int(config["seq_len"]),
        "calibration_size": int(action.params["calibration_size"]),
        "optimization_level": int(action.params["optimization_level"]),
        "compression_level": int(action.params["compression_level"]),
        "embeddings_layer": layers["inputs_embeds"],
        "attention_mask_layer": layers["attention_mask"],
        "projection": chosen,
    }
    script = render_recipe(action, context)
    print(f"{stage}: {len(chosen)} projection layers at the recipe's projection precision")
    calib = calibration_set(action, config, hn, layers)
    print(f"{stage}: calibration " + ", ".join(
        f"{k} {list(v.shape)} {v.dtype}" for k, v in calib.items()), flush=True)

    (action.out / "model_script.alls").write_text(script, encoding="utf-8")
    runner.load_model_script(script)
    watch = SdkLogWatch(work).start()
    try:
        runner.optimize(calib)
    except Exception as exc:
        watch.stop()
        fail(f"{stage}: DFC optimize failed: {type(exc).__name__}: {exc}")
    watch.stop()
    findings = watch.findings()
    if findings and not action.params.get("accept_reduced_optimization", False):
        fail(f"{stage}: the DFC reduced the optimization: '{findings[0]}' "
             "(make a GPU visible, or set accept_reduced_optimization = true)")
    for line in findings:
        print(f"{stage}: WARNING: accepted reduced optimization "
              f"(accept_reduced_optimization = true): {line}")
    saved = work / "quantized.sdk.har"
    runner.save_har(str(saved))
    normalize_har(saved, action.out / "quantized.har")


def main() -> None:
    action = load_action(sys.argv)
    prepare_environment(action.stage)
    run(action)
    check_outputs(action)


if __name__ == "__main__":
    main()
