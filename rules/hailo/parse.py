"""parse (hailo10h): export/model.onnx -> parsed.har with the Hailo Dataflow Compiler.

`ClientRunner(hw_arch="hailo10h").translate_onnx_model(onnx, <scope>, ...)` with every input's
shape from run_config (`net_input_shapes`) and its layout (`net_input_format`: 3-D inputs are
[batch, width, channels], 4-D ones [batch, height, width, channels]); the ONNX simplifier is
off (the export is deliberately not constant-folded). The whole graph is translated (no
start/end node names: the six inputs and the logits outputs are the graph's own). The parsed
graph must expose one input layer per run_config input; the HAR is saved and rewritten with
deterministic tar metadata.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from common.action import Action, check_outputs, fail, load_action
from common.dfc import (
    HW_ARCH,
    client_runner,
    import_sdk,
    input_layers,
    load_run_config,
    normalize_har,
    prepare_environment,
    register_acceleras_layers,
    warn_if_fake_sdk,
)


def input_formats(shapes: dict[str, list[int]], stage: str) -> dict[str, list[object]]:
    import_sdk(stage)
    dims = importlib.import_module("hailo_sdk_client.exposed_definitions").Dims
    formats: dict[str, list[object]] = {}
    for name, shape in shapes.items():
        if len(shape) == 3:
            formats[name] = [dims.BATCH, dims.WIDTH, dims.CHANNELS]
        elif len(shape) == 4:
            formats[name] = [dims.BATCH, dims.HEIGHT, dims.WIDTH, dims.CHANNELS]
        else:
            fail(f"{stage}: input {name} has rank {len(shape)} ({shape}); expected 3 or 4")
    return formats


def run(action: Action) -> None:
    export = action.input_dir("export")
    config = load_run_config(export, action.stage)
    onnx_path = export / "model.onnx"
    if not onnx_path.is_file():
        fail(f"{action.stage}: export/model.onnx is missing")
    shapes = {name: [int(d) for d in shape] for name, shape in config["inputs"].items()}
    import_sdk(action.stage)
    warn_if_fake_sdk(action.stage)
    print(f"{action.stage}: registered {register_acceleras_layers()} acceleras layer classes")
    runner = client_runner(action.stage, hw_arch=HW_ARCH)
    print(f"{action.stage}: translating {onnx_path.name} as '{config['scope']}' with inputs "
          f"{shapes}", flush=True)
    try:
        runner.translate_onnx_model(
            str(onnx_path),
            config["scope"],
            net_input_shapes=shapes,
            net_input_format=input_formats(shapes, action.stage),
            disable_onnx_simplifier=True,
        )
    except Exception as exc:
        fail(f"{action.stage}: the DFC parser rejected model.onnx: {type(exc).__name__}: {exc}")
    layers = input_layers(runner.get_hn_dict(), config, action.stage)
    print(f"{action.stage}: input layers {layers}")
    work = Path.cwd()
    saved = work / "parsed.sdk.har"
    runner.save_har(str(saved))
    normalize_har(saved, action.out / "parsed.har")


def main() -> None:
    action = load_action(sys.argv)
    prepare_environment(action.stage)
    run(action)
    check_outputs(action)


if __name__ == "__main__":
    main()
