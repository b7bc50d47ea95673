"""export (openvino): the fetched checkpoint as an OpenVINO IR folder that GenAI can load.

optimum-intel exports the model (stateful, with a KV cache) without any weight compression
(that is the compress stage's, declared); openvino-tokenizers converts the tokenizer into
`openvino_tokenizer.xml` / `openvino_detokenizer.xml`. `precision` chooses how the IR stores
its float weights: fp32, or fp16 (decompressed to f32 at run time).
Runs in the `openvino` venv toolchain.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from common.action import check_outputs, fail, load_action

PRECISIONS = ("fp32", "fp16")
MODEL_XML = "openvino_model.xml"


def export_model(ckpt: Path, out: Path, precision: str) -> None:
    import openvino as ov
    from optimum.intel import OVModelForCausalLM

    model = OVModelForCausalLM.from_pretrained(
        ckpt, export=True, compile=False, load_in_8bit=False, local_files_only=True)
    work = Path("export_work")
    model.save_pretrained(work)
    # Re-saved here so that the weights' precision is ours to declare, not a default's.
    ir = ov.Core().read_model(work / MODEL_XML)
    out.mkdir(parents=True)
    ov.save_model(ir, out / MODEL_XML, compress_to_fp16=precision == "fp16")
    for f in sorted(work.iterdir()):
        if f.suffix == ".json":
            shutil.copy2(f, out / f.name)


def export_tokenizer(ckpt: Path, out: Path) -> None:
    import openvino as ov
    from openvino_tokenizers import convert_tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    ov_tok, ov_detok = convert_tokenizer(tok, with_detokenizer=True)
    ov.save_model(ov_tok, out / "openvino_tokenizer.xml")
    ov.save_model(ov_detok, out / "openvino_detokenizer.xml")
    tok.save_pretrained(out)


def main() -> None:
    action = load_action(sys.argv)
    precision = str(action.params.get("precision", "fp32"))
    if precision not in PRECISIONS:
        fail(f"export: params.precision {precision!r} is not one of {list(PRECISIONS)}")
    ckpt = action.input_dir("fetch") / "checkpoint"
    out = action.out / "ir"
    export_model(ckpt, out, precision)
    export_tokenizer(ckpt, out)
    print(f"exported {ckpt.name} to OpenVINO IR ({precision}): "
          f"{sorted(p.name for p in out.iterdir())}")
    check_outputs(action)


if __name__ == "__main__":
    main()
