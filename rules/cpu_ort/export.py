"""export (cpu-ort): float32 HF checkpoint -> ONNX `model.onnx` (input_ids -> logits).

Gate: ONNX Runtime and torch must agree on the reference text's last-position logits
(cosine >= cosine_min), and again at a second batch/length so dynamic axes really are dynamic;
the figures go into export_report.json.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

from common.action import check_outputs, fail, load_action, round_sig, write_json
from common.checkpoint import load_checkpoint
from common.determinism import ort_session, pin_torch

# Fixed relative name: the traced file must not depend on the (fresh) scratch path.
EXPORT_PATH = Path("export_work") / "model.onnx"
SEED = 0


def logits_module(model: Any) -> Any:
    import torch

    class LogitsOnly(torch.nn.Module):
        """input_ids -> logits, nothing else in the graph's interface."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
            # An explicit all-ones mask keeps transformers off its packed-sequence detection,
            # which uses aten::diff (no ONNX symbolic); for unpadded input it changes nothing.
            mask = torch.ones_like(input_ids)
            return self.inner(input_ids=input_ids, attention_mask=mask, use_cache=False).logits

    return LogitsOnly(model).eval()


def export_onnx(module: Any, sample: Any, opset: int) -> None:
    import torch

    EXPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        torch.onnx.export(
            module,
            (sample,),
            str(EXPORT_PATH),
            dynamo=False,
            opset_version=opset,
            input_names=["input_ids"],
            output_names=["logits"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
            do_constant_folding=True,
        )


def cosine(a: Any, b: Any) -> float:
    import numpy as np

    return float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-30))


def both_logits(session: Any, module: Any, ids: Any) -> tuple[Any, Any]:
    import numpy as np
    import torch

    onnx_logits = session.run(["logits"], {"input_ids": ids.numpy()})[0].astype(np.float64)
    with torch.no_grad():
        torch_logits = module(ids).numpy().astype(np.float64)
    if onnx_logits.shape != torch_logits.shape:
        fail(f"export gate failed: ONNX logits {onnx_logits.shape} != torch {torch_logits.shape}")
    return onnx_logits, torch_logits


def compare(module: Any, ids: Any) -> dict[str, float]:
    import numpy as np

    session = ort_session(str(EXPORT_PATH))
    onnx_logits, torch_logits = both_logits(session, module, ids)
    a, b = onnx_logits[0, -1], torch_logits[0, -1]
    # The trace saw one shape; a batch of 2 at another length catches sizes frozen into the graph.
    other = ids[:, : max(1, ids.shape[1] // 2)].repeat(2, 1)
    onnx_other, torch_other = both_logits(session, module, other)
    return {
        "cosine_last": cosine(a, b),
        "cosine_other_shape": cosine(onnx_other[1, -1], torch_other[1, -1]),
        "max_abs_diff_last": float(np.abs(a - b).max()),
        "max_abs_diff_all": float(np.abs(onnx_logits - torch_logits).max()),
        "same_argmax_last": bool(a.argmax() == b.argmax()),
    }


def main() -> None:
    action = load_action(sys.argv)
    opset = int(action.params.get("opset", 17))
    text = str(action.params.get("reference_text", ""))
    cosine_min = float(action.params.get("cosine_min", 0.9999))
    pin_torch(SEED)

    import onnx
    import torch

    tok, model = load_checkpoint(action.input_dir("fetch") / "checkpoint")
    module = logits_module(model)
    ids = tok(text, return_tensors="pt").input_ids.to(torch.long)
    if ids.shape[1] == 0:
        fail("export: reference_text tokenizes to zero tokens")
    print(f"exporting {action.model} at opset {opset}, reference {ids.shape[1]} tokens", flush=True)
    export_onnx(module, ids, opset)
    onnx.checker.check_model(str(EXPORT_PATH))

    stats = compare(module, ids)
    worst_cosine = min(stats["cosine_last"], stats["cosine_other_shape"])
    passed = worst_cosine >= cosine_min
    data = EXPORT_PATH.read_bytes()
    report = {
        "model": action.model,
        "opset": opset,
        "reference_text": text,
        "reference_tokens": int(ids.shape[1]),
        "cosine_last": round_sig(stats["cosine_last"], 8),
        "cosine_min": cosine_min,
        "cosine_other_shape": round_sig(stats["cosine_other_shape"], 8),
        "max_abs_diff_last": round_sig(stats["max_abs_diff_last"]),
        "max_abs_diff_all": round_sig(stats["max_abs_diff_all"]),
        "same_argmax_last": stats["same_argmax_last"],
        "onnx_sha256": hashlib.sha256(data).hexdigest(),
        "onnx_bytes": len(data),
        "passed": passed,
    }
    print(
        f"cosine {report['cosine_last']} (min {cosine_min}), max abs diff "
        f"{report['max_abs_diff_last']} (last), {report['max_abs_diff_all']} (all positions)",
        flush=True,
    )
    if not passed:
        fail(f"export gate failed: cosine {round_sig(worst_cosine, 8)} < cosine_min {cosine_min}")
    shutil.move(str(EXPORT_PATH), action.out / "model.onnx")
    write_json(action.out / "export_report.json", report)
    check_outputs(action)


if __name__ == "__main__":
    main()
