"""The calibration rows of the hailo10h chain, shared by optimize (the DFC's calibration set)
and fidelity (the same rows calibrating the CPU emulation), so both see the same data.

Deterministic for a seed: the non-empty lines of the calibration file ordered by
`numpy.random.default_rng(seed).permutation`; row r starts with BOS and packs ordered lines
r, r+1, ... (cyclic, each line at most once per row), tokenized without special tokens by
export/tokenizer/tokenizer.json and cut to seq_len. Padding (left, with `pad_id`) follows
`common.hailo_inputs` and is left to the caller, which knows its input layout.

numpy and tokenizers are imported inside the functions: the DFC rules import this module
before `common.dfc.prepare_environment` has set NumPy's promotion state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.action import Action, fail


def calibration_lines(path: Path, seed: int, stage: str) -> list[str]:
    """The file's non-empty lines (stripped) in the seeded order."""
    import numpy as np

    try:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        fail(f"{stage}: cannot read calibration file {path}: {exc}")
    lines = [ln for ln in lines if ln]
    if not lines:
        fail(f"{stage}: calibration file {path} has no non-empty lines")
    order = np.random.default_rng(seed).permutation(len(lines))
    return [lines[int(i)] for i in order]


def token_rows(export: Path, ordered: list[str], config: dict[str, Any], size: int,
               stage: str) -> list[list[int]]:
    """`size` rows of at most seq_len ids: BOS, then ordered lines r, r+1, ... packed."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        fail(f"{stage}: the 'tokenizers' package is needed for calibration: {exc}")
    tok = Tokenizer.from_file(str(export / "tokenizer" / "tokenizer.json"))
    encoded = [tok.encode(line, add_special_tokens=False).ids for line in ordered]
    seq, bos = int(config["seq_len"]), config["bos_token_id"]
    rows: list[list[int]] = []
    for r in range(size):
        ids: list[int] = [] if bos is None else [int(bos)]
        for k in range(len(encoded)):
            if len(ids) >= seq:
                break
            ids.extend(int(i) for i in encoded[(r + k) % len(encoded)])
        rows.append(ids[:seq])
    return rows


def calibration_rows(action: Action, config: dict[str, Any]) -> list[list[int]]:
    """The rows for the action's `calibration` file, `calibration_size` and `calibration_seed`
    (optimize's parameters; fidelity declares the same ones)."""
    size = int(action.params["calibration_size"])
    ordered = calibration_lines(action.file("calibration"), int(action.params["calibration_seed"]),
                                action.stage)
    return token_rows(action.input_dir("export"), ordered, config, size, action.stage)


def pad_id(config: dict[str, Any]) -> int:
    """export's pad id (run_config falls back to eos when the tokenizer has none)."""
    pad = config["pad_token_id"] if config["pad_token_id"] is not None else config["eos_token_id"]
    return int(pad)
