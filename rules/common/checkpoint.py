"""Loading a fetched Hugging Face checkpoint the one way every stage compares against:
float32, eager attention (the reference implementation), no KV cache, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_checkpoint(ckpt: Path) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode) from a checkpoint folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype="float32", attn_implementation="eager", local_files_only=True
    )
    model.config.use_cache = False
    return tok, model.eval()
