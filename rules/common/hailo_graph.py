"""The Hailo-10H graph: our own float32 torch decoder built from a Hugging Face causal LM's
weights, written only with ops the DFC parser accepts (the sizes it is built for:
`common.hailo_graph_spec`; its export and its checks: `common.hailo_graph_export`).

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

The module copies no weight: each parameter is a view of the HF model's tensor (a projection's
[in, out] is the transposed view of HF's [out, in]), so the two together take the checkpoint's
size once. Its forward also takes every tensor of its state_dict as arguments after the six
inputs (`graph_tensors` names them, in order); given, they stand in for its own, which is how
the export traces them as graph inputs instead of serializing them (`common.hailo_graph_export`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from common.hailo_graph_spec import GraphSpec, UnsupportedModel

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


def _view(tensor: torch.Tensor) -> nn.Parameter:
    """A parameter sharing the tensor's storage (float32 checkpoints: `.float()` copies nothing)."""
    return nn.Parameter(tensor.detach().float(), requires_grad=False)


class Projection(nn.Module):
    """y = x @ W (+ b) with W stored as [in, out]: the MatMul reads the initializer directly
    (nn.Linear would add a Transpose of the weight, which constant folding is off to remove).
    W is HF's [out, in] weight transposed as a view; the export writes it out [in, out]."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = _view(weight.t())
        self.bias = None if bias is None else _view(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


def _projection(src: nn.Linear) -> Projection:
    return Projection(src.weight, src.bias)


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = _view(weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = (x * x).mean(-1, keepdim=True)
        return x / torch.sqrt(var + self.eps) * self.weight


class HeadNorm(nn.Module):
    """Qwen3 QK-norm: RMSNorm over each head's head_dim, via a segment-mean matrix."""

    def __init__(self, weight: torch.Tensor, eps: float, heads: int) -> None:
        super().__init__()
        self.weight = _view(weight.repeat(heads))  # the one copy: [heads * hd]
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
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """Last-position logits; `tensors`, when given, stand in for `graph_tensors(self)`."""
        inputs = (inputs_embeds, attention_mask, cos_k, sin_k, cos_q, sin_q)
        if not tensors:
            return self._logits(*inputs)
        with standing_in(self, dict(zip(graph_tensors(self), tensors, strict=True))):
            return self._logits(*inputs)

    def _logits(
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


# ---------------------------------------------------------------- tensors as arguments


def graph_tensors(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer the graph reads, by state_dict name, in state_dict order:
    the names and order of the exported initializers."""
    return {name: t.detach() for name, t in module.state_dict(keep_vars=True).items()}


@contextmanager
def standing_in(module: nn.Module, tensors: dict[str, torch.Tensor]) -> Iterator[None]:
    """The given tensors replace the module's parameters and buffers of the same names while
    the block runs (torch.func.functional_call would, but refuses to run under the tracer;
    the slots are written directly because setattr only takes Parameters)."""
    saved = []
    for name, tensor in tensors.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        slots = owner._parameters if attr in owner._parameters else owner._buffers
        saved.append((slots, attr, slots[attr]))
        slots[attr] = tensor
    try:
        yield
    finally:
        for slots, attr, tensor in saved:
            slots[attr] = tensor
