"""export (hailo10h): HF checkpoint -> the graph the Hailo DFC parses, plus what later stages need.

Outputs (all byte-deterministic):
- `model.onnx`: our own float32 decoder (`common.hailo_graph`), six inputs, last-position
  logits (`logits`, or `logits_0..N-1` when vocab > shard_vocab), TorchScript exporter,
  opset 17, no constant folding; only ops of `hailo_graph_export.ALLOWED_OPS`.
- `hf_reference.npz`: the gate's reference: `input_ids` [1, seq] int64 (left-padded),
  the six arrays fed to ONNX Runtime, `last_logits` [vocab] float32 (transformers, eager,
  float32, on the unpadded ids), `embedding_table` [vocab, hidden] float32, `pad_id`,
  `last_position` (index in the padded arrays of the last real token: always seq-1),
  `n_real` (real tokens). Padding convention: `common.hailo_inputs`.
- `tokenizer/`: prepared for the genai server (`common.hailo_tokenizer`).
- `export_report.json`: gate figures (cosine, max abs diff, same argmax, ...), graph facts.
- `run_config.json`: architecture constants for later stages. Keys:
    architecture           HF model_type (llama, mistral, qwen2, qwen3)
    hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
    head_dim (explicit config value when present), num_hidden_layers, rope_theta, rms_norm_eps
    vocab_size             rows of embedding / lm_head (the model's, may exceed the tokenizer's)
    tokenizer_vocab_size   ids the tokenizer can produce
    sliding_window         window every layer uses (the host mask applies it), or null
    qk_norm                true when the graph holds per-head QK RMSNorm (Qwen3)
    lm_head_shards         N outputs; shard_vocab: rows per shard (last shard may be shorter)
    seq_len, prefill_size, cache_size, scope   the stage parameters
    bos_token_id, eos_token_id, pad_token_id   (pad falls back to eos, then 0, when unset)
    mask_value             the additive value of a blocked mask entry (0 = attend)
    padding                "left": prompts are left-padded, the graph reads position seq-1
    inputs / outputs       {name: shape} in graph order (input_names / output_names: the order)
    onnx_opset             17
    layer_names            ONNX MatMul node names: {q_proj, k_proj, v_proj, o_proj, gate_proj,
                           up_proj, down_proj: [one per layer], lm_head: [one per shard]}

Memory (peak RSS within 2x the float32 checkpoint: SmolLM2-135M 1.90x, of which about 0.75x is
the process with torch and transformers loaded; Qwen2.5-Coder-0.5B 1.24x): the weights are held
once, by the transformers model (a memory map of the safetensors), and never copied whole:
- `HailoDecoder`'s parameters are views of the model's tensors (a projection's [in, out] is
  the transposed view of HF's [out, in]);
- the TorchScript exporter, which copies every constant it is shown several times over, is
  shown none: every tensor of the module is passed to its forward as an argument, so it is a
  graph input, and the graph is exported alone (`hailo_graph_export.traced_graph`);
- those inputs become the initializers the exporter would have written (same names, order and
  [in, out] layout), their data streamed to disk a tensor at a time, a transposed view made
  contiguous 16 MiB at a time; the torch side (module, model) is freed, the reference's
  `hf_reference.npz` having already been written to the work folder (its embedding table is a
  view into the model's memory map), and the file is written from the streamed data;
- the checker and ONNX Runtime get views of the file whose initializers refer into it
  (external data): the checker reads no tensor, and the gate's session, without prepacking or
  constant folding, maps the file's pages instead of copying them (`ort_logits`).
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from common.action import Action, check_outputs, fail, load_action, round_sig, write_json
from common.checkpoint import load_checkpoint
from common.determinism import pin_torch
from common.digest import sha256_file
from common.onnx_file import load_lazily

# Fixed relative name: the traced file must not depend on the (fresh) scratch path.
EXPORT_PATH = Path("export_work") / "model.onnx"
VIEW_PATH = EXPORT_PATH.parent / "view.onnx"  # the graph, its initializers external in EXPORT_PATH
REFERENCE_PATH = EXPORT_PATH.parent / "hf_reference.npz"
SEED = 0


def special_ids(tok: Any, config: Any) -> dict[str, int | None]:
    bos = tok.bos_token_id if tok.bos_token_id is not None else config.bos_token_id
    eos = tok.eos_token_id if tok.eos_token_id is not None else config.eos_token_id
    if isinstance(eos, list):
        eos = eos[0]
    pad = tok.pad_token_id
    if pad is None:
        pad = eos if eos is not None else 0
    return {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": int(pad)}


def reference(action: Action, tok: Any, model: Any, spec: Any, pad_id: int) -> dict[str, Any]:
    """Arrays of hf_reference.npz: left-padded ids, graph inputs, HF last logits, table."""
    import numpy as np
    from common.hailo_graph_export import hf_last_logits
    from common.hailo_inputs import graph_inputs, left_pad

    text = str(action.params.get("reference_text", ""))
    ids = tok(text).input_ids
    if not ids:
        fail("export: reference_text tokenizes to zero tokens")
    padded, n_real = left_pad(ids, spec.seq_len, pad_id)
    table = model.get_input_embeddings().weight.detach().float().numpy()
    feeds = graph_inputs(
        padded,
        n_real,
        table,
        n_heads=spec.num_attention_heads,
        n_kv_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        rope_theta=spec.rope_theta,
        sliding_window=spec.sliding_window,
    )
    return {
        **feeds,
        "input_ids": padded[None],
        "last_logits": hf_last_logits(model, padded[spec.seq_len - n_real :]),
        "embedding_table": np.ascontiguousarray(table, dtype=np.float32),
        "pad_id": np.array(pad_id, dtype=np.int64),
        "last_position": np.array(spec.seq_len - 1, dtype=np.int64),
        "n_real": np.array(n_real, dtype=np.int64),
    }


def run_config(
    action: Action, spec: Any, ids: dict[str, Any], tok: Any, layer_names: dict[str, list[str]]
) -> dict[str, Any]:
    from common.hailo_graph_export import OPSET
    from common.hailo_inputs import MASK_BLOCKED

    data = {
        "architecture": spec.architecture,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "num_hidden_layers": spec.num_hidden_layers,
        "rope_theta": spec.rope_theta,
        "rms_norm_eps": spec.rms_norm_eps,
        "vocab_size": spec.vocab_size,
        "tokenizer_vocab_size": len(tok),
        "sliding_window": spec.sliding_window,
        "qk_norm": spec.qk_norm,
        "lm_head_shards": len(spec.shard_sizes),
        "shard_vocab": spec.shard_vocab,
        "seq_len": spec.seq_len,
        "prefill_size": int(action.params.get("prefill_size", 32)),
        "cache_size": int(action.params.get("cache_size", 128)),
        "scope": str(action.params.get("scope", "model")),
        **ids,
        "mask_value": MASK_BLOCKED,
        "padding": "left",
        "inputs": spec.input_shapes,
        "input_names": list(spec.input_shapes),
        "outputs": spec.output_shapes,
        "output_names": spec.output_names,
        "onnx_opset": OPSET,
        "layer_names": layer_names,
    }
    return {key: data[key] for key in sorted(data)}


def write_ordered_json(path: Path, data: dict[str, Any]) -> None:
    """Keys as given (already sorted at the top; `inputs`/`outputs` keep graph order)."""
    text = json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")


def check_sizes(action: Action) -> tuple[int, int]:
    seq = int(action.params.get("seq_len", 128))
    prefill, cache = (
        int(action.params.get("prefill_size", 32)),
        int(action.params.get("cache_size", 128)),
    )
    if prefill > seq:
        fail(f"export: prefill_size {prefill} > seq_len {seq}")
    if cache < seq:
        fail(f"export: cache_size {cache} < seq_len {seq}")
    return seq, int(action.params.get("shard_vocab", 32000))


def main() -> None:
    action = load_action(sys.argv)
    seq, shard_vocab = check_sizes(action)
    cosine_min = float(action.params.get("cosine_min", 0.999))
    pin_torch(SEED)

    import onnx
    from common.hailo_graph import HailoDecoder
    from common.hailo_graph_export import (
        gate,
        graph_problems,
        ort_logits,
        projection_nodes,
        torch_logits,
        traced_graph,
        write_inline,
    )
    from common.hailo_graph_spec import UnsupportedModel, spec_from_config
    from common.hailo_inputs import INPUT_NAMES, save_npz
    from common.hailo_tokenizer import prepare_tokenizer

    ckpt = action.input_dir("fetch") / "checkpoint"
    tok, model = load_checkpoint(ckpt)
    try:
        spec = spec_from_config(model.config, seq, shard_vocab)
        module = HailoDecoder(spec, model).eval()
    except UnsupportedModel as exc:
        fail(f"export: unsupported model: {exc}")
    ids = special_ids(tok, model.config)
    ref = reference(action, tok, model, spec, ids["pad_token_id"])
    # Written now, so that no view of the embedding table keeps the checkpoint's memory map
    # (the model's weights) alive once the torch side is done; moved to out/ at the end.
    EXPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    save_npz(str(REFERENCE_PATH), ref)
    del ref["embedding_table"]
    print(
        f"exporting {action.model}: {spec.architecture}, {spec.num_hidden_layers} layers, "
        f"{len(spec.shard_sizes)} lm_head shard(s), seq {seq}, {int(ref['n_real'])} real "
        "reference tokens (left-padded)",
        flush=True,
    )

    feeds = {name: ref[name] for name in INPUT_NAMES}
    module_gate = gate(ref["last_logits"], torch_logits(module, feeds), cosine_min)
    traced = traced_graph(module, EXPORT_PATH)
    # The torch side is done: its weights go before the file is written and ONNX Runtime
    # maps it.
    del module, model
    gc.collect()
    write_inline(traced, EXPORT_PATH)
    graph = load_lazily(EXPORT_PATH, EXPORT_PATH.parent)  # the graph, weights left on disk
    # By path, as a view whose initializers refer into the file: the checker finds the data
    # there and reads none of it (given the file itself, it would parse every tensor).
    onnx.save(graph, str(VIEW_PATH))
    onnx.checker.check_model(str(VIEW_PATH))
    problems = graph_problems(graph, spec)
    if problems:
        fail(f"export: graph breaks the Hailo contract: {'; '.join(problems)}")
    try:
        layer_names = projection_nodes(graph, spec)
    except UnsupportedModel as exc:
        fail(f"export: {exc}")

    result = gate(ref["last_logits"], ort_logits(EXPORT_PATH, feeds), cosine_min)
    if result.cosine != result.cosine:  # NaN: the graph produced non-finite logits
        fail("export gate failed: ONNX Runtime logits are not finite")
    print(
        f"cosine {round_sig(result.cosine, 8)} (min {cosine_min}), max abs diff "
        f"{round_sig(result.max_abs_diff)}, torch module cosine "
        f"{round_sig(module_gate.cosine, 8)}",
        flush=True,
    )
    if not result.passed:
        fail(f"export gate failed: cosine {round_sig(result.cosine, 8)} < cosine_min {cosine_min}")

    onnx_digest, onnx_size = sha256_file(EXPORT_PATH), EXPORT_PATH.stat().st_size
    shutil.move(str(EXPORT_PATH), action.out / "model.onnx")
    shutil.move(str(REFERENCE_PATH), action.out / "hf_reference.npz")
    try:
        tok_changes = prepare_tokenizer(ckpt, action.out / "tokenizer",
                                        chat=bool(action.params.get("chat", False)))
    except (OSError, ValueError) as exc:
        fail(f"export: cannot prepare the tokenizer: {exc}")
    write_ordered_json(
        action.out / "run_config.json", run_config(action, spec, ids, tok, layer_names)
    )
    write_json(
        action.out / "export_report.json",
        {
            "model": action.model,
            "architecture": spec.architecture,
            "reference_text": str(action.params.get("reference_text", "")),
            "reference_tokens": int(ref["n_real"]),
            "seq_len": seq,
            "cosine": round_sig(result.cosine, 8),
            "cosine_min": cosine_min,
            "max_abs_diff": round_sig(result.max_abs_diff),
            "same_argmax": result.same_argmax,
            "torch_module_cosine": round_sig(module_gate.cosine, 8),
            "ops": sorted({n.op_type for n in graph.graph.node}),
            "nodes": len(graph.graph.node),
            "onnx_sha256": onnx_digest,
            "onnx_bytes": onnx_size,
            "lm_head_shards": len(spec.shard_sizes),
            "tokenizer": tok_changes,
            "passed": result.passed,
        },
    )
    check_outputs(action)


if __name__ == "__main__":
    main()
