"""The Hailo-10H graph: our own float32 torch decoder built from a Hugging Face causal LM's
weights, written only with ops the DFC parser accepts, plus its export and its checks.

Graph contract (interface in `common.hailo_inputs`): six inputs, logits of the last position
only, `[1, 1, vocab]` as `logits`, or, when vocab > shard_vocab, N = ceil(vocab/shard_vocab)
outputs `logits_0..logits_{N-1}` of `[1, 1, slice]`, each with its own last-position selection,
final norm and lm_head slice (the DFC post-fuser fails at fan-out >= 3 on a shared chain).

How each piece is expressed (every constant is an initializer, never an op):
- rotate-half: `x @ R`, R block-diagonal with one [[0, I], [-I, 0]] block per head;
- GQA key/value repeat: `k @ G`, G [kv*hd, heads*hd] copies kv head h // (heads/kv) to head h;
- RMSNorm: x / sqrt(mean(x*x) + eps) * w; the per-head QK-norm of Qwen3 takes the mean per
  head as `(x*x) @ S`, S block-diagonal with blocks of 1/head_dim (a segment mean);
- last position: `e @ x`, e a constant [1, 1, seq] one-hot row on seq-1 (no Gather/Slice),
  then the final norm on that one row (per-position, so the order does not change the result);
  each shard has its own e, norm and lm_head slice (`/last.i/`, `/norm.i/`, `/lm_head.i/`);
- attention: per-head [1, heads, seq, seq] scores; the tiled mask input is reshaped/transposed
  to that layout once at the top of the graph; SiLU as x * sigmoid(x).
Node names follow the HF module names (`/layers.0/self_attn/q_proj/MatMul`, `/lm_head.0/MatMul`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from common.hailo_inputs import INPUT_NAMES

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
OPSET = 17
# Every op the exported graph may contain; anything else (Expand, Gather, Slice, Concat, Where,
# Shape, ...) fails the export stage.
ALLOWED_OPS = frozenset(
    {
        "MatMul",
        "Add",
        "Mul",
        "Div",
        "Sqrt",
        "ReduceMean",
        "Softmax",
        "Reshape",
        "Transpose",
        "Sigmoid",
        "Constant",
    }
)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class UnsupportedModel(ValueError):
    """The checkpoint uses a feature this graph does not express."""


@dataclass(frozen=True)
class GraphSpec:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    rope_theta: float
    rms_norm_eps: float
    vocab_size: int
    sliding_window: int | None
    qk_norm: bool
    seq_len: int
    shard_vocab: int

    @property
    def shard_sizes(self) -> list[int]:
        n = math.ceil(self.vocab_size / self.shard_vocab)
        return [min(self.shard_vocab, self.vocab_size - i * self.shard_vocab) for i in range(n)]

    @property
    def output_names(self) -> list[str]:
        n = len(self.shard_sizes)
        return ["logits"] if n == 1 else [f"logits_{i}" for i in range(n)]

    @property
    def input_shapes(self) -> dict[str, list[int]]:
        s, hd = self.seq_len, self.head_dim
        kv, q = hd * self.num_key_value_heads, hd * self.num_attention_heads
        shapes = (
            [1, s, self.hidden_size],
            [1, 1, s, self.num_attention_heads * s],
            [1, s, kv],
            [1, s, kv],
            [1, s, q],
            [1, s, q],
        )
        return dict(zip(INPUT_NAMES, (list(x) for x in shapes), strict=True))

    @property
    def output_shapes(self) -> dict[str, list[int]]:
        return {n: [1, 1, v] for n, v in zip(self.output_names, self.shard_sizes, strict=True)}


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise UnsupportedModel(f"rope_type {rope_type!r} (only the default RoPE is expressed)")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise UnsupportedModel("config has no rope_theta")
    return float(theta)


def _sliding_window(config: Any) -> int | None:
    """The one window every layer uses, or None; mixed full/sliding layers are not expressed."""
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = getattr(config, "layer_types", None)
    if types is None or all(t == "sliding_attention" for t in types):
        return int(window)
    if all(t == "full_attention" for t in types):
        return None
    raise UnsupportedModel("mixed full/sliding attention layers (one mask input for all layers)")


def spec_from_config(config: Any, seq_len: int, shard_vocab: int) -> GraphSpec:
    arch = str(config.model_type)
    if arch not in SUPPORTED:
        raise UnsupportedModel(f"architecture {arch!r} is not one of {list(SUPPORTED)}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act {config.hidden_act!r} (only silu is expressed)")
    heads = int(config.num_attention_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return GraphSpec(
        architecture=arch,
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        num_hidden_layers=int(config.num_hidden_layers),
        rope_theta=_rope_theta(config),
        rms_norm_eps=float(config.rms_norm_eps),
        vocab_size=int(config.vocab_size),
        sliding_window=_sliding_window(config),
        qk_norm=arch == "qwen3",
        seq_len=int(seq_len),
        shard_vocab=int(shard_vocab),
    )


# ---------------------------------------------------------------- constant matrices


def rotate_half_matrix(head_dim: int, heads: int) -> torch.Tensor:
    """R with x @ R == rotate_half(x) per head: cat(-x2, x1)."""
    half = head_dim // 2
    block = np.zeros((head_dim, head_dim), dtype=np.float32)
    block[np.arange(half) + half, np.arange(half)] = -1.0
    block[np.arange(half), np.arange(half) + half] = 1.0
    return torch.from_numpy(np.kron(np.eye(heads, dtype=np.float32), block))


def kv_repeat_matrix(head_dim: int, kv_heads: int, heads: int) -> torch.Tensor:
    """G with (k @ G)[head h] == k[kv head h // (heads / kv_heads)]."""
    group = heads // kv_heads
    select = np.zeros((kv_heads, heads), dtype=np.float32)
    select[np.arange(heads) // group, np.arange(heads)] = 1.0
    return torch.from_numpy(np.kron(select, np.eye(head_dim, dtype=np.float32)))


def segment_mean_matrix(head_dim: int, heads: int) -> torch.Tensor:
    """S with (x @ S)[i] == mean of x over the head that holds column i."""
    block = np.full((head_dim, head_dim), 1.0 / head_dim, dtype=np.float32)
    return torch.from_numpy(np.kron(np.eye(heads, dtype=np.float32), block))


def last_position_selector(seq: int) -> torch.Tensor:
    row = np.zeros((1, 1, seq), dtype=np.float32)
    row[0, 0, seq - 1] = 1.0
    return torch.from_numpy(row)


# ---------------------------------------------------------------- modules


class Projection(nn.Module):
    """y = x @ W (+ b) with W stored as [in, out]: the MatMul reads the initializer directly
    (nn.Linear would add a Transpose of the weight, which constant folding is off to remove)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().float().t().contiguous())
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


def _projection(src: nn.Linear) -> Projection:
    return Projection(src.weight, src.bias)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().float().clone())
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = (x * x).mean(-1, keepdim=True)
        return x / torch.sqrt(var + self.eps) * self.weight


class HeadNorm(nn.Module):
    """Qwen3 QK-norm: RMSNorm over each head's head_dim, via a segment-mean matrix."""

    def __init__(self, weight: torch.Tensor, eps: float, heads: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().float().clone().repeat(heads))
        self.eps = eps

    def forward(self, x: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        return x / torch.sqrt((x * x) @ seg + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, spec: GraphSpec, hf: Any) -> None:
        super().__init__()
        self.spec = spec
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, _projection(getattr(hf, name)))
        if spec.qk_norm:
            eps = spec.rms_norm_eps
            self.q_norm = HeadNorm(hf.q_norm.weight, eps, spec.num_attention_heads)
            self.k_norm = HeadNorm(hf.k_norm.weight, eps, spec.num_key_value_heads)
        self.scale = spec.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        rope: dict[str, torch.Tensor],
        const: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        s, heads, hd = self.spec.seq_len, self.spec.num_attention_heads, self.spec.head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if self.spec.qk_norm:
            q, k = self.q_norm(q, const["seg_q"]), self.k_norm(k, const["seg_k"])
        q = q * rope["cos_q"] + (q @ const["rot_q"]) * rope["sin_q"]
        k = k * rope["cos_k"] + (k @ const["rot_k"]) * rope["sin_k"]
        if "kv_repeat" in const:
            k, v = k @ const["kv_repeat"], v @ const["kv_repeat"]
        qh = q.reshape(1, s, heads, hd).transpose(1, 2)
        kh = k.reshape(1, s, heads, hd).permute(0, 2, 3, 1)
        vh = v.reshape(1, s, heads, hd).transpose(1, 2)
        probs = torch.softmax((qh @ kh) * self.scale + mask, dim=-1)
        return self.o_proj((probs @ vh).transpose(1, 2).reshape(1, s, heads * hd))


class MLP(nn.Module):
    def __init__(self, hf: Any) -> None:
        super().__init__()
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, name, _projection(getattr(hf, name)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj(x)
        return self.down_proj(gate * torch.sigmoid(gate) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, spec: GraphSpec, hf: Any) -> None:
        super().__init__()
        eps = spec.rms_norm_eps
        self.input_layernorm = RMSNorm(hf.input_layernorm.weight, eps)
        self.self_attn = Attention(spec, hf.self_attn)
        self.post_attention_layernorm = RMSNorm(hf.post_attention_layernorm.weight, eps)
        self.mlp = MLP(hf.mlp)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor,
        rope: dict[str, torch.Tensor],
        const: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), mask, rope, const)
        return x + self.mlp(self.post_attention_layernorm(x))


class LastPosition(nn.Module):
    """[1, seq, hidden] -> [1, 1, hidden]: the last row, as a MatMul by a constant one-hot."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.register_buffer("row", last_position_selector(seq))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.row @ x


class HailoDecoder(nn.Module):
    """(inputs_embeds, attention_mask, cos_k, sin_k, cos_q, sin_q) -> last-position logits."""

    def __init__(self, spec: GraphSpec, hf_model: Any) -> None:
        super().__init__()
        self.spec = spec
        hd, heads, kv = spec.head_dim, spec.num_attention_heads, spec.num_key_value_heads
        if heads % kv:
            raise UnsupportedModel(f"{heads} heads are not a multiple of {kv} kv heads")
        self.register_buffer("rot_q", rotate_half_matrix(hd, heads))
        self.register_buffer("rot_k", rotate_half_matrix(hd, kv))
        if kv != heads:
            self.register_buffer("kv_repeat", kv_repeat_matrix(hd, kv, heads))
        if spec.qk_norm:
            self.register_buffer("seg_q", segment_mean_matrix(hd, heads))
            self.register_buffer("seg_k", segment_mean_matrix(hd, kv))
        # One selector per shard (distinct initializers): with a shared one, the tracer's
        # common-subexpression pass merges the shards' selection and norm back into one chain.
        self.last = nn.ModuleList(LastPosition(spec.seq_len) for _ in spec.shard_sizes)
        inner = hf_model.model
        self.layers = nn.ModuleList(Block(spec, layer) for layer in inner.layers)
        final = inner.norm.weight
        # One final norm + lm_head slice per shard: independent chains, no shared fan-out.
        self.norm = nn.ModuleList(RMSNorm(final, spec.rms_norm_eps) for _ in spec.shard_sizes)
        head = hf_model.lm_head.weight.detach().float()
        self.lm_head = nn.ModuleList()
        start = 0
        for size in spec.shard_sizes:
            self.lm_head.append(Projection(head[start : start + size]))
            start += size

    def _constants(self) -> dict[str, torch.Tensor]:
        names = ("rot_q", "rot_k", "kv_repeat", "seg_q", "seg_k")
        return {n: getattr(self, n) for n in names if hasattr(self, n)}

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        attention_mask: torch.Tensor,
        cos_k: torch.Tensor,
        sin_k: torch.Tensor,
        cos_q: torch.Tensor,
        sin_q: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        s, heads = self.spec.seq_len, self.spec.num_attention_heads
        mask = attention_mask.reshape(1, s, heads, s).transpose(1, 2)
        rope = {"cos_k": cos_k, "sin_k": sin_k, "cos_q": cos_q, "sin_q": sin_q}
        const = self._constants()
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, mask, rope, const)
        chains = zip(self.last, self.norm, self.lm_head, strict=True)
        return tuple(head(norm(last(x))) for last, norm, head in chains)


# ---------------------------------------------------------------- export and checks


def export_onnx(module: HailoDecoder, path: Path) -> None:
    """TorchScript exporter, opset 17, no constant folding (the contract's settings)."""
    sample = tuple(torch.zeros(shape) for shape in module.spec.input_shapes.values())
    path.parent.mkdir(parents=True, exist_ok=True)
    # Traced in training mode (the graph has no dropout or batch norm, so nothing else changes):
    # in eval mode the exporter merges initializers with equal VALUES (e.g. norm weights that
    # are all ones) and reads the copies through Identity nodes.
    module.train()
    try:
        with torch.no_grad():
            torch.onnx.export(
                module,
                sample,
                str(path),
                dynamo=False,
                opset_version=OPSET,
                input_names=list(INPUT_NAMES),
                output_names=module.spec.output_names,
                do_constant_folding=False,
                training=torch.onnx.TrainingMode.PRESERVE,
            )
    finally:
        module.eval()


def _dims(value_info: Any) -> list[int | str]:
    return [
        d.dim_value if d.HasField("dim_value") else d.dim_param
        for d in value_info.type.tensor_type.shape.dim
    ]


def graph_problems(model: Any, spec: GraphSpec) -> list[str]:
    """Everything wrong with an exported graph's interface and op set (empty when it is fine)."""
    problems = []
    inputs = {i.name: _dims(i) for i in model.graph.input}
    if inputs != spec.input_shapes or list(inputs) != list(INPUT_NAMES):
        problems.append(f"inputs {inputs} != {spec.input_shapes}")
    outputs = {o.name: _dims(o) for o in model.graph.output}
    if outputs != spec.output_shapes or list(outputs) != spec.output_names:
        problems.append(f"outputs {outputs} != {spec.output_shapes}")
    ops = sorted({n.op_type for n in model.graph.node})
    bad = [op for op in ops if op not in ALLOWED_OPS]
    if bad:
        problems.append(f"ops outside the allow-list: {bad}")
    return problems


def projection_nodes(model: Any, spec: GraphSpec) -> dict[str, list[str]]:
    """ONNX node names of the big MatMuls, per projection kind in layer order, and lm_head."""
    names = {n.name for n in model.graph.node if n.op_type == "MatMul"}
    found: dict[str, list[str]] = {}
    for proj in PROJECTIONS:
        block = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        found[proj] = [f"/layers.{i}/{block}/{proj}/MatMul" for i in range(spec.num_hidden_layers)]
    found["lm_head"] = [f"/lm_head.{i}/MatMul" for i in range(len(spec.shard_sizes))]
    missing = [n for group in found.values() for n in group if n not in names]
    if missing:
        raise UnsupportedModel(f"expected projection nodes missing from the graph: {missing[:3]}")
    return found


def ort_logits(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """Run the graph on ONNX Runtime (CPU, one thread); all shards joined: [vocab] float32."""
    from common.determinism import ort_session

    session = ort_session(str(path))
    outs = session.run(None, {name: feeds[name] for name in INPUT_NAMES})
    return np.concatenate([o.reshape(-1) for o in outs]).astype(np.float32)


def torch_logits(module: HailoDecoder, feeds: dict[str, np.ndarray]) -> np.ndarray:
    with torch.no_grad():
        outs = module(*(torch.from_numpy(feeds[name]) for name in INPUT_NAMES))
    return torch.cat([o.reshape(-1) for o in outs]).numpy().astype(np.float32)


def hf_last_logits(hf_model: Any, real_ids: np.ndarray) -> np.ndarray:
    """The reference: transformers' own forward on the real (unpadded) ids, last position."""
    ids = torch.from_numpy(np.asarray(real_ids, dtype=np.int64)).reshape(1, -1)
    with torch.no_grad():
        out = hf_model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0, -1].float().numpy()


@dataclass(frozen=True)
class Gate:
    cosine: float
    max_abs_diff: float
    same_argmax: bool
    cosine_min: float

    @property
    def passed(self) -> bool:
        return self.cosine >= self.cosine_min


def gate(reference: np.ndarray, candidate: np.ndarray, cosine_min: float) -> Gate:
    a, b = reference.astype(np.float64).ravel(), candidate.astype(np.float64).ravel()
    if a.shape != b.shape:
        return Gate(float("-inf"), float("inf"), False, cosine_min)
    denom = max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-30)
    return Gate(
        float(a @ b / denom), float(np.abs(a - b).max()), bool(a.argmax() == b.argmax()), cosine_min
    )
