"""Which precision the fidelity stage's CPU emulation gives each ONNX node and graph input:
the recipe's `quantization_param` lines (`common.hailo_precision`) mapped through the quantized
HAR's graph, every layer no line names at the DFC default, and the report's account of every
line (`unmatched`, `unmapped`, `output_only`, `unsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.dfc import hn_of_har
from common.hailo_precision import DEFAULT, Precision, base_layers, onnx_names, parse, resolve


@dataclass
class Plan:
    """What the emulation quantizes how, and the report's account of it."""

    nodes: dict[str, Precision]  # ONNX node -> its layer's precision (absent: DEFAULT)
    input_bits: dict[str, int]  # graph input -> its input layer's activation bits
    account: dict[str, Any] = field(default_factory=dict)
    mapping: dict[str, list[str]] = field(default_factory=dict)  # DFC layer -> ONNX names

    @property
    def mapped(self) -> set[str]:
        """ONNX nodes and graph inputs some DFC layer maps to."""
        return {name for names in self.mapping.values() for name in names}

    def bits(self, graph: Any, nodes: dict[str, Precision] | None = None
             ) -> tuple[dict[str, int], dict[str, int]]:
        """`tensor_bits` of the plan (or of `nodes` in place of its own)."""
        from common.qdq_emulation import tensor_bits

        return tensor_bits(graph, self.nodes if nodes is None else nodes, self.input_bits,
                           self.mapped)


def plan_precisions(script: str, hn: dict[str, Any] | None, config: dict[str, Any],
                    graph: Any) -> Plan:
    scope = str(config["scope"])
    lines = parse(script)
    layers = base_layers(hn, scope) if hn is not None else {}
    resolved = resolve(lines, layers, scope)
    mapping, how = onnx_names(layers, graph.constant, graph.inputs)
    plan = Plan({}, dict.fromkeys(graph.inputs, DEFAULT.activation_bits), mapping=mapping)
    unmapped, output_only = apply(plan, resolved.layers, mapping, graph)
    plan.account = {
        "default": DEFAULT.name,
        "mapping": how,
        "script_lines": len(lines),
        "input_bits": dict(plan.input_bits),
        "matmuls": _count(plan.nodes.get(n, DEFAULT).name for n in graph.names),
        "by_kind": by_kind(plan, graph, config.get("layer_names") or {}),
        "overrides": {n: plan.nodes[n].name for n in sorted(plan.nodes)
                      if n in graph.weights and plan.nodes[n] != DEFAULT},
        "unmatched": sorted(set(resolved.unmatched)),
        "unmapped": unmapped,
        "output_only": output_only,
        "unsupported": resolved.unsupported,
    }
    return plan


def apply(plan: Plan, layers: dict[str, Precision], mapping: dict[str, list[str]],
          graph: Any) -> tuple[list[str], list[str]]:
    """Give each layer's ONNX nodes its precision; return the layers with no ONNX node, and
    those with neither a MatMul nor a graph input among them (only what they write into a
    MatMul is emulated)."""
    emulated = set(graph.names) | set(graph.inputs)
    unmapped, output_only = [], []
    for layer, precision in sorted(layers.items()):
        targets = mapping.get(layer) or []
        if not targets:
            unmapped.append(layer)
        elif not emulated & set(targets):
            output_only.append(layer)
        for name in targets:
            _assign(plan, name, precision)
    return unmapped, output_only


def _assign(plan: Plan, name: str, precision: Precision) -> None:
    """Two layers claiming one node (not expected) leave it the fewer bits of each kind."""
    if name in plan.input_bits:
        plan.input_bits[name] = precision.activation_bits
        return
    old = plan.nodes.get(name, precision)
    plan.nodes[name] = Precision(min(old.activation_bits, precision.activation_bits),
                                 min(old.weight_bits, precision.weight_bits))


def by_kind(plan: Plan, graph: Any, layer_names: dict[str, list[str]]) -> dict[str, Any]:
    """Precision counts per projection kind of run_config's layer_names ("other": the rest:
    RoPE and key/value-repeat helpers, attention scores, row selection)."""
    kind_of = {n: kind for kind, names in layer_names.items() for n in names}
    kinds: dict[str, list[str]] = {}
    for node in graph.names:
        kinds.setdefault(kind_of.get(node, "other"), []).append(
            plan.nodes.get(node, DEFAULT).name)
    return {k: _count(v) for k, v in sorted(kinds.items())}


def _count(names: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def read_hn(har: Path) -> dict[str, Any] | None:
    try:
        return hn_of_har(har)
    except (OSError, KeyError, ValueError) as exc:
        print(f"fidelity: WARNING: cannot read the graph of {har.name} ({exc}); no recipe "
              "line can be mapped, every layer is emulated at the default a8_w8")
        return None
