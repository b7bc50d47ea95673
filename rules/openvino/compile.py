"""compile (openvino): the compressed IR compiled for the declared device; the blob is the artifact.

`openvino.Core().compile_model(ir, device)` then `export_model()` writes `model.blob`, what an
NPU deployment imports. The blob is imported again and run once next to the compiled model
(same logits), so a blob that cannot be loaded never leaves this stage. GenAI's LLMPipeline
loads an IR folder, not a CPU blob: the IR (with its tokenizer) is kept as `ir/` for verify.
Runs in the `openvino` venv toolchain.
"""

from __future__ import annotations

import io
import shutil
import sys
from typing import Any

from common.action import check_outputs, fail, load_action

DEVICES = ("CPU", "NPU", "GPU")
MODEL_XML = "openvino_model.xml"
SMOKE_IDS = [1, 5, 9, 13]


def device_of(params: dict[str, Any], available: list[str]) -> str:
    device = str(params.get("device", "CPU"))
    if device not in DEVICES:
        fail(f"compile: params.device {device!r} is not one of {list(DEVICES)}")
    if not any(d == device or d.startswith(device + ".") for d in available):
        fail(f"compile: OpenVINO device {device} is not available on this machine (available: "
             f"{', '.join(available) or 'none'}); build on a machine with it, or set "
             f"[stages.compile] device = \"CPU\"")
    return device


def smoke_inputs(model: Any) -> dict[str, Any]:
    """One short prompt for the stateful LLM IR: ids, mask, positions, beam index."""
    import numpy as np

    n = len(SMOKE_IDS)
    feeds = {"input_ids": np.asarray([SMOKE_IDS], dtype=np.int64),
             "attention_mask": np.ones((1, n), dtype=np.int64),
             "position_ids": np.arange(n, dtype=np.int64)[None, :],
             "beam_idx": np.zeros((1,), dtype=np.int32)}
    names = {name for port in model.inputs for name in port.get_names()}
    return {k: v for k, v in feeds.items() if k in names}


def logits_of(compiled: Any, feeds: dict[str, Any]) -> Any:
    request = compiled.create_infer_request()
    request.reset_state()
    request.infer(feeds)
    return request.get_tensor("logits").data.copy()


def main() -> None:
    import numpy as np
    import openvino as ov

    action = load_action(sys.argv)
    core = ov.Core()
    device = device_of(action.params, list(core.available_devices))
    src = action.input_dir("compress") / "ir"
    compiled = core.compile_model(src / MODEL_XML, device)
    blob = action.out / "model.blob"
    exported = compiled.export_model()  # a BytesIO (bytes in older releases)
    blob.write_bytes(exported.getvalue() if hasattr(exported, "getvalue") else exported)
    with open(blob, "rb") as f:
        imported = core.import_model(io.BytesIO(f.read()), device)
    feeds = smoke_inputs(compiled)
    expected, got = logits_of(compiled, feeds), logits_of(imported, feeds)
    if not np.isfinite(got).all():
        fail(f"compile: the imported blob produced non-finite logits on {device}")
    if not np.allclose(expected, got, rtol=1e-4, atol=1e-4):
        fail(f"compile: the imported blob's logits differ from the compiled model's on {device} "
             f"(max |diff| {float(np.abs(expected - got).max()):.3g})")
    shutil.copytree(src, action.out / "ir")
    print(f"compiled for {device}: model.blob {blob.stat().st_size} bytes; imported and run "
          f"once, logits {list(got.shape)} equal to the compiled model's")
    check_outputs(action)


if __name__ == "__main__":
    main()
