"""compile (cpu-ort): ONNX Runtime offline graph optimization of the quantized model.

The optimized graph is written by ORT while it builds a session; it is then loaded again in a
fresh session and run once, so a graph ORT cannot execute never leaves this stage.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from common.action import check_outputs, fail, load_action
from common.determinism import ort_session

LEVELS = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
# Relative and fixed: ORT may record the output location while serializing.
WORK_PATH = Path("compile_work") / "model.opt.onnx"
SMOKE_IDS = [[1, 2, 3, 4]]


def optimize(source: Path, level_name: str) -> None:
    import onnxruntime as ort

    WORK_PATH.parent.mkdir(parents=True, exist_ok=True)
    level = getattr(ort.GraphOptimizationLevel, LEVELS[level_name])
    ort_session(
        str(source), graph_optimization_level=level, optimized_model_filepath=str(WORK_PATH)
    )
    if not WORK_PATH.is_file():
        fail(f"compile: ONNX Runtime did not write the optimized model at level {level_name}")


def smoke_run(path: Path) -> tuple[int, ...]:
    import numpy as np
    import onnxruntime as ort

    # Already optimized: do not let this session rewrite the graph again.
    session = ort_session(
        str(path), graph_optimization_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    logits = session.run(["logits"], {"input_ids": np.asarray(SMOKE_IDS, dtype=np.int64)})[0]
    if not np.isfinite(logits).all():
        fail("compile: optimized model produced non-finite logits on the smoke input")
    return tuple(logits.shape)


def main() -> None:
    action = load_action(sys.argv)
    level_name = str(action.params.get("optimization_level", "extended"))
    if level_name not in LEVELS:
        fail(f"compile: params.optimization_level {level_name!r} is not one of {list(LEVELS)}")
    source = action.input_dir("quantize") / "model.int8.onnx"
    optimize(source, level_name)
    shape = smoke_run(WORK_PATH)
    print(f"optimized at level {level_name}; smoke run logits shape {list(shape)}")
    shutil.move(str(WORK_PATH), action.out / "model.opt.onnx")
    check_outputs(action)


if __name__ == "__main__":
    main()
