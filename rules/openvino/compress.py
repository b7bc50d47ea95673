"""compress (openvino): NNCF weight compression of the exported IR, as declared.

`mode` is int8_asym (NNCF's default), int8_sym, int4_sym (preferred on the NPU) or int4_asym.
int8 is per output channel; int4 groups `group_size` input channels (-1: channel-wise) and
keeps the share 1 - `ratio` of the layers (and, as NNCF does, the embedding and the last
layer) in int8. The compressed IR replaces the model in a copy of export's folder, tokenizer
included. Runs in the `openvino` venv toolchain.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action

MODES = ("int8_asym", "int8_sym", "int4_sym", "int4_asym")
MODEL_XML = "openvino_model.xml"
GROUP_SIZES = (16, 32, 64, 128, 256)  # targets/openvino.toml's group_size choices (and -1)
FAILED_NODE = re.compile(r'"([^"]+)" \(channel size: (\d+)\)')


def compress_options(params: dict[str, Any]) -> dict[str, Any]:
    """nncf.compress_weights keyword arguments for the declared parameters."""
    import nncf

    mode = str(params.get("mode", "int8_asym"))
    if mode not in MODES:
        fail(f"compress: params.mode {mode!r} is not one of {list(MODES)}")
    options: dict[str, Any] = {"mode": getattr(nncf.CompressWeightsMode, mode.upper())}
    if mode.startswith("int4"):
        options["group_size"] = int(params.get("group_size", 128))
        options["ratio"] = float(params.get("ratio", 1.0))
    return options


def compress(src: Path, out: Path, options: dict[str, Any]) -> None:
    import nncf
    import openvino as ov

    model = ov.Core().read_model(src / MODEL_XML)
    try:
        compressed = nncf.compress_weights(model, **options)
    except Exception as exc:  # NNCF's own errors name the layer and the constraint
        fail(f"compress: nncf.compress_weights({describe(options)}) failed: {reason(exc)}")
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("openvino_model.*"))
    ov.save_model(compressed, out / MODEL_XML, compress_to_fp16=False)


def reason(exc: Exception) -> str:
    """NNCF's message, with its list of failed nodes (one per layer: SmolLM2-135M's 180 make
    15 kB on the one failure line) cut to a count and the first, and for input channels a
    group size does not divide, the declared group sizes that divide them all."""
    head, sep, tail = str(exc).partition("Failed nodes:")
    nodes = FAILED_NODE.findall(tail)
    if not sep or not nodes:
        return str(exc)
    sizes = sorted({int(size) for _, size in nodes})
    fits = [g for g in GROUP_SIZES if all(size % g == 0 for size in sizes)]
    hint = f"group_size values that divide them: {', '.join(map(str, fits))}, or -1" if fits \
        else "no declared group_size divides them: -1"
    return (f"{head.strip()} {len(nodes)} failed nodes (channel sizes "
            f"{', '.join(map(str, sizes))}), the first {nodes[0][0]}. {hint} (channel-wise)")


def describe(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in options.items())


def main() -> None:
    action = load_action(sys.argv)
    options = compress_options(action.params)
    out = action.out / "ir"
    compress(action.input_dir("export") / "ir", out, options)
    (out / "hefbuild_compression.json").write_text(
        json.dumps({k: getattr(v, "value", v) for k, v in options.items()}, sort_keys=True)
        + "\n")
    print(f"compressed weights with NNCF: {describe(options)}")
    check_outputs(action)


if __name__ == "__main__":
    main()
