"""What each layer group's precisions cost the model, in the fidelity stage's emulation: per
layer group (a decoder layer's projections, run_config's `layer_names` by index; the lm_head
on its own), two measurements on the first calibration rows, each against the float32 graph
(logit cosine, top-1 agreement), everything else float32:

- weights: only the group's MatMul weights at the recipe's wY (symmetric per output channel);
- activations: only the group's activation tensors at the recipe's aX (per tensor, MinMax over
  the calibration rows): those whose bits an a16 line for the group would raise (`Reach`):
  what its projections write, what they read from the layers that write it when the HN maps
  them (norms, the MLP's product), else from ops no layer maps to (`tensor_bits`).

A measurement whose tensors are all at 16 bits already is left out (nothing to promote). The
table ranks what a `precision_mode` line can change, costliest first, for the proposal
(`common.hailo_fidelity_proposal`). One ONNX Runtime session per measurement, over export's
mapped weights; rounded weights are handed to it (`add_initializer`), the file is not
rewritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.action import round_sig
from common.compare import argmax, cosine
from common.hailo_fidelity_graphs import Export
from common.hailo_fidelity_plan import Plan
from common.hailo_precision import DEFAULT, Precision, natural_order
from common.qdq_emulation import Quant, fake_quantize, with_fake_quant


@dataclass(frozen=True)
class Group:
    name: str  # "layer 3", "lm_head"
    nodes: tuple[str, ...]  # its projections: MatMul nodes with a constant weight
    scoped: tuple[str, ...] = ()  # other weighted MatMuls in its scope (RoPE, kv repeat)


def layer_groups(layer_names: dict[str, list[str]], weighted: list[str]) -> list[Group]:
    """Decoder layers by index across the projection kinds, then the lm_head's shards. A
    decoder layer's activations also take the other MatMuls with a weight under its
    projections' common ONNX name scope (RoPE's rotation, the key/value repeat:
    `/layers.3/...`, in graph order); its weights are its projections'."""
    known = set(weighted)
    by_index: dict[int, list[str]] = {}
    head: list[str] = []
    for kind, names in sorted(layer_names.items()):
        for i, node in enumerate(names):
            if node not in known:
                continue
            (head if kind == "lm_head" else by_index.setdefault(i, [])).append(node)
    taken = {n for nodes in by_index.values() for n in nodes} | set(head)
    groups = []
    for i, nodes in sorted(by_index.items()):
        scope = _scope(nodes)
        extra = [n for n in weighted if scope and n.startswith(scope) and n not in taken]
        taken.update(extra)
        groups.append(Group(f"layer {i}", tuple(nodes), tuple(extra)))
    return groups + ([Group("lm_head", tuple(head))] if head else [])


def _scope(nodes: list[str]) -> str:
    """The ONNX name scope the nodes share ("/layers.3/"), "" when only the root."""
    parts = [n.split("/")[:-1] for n in nodes]
    common = []
    for level in zip(*parts, strict=False):
        if len(set(level)) != 1:
            break
        common.append(level[0])
    scope = "/".join(common) + "/"
    return scope if scope.strip("/") else ""


@dataclass(frozen=True)
class Reach:
    """The DFC layers a line for a group names, and the activation tensors they write."""

    weight_layers: tuple[str, ...]  # the layers of the group's MatMuls
    activation_layers: tuple[str, ...]  # those, and the mapped writers of what they read
    points: tuple[str, ...]  # activation tensors whose bits a16 on the latter raises


