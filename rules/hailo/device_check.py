"""device_check: the verify stage's probe, run ON THE HAILO HOST, one fresh process per attempt.

Self-contained with its `device_check_*.py` modules (errors, versions, audit, generate): the
build host copies them side by side and the HEF to the device host and runs this file with the
device's python (standard library, numpy and HailoRT's `hailo_platform` only).

    python device_check.py versions
        {"hailort": "<runtime version>", "firmware": "<device firmware>", "devices": [ids],
         "firmware_by_device": {id: raw firmware string}}
    python device_check.py audit HEF
        static HEF audit, no device needed: {"ok", "problems", "network_groups", "inputs",
        "config", "resources"}
    python device_check.py generate HEF REQUEST_JSON
        REQUEST {"prompts": [...], "max_new_tokens": N, "seed": S, "prefill": {"npz": path|null},
                 "expect_versions": {"hailort": "5.3.0", "firmware": "5.3.0"} (optional)}
        -> {"generations": [...], "prefill_logits": [...]|null, "hailort": ..., "firmware": ...}

Every answer is ONE JSON line on stdout (library output is sent to stderr); with the
`hailo_platform` test double it carries "fake": true. Errors print
{"error": {"class": "transient"|"deterministic", "status": "HAILO_..."|null, "message": ...}}
and exit 3 (transient: the interrupted-accept flake surfacing as HAILO_COMMUNICATION_CLOSED,
HAILO_DRIVER_INTERRUPTED or HAILO_INTERRUPTED_BY_SIGNAL; a fresh process succeeds) or 4
(deterministic: bad HEF, version mismatch, failed audit, anything else). Usage errors exit 2.

generate: one VDevice (shared group id) and one `genai.LLM` per process; before each prompt
`clear_context()`, then greedy generation (do_sample=False, the request's seed and
max_generated_tokens). A prompt is a string (raw text, inserted as is: the server adds no BOS,
so put the BOS text in it) or a list of chat messages (the HEF's chat template applies).
The genai API streams TEXT, one piece per token (a piece ending in U+FFFD is held back and
merged with the next), and has no token-id output. So `token_ids` are the LLM's own
`tokenize()` of each streamed piece, concatenated; `token_ids_exact` says whether every piece
gave exactly one id (then the ids are the generated ids, barring a tokenizer whose encode of a
token's text differs from the token); `retokenized_ids` is `tokenize()` of the whole text.

prefill (optional): the six arrays of export's hf_reference.npz are fed, through the low-level
InferModel API, to the `<scope>__prefill` network group and the last-position logits (shards
concatenated in output-name order) are returned for the build host's cosine. Only when the
group's input shapes hold the npz arrays (one run); a group compiled for fewer tokens than the
reference (prefill_input_tokens_count < seq, driven through the KV cache in chunks by the
runtime) is not driven here: `prefill_logits` is then null and `prefill_error` says why.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

# These modules are copies in the device host's remote_dir: no __pycache__ is written there
# (none to go stale when a module is copied again), as when the probe was one file.
_WRITE_BYTECODE, sys.dont_write_bytecode = sys.dont_write_bytecode, True
from device_check_audit import audit  # noqa: E402
from device_check_errors import classify  # noqa: E402
from device_check_generate import generate  # noqa: E402
from device_check_versions import read_versions  # noqa: E402

sys.dont_write_bytecode = _WRITE_BYTECODE

EXIT_TRANSIENT, EXIT_DETERMINISTIC, EXIT_USAGE = 3, 4, 2


# -- output ----------------------------------------------------------------------------------

_OUT = sys.stdout


def _claim_stdout() -> None:
    """Keep the real stdout for the one JSON line; anything else printed goes to stderr."""
    global _OUT
    try:
        _OUT = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
    except OSError:
        _OUT = sys.stdout
    sys.stdout = sys.stderr


def _is_fake() -> bool:
    module = sys.modules.get("hailo_platform")
    return bool(getattr(module, "IS_FAKE_HAILORT", False))


def emit(answer: dict[str, Any]) -> None:
    if _is_fake():
        answer = {**answer, "fake": True}
    _OUT.write(json.dumps(answer, sort_keys=True) + "\n")
    _OUT.flush()


def fail(exc: BaseException) -> int:
    error = classify(exc)
    emit({"error": error})
    return EXIT_TRANSIENT if error["class"] == "transient" else EXIT_DETERMINISTIC


# -- CLI -------------------------------------------------------------------------------------

USAGE = ("usage: device_check.py versions | audit HEF | generate HEF REQUEST_JSON")


def main(argv: list[str]) -> int:
    _claim_stdout()
    commands = {"versions": 0, "audit": 1, "generate": 2}
    if len(argv) < 1 or argv[0] not in commands or len(argv) - 1 != commands[argv[0]]:
        print(USAGE, file=sys.stderr)
        return EXIT_USAGE
    try:
        if argv[0] == "versions":
            emit(read_versions())
        elif argv[0] == "audit":
            emit(audit(argv[1]))
        else:
            emit(generate(argv[1], argv[2]))
    except Exception as exc:  # noqa: BLE001 - every failure becomes one classified JSON line
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
