"""What the Hailo-10H graph (`common.hailo_graph`) is built for: a checkpoint's config read
into the sizes of the exported graph's inputs and outputs, and every config feature the graph
does not express refused with `UnsupportedModel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from common.hailo_inputs import INPUT_NAMES

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")


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