def reach_of(group: Group, plan: Plan, graph: Any, writer: dict[str, str]) -> Reach:
    """The group's layers, the mapped writers of what they read, and the activation tensors
    whose bits a16 on those layers changes (those they write, and what they read from ops the
    HN maps to no layer: `tensor_bits`)."""
    layers_of: dict[str, list[str]] = {}
    for layer, names in plan.mapping.items():
        for name in names:
            layers_of.setdefault(name, []).append(layer)
    own = {layer for n in group.nodes for layer in layers_of.get(n, [])}
    matmuls = group.nodes + group.scoped
    feeders = {writer[t] for n in matmuls for t in graph.reads[n] if t in writer}
    acting = own | {layer for w in {*group.scoped, *feeders} for layer in layers_of.get(w, [])}
    nodes = set(matmuls) | {n for layer in acting for n in plan.mapping[layer]}
    before = plan.bits(graph)[0]
    after = plan.bits(graph, {**plan.nodes, **dict.fromkeys(nodes, Precision(16, 16))})[0]
    return Reach(tuple(natural_order(own)), tuple(natural_order(acting)),
                 tuple(t for t in before if after[t] > before[t]))


@dataclass
class Sensitivity:
    """The float graph, the rows' feeds and float32 logits, the recipe's bits and ranges."""

    export: Export
    feeds: list[dict[str, Any]]
    reference: list[Any]  # float32 logits of each row
    act_bits: dict[str, int]  # activation tensor -> the recipe's bits
    weight_bits: dict[str, int]  # weight initializer -> the recipe's bits
    ranges: dict[str, tuple[float, float]]

    def cost(self, model: Any, weights: dict[str, Any]) -> dict[str, Any]:
        session = self.export.session("sensitivity", model, weights)
        rows = [session.logits(self.export.outputs, f) for f in self.feeds]
        session.close()
        pairs = list(zip(self.reference, rows, strict=True))
        mean = sum(cosine(r, q) for r, q in pairs) / len(pairs)
        return {"logit_cosine": round_sig(mean), "cosine_loss": round_sig(1.0 - mean),
                "top1_agreement": round_sig(sum(argmax(r) == argmax(q) for r, q in pairs)
                                            / len(pairs))}

    def weights(self, group: Group) -> dict[str, Any] | None:
        names = sorted({self.export.graph.weights[n][0] for n in group.nodes})
        bits = {n: self.weight_bits.get(n, DEFAULT.weight_bits) for n in names}
        if min(bits.values()) >= 16:
            return None
        arrays = {n: fake_quantize(self.export.weight(n), b) for n, b in bits.items()}
        return {"group": group.name, "kind": "weights", "bits": _bits("w", bits.values()),
                "tensors": len(names), **self.cost(self.export.model, arrays)}

    def activations(self, group: Group, reach: Reach) -> dict[str, Any] | None:
        bits = {t: self.act_bits.get(t, DEFAULT.activation_bits) for t in reach.points}
        if not bits:  # none below 16 bits, or none a line for the group changes
            return None
        quants = {t: Quant.of(b, *self.ranges[t]) for t, b in bits.items()}
        return {"group": group.name, "kind": "activations", "bits": _bits("a", bits.values()),
                "tensors": len(bits), **self.cost(with_fake_quant(self.export.model, quants),
                                                  {})}


def _bits(prefix: str, bits: Any) -> str:
    return "/".join(f"{prefix}{b}" for b in sorted(set(bits)))


def table(sens: Sensitivity, groups: list[Group],
          reaches: dict[str, Reach]) -> list[dict[str, Any]]:
    """Every group's weights and activations cost, the costliest first (ties: graph order,
    weights before activations)."""
    rows = []
    for g in groups:
        rows += [r for r in (sens.weights(g), sens.activations(g, reaches[g.name])) if r]
    order = sorted(range(len(rows)), key=lambda i: (-rows[i]["cosine_loss"], i))
    return [rows[i] for i in order]


def layer_precision(layer: str, mapping: dict[str, list[str]],
                    precision: dict[str, Precision]) -> Precision:
    """A layer's precision in the plan (that of its ONNX names; DEFAULT when none has one)."""
    found = [precision[n] for n in mapping.get(layer, []) if n in precision]
    return min(found) if found else DEFAULT
