"""compile (hailo10h): quantized.har -> model.hef, compiled.har, model.auto.alls,
compile_script.alls.

The compile script is rendered from the `compile_script` template (syntax:
rules/common/dfc_script.py) with:

    {scope} {compiler_optimization_level}
    [unless auto_spatial_reshapes] ...      the allocator line; auto_spatial_reshapes = true
                                            drops it (the compiler default returns)
    [each network_group] ... {network_group}   exactly `<scope>__prefill` and `<scope>__tbt`
    [each cache_input]  ... {cache_input.group} {cache_input.layer} {cache_input.short}
                            {cache_input.next}    every KV-cache input layer of both groups
                                                  (io_type "cache") and its successor
    [each cache_output] ... {cache_output.group} {cache_output.layer} {cache_output.short}
                            {cache_output.prev}   every KV-cache output layer and its
                                                  predecessor

The rendered script must declare exactly those two network groups and must not carry
`automatic_reshapes=disabled` (some reshapes are required).

replay_placement = true: the `placement` file (a previous compile's `.auto.alls`) REPLACES the
rendered script: it is the compiler's full record of its decisions for this graph (the
rendered commands included), and loading it as the model script is the documented way to
recompile without the placement search (`hailo compiler <har> --model-script <x>.auto.alls`).
compile_script.alls is then the placement content, i.e. always the script that was loaded.

After `runner.compile()` the HEF bytes are written, the compiled HAR saved (deterministic tar
metadata), and the compiler's `.auto.alls` taken from it: the HAR member named `*.auto.alls`,
else `hailo har extract <compiled.har> --auto-model-script-path model.auto.alls`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action
from common.dfc import (
    HW_ARCH,
    client_runner,
    har_member_names,
    import_sdk,
    load_run_config,
    natural_key,
    normalize_har,
    patch_sdk_paths,
    prepare_environment,
    read_har_member,
    register_acceleras_layers,
    sha256_bytes,
    warn_if_fake_sdk,
)
from common.dfc_script import ScriptError, commands, render

NETWORK_GROUP = re.compile(r"^\s*([\w./-]+)\s*=\s*network_group\(")


def cache_layers(hn: dict[str, Any], groups: list[str]) -> tuple[list[dict], list[dict]]:
    inputs: list[dict] = []
    outputs: list[dict] = []
    for name, layer in sorted(hn.get("layers", {}).items(), key=lambda kv: natural_key(kv[0])):
        group, _, short = name.partition("/")
        if group not in groups or layer.get("io_type") != "cache":
            continue
        if layer.get("type") == "input_layer" and layer.get("output"):
            inputs.append({"group": group, "layer": name, "short": short,
                           "next": layer["output"][0]})
        elif layer.get("type") == "output_layer" and layer.get("input"):
            outputs.append({"group": group, "layer": name, "short": short,
                            "prev": layer["input"][0]})
    return inputs, outputs


def render_script(action: Action, config: dict[str, Any], hn: dict[str, Any]) -> str:
    stage, scope = action.stage, config["scope"]
    groups = [f"{scope}__prefill", f"{scope}__tbt"]
    cache_in, cache_out = cache_layers(hn, groups)
    if not cache_in or not cache_out:
        fail(f"{stage}: no KV-cache layers in groups {groups} of quantized.har; was "
             "set_kv_cache_global_params in the optimize recipe?")
    expected = 2 * 2 * int(config["num_hidden_layers"])  # (K, V) x layers x 2 groups
    print(f"{stage}: {len(cache_in)} cache inputs, {len(cache_out)} cache outputs "
          f"(expected {expected} each for {config['num_hidden_layers']} layers)")
    context = {
        "scope": scope,
        "compiler_optimization_level": int(action.params["compiler_optimization_level"]),
        "auto_spatial_reshapes": bool(action.params["auto_spatial_reshapes"]),
        "network_group": groups,
        "cache_input": cache_in,
        "cache_output": cache_out,
    }
    template_path = action.file("compile_script")
    try:
        template = template_path.read_text(encoding="utf-8")
        script = render(template, context, str(template_path))
    except OSError as exc:
        fail(f"{stage}: cannot read compile script {template_path}: {exc}")
    except ScriptError as exc:
        fail(f"{stage}: compile script {exc}")
    lines = commands(script)
    declared = sorted(m.group(1) for ln in lines if (m := NETWORK_GROUP.match(ln)))
    if declared != sorted(groups):
        fail(f"{stage}: compile script {template_path} declares network groups {declared}; "
             f"exactly {groups} are allowed")
    if any("automatic_reshapes=disabled" in ln.replace(" ", "") for ln in lines):
        fail(f"{stage}: compile script {template_path} disables automatic_reshapes; some "
             "reshapes are required (use auto_spatial_reshapes instead)")
    return script


def placement_script(action: Action) -> str:
    path = action.file("placement")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"{action.stage}: cannot read placement {path}: {exc}")
    if not commands(text):
        fail(f"{action.stage}: placement {path} has no model-script commands")
    print(f"{action.stage}: replaying placement {path.name} "
          f"(sha256 {sha256_bytes(text.encode())[:16]}) as the model script")
    return text


def extract_auto_alls(compiled: Path, dest: Path, stage: str) -> None:
    members = [n for n in har_member_names(compiled) if n.endswith(".auto.alls")]
    if len(members) == 1:
        dest.write_bytes(read_har_member(compiled, members[0]))
        return
    if len(members) > 1:
        fail(f"{stage}: compiled.har holds several .auto.alls members: {members}")
    hailo = Path(sys.executable).with_name("hailo")
    cli = str(hailo) if hailo.exists() else shutil.which("hailo")
    if cli is None:
        fail(f"{stage}: compiled.har has no .auto.alls member and the 'hailo' CLI is not found "
             "to run 'hailo har extract --auto-model-script-path'")
    done = subprocess.run([cli, "har", "extract", str(compiled), "--auto-model-script-path",
                           str(dest)], capture_output=True, text=True)
    if done.returncode != 0 or not dest.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        fail(f"{stage}: 'hailo har extract --auto-model-script-path' failed: {tail[0]}")


def run(action: Action) -> None:
    stage = action.stage
    config = load_run_config(action.input_dir("export"), stage)
    quantized = action.input_dir("optimize") / "quantized.har"
    if not quantized.is_file():
        fail(f"{stage}: optimize/quantized.har is missing")
    work = Path.cwd()

    import_sdk(stage)
    warn_if_fake_sdk(stage)
    print(f"{stage}: registered {register_acceleras_layers()} acceleras layer classes")
    patch_sdk_paths(stage, work)
    runner = client_runner(stage, har=str(quantized), hw_arch=HW_ARCH)
    if action.params.get("replay_placement"):
        script = placement_script(action)
    else:
        script = render_script(action, config, runner.get_hn_dict())
    (action.out / "compile_script.alls").write_text(script, encoding="utf-8")
    runner.load_model_script(script)
    print(f"{stage}: compiling (placement search can take hours on deep models)", flush=True)
    try:
        hef = runner.compile()
    except Exception as exc:
        fail(f"{stage}: DFC compile failed: {type(exc).__name__}: {exc}")
    if not isinstance(hef, (bytes, bytearray)) or not hef:
        fail(f"{stage}: runner.compile() returned no HEF bytes ({type(hef).__name__})")
    (action.out / "model.hef").write_bytes(bytes(hef))
    saved = work / "compiled.sdk.har"
    runner.save_har(str(saved))
    normalize_har(saved, action.out / "compiled.har")
    extract_auto_alls(action.out / "compiled.har", action.out / "model.auto.alls", stage)
    print(f"{stage}: model.hef {len(hef)} bytes")


def main() -> None:
    action = load_action(sys.argv)
    prepare_environment(action.stage)
    run(action)
    check_outputs(action)


if __name__ == "__main__":
    main()
