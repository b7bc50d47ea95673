"""resources (hailo10h): parsed.har -> resources.har + hailo-config.json.

Attaches what the genai runtime needs besides the graph, through the DFC's own API on the
parsed HAR:

* `runner.add_external_resources({"input_layers_mapping": ..., "weights": ...})`:
  the embedding table (export/hf_reference.npz `embedding_table`, float32 [vocab, hidden]) as
  `{"embed": table}` on the embeddings input layer (mapped "embedding"); the RoPE theta table
  (the head_dim/2 inverse frequencies of `rope_theta`, repeated twice, float32) on the four
  RoPE input layers (mapped "cos"/"sin") with `"tile": [1, 1, n_kv_heads]` for K and
  `[1, 1, n_heads]` for Q and `"factor": [1.0]`, so the device computes cos/sin from positions;
* `runner.add_external_file("tokenizer.json", ...)` and
  `runner.add_external_file("hailo-config.json", ...)`.

The SDK then saves the HAR (its member names are the SDK's own). resources.har is that HAR,
checked to still hold every member of parsed.har, rewritten sorted with fixed tar metadata,
plus this build's members (all under `hefbuild/`; optimize strips them before the SDK loads
the HAR):

    hefbuild/resources.json       manifest: scope, input layer of each ONNX input and its role,
                                  the embedding table's shape/dtype/sha256, rope theta table,
                                  tiles, sha256 of every attached file
    hefbuild/hailo-config.json    same bytes as the hailo-config.json output
    hefbuild/tokenizer.json       the tokenizer attached to the HEF (see below)

The attached tokenizer is export/tokenizer/tokenizer.json with every `Strip` step removed from
its decoder (the server detokenizes token by token; a Strip eats spaces; export already drops
them, this re-checks). The server ignores the tokenizer's post-processor, so BOS lives in the
chat template of hailo-config.json: export's template (tokenizer_config.json) with
`{{ bos_token }}` replaced by the BOS text, or the BOS text prepended when it has none.

hailo-config.json (keys the genai server reads): `model_name`, `eos_token_id`,
`stop_token_id`, `bos_token_id`, `default_generation_params`, `chat_template`,
`pre_process_params` {`num_attention_heads`, `num_key_value_heads`, `kv_cache_size`,
`prefill_input_tokens_count` (EXACT key: a `_size` variant is silently ignored and the server
falls back to 96)}, `input_layers_names_suffixes` {embeddings, attention_mask, pe_k_cos,
pe_q_cos, pe_k_sin, pe_q_sin -> the HN input layer name within its scope}.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action, write_json
from common.dfc import (
    HW_ARCH,
    INPUT_ROLES,
    client_runner,
    har_member_names,
    import_sdk,
    input_layers,
    json_bytes,
    load_run_config,
    prepare_environment,
    register_acceleras_layers,
    rope_inverse_frequencies,
    sha256_bytes,
    warn_if_fake_sdk,
    write_har,
)

HEFBUILD_PREFIX = "hefbuild/"
ROPE_INPUTS = {  # ONNX input -> (runtime mapping, heads config key)
    "cos_k": ("cos", "num_key_value_heads"),
    "sin_k": ("sin", "num_key_value_heads"),
    "cos_q": ("cos", "num_attention_heads"),
    "sin_q": ("sin", "num_attention_heads"),
}
BOS_VARIABLE = re.compile(r"\{\{-?\s*bos_token\s*-?\}\}")
# Greedy by default: the verify stage compares with a float32 greedy run.
GENERATION_DEFAULTS = {
    "max_new_tokens": 64,
    "do_sample": False,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 1,
    "repetition_penalty": 1.0,
}
# Base checkpoints have no chat template: the messages' text, one per line.
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}{{ item['text'] }}{% endfor %}{% endif %}"
    "{% if not loop.last %}\n{% endif %}"
    "{% endfor %}"
)


def load_reference(export: Path, config: dict[str, Any], stage: str) -> Any:
    import numpy as np

    path = export / "hf_reference.npz"
    try:
        with np.load(path) as ref:
            table = np.asarray(ref["embedding_table"], dtype=np.float32)
    except (OSError, KeyError, ValueError) as exc:
        fail(f"{stage}: cannot read embedding_table from export/hf_reference.npz: {exc}")
    if table.ndim != 2 or table.shape[1] != int(config["hidden_size"]):
        fail(f"{stage}: embedding_table has shape {list(table.shape)}; expected "
             f"[vocab, {config['hidden_size']}]")
    if table.shape[0] < int(config["vocab_size"]):
        fail(f"{stage}: embedding_table has {table.shape[0]} rows < vocab_size "
             f"{config['vocab_size']}")
    return np.ascontiguousarray(table)


def tokenizer_for_hef(export: Path, stage: str) -> tuple[bytes, dict[str, Any]]:
    """tokenizer.json without decoder Strip steps, and tokenizer_config.json (or {})."""
    folder = export / "tokenizer"
    try:
        tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail(f"{stage}: cannot read export/tokenizer/tokenizer.json: {exc}")
    decoder = tok.get("decoder")
    if isinstance(decoder, dict):
        if decoder.get("type") == "Strip":
            tok["decoder"] = None
        elif decoder.get("type") == "Sequence":
            steps = [d for d in decoder.get("decoders", []) if d.get("type") != "Strip"]
            if len(steps) != len(decoder.get("decoders", [])):
                print(f"{stage}: dropped {len(decoder['decoders']) - len(steps)} Strip step(s) "
                      "from the tokenizer decoder")
            tok["decoder"] = dict(decoder, decoders=steps)
    cfg_path = folder / "tokenizer_config.json"
    tok_config: dict[str, Any] = {}
    if cfg_path.is_file():
        try:
            tok_config = json.loads(cfg_path.read_text(encoding="utf-8"))
        except ValueError as exc:
            fail(f"{stage}: export/tokenizer/tokenizer_config.json is not JSON: {exc}")
    data = (json.dumps(tok, ensure_ascii=False, indent=2, sort_keys=True) + "\n").encode()
    return data, tok_config


def token_text(tok_json: bytes, tok_config: dict[str, Any], token_id: int | None) -> str | None:
    if token_id is None:
        return None
    for added in json.loads(tok_json).get("added_tokens", []):
        if added.get("id") == token_id:
            return str(added.get("content"))
    vocab = (json.loads(tok_json).get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        for text, idx in vocab.items():
            if idx == token_id:
                return str(text)
    bos = tok_config.get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    return str(bos) if bos else None


def chat_template(tok_config: dict[str, Any], bos_text: str | None) -> str:
    """export's chat template with `{{ bos_token }}` as literal text, so the server emits it
    whatever variables its template engine defines. Nothing is added: export already decided
    whether BOS belongs there (`common.hailo_tokenizer`)."""
    template = tok_config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"),
                        None)
    if not isinstance(template, str) or not template:
        template = PLAIN_TEMPLATE
    if bos_text:
        template = BOS_VARIABLE.sub(lambda _: bos_text, template)
    return template


def hailo_config(config: dict[str, Any], layers: dict[str, str], template: str) -> dict:
    return {
        "model_name": config["scope"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "stop_token_id": [config["eos_token_id"]],
        "default_generation_params": dict(GENERATION_DEFAULTS),
        "chat_template": template,
        "pre_process_params": {
            "num_attention_heads": int(config["num_attention_heads"]),
            "num_key_value_heads": int(config["num_key_value_heads"]),
            "kv_cache_size": int(config["cache_size"]),
            "prefill_input_tokens_count": int(config["prefill_size"]),
        },
        "input_layers_names_suffixes": {
            INPUT_ROLES[name]: layer.split("/", 1)[-1] for name, layer in layers.items()
        },
    }


def run(action: Action) -> None:
    stage = action.stage
    import_sdk(stage)  # the SDK first, numpy after it: both under the guarded environment
    import numpy as np

    export = action.input_dir("export")
    parsed = action.input_dir("parse") / "parsed.har"
    config = load_run_config(export, stage)
    if not parsed.is_file():
        fail(f"{stage}: parse/parsed.har is missing")
    table = load_reference(export, config, stage)
    tok_json, tok_config = tokenizer_for_hef(export, stage)
    work = Path.cwd()
    warn_if_fake_sdk(stage)
    print(f"{stage}: registered {register_acceleras_layers()} acceleras layer classes")
    runner = client_runner(stage, har=str(parsed), hw_arch=HW_ARCH)
    layers = input_layers(runner.get_hn_dict(), config, stage)

    theta = rope_inverse_frequencies(config["rope_theta"], int(config["head_dim"]))
    mapping = {layers["inputs_embeds"]: "embedding"}
    weights: dict[str, dict[str, Any]] = {layers["inputs_embeds"]: {"embed": table}}
    tiles: dict[str, list[int]] = {}
    for name, (kind, heads_key) in ROPE_INPUTS.items():
        tile = [1, 1, int(config[heads_key])]
        mapping[layers[name]] = kind
        tiles[name] = tile
        weights[layers[name]] = {"theta": theta, "tile": np.array(tile, dtype=np.int32),
                                 "factor": np.array([1.0], dtype=np.float32)}
    runner.add_external_resources({"input_layers_mapping": mapping, "weights": weights})

    bos_text = token_text(tok_json, tok_config, config.get("bos_token_id"))
    cfg = hailo_config(config, layers, chat_template(tok_config, bos_text))
    write_json(action.out / "hailo-config.json", cfg)
    cfg_bytes = (action.out / "hailo-config.json").read_bytes()
    tok_path = work / "tokenizer.json"
    tok_path.write_bytes(tok_json)
    runner.add_external_file("tokenizer.json", str(tok_path))
    runner.add_external_file("hailo-config.json", str(action.out / "hailo-config.json"))

    saved = work / "resources.sdk.har"
    runner.save_har(str(saved))
    lost = sorted(set(har_member_names(parsed)) - set(har_member_names(saved)))
    if lost:
        fail(f"{stage}: the SDK's saved HAR lacks members of parsed.har: {', '.join(lost)}")

    manifest = {
        "scope": config["scope"],
        "input_layers": layers,
        "input_roles": {name: INPUT_ROLES[name] for name in layers},
        "input_layers_mapping": mapping,
        "embedding_table": {"shape": list(table.shape), "dtype": str(table.dtype),
                            "sha256": sha256_bytes(table.tobytes())},
        "rope_theta": float(config["rope_theta"]),
        "rope_theta_table": [float(x) for x in theta],
        "rope_tiles": tiles,
        "rope_inputs_take_positions": True,
        "files": {"tokenizer.json": sha256_bytes(tok_json),
                  "hailo-config.json": sha256_bytes(cfg_bytes)},
    }
    write_har(action.out / "resources.har", [saved], extra={
        f"{HEFBUILD_PREFIX}resources.json": json_bytes(manifest),
        f"{HEFBUILD_PREFIX}hailo-config.json": cfg_bytes,
        f"{HEFBUILD_PREFIX}tokenizer.json": tok_json,
    }, drop_prefix=HEFBUILD_PREFIX)
    pre = cfg["pre_process_params"]
    print(f"{stage}: prefill_input_tokens_count={pre['prefill_input_tokens_count']} "
          f"kv_cache_size={pre['kv_cache_size']}")


def main() -> None:
    action = load_action(sys.argv)
    prepare_environment(action.stage)
    run(action)
    check_outputs(action)


if __name__ == "__main__":
    main()
